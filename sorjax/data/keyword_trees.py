"""The keyword task of Le & Zuidema (2016), section 3.

A sentence is a sequence of tokens 0..9999 holding exactly one keyword
(a token < 1000) and l - 1 non-keywords (each uniform over 1000..9999,
drawn independently); the keyword is uniform over 0..999 and sits at a
uniformly random position ("we shuffle a list of randomly chosen l - 1
non-keywords and one keyword"). The label is keyword // 100 (10 classes).
The sentence is "parsed" by a random binary tree with l leaves, the tokens
on its leaves from left to right.

Random tree: the paper says only "randomly generating a binary tree whose
number of leaf nodes equals the sentence length". We take the uniform
distribution over the Catalan(l - 1) shapes of full binary trees with l
leaves, sampled exactly by Remy's algorithm (grow a uniform tree with j
leaves into one with j + 1: pick one of its 2j - 1 nodes uniformly, put it
under a new internal node whose other child is a new leaf, on a fair
coin's side).

Trees are nested tuples of token ids: a leaf is an int, an internal node a
2-tuple (left, right); `to_string` gives the bracketed form "(a b)".
A keyword's depth is its number of edges to the root (a one-leaf tree has
depth 0); its leaf index is its 0-based position in the sentence.

Experiment 1 (3.1): dataset i (1..10) has sentences of lengths 10i-9..10i,
the length uniform in that range; 10k train, 1k dev, 1k test.
Experiment 2 (3.2): a pool of sentences of lengths 21..30 (uniform) with
random trees, filtered to keyword depth i or i+1; 10k / 1k / 1k. We sample
that filtered pool exactly by rejection, without building the pool.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence, Union

import numpy as np

from sorjax import checks
from sorjax.data.checks import check_fits, check_int, check_scale

VOCAB_SIZE = 10_000
NUM_KEYWORDS = 1_000
NUM_CLASSES = 10
SPLITS = (("train", 10_000), ("dev", 1_000), ("test", 1_000))

Tree = Union[int, tuple["Tree", "Tree"]]


# ---------------------------------------------------------------- trees

def _remy(n: int, rng: np.random.Generator):
  """Remy's algorithm: child lists and root of a uniform tree, n leaves."""
  left, right, parent = [-1], [-1], [-1]   # node 0: the first leaf
  root = 0
  picks = rng.integers(0, 2 * np.arange(1, n) - 1).tolist() if n > 1 else []
  for v, side in zip(picks, rng.integers(0, 2, size=n - 1).tolist()):
    u, leaf = len(left), len(left) + 1     # new internal node, new leaf
    left += [leaf, -1] if side else [v, -1]
    right += [v, -1] if side else [leaf, -1]
    p = parent[v]
    parent += [p, u]
    if p < 0:
      root = u
    elif left[p] == v:
      left[p] = u
    else:
      right[p] = u
    parent[v] = u
  return left, right, root


def _depths(left, right, root) -> list[int]:
  """Each leaf's depth, left to right."""
  depths, stack = [], [(root, 0)]
  while stack:
    node, d = stack.pop()
    if left[node] < 0:
      depths.append(d)
    else:
      stack += [(right[node], d + 1), (left[node], d + 1)]
  return depths


def _build(left, right, node, tokens) -> Tree:
  """The nested tuple with tokens (an iterator) on the leaves in order."""
  if left[node] < 0:
    return next(tokens)
  return (_build(left, right, left[node], tokens),
          _build(left, right, right[node], tokens))


def random_shape(num_leaves: int, rng: np.random.Generator) -> Tree:
  """A uniformly random full binary tree with leaves 0..num_leaves-1 in
  left-to-right order (Remy's algorithm)."""
  n = check_int("random_shape", "num_leaves", num_leaves, 1)
  return _build(*_remy(n, rng), iter(range(n)))


def relabel(shape: Tree, tokens: Sequence[int]) -> Tree:
  """The shape with leaf i replaced by tokens[i]."""
  if isinstance(shape, tuple):
    return (relabel(shape[0], tokens), relabel(shape[1], tokens))
  return int(tokens[shape])


def leaves(tree: Tree) -> list[int]:
  """Leaf tokens from left to right."""
  return [tok for tok, _ in _leaf_depths(tree)]


def leaf_depths(tree: Tree) -> list[int]:
  """Edges from the root to each leaf, left to right."""
  return [d for _, d in _leaf_depths(tree)]


def _leaf_depths(tree: Tree) -> list[tuple[int, int]]:
  out, stack = [], [(tree, 0)]
  while stack:
    node, d = stack.pop()
    if isinstance(node, tuple):
      if len(node) != 2:
        raise ValueError(f"a tree node must be a leaf (int) or a 2-tuple, "
                         f"got a {len(node)}-tuple")
      stack += [(node[1], d + 1), (node[0], d + 1)]
    elif checks.is_int(node):
      out.append((int(node), d))
    else:
      raise ValueError(f"a tree leaf must be an int token, got {node!r}")
  return out


def to_string(tree: Tree) -> str:
  """Bracketed form: "(a b)" for an internal node, "a" for a leaf."""
  if isinstance(tree, tuple):
    return f"({to_string(tree[0])} {to_string(tree[1])})"
  return str(int(tree))


def from_string(text: str) -> Tree:
  """Inverse of `to_string`."""
  toks = text.replace("(", " ( ").replace(")", " ) ").split()
  stack: list[list] = [[]]
  for j, t in enumerate(toks):
    if t == "(":
      stack.append([])
    elif t == ")":
      node = stack.pop()
      if len(node) != 2 or not stack:
        raise ValueError(f"from_string: node closed at token {j} has "
                         f"{len(node)} children (binary trees need 2): "
                         f"{text!r}")
      stack[-1].append(tuple(node))
    elif t.isdigit():
      stack[-1].append(int(t))
    else:
      raise ValueError(f"from_string: bad token {t!r} at {j} in {text!r}")
  if len(stack) != 1 or len(stack[0]) != 1:
    raise ValueError(f"from_string: not a single tree: {text!r}")
  return stack[0][0]


# ---------------------------------------------------------------- examples

class KeywordExample(NamedTuple):
  tree: Tree                # nested tuples of token ids
  tokens: np.ndarray        # int32 [length]: the leaves, left to right
  label: int                # keyword // 100
  keyword_index: int        # leaf index of the keyword
  keyword_depth: int        # edges from the root to the keyword

  @property
  def keyword(self) -> int:
    return int(self.tokens[self.keyword_index])


def sample(num: int, min_length: int, max_length: int, seed: int = 0,
           depths: Sequence[int] | None = None) -> list[KeywordExample]:
  """`num` examples, lengths uniform in [min_length, max_length] (inclusive),
  uniform random trees; with `depths`, only those whose keyword depth is in
  `depths` (exactly the filtered pool of Experiment 2)."""
  owner = "keyword_trees.sample"
  num = check_int(owner, "num", num, 0)
  check_fits(owner, "num", num, 200)      # a tree and its token array each
  check_int(owner, "min_length", min_length, 1)
  check_int(owner, "max_length", max_length, 1)
  seed = check_int(owner, "seed", seed, 0)
  if min_length > max_length:
    raise ValueError(f"{owner}: min_length={min_length} > "
                     f"max_length={max_length}")
  if depths is not None:
    if isinstance(depths, (str, bytes)) or not isinstance(depths, Iterable):
      raise ValueError(f"{owner}: depths must be a sequence of ints, got "
                       f"{depths!r}")
    depths = frozenset(check_int(owner, "depths[]", d, 0) for d in depths)
    # A tree with n >= 2 leaves has leaves at depths 1..n-1 only; n = 1: 0.
    if not any((d == 0 and min_length == 1) or 1 <= d < max_length
               for d in depths):
      raise ValueError(
          f"{owner}: no tree with {min_length}..{max_length} leaves has a "
          f"leaf at depths {sorted(depths)}")
    # Leaves at depth <= D: at most 2^D (Kraft), so (#qualifying / n) <= r.
    # No leaf is deeper than max_length - 1; 2^D >= min_length gives r = 1.
    top = min(max(depths), max_length - 1)
    ratio = (1.0 if top >= int(min_length).bit_length()
             else min(1.0, 2.0 ** top / min_length))
  rng = np.random.default_rng(seed)
  out: list[KeywordExample] = []
  attempts, limit = 0, 1_000 * num + 100_000
  while len(out) < num:
    attempts += 1
    if attempts > limit:
      raise RuntimeError(f"{owner}: {limit} random trees gave only "
                         f"{len(out)} of {num} examples with keyword depth "
                         f"in {sorted(depths)}; such depths are too rare")
    n = int(rng.integers(min_length, max_length + 1))
    shape = _remy(n, rng)
    depth = _depths(*shape)
    if depths is None:
      index = int(rng.integers(n))
    else:
      # P(tree, index) must be P(tree) / n for each qualifying index: keep
      # the tree w.p. (count / n) / ratio, then a uniform qualifying leaf.
      ok = [i for i, d in enumerate(depth) if d in depths]
      if not ok or rng.random() * ratio >= len(ok) / n:
        continue
      index = ok[int(rng.integers(len(ok)))]
    tokens = rng.integers(NUM_KEYWORDS, VOCAB_SIZE, size=n).astype(np.int32)
    tokens[index] = rng.integers(NUM_KEYWORDS)
    tree = _build(*shape, iter(tokens.tolist()))
    out.append(KeywordExample(tree, tokens, int(tokens[index]) // 100, index,
                              depth[index]))
  return out


def _split(examples, sizes):
  out, start = {}, 0
  for name, size in sizes:
    out[name] = examples[start:start + size]
    start += size
  return out


def _sizes(owner, scale):
  check_scale(owner, scale)
  return [(name, max(1, round(size * scale))) for name, size in SPLITS]


def length_experiment(i: int, seed: int = 0, scale: float = 1.0
                      ) -> dict[str, list[KeywordExample]]:
  """Experiment 1, dataset i in 1..10: lengths 10i-9..10i, 10k/1k/1k."""
  owner = "length_experiment"
  i = check_int(owner, "i", i, 1)
  if i > 10:
    raise ValueError(f"{owner}: i must be in 1..10, got {i}")
  sizes = _sizes(owner, scale)
  return _split(sample(sum(s for _, s in sizes), 10 * i - 9, 10 * i, seed),
                sizes)


def depth_experiment(i: int, seed: int = 0, scale: float = 1.0,
                     min_length: int = 21, max_length: int = 30
                     ) -> dict[str, list[KeywordExample]]:
  """Experiment 2, dataset i in 1..10: keyword depth i or i+1, lengths
  21..30 (deeper keywords are too rare for rejection sampling: depth 25
  finds none in 10^5 trees)."""
  owner = "depth_experiment"
  i = check_int(owner, "i", i, 1)
  if i > 10:
    raise ValueError(f"{owner}: i must be in 1..10 (the paper's datasets), "
                     f"got {i}")
  sizes = _sizes(owner, scale)
  return _split(sample(sum(s for _, s in sizes), min_length, max_length,
                       seed, depths=(i, i + 1)), sizes)
