"""Markov control corpus (Mahto et al. 3.1.1) against bigram counts."""

import collections
import itertools
import os

import numpy as np
import pytest

from sorjax.data.markov import bigram_successors, markov_corpus


def bigrams(x):
  return set(zip(x[:-1].tolist(), x[1:].tolist()))


def transition_matrix(x, V):
  counts = np.zeros((V, V))
  np.add.at(counts, (x[:-1], x[1:]), 1)
  return counts / np.maximum(counts.sum(1, keepdims=True), 1)


def source_chain(n, seed=0):
  """A stream from a known 5-state chain with some zero transitions."""
  P = np.array([[.1, .6, .3, 0, 0], [0, .2, .2, .6, 0], [.5, 0, 0, .25, .25],
                [.3, .3, .4, 0, 0], [0, 0, 0, .5, .5]])
  rng = np.random.default_rng(seed)
  x = [0]
  for _ in range(n - 1):
    x.append(rng.choice(5, p=P[x[-1]]))
  return np.array(x, np.int32)


def test_same_size_dtype_and_only_source_bigrams():
  src = source_chain(3000)
  for wrap in (True, False):
    out = markov_corpus(src, seed=1, wrap=wrap)
    assert out.shape == src.shape and out.dtype == src.dtype
    allowed = bigrams(src) | ({(int(src[-1]), int(src[0]))} if wrap else set())
    assert bigrams(out) <= allowed
  assert markov_corpus(src, seed=1, length=10).shape == (10,)


def test_bigram_and_unigram_frequencies_match_the_source():
  src = source_chain(4000)
  out = markov_corpus(src, seed=2, length=200_000)
  np.testing.assert_allclose(transition_matrix(out, 5),
                             transition_matrix(src, 5), atol=0.02)
  np.testing.assert_allclose(np.bincount(out, minlength=5) / out.size,
                             np.bincount(src, minlength=5) / src.size,
                             atol=0.02)


def test_the_first_token_is_a_bigram_start_drawn_by_frequency():
  """The chain starts at the first token of a uniformly drawn source
  bigram: a token that starts 90% of the bigrams starts ~90% of corpora
  (not half, as a uniform draw over the token types would give)."""
  src = np.array([0] * 90 + [1] * 10, np.int32)   # with wrap: 100 bigrams
  first = [int(markov_corpus(src, seed=s, length=1)[0]) for s in range(400)]
  assert abs(np.mean(np.array(first) == 0) - 0.9) < 0.06


def test_successor_table_counts_bigrams():
  src = np.array([3, 1, 3, 1, 2, 3, 1])
  offsets, succ = bigram_successors(src, wrap=False)
  table = {a: collections.Counter(succ[offsets[a]:offsets[a + 1]].tolist())
           for a in range(4)}
  assert table == {0: {}, 1: {3: 1, 2: 1}, 2: {3: 1}, 3: {1: 3}}
  offsets, succ = bigram_successors(src, wrap=True)
  assert collections.Counter(succ[offsets[1]:offsets[2]].tolist()) == {
      3: 2, 2: 1}                      # (1, 3) twice with the wrap-around


def test_dead_ends_are_pruned_without_wrap():
  # 2 occurs only at the end: the (1, 2) transition is a dead end.
  src = np.array([0, 1, 0, 1, 0, 1, 2])
  out = markov_corpus(src, seed=0, length=500, wrap=False)
  assert 2 not in out and bigrams(out) <= bigrams(src)
  # With wrap, 2 -> 0 continues the chain and 2 appears.
  assert 2 in markov_corpus(src, seed=0, length=500, wrap=True)
  with pytest.raises(ValueError, match="dead end; use wrap=True"):
    markov_corpus(np.arange(5), seed=0, wrap=False)
  cycle = markov_corpus(np.arange(5), seed=0, length=12, wrap=True)
  np.testing.assert_array_equal(np.diff(cycle) % 5, 1)   # 0 1 2 3 4 0 ...


def test_seeds_reproduce_and_differ():
  src = source_chain(500)
  a, b, c = (markov_corpus(src, seed=s) for s in (4, 4, 5))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


@pytest.mark.parametrize("tokens,kwargs,match", [
    (np.zeros((2, 3), int), {}, "1-D int array"),
    (np.array([0.5, 1.5]), {}, "1-D int array"),
    (np.array([3]), {}, "needs >= 2 tokens"),
    (np.array([0, -1, 2]), {}, "token ids must be >= 0, got -1 at position 1"),
    (np.array([0, 1, 0]), {"seed": -1}, "seed must be"),
    (np.array([0, 1, 0]), {"length": 0}, "length must be")])
def test_bad_inputs(tokens, kwargs, match):
  with pytest.raises(ValueError, match=match):
    markov_corpus(tokens, **kwargs)


def test_markov_ptb_slice(shared_data):
  path = os.path.join(shared_data, "ptb", "ptb.train.txt")
  with open(path, encoding="utf-8") as f:
    words = list(itertools.chain.from_iterable(
        line.split() + ["<eos>"] for line in itertools.islice(f, 2000)))
  ids = {w: i for i, w in enumerate(dict.fromkeys(words))}
  src = np.array([ids[w] for w in words], np.int32)
  out = markov_corpus(src, seed=0, wrap=False)
  assert out.size == src.size and bigrams(out) <= bigrams(src)
  # <eos> keeps its frequency: it follows the source's line-end statistics.
  eos = ids["<eos>"]
  assert abs(np.mean(out == eos) - np.mean(src == eos)) < 0.01


def test_sparse_ids_are_relabelled_not_tabled():
  dense = np.array([2, 0, 1, 0, 2, 2, 1, 0])
  ids = np.array([3, 5 * 10**9, 10**12])      # increasing, as 0, 1, 2
  for wrap in (True, False):
    out = markov_corpus(ids[dense], seed=3, length=300, wrap=wrap)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(
        out, ids[markov_corpus(dense, seed=3, length=300, wrap=wrap)])
  with pytest.raises(ValueError, match=r"bigram_successors: token ids must "
                     r"be < 2\*\*24 .* got 1000000000000 at position 0"):
    bigram_successors(np.array([10**12, 1, 10**12]))


def test_wrap_must_be_a_bool():
  with pytest.raises(TypeError, match="markov_corpus: wrap must be a bool"):
    markov_corpus(np.array([1, 2, 1, 2]), wrap="no")
