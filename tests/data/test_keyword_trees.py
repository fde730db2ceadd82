"""Keyword trees (Le & Zuidema 3) against enumeration of binary trees, the
task's rules, and an exact count of leaf depths over all trees."""

import collections
import functools
import math

import numpy as np
import pytest
from scipy import stats

from sorjax.data import keyword_trees as kt


def all_shapes(lo, hi):
  """Every full binary tree over leaves lo..hi-1 in order."""
  if hi - lo == 1:
    return [lo]
  return [(a, b) for s in range(lo + 1, hi)
          for a in all_shapes(lo, s) for b in all_shapes(s, hi)]


def depth_of_leaf(tree, index):
  """Naive recursion: depth of the index-th leaf from the left."""
  def walk(node, d):
    if isinstance(node, tuple):
      return walk(node[0], d + 1) + walk(node[1], d + 1)
    return [d]
  return walk(tree, 0)[index]


@functools.lru_cache(maxsize=None)
def depth_counts(n):
  """{depth: number of (tree, leaf) pairs} over all trees with n leaves."""
  if n == 1:
    return {0: 1}
  out = collections.Counter()
  for a in range(1, n):
    b = n - a
    for side, other in ((a, b), (b, a)):
      for d, c in depth_counts(side).items():
        out[d + 1] += c * math.comb(2 * other - 2, other - 1) // other
  return dict(out)


# ---------------------------------------------------------------- trees

@pytest.mark.parametrize("n", [4, 5])
def test_random_shape_is_uniform_over_shapes(n):
  shapes = all_shapes(0, n)
  assert len(shapes) == math.comb(2 * n - 2, n - 1) // n   # Catalan(n-1)
  rng = np.random.default_rng(0)
  counts = collections.Counter(kt.random_shape(n, rng) for _ in range(4000))
  assert set(counts) <= set(shapes)
  obs = [counts[s] for s in shapes]
  assert stats.chisquare(obs).pvalue > 1e-3


def test_random_shape_leaves_in_order():
  rng = np.random.default_rng(1)
  for n in (1, 2, 7, 40):
    assert kt.leaves(kt.random_shape(n, rng)) == list(range(n))


def test_strings_and_depths_hand_case():
  tree = ((1, 2), (3, (4, 5)))
  assert kt.to_string(tree) == "((1 2) (3 (4 5)))"
  assert kt.from_string("((1 2) (3 (4 5)))") == tree
  assert kt.from_string("7") == 7
  assert kt.leaves(tree) == [1, 2, 3, 4, 5]
  assert kt.leaf_depths(tree) == [2, 2, 2, 3, 3]
  assert kt.relabel(((0, 1), 2), [9, 8, 7]) == ((9, 8), 7)


@pytest.mark.parametrize("text", ["(1 2 3)", "(1)", "(1 2", "1 2",
                                  "(1 x)"])
def test_from_string_rejects_malformed(text):
  with pytest.raises(ValueError, match="from_string"):
    kt.from_string(text)


def test_malformed_tree_values():
  with pytest.raises(ValueError, match="2-tuple"):
    kt.leaves((1, 2, 3))
  with pytest.raises(ValueError, match="int token"):
    kt.leaf_depths((1, "a"))


# ---------------------------------------------------------------- examples

def check_example(e, lo, hi):
  n = len(e.tokens)
  assert lo <= n <= hi and e.tokens.dtype == np.int32
  assert np.all((0 <= e.tokens) & (e.tokens < 10_000))
  keywords = np.flatnonzero(e.tokens < 1_000)
  assert keywords.tolist() == [e.keyword_index]          # exactly one
  assert e.label == e.tokens[e.keyword_index] // 100 == e.keyword // 100
  assert kt.leaves(e.tree) == e.tokens.tolist()
  assert e.keyword_depth == depth_of_leaf(e.tree, e.keyword_index)
  assert kt.from_string(kt.to_string(e.tree)) == e.tree


def test_sample_follows_the_task_rules():
  examples = kt.sample(300, 1, 12, seed=0)
  for e in examples:
    check_example(e, 1, 12)
  assert {len(e.tokens) for e in examples} == set(range(1, 13))
  assert {e.label for e in examples} == set(range(10))
  one = [e for e in examples if len(e.tokens) == 1][0]
  assert one.tree == one.keyword and one.keyword_depth == 0


def test_keyword_position_uniform():
  examples = kt.sample(2000, 6, 6, seed=1)
  obs = np.bincount([e.keyword_index for e in examples], minlength=6)
  assert stats.chisquare(obs).pvalue > 1e-3


def test_seeds_reproduce_and_differ():
  a, b, c = (kt.sample(20, 5, 9, seed=s) for s in (3, 3, 4))
  assert [x.tree for x in a] == [x.tree for x in b]
  assert [x.tree for x in a] != [x.tree for x in c]


def test_length_experiment():
  data = kt.length_experiment(3, seed=0, scale=0.02)
  assert {s: len(v) for s, v in data.items()} == {"train": 200, "dev": 20,
                                                  "test": 20}
  for split in data.values():
    for e in split:
      check_example(e, 21, 30)
  assert kt.SPLITS == (("train", 10_000), ("dev", 1_000), ("test", 1_000))


@pytest.mark.parametrize("i", [1, 4])
def test_depth_experiment_depths(i):
  data = kt.depth_experiment(i, seed=0, scale=0.01)
  for split in data.values():
    for e in split:
      check_example(e, 21, 30)
      assert e.keyword_depth in (i, i + 1)


def test_depth_filter_is_the_filtered_pool():
  """Joint (length, depth) frequencies equal the pool's exact distribution:
  length uniform, keyword a uniform leaf of a uniform tree, conditioned on
  depth in {i, i+1}."""
  i, lo, hi = 3, 21, 30
  cells = [(n, d) for n in range(lo, hi + 1) for d in (i, i + 1)]
  # (tree, leaf) pairs with n leaves: n Catalan(n-1) = comb(2n-2, n-1).
  prob = np.array([depth_counts(n).get(d, 0) / math.comb(2 * n - 2, n - 1)
                   for n, d in cells])
  prob /= prob.sum()
  examples = kt.sample(1500, lo, hi, seed=2, depths=(i, i + 1))
  counts = collections.Counter((len(e.tokens), e.keyword_depth)
                               for e in examples)
  obs = np.array([counts[c] for c in cells])
  assert obs.sum() == len(examples)
  assert stats.chisquare(obs, prob * len(examples)).pvalue > 1e-3


def shallow_leaf_counts(n):
  """{c: number of trees with n >= 3 leaves having c leaves at depth 1 or
  2}: each child of the root adds 1 if a leaf, else its own leaf
  children (2 for a cherry; one of a leaf and a subtree: 1)."""
  def child(m):   # {value: shapes} of a child subtree with m leaves
    if m <= 2:
      return {m: 1}
    return {1: 2 * catalan(m - 1), 0: catalan(m) - 2 * catalan(m - 1)}
  out = collections.Counter()
  for a in range(1, n):
    for va, ca in child(a).items():
      for vb, cb in child(n - a).items():
        out[va + vb] += ca * cb
  return out


def catalan(m):   # binary tree shapes with m leaves
  return math.comb(2 * m - 2, m - 1) // m


def test_shallow_depth_filter_keeps_the_pools_proportions():
  """Depths 1-2 (dataset i = 1), where the sampler's acceptance bound
  2^2 / 21 is tight: the share of examples whose tree has 3 leaves at
  depth 1-2, against its exact value (a tree with c qualifying leaves is
  drawn in proportion to c / n). With the bound halved (2^(D-1)) such
  trees were kept too rarely: 6.5 standard errors off at this size."""
  lo, hi, n_ex = 21, 30, 6000
  weight = collections.Counter()
  for n in range(lo, hi + 1):
    counts = shallow_leaf_counts(n)
    assert sum(counts.values()) == catalan(n)
    for c, k in counts.items():
      weight[c] += c * k / (catalan(n) * n)
  p3 = weight[3] / sum(weight.values())

  def shallow(tree, d=0):
    if isinstance(tree, tuple):
      return shallow(tree[0], d + 1) + shallow(tree[1], d + 1)
    return int(d in (1, 2))
  examples = kt.sample(n_ex, lo, hi, seed=0, depths=(1, 2))
  got = np.mean([shallow(e.tree) == 3 for e in examples])
  assert abs(got - p3) < 4 * math.sqrt(p3 * (1 - p3) / n_ex), (got, p3)


def test_unreachable_depths_are_never_drawn():
  # No tree with <= 4 leaves has a leaf at depth 2000: depth 1 only.
  examples = kt.sample(50, 2, 4, seed=0, depths=[1, 2000])
  assert len(examples) == 50
  for e in examples:
    check_example(e, 2, 4)
    assert e.keyword_depth == 1 == kt.leaf_depths(e.tree)[e.keyword_index]


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("kwargs,match", [
    (dict(num=5, min_length=8, max_length=4), "min_length=8 > max_length=4"),
    (dict(num=5, min_length=0, max_length=4), "min_length must be"),
    (dict(num=-1, min_length=1, max_length=4), "num must be"),
    (dict(num=5, min_length=2, max_length=4, seed=-1), "seed must be"),
    (dict(num=5, min_length=2, max_length=4, depths=(0,)),
     r"no tree with 2..4 leaves has a leaf at depths \[0\]"),
    (dict(num=5, min_length=2, max_length=4, depths=(4, 5)),
     "no tree with 2..4 leaves"),
    (dict(num=3, min_length=2, max_length=4, depths=5),
     "depths must be a sequence of ints, got 5"),
    (dict(num=3, min_length=2, max_length=4, depths=(1, -1)),
     r"depths\[\] must be an int >= 0, got -1")])
def test_bad_sample_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    kt.sample(**kwargs)


def test_bad_experiment_arguments():
  with pytest.raises(ValueError, match="i must be in 1..10"):
    kt.length_experiment(11)
  with pytest.raises(ValueError, match="i must be an int >= 1"):
    kt.depth_experiment(0)
  # beyond the paper's 10 datasets depths are too rare to sample: i = 25
  # searched for minutes before a RuntimeError (QA, session 41)
  with pytest.raises(ValueError, match=r"i must be in 1..10 \(the paper"):
    kt.depth_experiment(25)
  with pytest.raises(ValueError, match="scale must be"):
    kt.length_experiment(1, scale=2)
  with pytest.raises(ValueError, match=r"scale must be a finite number in \(0, 1\], "
                                       "got '0.1'"):
    kt.length_experiment(1, scale="0.1")
  with pytest.raises(ValueError, match="num_leaves must be"):
    kt.random_shape(0, np.random.default_rng(0))
