"""sorjax.trees: bracketed parsing, level schedules, height-scheduled `run`."""

import functools
import gzip
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax import trees
from sorjax.trees import Tree, TreeParseError


def key(seed):
  """PRNG keys of the "rbg" implementation: on CPU their random ops compile
  several times faster than threefry's, which dominates these tests."""
  return jax.random.key(seed, impl="rbg")


SST = "(3 (2 It) (4 (2 's) (3 good)))"


# ---------------------------------------------------------------- helpers

def random_tree(rng, words, labeled=True):
  """A uniformly random split at every node: trees of every shape."""
  label = str(rng.integers(5)) if labeled else None
  if len(words) == 1:
    return Tree(label, word=words[0])
  k = int(rng.integers(1, len(words)))
  return Tree(label, (random_tree(rng, words[:k], labeled),
                      random_tree(rng, words[k:], labeled)))


def chain(words):
  """Left-branching (((a b) c) d): height = leaves - 1."""
  t = Tree(word=words[0])
  for w in words[1:]:
    t = Tree(children=(t, Tree(word=w)))
  return t


def balanced(words):
  if len(words) == 1:
    return Tree(word=words[0])
  k = len(words) // 2
  return Tree(children=(balanced(words[:k]), balanced(words[k:])))


RUN = jax.jit(trees.run, static_argnums=0, static_argnames="remat")


def reference_states(cell, params, x, tree):
  """Recursive Python evaluation of one tree, node by node, in the
  documented numbering: sort by (height, leftmost leaf), leaves having
  height 0 and coming first left to right. leaf and compose are jitted for
  [H] vectors, so the node-by-node loop compiles nothing per node."""
  entries, count = [], [0]
  leaf, compose = _jitted(cell)

  def visit(t):
    if t.is_leaf:
      i = count[0]
      count[0] += 1
      s = leaf(params, x[i])
      entries.append(((0, i), s))
      return s, 0, i
    (sl, hl, fl), (sr, hr, _) = visit(t.children[0]), visit(t.children[1])
    s = compose(params, sl, sr)
    entries.append(((1 + max(hl, hr), fl), s))
    return s, 1 + max(hl, hr), fl

  visit(tree)
  entries.sort(key=lambda e: e[0])
  return [s for _, s in entries]


_JITTED = {}


def _jitted(cell):
  if cell not in _JITTED:
    _JITTED[cell] = jax.jit(cell.leaf), jax.jit(cell.compose)
  return _JITTED[cell]


def reference_run(cell, params, x, batch, N):
  """[B, N, H] NumPy states per field from `reference_states`, zero padding."""
  x = np.asarray(x)
  out = np.zeros((len(cell.leaf(params, x[:, :1])), *x.shape[:1], N,
                  x.shape[-1]), np.float32)
  for b, t in enumerate(batch):
    for i, s in enumerate(reference_states(cell, params, x[b], t)):
      for f, a in enumerate(s):
        out[f, b, i] = a
  return list(out)


# ---------------------------------------------------------------- parse

def test_parse_sst_tree():
  t = trees.parse(SST)
  assert t.label == "3" and not t.is_leaf and t.height == 2
  assert t.leaves() == ["It", "'s", "good"]
  left, right = t.children
  assert left == Tree("2", word="It")
  assert right.label == "4"
  assert [c.label for c in right.children] == ["2", "3"]


def test_parse_unlabeled_and_whitespace():
  t = trees.parse("  ((It 's)\n\t good) ", labeled=False)
  assert t == Tree(children=(Tree(children=(Tree(word="It"),
                                            Tree(word="'s"))),
                             Tree(word="good")))
  assert trees.parse("word", labeled=False) == Tree(word="word")
  assert trees.parse("( 3 ( 2 It )(3 good))") == Tree(
      "3", (Tree("2", word="It"), Tree("3", word="good")))


@pytest.mark.parametrize("labeled", [True, False])
def test_round_trip(labeled):
  rng = np.random.default_rng(0)
  for n in range(1, 12):
    t = random_tree(rng, [f"w{i}" for i in range(n)], labeled)
    s = str(t)
    assert trees.parse(s, labeled=labeled) == t
    assert str(trees.parse(s, labeled=labeled)) == s
  assert str(trees.parse(SST)) == SST


BAD = [
    # text, labeled, message, column
    ("", True, "empty tree", 1),
    ("   ", False, "empty tree", 4),
    ("(3 (2 It) (4 (2 's) (3 good))", True, "unclosed '\\(' opened at "
     "column 1", 1),
    ("(3 (2 It) (4 (2 's) (3 good)", True, "unclosed '\\(' opened at "
     "column 11", 11),
    ("(3 (2 a) (2 b)))", True, "unmatched '\\)'", 16),
    (")", True, "unmatched '\\)'", 1),
    ("(3 (2 a) (2 b)) (2 c)", True, "unexpected text after the tree", 17),
    ("((a b) c) d", False, "unexpected text after the tree", 11),
    ("(3 (2 a) (2 b) (2 c))", True, "has 3 children; binary trees need 2",
     1),
    ("(a (b c d))", False, "node opened at column 4 has 3 children", 4),
    ("(3 (2 a) (4 (2 b)))", True, "has 1 child", 10),
    ("(3)", True, "empty node", 3),
    ("()", False, "empty node", 2),
    ("((2 a) (2 b))", True, "expected a label after '\\('", 2),
    ("(", True, "expected a label after '\\('", 2),
    ("(2 a b)", True, "one word; found a second", 6),
    ("(2 a (2 b))", True, "a labeled leaf holds one word, not a subtree", 6),
    ("(2 (2 a) b)", True, "either one word or subtrees", 10),
    ("word", True, "expected '\\('", 1),
]


@pytest.mark.parametrize("text,labeled,message,column", BAD)
def test_parse_errors_name_source_and_column(text, labeled, message, column):
  with pytest.raises(TreeParseError, match=message) as e:
    trees.parse(text, labeled=labeled, source="train.txt:12")
  assert e.value.column == column
  assert e.value.source == "train.txt:12"
  assert str(e.value).startswith(f"train.txt:12: column {column}: ")
  assert isinstance(e.value, ValueError)


def test_binarize_only_when_asked():
  text = "(3 (2 a) (1 b) (0 c) (4 d))"
  with pytest.raises(TreeParseError, match="4 children"):
    trees.parse(text)
  a, b, c, d = (Tree(l, word=w) for l, w in
                (("2", "a"), ("1", "b"), ("0", "c"), ("4", "d")))
  assert trees.parse(text, binarize="right") == Tree(
      "3", (a, Tree(None, (b, Tree(None, (c, d))))))
  assert trees.parse(text, binarize="left") == Tree(
      "3", (Tree(None, (Tree(None, (a, b)), c)), d))
  # five children: the words stay in order either way
  five = "(3 (2 a) (1 b) (0 c) (4 d) (2 e))"
  e = Tree("2", word="e")
  assert trees.parse(five, binarize="right") == Tree(
      "3", (a, Tree(None, (b, Tree(None, (c, Tree(None, (d, e))))))))
  assert trees.parse(five, binarize="left") == Tree(
      "3", (Tree(None, (Tree(None, (Tree(None, (a, b)), c)), d)), e))
  # A unary node collapses onto its child, keeping the outer label.
  assert trees.parse("(3 (1 (2 a)) (2 b))", binarize="right") == Tree(
      "3", (Tree("1", word="a"), Tree("2", word="b")))
  assert trees.parse("((a) b)", labeled=False, binarize="left") == Tree(
      None, (Tree(word="a"), Tree(word="b")))
  with pytest.raises(ValueError, match="binarize must be"):
    trees.parse(SST, binarize="yes")


def test_read_trees_names_file_and_line(tmp_path):
  good = tmp_path / "trees.txt"
  good.write_text(f"{SST}\n\n(1 (2 a) (0 b))\n")
  got = trees.read_trees(str(good))
  assert [str(t) for t in got] == [SST, "(1 (2 a) (0 b))"]
  zipped = tmp_path / "trees.txt.gz"
  with gzip.open(zipped, "wt") as f:
    f.write(f"{SST}\n")
  assert trees.read_trees(str(zipped)) == got[:1]
  bad = tmp_path / "bad.txt"
  bad.write_text(f"{SST}\n{SST}\n(1 (2 a) (0 b)\n")
  with pytest.raises(TreeParseError,
                     match=f"{bad}:3: column 1: unclosed") as e:
    trees.read_trees(str(bad))
  assert e.value.source == f"{bad}:3"


def test_sst_dev_counts(shared_data):
  """Counts stated in shared/data/SOURCES.md for the official dev split."""
  dev = trees.read_trees(os.path.join(shared_data, "sst", "dev.txt"))
  assert len(dev) == 1101
  leaves = sum(len(t.leaves()) for t in dev)
  assert leaves == 21274
  assert leaves - len(dev) == 20173           # internal nodes, all binary
  schedule = trees.encode(dev[:64], lambda w: 0)
  labels = schedule.labels[schedule.node_mask]
  assert labels.min() >= 0 and labels.max() <= 4  # a 0-4 label on every node


def test_a_no_break_space_stays_inside_a_word():
  """SST's train split has U+00A0 inside three words; only ASCII blanks
  separate words (the SST builder reads them so too)."""
  t = trees.parse("(3 (2 8\u00a01\\/2) (2 b))")
  assert t.leaves() == ["8\u00a01\\/2", "b"]


def test_sst_train_parses_whole(shared_data):
  """Its lines 4342, 5799 and 7409 hold a word with U+00A0."""
  train = trees.read_trees(os.path.join(shared_data, "sst", "train.txt"))
  assert len(train) == 8544
  # SOURCES.md's 163,566 tokens split at every blank, U+00A0 too
  assert sum(len(t.leaves()) for t in train) == 163566 - 3
  assert "8\u00a01\\/2" in train[4341].leaves()


def test_tree_validation_and_from_nested():
  with pytest.raises(ValueError, match="either a word .* or children"):
    Tree("1", (Tree(word="a"),), word="b")
  with pytest.raises(ValueError, match="either a word"):
    Tree("1")
  assert Tree.from_nested(((1, 2), 3)) == Tree(children=(
      Tree(children=(Tree(word=1), Tree(word=2))), Tree(word=3)))
  with pytest.raises(ValueError, match="a pair, got 3"):
    Tree.from_nested((1, 2, 3))
  with pytest.raises(ValueError, match="str or int word"):
    Tree.from_nested((1, 2.5))
  # Deep trees do not hit Python's recursion limit.
  deep = chain(list(range(3000)))
  assert deep.height == 2999 and len(str(deep)) > 3000


# ---------------------------------------------------------------- encode

def test_encode_hand_computed():
  vocab = {w: i for i, w in enumerate("It 's good a b c d e".split())}
  batch = [trees.parse(SST),
           trees.parse("((a b) (c (d e)))", labeled=False),
           Tree("1", word="a")]
  s = trees.encode(batch, vocab, pad_id=9, schedule="level")
  # L = 5 leaves, N = 9 slots; T = 3 levels; widths 3, 2, 1 -> W = 3.
  np.testing.assert_array_equal(
      s.tokens, [[0, 1, 2, 9, 9], [3, 4, 5, 6, 7], [3, 9, 9, 9, 9]])
  np.testing.assert_array_equal(s.leaf_mask.sum(1), [3, 5, 1])
  np.testing.assert_array_equal(s.node_mask.sum(1), [5, 9, 1])
  # SST tree: It 's good, ('s good), root; labels as written.
  np.testing.assert_array_equal(s.labels[0], [2, 2, 3, 4, 3, -1, -1, -1, -1])
  np.testing.assert_array_equal(s.labels[1], [-1] * 9)
  np.testing.assert_array_equal(s.labels[2], [1] + [-1] * 8)
  np.testing.assert_array_equal(s.depth[0], [1, 2, 2, 1, 0, -1, -1, -1, -1])
  np.testing.assert_array_equal(s.depth[1], [2, 2, 2, 3, 3, 1, 2, 1, 0])
  np.testing.assert_array_equal(s.root, [4, 8, 0])
  np.testing.assert_array_equal(s.height, [2, 3, 0])
  # Tree 1 (offset 9): (a b) = 14, (d e) = 15, (c (d e)) = 16, root = 17.
  np.testing.assert_array_equal(s.node, [[3, 14, 15], [4, 16, 29],
                                         [17, 28, 29]])
  np.testing.assert_array_equal(s.left, [[1, 9, 12], [0, 11, 0],
                                         [14, 0, 0]])
  np.testing.assert_array_equal(s.right, [[2, 10, 13], [3, 15, 0],
                                          [16, 0, 0]])
  np.testing.assert_array_equal(s.step_mask, [[1, 1, 1], [1, 1, 0],
                                               [1, 0, 0]])
  assert s.tokens.dtype == s.node.dtype == np.int32


def test_encode_chunked_hand_computed():
  """Hu's schedule: deepest ready node first, then the lowest flat index."""
  vocab = {w: i for i, w in enumerate("It 's good a b c d e".split())}
  batch = [trees.parse(SST),
           trees.parse("((a b) (c (d e)))", labeled=False),
           Tree("1", word="a")]
  # Internal nodes (flat index: depth): tree 0 ('s good) 3: 1, root 4: 0;
  # tree 1 (a b) 14: 1, (d e) 15: 2, (c (d e)) 16: 1, root 17: 0.
  # Default width: 6 internal nodes / height 3 = 2.
  s = trees.encode(batch, vocab, pad_id=9)
  np.testing.assert_array_equal(s.node, [[3, 15], [14, 16], [4, 17]])
  np.testing.assert_array_equal(s.left, [[1, 12], [9, 11], [0, 14]])
  np.testing.assert_array_equal(s.right, [[2, 13], [10, 15], [3, 16]])
  assert s.step_mask.all()
  s1 = trees.encode(batch, vocab, width=1)
  np.testing.assert_array_equal(s1.node[:, 0], [15, 3, 14, 16, 4, 17])
  # Everything but the schedule is the level schedule's.
  level = trees.encode(batch, vocab, pad_id=9, schedule="level")
  for f in ("tokens", "leaf_mask", "node_mask", "labels", "depth", "root",
            "height"):
    np.testing.assert_array_equal(getattr(s, f), getattr(level, f))


def test_chunked_is_the_level_schedule_when_wide_enough():
  """Width >= the widest level: every ready node runs at once (ASAP), which
  is the level schedule."""
  rng = np.random.default_rng(7)
  batch = [random_tree(rng, list(range(n)), labeled=False)
           for n in rng.integers(1, 12, size=6)]
  level = trees.encode(batch, schedule="level")
  chunked = trees.encode(batch, width=level.node.shape[1])
  for a, b in zip(level, chunked):
    np.testing.assert_array_equal(a, b)


def _optimal_steps(parent, width):
  """Fewest steps of any schedule of `width` slots: breadth-first search
  over the sets of done tasks, trying every subset of the ready ones."""
  import itertools
  M = len(parent)
  kids = [[j for j in range(M) if parent[j] == k] for k in range(M)]
  frontier, seen, steps = {frozenset()}, set(), 0
  while True:
    if frozenset(range(M)) in frontier:
      return steps
    nxt = set()
    for done in frontier:
      ready = [k for k in range(M) if k not in done
               and all(c in done for c in kids[k])]
      for r in range(1, min(width, len(ready)) + 1):
        for pick in itertools.combinations(ready, r):
          d = done | frozenset(pick)
          if d not in seen:
            seen.add(d)
            nxt.add(d)
    frontier, steps = nxt, steps + 1


@pytest.mark.parametrize("seed", range(6))
def test_hu_steps_are_valid_and_optimal(seed):
  rng = np.random.default_rng(seed)
  batch = [random_tree(rng, list(range(n)), labeled=False)
           for n in rng.integers(2, 6, size=3)]     # <= 12 internal nodes
  arrays = [trees.tree_arrays(t) for t in batch]
  # The forest of internal nodes: parents and depths, numbered per tree.
  parent, depth, base = [], [], 0
  for a in arrays:
    L = len(a.tokens)
    up = {int(c): L + k for k, pair in enumerate(zip(a.left, a.right))
          for c in pair}
    parent += [base + up[L + k] - L if L + k in up else -1
               for k in range(L - 1)]
    depth += list(a.depth[L:])
    base += L - 1
  parent, depth = np.asarray(parent), np.asarray(depth)
  for width in (1, 2, 3):
    step = trees.hu_steps(parent, depth, width)
    child = parent >= 0
    assert np.all(step[child] < step[parent[child]])       # children first
    assert np.bincount(step).max() <= width
    assert step.max() + 1 == _optimal_steps(list(parent), width)


def test_hu_steps_rejects_bad_inputs():
  with pytest.raises(ValueError, match="width must be an int >= 1, got 0"):
    trees.hu_steps(np.array([-1]), np.array([0]), 0)
  with pytest.raises(ValueError, match=r"depth must be \[2\] like parent"):
    trees.hu_steps(np.array([1, -1]), np.array([0]), 1)
  with pytest.raises(ValueError, match=r"tasks \[0, 1\] wait on a cycle"):
    trees.hu_steps(np.array([1, 0, -1]), np.array([1, 1, 0]), 2)


def test_tree_arrays_are_what_encode_batches():
  rng = np.random.default_rng(2)
  batch = [random_tree(rng, list(range(n))) for n in (4, 1, 6)]
  arrays = [trees.tree_arrays(t) for t in batch]
  a = arrays[2]
  assert len(a.tokens) == 6 and len(a.labels) == len(a.depth) == 11
  assert a.height[-1] == batch[2].height and a.depth[-1] == 0
  for schedule in trees.SCHEDULES:
    for x, y in zip(trees.encode(batch, schedule=schedule, width=3),
                    trees.encode(arrays, schedule=schedule, width=3)):
      np.testing.assert_array_equal(x, y)
  with pytest.raises(ValueError, match="tree_arrays: tree: word 'x' is not "
                     "an integer"):
    trees.tree_arrays(Tree(word="x"))


@pytest.mark.parametrize("field, value, match", [
    ("left", [0], r"left must be 2 integers for 3 leaves"),
    ("left", [-1, 3], r"left\[0\] = -1: node 3's children must be numbered "
     r"0..2"),
    ("left", [4, 3], r"left\[0\] = 4: node 3's"),       # a cycle 3 <-> 4
    ("left", [0, 7], r"left\[1\] = 7: node 4's children must be numbered "
     r"0..3"),
    ("right", [1, 0], r"node 0 is the child of 2 nodes"),
    ("height", [0, 0, 0, 1, 1], r"height \[0, 0, 0, 1, 1\] disagrees"),
    ("depth", [2, 2, 1, 1, 1], r"depth \[2, 2, 1, 1, 1\] disagrees"),
    ("tokens", [1, -2, 3], r"tokens must be >= 0"),
    ("labels", [0.5] * 5, r"labels must be 5 integers"),
])
def test_encode_checks_given_tree_arrays(field, value, match):
  """TreeArrays that tree_arrays would not make used to be composed into a
  root (a child left out, a negative one read from the end, a cycle under
  the level schedule) or fail as numpy's IndexError."""
  a = trees.tree_arrays(((1, 2), 3))        # left [0, 3], right [1, 2]
  bad = a._replace(**{field: np.asarray(value)})
  for schedule in trees.SCHEDULES:
    with pytest.raises(ValueError, match="encode: tree 1: " + match):
      trees.encode([a, bad], schedule=schedule)
  trees.encode([a, a])
  if field == "height":  # unchecked: the caller vouches for its arrays
    trees.encode([a, bad], check_arrays=False)


def test_encode_pads_to_fixed_sizes_and_reports_overflow():
  batch = [Tree.from_nested(((1, 2), 3)), Tree.from_nested((4, 5))]
  for schedule in trees.SCHEDULES:
    s = trees.encode(batch, schedule=schedule, max_leaves=6, max_steps=4,
                     width=5)
    assert s.tokens.shape == (2, 6) and s.node_mask.shape == (2, 11)
    assert s.node.shape == s.left.shape == s.step_mask.shape == (4, 5)
    assert s.step_mask.sum() == 3
    # Padding slots write past the B * N = 22 slots, each to its own index.
    np.testing.assert_array_equal(s.node[3], 22 + np.arange(5))
  with pytest.raises(trees.ScheduleError, match="tree 0 needs max_leaves=3 > "
                     "the given max_leaves=2"):
    trees.encode(batch, max_leaves=2)
  for schedule in trees.SCHEDULES:
    with pytest.raises(trees.ScheduleError, match=r"tree 0 needs max_steps=2 "
                       r"\(its height\) > the given max_steps=1"):
      trees.encode(batch, schedule=schedule, max_steps=1)
  with pytest.raises(trees.ScheduleError, match="2 nodes of height 1 > the "
                     "given width=1"):
    trees.encode(batch, schedule="level", width=1)
  # Chunked: width 1 runs (1 2), then the two roots one after the other.
  assert trees.encode(batch, width=1).node.shape == (3, 1)
  with pytest.raises(trees.ScheduleError, match="the batch needs 3 steps at "
                     "width=1 > the given max_steps=2; raise width or "
                     "max_steps"):
    trees.encode(batch, width=1, max_steps=2)
  with pytest.raises(ValueError, match="schedule must be one of"):
    trees.encode(batch, schedule="levels")
  for name in ("width", "max_leaves", "max_steps"):
    with pytest.raises(ValueError, match=f"{name} must be None or an int >= 1"):
      trees.encode(batch, **{name: 0})
  for bad in (-1, 1.5, True):
    with pytest.raises(ValueError, match=r"encode: pad_id \(a token id: "
                       r"padded leaf slots are embedded too\) must be an int "
                       r">= 0"):
      trees.encode(batch, pad_id=bad)


def test_encode_errors_name_tree_and_item():
  batch = [trees.parse(SST), trees.parse("(1 (2 new) (0 words))")]
  vocab = {"It": 1, "'s": 2, "good": 3}
  with pytest.raises(ValueError, match="tree 1: word 'new' is not in the vocab"):
    trees.encode(batch, vocab)
  s = trees.encode(batch, vocab, unk=0)
  np.testing.assert_array_equal(s.tokens, [[1, 2, 3], [0, 0, 0]])
  with pytest.raises(ValueError, match="tree 0: word 'It' is not an integer"):
    trees.encode(batch)
  pos = trees.parse("(pos (neg a) (pos b))")
  with pytest.raises(ValueError, match="tree 0: label 'neg' is not an integer"):
    trees.encode([pos], vocab, unk=0)
  s = trees.encode([pos], vocab, unk=0, labels={"neg": 0, "pos": 1})
  np.testing.assert_array_equal(s.labels, [[0, 1, 1]])
  with pytest.raises(ValueError, match="tree 0: label '-1' maps to -1; label "
                     "ids must be >= 0"):
    trees.encode([trees.parse("(1 (-1 a) (1 b))")], vocab, unk=0)
  with pytest.raises(ValueError, match=r"tree 0: word -1 has a negative id "
                     r"\(-1\)"):
    trees.encode([(-1, 2)])
  # ... from a mapping, a function or unk too (it would index the
  # embedding table from its end)
  for kw in (dict(vocab={"a": -1, "b": 2}), dict(vocab=lambda w: -3),
             dict(vocab={"b": 2}, unk=-1)):
    with pytest.raises(ValueError, match=r"tree 0: word 'a' has a negative "
                       r"id"):
      trees.encode([("a", "b")], **kw)
  with pytest.raises(ValueError, match="word 1.7 is not an integer"):
    trees.encode([Tree(children=(Tree(word=1.7), Tree(word=2)))])
  flat = Tree(children=(Tree(word=1), Tree(word=2), Tree(word=3)))
  with pytest.raises(ValueError, match="tree 1 has a node with 3 children"):
    trees.encode([Tree(word=1), flat])
  with pytest.raises(ValueError, match="no trees"):
    trees.encode([])


# ---------------------------------------------------------------- run

def _setup(name, batch, H=4, dtype=jnp.float32, **pad):
  cell = sorjax.cells.make(name, hidden_size=H)
  s = trees.encode(batch, **pad)

  @jax.jit
  def make(prng):  # one compilation instead of one per op
    k_p, k_x = jax.random.split(prng)
    params = cell.init(k_p, H, dtype)
    params = {k: v + 0.1 * jnp.ones_like(v) if k.startswith("b") else v
              for k, v in params.items()}   # non-zero biases
    return params, jax.random.normal(k_x, s.tokens.shape + (H,), dtype)

  params, x = make(key(0))
  return cell, params, s, x


# Both schedules padded past the batch's sizes (L = 8 > 7 leaves; level: 7
# steps > the largest height 4; chunked: 3 slots a step, 14 nodes in 5 steps
# of 7, one padding slot).
PADS = {"level": dict(schedule="level", max_leaves=8, max_steps=7),
        "chunked": dict(width=3, max_leaves=8, max_steps=7)}


def _random_batch(seed=0):
  """Trees of 1 to 7 leaves and random shapes."""
  rng = np.random.default_rng(seed)
  return [random_tree(rng, list(range(n)), labeled=False)
          for n in (1, 7, 3, 6, 2)]


@pytest.fixture(scope="module", params=[
    ("tree_rnn", "level"), ("tree_rnn", "chunked"), ("tree_lstm", "level"),
    ("tree_lstm", "chunked")], ids="-".join)
def setup(request):
  name, schedule = request.param
  batch = _random_batch()
  return (batch, *_setup(name, batch, **PADS[schedule]))


def test_run_equals_recursive_reference(setup):
  batch, cell, params, s, x = setup
  N = s.node_mask.shape[1]
  states, roots = RUN(cell, params, x, s)
  ref = reference_run(cell, params, x, batch, N)
  for got, want in zip(states, ref):   # padded slots are zero in both
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  for b, t in enumerate(batch):
    for got, want in zip(roots, ref):
      np.testing.assert_allclose(got[b], want[b, 2 * len(t.leaves()) - 2],
                                 rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(roots.h[0], x[0, 0])  # a lone leaf is its root
  if len(roots) == 2:
    np.testing.assert_array_equal(roots.c[0], np.zeros(4))


def test_run_gradients_equal_recursive_reference():
  """Gradients w.r.t. params and leaf inputs: both schedules, and the
  default (chunked) also with remat. The recursion is cell-agnostic;
  tree_lstm's two-field state is the harder case. The reference is computed
  once: the node states do not depend on the schedule."""
  batch = _random_batch()
  cell, params, s, x = _setup("tree_lstm", batch, **PADS["level"])
  weights = jax.random.normal(key(2), s.node_mask.shape + (4,))
  term = jax.jit(lambda w, s: sum(jnp.sum(w * a) for a in s))
  square = jax.jit(lambda s: jnp.sum(s.h ** 2))

  def loss_ref(params, x):  # the loss below, one node at a time
    total = 0.0
    for b, t in enumerate(batch):
      nodes = reference_states(cell, params, x[b], t)
      total += sum(term(weights[b, i], n) for i, n in enumerate(nodes))
      total += square(nodes[-1])
    return total

  g_ref = jax.grad(loss_ref, argnums=(0, 1))(params, x)

  @functools.partial(jax.jit, static_argnums=(3,))
  def grad(params, x, s, remat):
    def loss_run(params, x):
      states, roots = trees.run(cell, params, x, s, remat=remat)
      return sum(jnp.sum(weights * a) for a in states) + jnp.sum(roots.h ** 2)
    return jax.grad(loss_run, argnums=(0, 1))(params, x)

  for name, pad in PADS.items():
    s = trees.encode(batch, **pad)
    for remat in (False, True) if name == "chunked" else (False,):
      g_run = grad(params, x, s, remat)
      jax.tree_util.tree_map(
          lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
          g_run, g_ref)
    # Padded leaf slots get no gradient; every real leaf gets some.
    assert not np.any(np.asarray(g_run[1])[~s.leaf_mask])
    assert np.all(np.any(np.asarray(g_run[1]) != 0, -1)[s.leaf_mask])


def _scan_lengths(fn, *args):
  return [e.params["length"] for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns
          if e.primitive.name == "scan"]


def test_sequential_steps_are_the_schedule_length():
  H = 3
  cell = sorjax.cells.make("tree_rnn", hidden_size=H)
  params = jax.eval_shape(lambda k: cell.init(k, H), key(0))
  two = [balanced(list(range(16)))] * 2   # 30 internal nodes, height 4
  # Level: the largest height (a 6-leaf chain has height 5). Chunked: two
  # 16-leaf trees at width 16 take their height, 4 steps; at width 8 the 16
  # nodes of height 1 take two steps, then 8, 4, 2 nodes: 5 steps.
  for batch, kw, steps in (
      (two, dict(schedule="level"), 4),
      ([two[0], chain(list(range(6)))], dict(schedule="level"), 5),
      ([Tree(word=1), Tree(word=2)], dict(schedule="level"), 0),
      (two, dict(width=16), 4),
      (two, dict(width=8), 5),
      (two, {}, 5)):                    # default width: 30 / 4 -> 8
    s = trees.encode(batch, **kw)
    x = jax.ShapeDtypeStruct(s.tokens.shape + (H,), jnp.float32)
    assert s.node.shape[0] == steps
    fn = lambda params, x: trees.run(cell, params, x, s)
    assert _scan_lengths(fn, params, x) == [steps]
    # ... also in the backward pass.
    g = jax.grad(lambda p, x: jnp.sum(fn(p, x)[1].h))
    assert set(_scan_lengths(g, params, x)) == {steps}


def test_chunks_pad_less_than_levels():
  """The point of chunking: 32 trees of 10-40 leaves (the benchmark's
  forest) in fewer slots than levels padded to the widest one, in at most a
  few more steps than the largest height."""
  rng = np.random.default_rng(0)
  batch = [random_tree(rng, list(range(n)), labeled=False)
           for n in rng.integers(10, 41, size=32)]
  level, chunked = (trees.encode(batch, schedule=k) for k in ("level",
                                                                "chunked"))
  nodes = sum(len(t.leaves()) - 1 for t in batch)
  assert level.step_mask.sum() == chunked.step_mask.sum() == nodes
  assert chunked.node.size < 0.5 * level.node.size
  assert chunked.node.shape[0] <= level.node.shape[0] + 3


def test_jit_compiles_once_for_padded_batches():
  traces = []
  cell = sorjax.cells.make("tree_rnn", hidden_size=2)
  params = {"W": jnp.ones((4, 2)), "b": jnp.zeros(2)}

  @jax.jit
  def roots(params, x, s):
    traces.append(1)
    return trees.run(cell, params, x, s)[1].h

  rng = np.random.default_rng(3)
  for _ in range(3):
    batch = [random_tree(rng, list(range(n)), labeled=False)
             for n in rng.integers(1, 6, size=3)]
    s = trees.encode(batch, max_leaves=5, max_steps=4, width=6)
    roots(params, jnp.ones(s.tokens.shape + (2,)), s)
  assert len(traces) == 1


def test_vmap_over_batches_and_params():
  rng = np.random.default_rng(4)
  pad = dict(max_leaves=6, max_steps=5, width=6)
  batches = [[random_tree(rng, list(range(n)), labeled=False)
              for n in sizes] for sizes in ((6, 2), (3, 5))]
  cell = sorjax.cells.make("tree_rnn", hidden_size=4)
  rng_p = np.random.default_rng(5)
  params = {"W": jnp.asarray(rng_p.normal(size=(8, 4)), jnp.float32),
            "b": jnp.asarray(rng_p.normal(size=4), jnp.float32)}
  ss = [trees.encode(b, **pad) for b in batches]
  xs = jax.random.normal(key(5), (2, 2, 6, 4))
  stacked = jax.tree_util.tree_map(lambda *a: np.stack(a), *ss)
  run = lambda p, x, s: RUN(cell, p, x, s)[0].h
  both = jax.jit(jax.vmap(run, in_axes=(None, 0, 0)))(params, xs, stacked)
  for k in range(2):
    np.testing.assert_allclose(both[k], run(params, xs[k], ss[k]),
                               rtol=1e-5, atol=1e-6)
  ensemble = jax.tree_util.tree_map(lambda a: jnp.stack([a, 2 * a]), params)
  two = jax.jit(jax.vmap(run, in_axes=(0, None, None)))(ensemble, xs[0], ss[0])
  for k in range(2):
    p = jax.tree_util.tree_map(lambda a: a[k], ensemble)
    np.testing.assert_allclose(two[k], run(p, xs[0], ss[0]), rtol=1e-5,
                               atol=1e-6)


def test_run_rejects_misshapen_leaf_inputs(setup):
  _, cell, params, s, x = setup
  with pytest.raises(ValueError, match=r"leaf_inputs must be \[B, L, D\] = "
                     r"\[5, 8, D\].*\(5, 6, 4\)"):
    trees.run(cell, params, x[:, :6], s)
  with pytest.raises(ValueError, match="word vectors of size hidden_size=4"):
    trees.run(cell, params, jnp.zeros(x.shape[:2] + (3,)), s)


def test_run_names_params_init_would_not_make(setup):
  _, cell, params, s, x = setup
  name, first = sorjax.cells.name_of(cell), sorted(params)[0]
  with pytest.raises(ValueError, match=rf"run: {name}: params lack "
                     rf"\['{first}'\] \(as {type(cell).__name__}.init makes "
                     r"them for input size 4: "):
    trees.run(cell, {k: v for k, v in params.items() if k != first}, x, s)
  shape = params[first].shape
  with pytest.raises(ValueError, match=rf"run: {name}: params\['{first}'\] "
                     rf"must have shape {re.escape(str(shape))} .*, got "
                     r"\(3, 3\)"):
    trees.run(cell, {**params, first: jnp.zeros((3, 3))}, x, s)


def test_run_refuses_other_cells_inputs_and_flags(setup):
  _, cell, params, s, x = setup
  with pytest.raises(ValueError, match="run: leaf_inputs must be floating "
                     "vectors, got int32"):   # states were rounded to ints
    trees.run(cell, params, x.astype(jnp.int32), s)
  with pytest.raises(ValueError, match="leaf_inputs are float32 but the params "
                     "bfloat16"):
    trees.run(cell, jax.tree_util.tree_map(
        lambda a: a.astype(jnp.bfloat16), params), x, s)
  with pytest.raises(ValueError, match="run: remat must be True or False"):
    trees.run(cell, params, x, s, remat="dots")
  lstm = sorjax.cells.make("lstm", hidden_size=4)
  with pytest.raises(ValueError, match="run: lstm is not a tree cell"):
    trees.run(lstm, params, x, s)
  with pytest.raises(ValueError, match=f"unroll: {sorjax.cells.name_of(cell)}"
                     " is not a sequence cell"):
    sorjax.unroll(cell, params, x)
