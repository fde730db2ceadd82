"""Binary trees: bracketed parsing, composition schedules, batched recursion.

    trees = read_trees("sst/train.txt")      # or parse(line, source=...)
    schedule = encode(trees, vocab)          # NumPy arrays, fixed shapes
    states, roots = run(cell, params, embeddings[schedule.tokens], schedule)

`run` applies a tree cell (`sorjax.cells.tree`) bottom-up, Le & Zuidema's
p = F(x, y) (sec. 2) at every internal node: one `lax.scan` step gathers the
children of W nodes across the batch, composes them at once and scatters
the parents. `encode` decides which nodes share a step. The default
"chunked" schedule is Hu's list schedule of width W (a node enters a step
once its children are done, deepest first): about max(height, nodes / W)
steps with little padding. The "level" schedule composes all nodes of
height t (a leaf has height 0, a parent 1 + the larger of its children's)
in step t; it takes exactly the largest height in steps but pads every
level to the widest one, which costs more than it saves on a CPU
(benchmarks/RESULTS.md, Trees).

Node numbering inside a tree with L leaves: the leaves are 0 .. L-1 left to
right (so `tokens[b, :L]` is the sentence), then the internal nodes sorted by
(height, leftmost leaf); the root is the last node, 2L - 2. It does not
depend on the schedule.
"""

from __future__ import annotations

import dataclasses
import gzip
import re
from typing import Any, Callable, Mapping, NamedTuple, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from sorjax import cells, checks
from sorjax.cells import base

Word = Union[str, int]


# ---------------------------------------------------------------- trees

@dataclasses.dataclass(frozen=True)
class Tree:
  """A node: a leaf holds a `word`, an internal node its `children`.

  `label` is the node's annotation as written ("3" in SST), or None.
  """
  label: str | None = None
  children: tuple["Tree", ...] = ()
  word: Word | None = None

  def __post_init__(self):
    object.__setattr__(self, "children", tuple(self.children))
    if (self.word is None) == (not self.children):
      raise ValueError("Tree: a node has either a word (a leaf) or children, "
                       f"not {'both' if self.children else 'neither'}")

  @property
  def is_leaf(self) -> bool:
    return self.word is not None

  def leaves(self) -> list[Word]:
    """The words, left to right."""
    return [n.word for n in _preorder(self) if n.is_leaf]

  @property
  def height(self) -> int:
    """Edges on the longest path down to a leaf (a lone leaf: 0)."""
    return _heights(self)[id(self)]

  def __str__(self) -> str:
    """The bracketed form that `parse` reads back."""
    out, stack = [], [self]
    while stack:  # iterative: deep random trees exceed Python's recursion
      n = stack.pop()
      if isinstance(n, str):
        out.append(n)
      elif n.is_leaf and n.label is None:
        out.append(str(n.word))
      else:
        out.append("(" if n.label is None else f"({n.label} ")
        seq = []
        for k, c in enumerate([str(n.word)] if n.is_leaf else n.children):
          seq += [" ", c] if k else [c]
        stack.extend(reversed(seq + [")"]))
    return "".join(out)

  @classmethod
  def from_nested(cls, obj: Any) -> "Tree":
    """An unlabeled tree from nested pairs of words: ((1, 2), 3)."""
    if isinstance(obj, Tree):
      return obj
    if isinstance(obj, (tuple, list)):
      if len(obj) != 2:
        raise ValueError(
            f"Tree.from_nested: a node must be a pair, got {len(obj)} items: "
            f"{obj!r}")
      return cls(children=(cls.from_nested(obj[0]), cls.from_nested(obj[1])))
    if isinstance(obj, str) or checks.is_int(obj):
      return cls(word=obj if isinstance(obj, str) else int(obj))
    raise ValueError(f"Tree.from_nested: a leaf must be a str or int word, "
                     f"got {obj!r}")


def _preorder(tree: Tree):
  stack = [tree]
  while stack:
    n = stack.pop()
    yield n
    stack.extend(reversed(n.children))


def _heights(tree: Tree) -> dict[int, int]:
  """id(node) -> height, computed bottom-up without recursion."""
  h = {}
  for n in reversed(list(_preorder(tree))):
    h[id(n)] = 0 if n.is_leaf else 1 + max(h[id(c)] for c in n.children)
  return h


# ---------------------------------------------------------------- parsing

class TreeParseError(ValueError):
  """A malformed bracketed tree; `source` and `column` say where."""

  def __init__(self, message: str, text: str, pos: int, source: str | None):
    self.source, self.column = source, pos + 1
    where = f"{source}: " if source else ""
    lo = max(0, pos - 40)
    snippet = re.sub(r"\s", " ", text[lo:pos + 40])  # keeps the caret aligned
    prefix = "..." if lo else ""
    super().__init__(f"{where}column {pos + 1}: {message}\n  {prefix}{snippet}"
                     f"\n  {' ' * (len(prefix) + pos - lo)}^")


# Words split at ASCII blanks only, as the SST files and their builder do:
# str patterns' \s also matches U+00A0, which SST's train split has inside
# three words ("8\u00a01\/2").
_TOKEN = re.compile(r"[()]|[^ \t\n\r\f\v()]+")


def _tokens(text: str):
  """(kind, start, value): kind '(' or ')' or 'w' (a word or a label)."""
  for m in _TOKEN.finditer(text):
    v = m.group()
    yield (v if v in "()" else "w"), m.start(), v


def _binarize(label, children, how):
  """Right- ((A a (b c))) or left-factored (((a b) c)) binary nodes; the new
  intermediate nodes have no label. A unary node becomes its child, keeping
  the outer label."""
  if len(children) == 1:
    c = children[0]
    return dataclasses.replace(c, label=label if label is not None else c.label)
  kids = list(children)
  if how == "right":
    node = Tree(None, (kids[-2], kids[-1]))
    for c in reversed(kids[1:-2]):
      node = Tree(None, (c, node))
    return Tree(label, (kids[0], node))
  node = Tree(None, (kids[0], kids[1]))
  for c in kids[2:-1]:
    node = Tree(None, (node, c))
  return Tree(label, (node, kids[-1]))


def parse(text: str, *, labeled: bool = True, binarize: str | None = None,
          source: str | None = None) -> Tree:
  """Parses one bracketed binary tree.

  labeled=True (SST, PTB): every node is "(label ...)"; a leaf is
  "(label word)", an internal node "(label subtree subtree)", e.g.
  "(3 (2 It) (4 (2 's) (3 good)))". labeled=False: "((It 's) good)", leaves
  are bare words.

  Nodes with one or more than two children are errors unless binarize is
  "right" or "left" (factoring direction; unary nodes are collapsed).
  `source` ("file:line") prefixes every error message.
  """
  if binarize not in (None, "left", "right"):
    raise ValueError(f"parse: binarize must be None, 'left' or 'right', "
                     f"got {binarize!r}")

  def error(message, pos):
    return TreeParseError(message, text, pos, source)

  toks = list(_tokens(text))
  if not toks:
    raise error("empty tree: expected '('" if labeled else
                "empty tree: expected '(' or a word", len(text))
  root = None
  stack = []  # frames: [open position, label, children, word]
  k = 0
  while k < len(toks):
    kind, pos, val = toks[k]
    k += 1
    if root is not None:
      raise error("unmatched ')' after the end of the tree" if kind == ")"
                  else "unexpected text after the tree", pos)
    if kind == "(":
      if stack and stack[-1][3] is not None:
        raise error("a labeled leaf holds one word, not a subtree", pos)
      label = None
      if labeled:
        if k >= len(toks) or toks[k][0] != "w":
          where = toks[k][1] if k < len(toks) else len(text)
          raise error("expected a label after '('", where)
        label = toks[k][2]
        k += 1
      stack.append([pos, label, [], None])
    elif kind == ")":
      if not stack:
        raise error("unmatched ')'", pos)
      start, label, children, word = stack.pop()
      if word is not None:
        node = Tree(label, word=word)
      elif not children:
        raise error("empty node: expected " +
                    ("a word or subtrees" if labeled else "two children"), pos)
      elif len(children) == 2:
        node = Tree(label, tuple(children))
      elif binarize is None:
        raise error(
            f"node opened at column {start + 1} has {len(children)} "
            f"{'child' if len(children) == 1 else 'children'}; binary trees "
            f"need 2 (pass binarize='right' or 'left' to binarise)", start)
      else:
        node = _binarize(label, children, binarize)
      if stack:
        stack[-1][2].append(node)
      else:
        root = node
    else:  # a word
      if not stack:
        if labeled:
          raise error("expected '(' (labeled trees put every word in "
                      "'(label word)')", pos)
        root = Tree(word=val)
      elif labeled:
        frame = stack[-1]
        if frame[2]:
          raise error("a node holds either one word or subtrees, not both",
                      pos)
        if frame[3] is not None:
          raise error("a labeled leaf holds one word; found a second", pos)
        frame[3] = val
      else:
        stack[-1][2].append(Tree(word=val))
  if stack:
    raise error(f"unclosed '(' opened at column {stack[-1][0] + 1}",
                stack[-1][0])
  return root


def read_trees(path: str, **kwargs: Any) -> list[Tree]:
  """One tree per non-blank line (gzip if the name ends in .gz); errors name
  the file and line. kwargs go to `parse`."""
  opener = gzip.open if str(path).endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8") as f:
    return [parse(line, source=f"{path}:{i}", **kwargs)
            for i, line in enumerate(f, 1) if line.strip()]


# ---------------------------------------------------------------- schedules

SCHEDULES = ("chunked", "level")


class ScheduleError(ValueError):
  """A batch that does not fit the sizes given to `encode`."""


class Schedule(NamedTuple):
  """A batch of B trees as fixed-shape NumPy arrays (a pytree for jit).

  L = max leaves, N = 2L - 1 node slots per tree; the internal nodes are
  composed in T sequential steps of W slots (`encode` says which nodes go
  into which step). Node indices follow the module's numbering; `node`,
  `left`, `right` are flat indices b * N + n into the batch's [B * N] node
  slots.
  """
  tokens: np.ndarray      # int32 [B, L] leaf ids, left to right; then pad_id
  leaf_mask: np.ndarray   # bool [B, L]
  node_mask: np.ndarray   # bool [B, N]
  labels: np.ndarray      # int32 [B, N] per-node labels; -1: none or padding
  depth: np.ndarray       # int32 [B, N] edges to the root; -1: padding
  root: np.ndarray        # int32 [B] root node index, 2 L_b - 2
  height: np.ndarray      # int32 [B] tree heights
  node: np.ndarray        # int32 [T, W] flat index of the nodes composed at
                          #   step t, ascending; padding B * N + j (past
                          #   the end)
  left: np.ndarray        # int32 [T, W] flat index of each one's left child
  right: np.ndarray       # int32 [T, W] ... and right child; padding 0
  step_mask: np.ndarray   # bool [T, W] real slots (not padding)


class TreeArrays(NamedTuple):
  """One tree in the module's numbering, ids looked up (`tree_arrays`).

  `encode` takes these in place of trees: a fixed data set is numbered and
  looked up once, and batching it is array work only.
  """
  tokens: np.ndarray   # int32 [L] leaf ids, left to right
  labels: np.ndarray   # int32 [2L - 1] label ids; -1: none
  depth: np.ndarray    # int32 [2L - 1] edges to the root
  height: np.ndarray   # int32 [2L - 1] (a leaf: 0)
  left: np.ndarray     # int32 [L - 1] left child of internal node L + k
  right: np.ndarray    # int32 [L - 1] ... and its right child


def _lookup(kind: str, table, key, where: str, default=None) -> int:
  """vocab / label lookup with errors that name the tree and the key."""
  if table is None:
    try:  # ints, or their strings ("3" in SST); int(1.7) would be 1
      if isinstance(key, (bool, np.bool_, float, np.floating)):
        raise TypeError
      value = int(key)
    except (TypeError, ValueError):
      raise ValueError(
          f"{where}: {kind} {key!r} is not an integer; pass a "
          f"{'vocab' if kind == 'word' else 'labels'} mapping") from None
  elif callable(table) and not isinstance(table, Mapping):
    value = int(table(key))
  elif key in table:
    value = int(table[key])
  elif default is not None:
    value = int(default)
  else:
    raise ValueError(f"{where}: {kind} {key!r} is not in the "
                     f"{'vocab' if kind == 'word' else 'labels'} mapping"
                     + (" (pass unk=...)" if kind == "word" else ""))
  if kind == "word" and value < 0:  # would index the table from its end
    raise ValueError(f"{where}: word {key!r} has a negative id ({value})")
  return value


def _arrays(tree: Tree | Any, where: str, vocab, labels, unk) -> TreeArrays:
  if not isinstance(tree, Tree):
    tree = Tree.from_nested(tree)
  order = list(_preorder(tree))
  for n in order:
    if not n.is_leaf and len(n.children) != 2:
      raise ValueError(f"{where} has a node with {len(n.children)} "
                       "children; only binary trees can be encoded (see "
                       "parse(..., binarize=...))")
  height = _heights(tree)
  leaves = [n for n in order if n.is_leaf]
  first = {id(n): i for i, n in enumerate(leaves)}  # id -> leftmost leaf
  for n in reversed(order):
    if not n.is_leaf:
      first[id(n)] = first[id(n.children[0])]
  internal = sorted((n for n in order if not n.is_leaf),
                    key=lambda n: (height[id(n)], first[id(n)]))
  depth = {id(tree): 0}
  for n in order:
    for c in n.children:
      depth[id(c)] = depth[id(n)] + 1
  nodes = leaves + internal
  index = {id(n): i for i, n in enumerate(nodes)}
  label_ids = np.full(len(nodes), -1, np.int32)
  for i, n in enumerate(nodes):
    if n.label is not None:
      label_ids[i] = _lookup("label", labels, n.label, where)
      if label_ids[i] < 0:  # -1 marks "no label"
        raise ValueError(f"{where}: label {n.label!r} maps to "
                         f"{label_ids[i]}; label ids must be >= 0")
  ints = lambda xs: np.asarray(xs, np.int32).reshape(-1)
  return TreeArrays(
      tokens=ints([_lookup("word", vocab, n.word, where, unk)
                   for n in leaves]),
      labels=label_ids,
      depth=ints([depth[id(n)] for n in nodes]),
      height=ints([height[id(n)] for n in nodes]),
      left=ints([index[id(n.children[0])] for n in internal]),
      right=ints([index[id(n.children[1])] for n in internal]))


def _check_arrays(a: TreeArrays, where: str) -> None:
  """`TreeArrays` given to `encode` as `tree_arrays` makes them: a child
  out of range, used twice or not below its parent, or heights and depths
  that disagree with the children, would be composed into a wrong root (or
  a cycle) without an error."""
  a = TreeArrays(*map(np.asarray, a))
  L = len(a.tokens)
  if L < 1:
    raise ValueError(f"{where}: a tree has at least one leaf; tokens are "
                     f"{a.tokens.tolist()}")
  want = dict(tokens=L, labels=2 * L - 1, depth=2 * L - 1,
              height=2 * L - 1, left=L - 1, right=L - 1)
  for name, n in want.items():
    v = getattr(a, name)
    if v.shape != (n,) or not np.issubdtype(v.dtype, np.integer):
      raise ValueError(f"{where}: {name} must be {n} integers for {L} "
                       f"leaves, got {v.dtype} {v.shape}")
  if (a.tokens < 0).any():
    raise ValueError(f"{where}: tokens must be >= 0, got {a.tokens.tolist()}")
  parent = L + np.arange(L - 1)
  for name in ("left", "right"):
    c = getattr(a, name)
    bad = np.flatnonzero((c < 0) | (c >= parent))
    if bad.size:
      k = int(bad[0])
      raise ValueError(f"{where}: {name}[{k}] = {int(c[k])}: node {L + k}'s "
                       f"children must be numbered 0..{L + k - 1}")
  used = np.bincount(np.concatenate([a.left, a.right]), minlength=2 * L - 1)
  if (used[:-1] != 1).any():
    n = int(np.flatnonzero(used[:-1] != 1)[0])
    raise ValueError(f"{where}: node {n} is the child of {int(used[n])} "
                     "nodes; every node but the root has one parent")
  height, depth = np.zeros(2 * L - 1, np.int64), np.zeros(2 * L - 1, np.int64)
  for k in range(L - 1):
    height[L + k] = 1 + max(height[a.left[k]], height[a.right[k]])
  for k in reversed(range(L - 1)):
    depth[a.left[k]] = depth[a.right[k]] = depth[L + k] + 1
  for name, v in (("height", height), ("depth", depth)):
    if (getattr(a, name) != v).any():
      raise ValueError(f"{where}: {name} {getattr(a, name).tolist()} "
                       f"disagrees with left and right ({v.tolist()})")


def tree_arrays(tree: Tree | Any,
                vocab: Mapping[str, int] | Callable[[Word], int] | None = None,
                *, labels: Mapping[str, int] | None = None,
                unk: int | None = None) -> TreeArrays:
  """One tree's `TreeArrays` (arguments as in `encode`)."""
  return _arrays(tree, "tree_arrays: tree", vocab, labels, unk)


def _padded(name: str, need: np.ndarray, given: int | None) -> int:
  """max(need), or `given` when that is enough; else an error naming the
  first tree that does not fit."""
  if given is None:
    return int(need.max())
  if need.max() > given:
    b = int(np.argmax(need))
    raise ScheduleError(f"encode: tree {b} needs {name}={need[b]} > the "
                        f"given {name}={given}")
  return given


def _check_size(name: str, value) -> None:
  checks.check_int(f"encode: {name}", value, 1, optional=True)


def hu_steps(parent: np.ndarray, depth: np.ndarray, width: int
             ) -> np.ndarray:
  """Hu's list schedule of a forest of unit tasks on `width` slots.

  Task k may run once its children (the tasks j with parent[j] == k; -1
  marks a root) are done; each step runs up to `width` ready tasks, the
  deepest first (Hu 1961, "Parallel sequencing and assembly line problems":
  highest level first, and in a forest a task's level is its depth, edges
  to its root), then the lowest index. For forests this is optimal: no
  schedule of this width takes fewer steps. Returns each task's step.
  """
  checks.check_int("hu_steps: width", width, 1)
  parent, depth = np.asarray(parent), np.asarray(depth)
  M = len(parent)
  if depth.shape != (M,):
    raise ValueError(f"hu_steps: depth must be [{M}] like parent, got shape "
                     f"{depth.shape}")
  pending = np.bincount(parent[parent >= 0], minlength=M)
  step = np.full(M, -1, np.int64)
  ready, t = np.flatnonzero(pending == 0), 0
  while ready.size:
    rest = ready[:0]
    if ready.size > width:
      order = np.lexsort((ready, -depth[ready]))
      ready, rest = ready[order[:width]], ready[order[width:]]
    step[ready] = t
    up = parent[ready]
    up = up[up >= 0]
    np.subtract.at(pending, up, 1)
    ready = np.concatenate([rest, np.unique(up[pending[up] == 0])])
    t += 1
  if np.any(step < 0):
    raise ValueError(f"hu_steps: tasks {np.flatnonzero(step < 0)[:5].tolist()}"
                     " wait on a cycle; parent must describe a forest")
  return step


def encode(trees: Sequence[Tree | TreeArrays | Any],
           vocab: Mapping[str, int] | Callable[[Word], int] | None = None, *,
           labels: Mapping[str, int] | None = None, unk: int | None = None,
           pad_id: int = 0, schedule: str = "chunked",
           width: int | None = None, max_leaves: int | None = None,
           max_steps: int | None = None,
           check_arrays: bool = True) -> Schedule:
  """The composition schedule of a batch of binary trees.

  schedule="chunked" (the default): Hu's list schedule (`hu_steps`) with W =
  `width` slots per step: a node enters a step once both children are done,
  deepest nodes first. It takes the fewest steps any schedule of width W
  can (at least the batch's largest height, about internal nodes / W when
  W is small); a step has empty slots only when fewer nodes are ready.
  schedule="level": step t composes every node of height t + 1; T is the
  largest height, W the widest level, and the other levels are padded to it.

  Args:
    trees: `Tree`s, nested pairs of words (see `Tree.from_nested`), or
      `TreeArrays` (already looked up: vocab, labels and unk do not apply).
    vocab: word -> id mapping or function; None: words must be integers.
    labels: label -> id mapping; None: labels must be integers ("0".."4").
    unk: id of words missing from a vocab mapping (else they are an error).
    pad_id: token id of padded leaf slots.
    schedule: "chunked" or "level".
    width: chunked: W, compositions per step (None: internal nodes / the
      largest height, rounded up, for about height steps); level: pad W up
      to this (None: the widest level; a wider level is an error).
    max_leaves, max_steps: pad L and T up to these sizes (fixed shapes
      across batches, so `run` compiles once); a batch that needs more is an
      error naming the tree (or, chunked, the steps it needs at this width).
    check_arrays: check given `TreeArrays` as `tree_arrays` makes them
      (O(leaves) Python per tree, 3x encode's own time); False for arrays
      `tree_arrays` made, as the trees task batches them every step.
  """
  if schedule not in SCHEDULES:
    raise ValueError(f"encode: schedule must be one of {SCHEDULES}, got "
                     f"{schedule!r}")
  for name, value in (("width", width), ("max_leaves", max_leaves),
                      ("max_steps", max_steps)):
    _check_size(name, value)
  # like a word id: a padded leaf slot is still looked up in the embedding
  checks.check_int("encode: pad_id (a token id: padded leaf slots are "
                   "embedded too)", pad_id, 0)
  if not len(trees):
    raise ValueError("encode: no trees")
  arrs = [t if isinstance(t, TreeArrays) else
          _arrays(t, f"encode: tree {b}", vocab, labels, unk)
          for b, t in enumerate(trees)]
  for b, t in enumerate(trees):
    if check_arrays and isinstance(t, TreeArrays):
      _check_arrays(t, f"encode: tree {b}")
  B = len(arrs)
  n_leaves = np.asarray([len(a.tokens) for a in arrs])
  heights = np.asarray([a.height[-1] for a in arrs], np.int32)  # the roots'
  L = _padded("max_leaves", n_leaves, max_leaves)
  N = 2 * L - 1
  cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int32)

  tokens = np.full((B, L), pad_id, np.int32)
  leaf_mask = np.arange(L) < n_leaves[:, None]
  tokens[leaf_mask] = cat([a.tokens for a in arrs])
  node_mask = np.arange(N) < 2 * n_leaves[:, None] - 1
  label_ids = np.full((B, N), -1, np.int32)
  label_ids[node_mask] = cat([a.labels for a in arrs])
  depth = np.full((B, N), -1, np.int32)
  depth[node_mask] = cat([a.depth for a in arrs])

  # The M internal nodes of the batch: tree b's node L_b + k is number
  # first[b] + k; flat slot indices b * N + n.
  n_int = n_leaves - 1
  first = np.cumsum(n_int) - n_int
  tree_of = np.repeat(np.arange(B), n_int)
  k = np.arange(n_int.sum()) - first[tree_of]
  offset = tree_of * N
  left, right = cat([a.left for a in arrs]), cat([a.right for a in arrs])
  flat = (offset + n_leaves[tree_of] + k, offset + left, offset + right)
  if schedule == "level":
    step = cat([a.height[len(a.tokens):] for a in arrs]).astype(np.int64) - 1
  else:
    parent = np.full(k.size, -1, np.int64)
    for child in (left, right):   # an internal child's number gets its parent
      inner = child >= n_leaves[tree_of]
      parent[(first[tree_of] + child - n_leaves[tree_of])[inner]] = (
          first[tree_of] + k)[inner]
    chunk = width or max(1, -(-k.size // max(int(heights.max()), 1)))
    step = hu_steps(parent, cat([a.depth[len(a.tokens):] for a in arrs]),
                    chunk)
  T = int(step.max()) + 1 if step.size else 0
  counts = np.bincount(step, minlength=T)
  W = int(counts.max()) if T else 1
  if max_steps is not None and T > max_steps:
    b = int(np.argmax(heights))
    if schedule == "level" or heights[b] > max_steps:
      raise ScheduleError(f"encode: tree {b} needs max_steps={heights[b]} (its "
                       f"height) > the given max_steps={max_steps}")
    raise ScheduleError(f"encode: the batch needs {T} steps at width={chunk} "
                     f"> the given max_steps={max_steps}; raise width or "
                     f"max_steps")
  if width is not None and W > width:   # level only: chunks never overflow
    raise ScheduleError(f"encode: the batch has {W} nodes of height "
                     f"{int(np.argmax(counts)) + 1} > the given width={width}")
  W, T = width or W, max_steps or T

  # Step t's nodes fill its first slots by ascending flat index; padding
  # slots write past the end (dropped by the scatter), each to its own index
  # so the scatter's indices stay unique and sorted.
  order = np.lexsort((flat[0], step))
  t = step[order]
  slot = np.arange(order.size) - (np.cumsum(counts) - counts)[t]
  node = np.broadcast_to(B * N + np.arange(W, dtype=np.int32), (T, W)).copy()
  left_, right_ = np.zeros((T, W), np.int32), np.zeros((T, W), np.int32)
  step_mask = np.zeros((T, W), bool)
  for out, idx in zip((node, left_, right_), flat):
    out[t, slot] = idx[order]
  step_mask[t, slot] = True
  root = (2 * n_leaves - 2).astype(np.int32)
  return Schedule(tokens, leaf_mask, node_mask, label_ids, depth, root,
                  heights, node, left_, right_, step_mask)


# ---------------------------------------------------------------- recursion

def run(cell, params, leaf_inputs: jax.Array, schedule: Schedule, *,
        remat: bool = False):
  """Applies a tree cell bottom-up over a batch; returns (states, roots).

  Args:
    cell: a tree cell (`sorjax.cells.make("tree_lstm", hidden_size=...)`).
    params: its parameters.
    leaf_inputs: [B, L, D] word vectors of the leaves, left to right
      (e.g. `embeddings[schedule.tokens]`); padded slots are ignored.
    schedule: `encode(...)` of the batch (NumPy or traced arrays).
    remat: rematerialise each step in the backward pass.

  Returns:
    states: the cell's node state (h, and c for tree_lstm), each [B, N, H],
      in the node numbering of this module; padded slots are zero.
    roots: the root states, each [B, H].
  """
  if not (hasattr(cell, "leaf") and hasattr(cell, "compose")):
    raise ValueError(f"run: {cells.name_of(cell)} is not a tree cell "
                     "(tree_rnn, tree_lstm); sequence cells run with "
                     "sorjax.unroll")
  if not isinstance(remat, (bool, np.bool_)):
    raise ValueError(f"run: remat must be True or False, got {remat!r}")
  B, L = schedule.tokens.shape
  N = schedule.node_mask.shape[1]
  leaf_inputs = jnp.asarray(leaf_inputs)
  if not jnp.issubdtype(leaf_inputs.dtype, jnp.floating):
    raise ValueError(f"run: leaf_inputs must be floating vectors, got "
                     f"{leaf_inputs.dtype} (integer states would be "
                     "truncated)")
  if leaf_inputs.ndim != 3 or leaf_inputs.shape[:2] != (B, L):
    raise ValueError(
        f"run: leaf_inputs must be [B, L, D] = [{B}, {L}, D] like "
        f"schedule.tokens; got shape {tuple(leaf_inputs.shape)}")
  # A tree cell's input size is its hidden size (`sorjax.cells.tree`);
  # `cell.leaf` names leaf inputs of another size.
  base.check_params(f"run: {cells.name_of(cell)}", cell, params,
                    cell.hidden_size)
  base.check_input_dtype(f"run: {cells.name_of(cell)}", params, leaf_inputs,
                         "leaf_inputs")
  # narrower leaves computed in the params' dtype, as unroll does (node
  # states scattered into the leaves' dtype were silently truncated)
  leaf_inputs = leaf_inputs.astype(base.param_dtype(params))
  leaf_mask = jnp.asarray(schedule.leaf_mask)[..., None]

  def slots(a):  # [B, L, H] leaf states -> [B * N, H] slots, zero elsewhere
    a = jnp.where(leaf_mask, a, jnp.zeros_like(a))
    return jnp.pad(a, ((0, 0), (0, N - L), (0, 0))).reshape(B * N, -1)

  states = jax.tree_util.tree_map(slots, cell.leaf(params, leaf_inputs))

  def compose(states, idx):  # one step's nodes: gather, compose, scatter
    node, left, right = idx

    def gather(i):
      return jax.tree_util.tree_map(
          lambda a: a.at[i].get(mode="promise_in_bounds"), states)

    parents = cell.compose(params, gather(left), gather(right))
    return jax.tree_util.tree_map(
        lambda a, p: a.at[node].set(p, mode="drop", indices_are_sorted=True,
                                    unique_indices=True), states, parents)

  if remat:
    compose = jax.checkpoint(compose, prevent_cse=False)
  # Padded steps are computed, not skipped: a lax.cond around `compose`
  # made the keyword task's update slower on CPU, not faster.
  steps = (schedule.node, schedule.left, schedule.right)
  states, _ = jax.lax.scan(lambda s, idx: (compose(s, idx), None), states,
                           jax.tree_util.tree_map(jnp.asarray, steps))
  states = jax.tree_util.tree_map(lambda a: a.reshape(B, N, -1), states)
  root = jnp.asarray(schedule.root)[:, None, None]
  roots = jax.tree_util.tree_map(
      lambda a: jnp.take_along_axis(a, root, axis=1)[:, 0], states)
  return states, roots


__all__ = ["SCHEDULES", "Schedule", "ScheduleError", "Tree", "TreeArrays",
           "TreeParseError", "encode", "hu_steps", "parse", "read_trees",
           "run", "tree_arrays"]
