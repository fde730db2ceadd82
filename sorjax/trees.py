"""Binary trees: bracketed parsing, level schedules, level-wise recursion.

    trees = read_trees("sst/train.txt")      # or parse(line, source=...)
    schedule = encode(trees, vocab)          # NumPy arrays, fixed shapes
    states, roots = run(cell, params, embeddings[schedule.tokens], schedule)

`run` applies a tree cell (`sorjax.cells.tree`) bottom-up, Le & Zuidema's
p = F(x, y) (sec. 2) at every internal node. It is height-scheduled: all
nodes of height t (a leaf has height 0, a parent 1 + the larger of its
children's) depend only on lower nodes, so one `lax.scan` step composes all
of them across the batch at once. The number of sequential steps is the
batch's largest tree height, not its node count.

Node numbering inside a tree with L leaves: the leaves are 0 .. L-1 left to
right (so `tokens[b, :L]` is the sentence), then the internal nodes sorted by
(height, leftmost leaf); the root is the last node, 2L - 2.
"""

from __future__ import annotations

import dataclasses
import gzip
import re
from typing import Any, Callable, Mapping, NamedTuple, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

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
    if isinstance(obj, (str, int, np.integer)) and not isinstance(obj, bool):
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


_TOKEN = re.compile(r"[()]|[^\s()]+")


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

class Schedule(NamedTuple):
  """A batch of B trees as fixed-shape NumPy arrays (a pytree for jit).

  L = max leaves, N = 2L - 1 node slots per tree, T = max height, W = max
  internal nodes of one height in the whole batch. Node indices follow the
  module's numbering; `node`, `left`, `right` are flat indices b * N + n
  into the batch's [B * N] node slots.
  """
  tokens: np.ndarray      # int32 [B, L] leaf ids, left to right; then pad_id
  leaf_mask: np.ndarray   # bool [B, L]
  node_mask: np.ndarray   # bool [B, N]
  labels: np.ndarray      # int32 [B, N] per-node labels; -1: none or padding
  depth: np.ndarray       # int32 [B, N] edges to the root; -1: padding
  root: np.ndarray        # int32 [B] root node index, 2 L_b - 2
  height: np.ndarray      # int32 [B] tree heights
  node: np.ndarray        # int32 [T, W] flat index of the nodes of height
                          #   t + 1; padding B * N + j (past the end)
  left: np.ndarray        # int32 [T, W] flat index of each one's left child
  right: np.ndarray       # int32 [T, W] ... and right child; padding 0
  level_mask: np.ndarray  # bool [T, W]


def _lookup(kind: str, table, key, b: int, default=None) -> int:
  """vocab / label lookup with errors that name the tree and the key."""
  if table is None:
    try:
      return int(key)
    except (TypeError, ValueError):
      raise ValueError(
          f"encode: tree {b}: {kind} {key!r} is not an integer; pass a "
          f"{'vocab' if kind == 'word' else 'labels'} mapping") from None
  if callable(table) and not isinstance(table, Mapping):
    return int(table(key))
  if key in table:
    return int(table[key])
  if default is not None:
    return int(default)
  raise ValueError(f"encode: tree {b}: {kind} {key!r} is not in the "
                   f"{'vocab' if kind == 'word' else 'labels'} mapping"
                   + (" (pass unk=...)" if kind == "word" else ""))


class _Numbered(NamedTuple):
  """One tree in the module's numbering."""
  leaves: list[Tree]      # left to right: nodes 0 .. L-1
  internal: list[Tree]    # by (height, leftmost leaf): nodes L .. 2L-2
  index: dict[int, int]   # id(node) -> node number
  height: dict[int, int]  # id(node) -> height
  depth: dict[int, int]   # id(node) -> edges to the root


def _number(tree: Tree | Any, b: int) -> _Numbered:
  if not isinstance(tree, Tree):
    tree = Tree.from_nested(tree)
  order = list(_preorder(tree))
  for n in order:
    if not n.is_leaf and len(n.children) != 2:
      raise ValueError(f"encode: tree {b} has a node with {len(n.children)} "
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
  index = {id(n): i for i, n in enumerate(leaves + internal)}
  return _Numbered(leaves, internal, index, height, depth)


def _padded(name: str, need: list[int], given: int | None) -> int:
  """max(need), or `given` when that is enough; else an error naming the
  first tree that does not fit."""
  if given is None:
    return max(need)
  if max(need) > given:
    b = int(np.argmax(need))
    raise ValueError(f"encode: tree {b} needs {name}={need[b]} > the given "
                     f"{name}={given}")
  return given


def encode(trees: Sequence[Tree | Any],
           vocab: Mapping[str, int] | Callable[[Word], int] | None = None, *,
           labels: Mapping[str, int] | None = None, unk: int | None = None,
           pad_id: int = 0, max_leaves: int | None = None,
           max_height: int | None = None,
           max_width: int | None = None) -> Schedule:
  """The level schedule of a batch of binary trees.

  Args:
    trees: `Tree`s (or nested pairs of words, see `Tree.from_nested`).
    vocab: word -> id mapping or function; None: words must be integers.
    labels: label -> id mapping; None: labels must be integers ("0".."4").
    unk: id of words missing from a vocab mapping (else they are an error).
    pad_id: token id of padded leaf slots.
    max_leaves, max_height, max_width: pad L, T, W up to these sizes (fixed
      shapes across batches, so `run` compiles once); a larger batch is an
      error naming the tree.
  """
  if not len(trees):
    raise ValueError("encode: no trees")
  numbered = [_number(t, b) for b, t in enumerate(trees)]
  B = len(numbered)
  n_leaves = [len(t.leaves) for t in numbered]
  # The last internal node is the root, the only one of maximal height.
  heights = [t.height[id(t.internal[-1])] if t.internal else 0
             for t in numbered]
  L = _padded("max_leaves", n_leaves, max_leaves)
  N = 2 * L - 1
  T = _padded("max_height", heights, max_height)
  widths = np.zeros(max(T, 1), np.int64)  # nodes of each height in the batch
  for t in numbered:
    for n in t.internal:
      widths[t.height[id(n)] - 1] += 1
  if max_width is not None and widths.max() > max_width:
    raise ValueError(f"encode: the batch has {int(widths.max())} nodes of "
                     f"height {int(widths.argmax()) + 1} > the given "
                     f"max_width={max_width}")
  W = max(1, int(widths.max()) if max_width is None else max_width)

  tokens = np.full((B, L), pad_id, np.int32)
  leaf_mask = np.zeros((B, L), bool)
  node_mask = np.zeros((B, N), bool)
  label_ids = np.full((B, N), -1, np.int32)
  depth = np.full((B, N), -1, np.int32)
  node, left, right = (np.zeros((T, W), np.int32) for _ in range(3))
  level_mask = np.zeros((T, W), bool)
  fill = np.zeros(T, np.int64)  # next free slot of each level
  for b, t in enumerate(numbered):
    for i, leaf in enumerate(t.leaves):
      tokens[b, i] = _lookup("word", vocab, leaf.word, b, unk)
    leaf_mask[b, :len(t.leaves)] = True
    for n in t.leaves + t.internal:
      i = t.index[id(n)]
      node_mask[b, i] = True
      depth[b, i] = t.depth[id(n)]
      if n.label is not None:
        label_ids[b, i] = _lookup("label", labels, n.label, b)
        if label_ids[b, i] < 0:  # -1 marks "no label"
          raise ValueError(f"encode: tree {b}: label {n.label!r} maps to "
                           f"{label_ids[b, i]}; label ids must be >= 0")
    for n in t.internal:  # by height, then position: flat indices ascend
      h = t.height[id(n)] - 1
      j = fill[h]
      fill[h] += 1
      node[h, j] = b * N + t.index[id(n)]
      left[h, j] = b * N + t.index[id(n.children[0])]
      right[h, j] = b * N + t.index[id(n.children[1])]
      level_mask[h, j] = True
  # Padding slots write past the end (dropped by the scatter), each to its
  # own index so the scatter's indices stay unique and sorted.
  pad = B * N + np.arange(W, dtype=np.int32)
  node = np.where(level_mask, node, pad[None, :]).astype(np.int32)
  root = np.asarray([2 * n - 2 for n in n_leaves], np.int32)
  return Schedule(tokens, leaf_mask, node_mask, label_ids, depth, root,
                  np.asarray(heights, np.int32), node, left, right, level_mask)


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
    remat: rematerialise each level in the backward pass.

  Returns:
    states: the cell's node state (h, and c for tree_lstm), each [B, N, H],
      in the node numbering of this module; padded slots are zero.
    roots: the root states, each [B, H].
  """
  B, L = schedule.tokens.shape
  N = schedule.node_mask.shape[1]
  if leaf_inputs.ndim != 3 or leaf_inputs.shape[:2] != (B, L):
    raise ValueError(
        f"run: leaf_inputs must be [B, L, D] = [{B}, {L}, D] like "
        f"schedule.tokens; got shape {tuple(leaf_inputs.shape)}")
  leaf_mask = jnp.asarray(schedule.leaf_mask)[..., None]

  def slots(a):  # [B, L, H] leaf states -> [B * N, H] slots, zero elsewhere
    a = jnp.where(leaf_mask, a, jnp.zeros_like(a))
    return jnp.pad(a, ((0, 0), (0, N - L), (0, 0))).reshape(B * N, -1)

  states = jax.tree_util.tree_map(slots, cell.leaf(params, leaf_inputs))

  def level(states, idx):  # every node of one height: gather, compose, scatter
    node, left, right = idx

    def gather(i):
      return jax.tree_util.tree_map(
          lambda a: a.at[i].get(mode="promise_in_bounds"), states)

    parents = cell.compose(params, gather(left), gather(right))
    states = jax.tree_util.tree_map(
        lambda a, p: a.at[node].set(p, mode="drop", indices_are_sorted=True,
                                    unique_indices=True), states, parents)
    return states, None

  if remat:
    level = jax.checkpoint(level, prevent_cse=False)
  levels = (schedule.node, schedule.left, schedule.right)
  states, _ = jax.lax.scan(level, states, jax.tree_util.tree_map(
      jnp.asarray, levels))
  states = jax.tree_util.tree_map(lambda a: a.reshape(B, N, -1), states)
  root = jnp.asarray(schedule.root)[:, None, None]
  roots = jax.tree_util.tree_map(
      lambda a: jnp.take_along_axis(a, root, axis=1)[:, 0], states)
  return states, roots


__all__ = ["Schedule", "Tree", "TreeParseError", "encode", "parse",
           "read_trees", "run"]
