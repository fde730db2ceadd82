"""Dyck PCFG against naive references: a stack simulation, hand cases, and
the inside probabilities of the grammar."""

import collections
import functools

import numpy as np
import pytest
from scipy import stats

from sorjax.data import pcfg
from sorjax.data.pcfg import DyckPCFG


def naive_targets(seq, k):
  """Admissible next symbols by a Python stack: opens, top's close, END."""
  rows, stack = [], []
  for t in seq:
    if t < k:
      stack.append(t)
    else:
      assert stack and stack.pop() == t - k
    row = [True] * k + [False] * k + [not stack]
    if stack:
      row[k + stack[-1]] = True
    rows.append(row)
  return np.array(rows, bool).reshape(len(seq), 2 * k + 1)


def inside_probability(word, p, q):
  """P(S =>* word) for S -> open_i S close_i (p[i]) | S S (q) | eps.

  e = P(S =>* "") solves e = eps + q e^2; for a non-empty span the S S rule
  with one empty side contributes 2 q e I(span), hence the division.
  """
  k, eps = len(p), 1 - sum(p) - q
  e = (1 - np.sqrt(1 - 4 * q * eps)) / (2 * q)

  @functools.lru_cache(maxsize=None)
  def inside(i, j):
    if i == j:
      return e
    total = 0.0
    if word[i] < k and word[j - 1] == word[i] + k:
      total += p[word[i]] * inside(i + 1, j - 1)
    total += q * sum(inside(i, s) * inside(s, j) for s in range(i + 1, j))
    return total / (1 - 2 * q * e)

  return inside(0, len(word))


def all_words(k, max_length):
  """Every balanced word up to max_length: wrap any span in a new pair."""
  words = {()}
  for _ in range(max_length // 2):
    words |= {w[:i] + (t,) + w[i:j] + (t + k,) + w[j:]
              for w in words for i in range(len(w) + 1)
              for j in range(i, len(w) + 1) for t in range(k)
              if _balanced(w[i:j], k)}
  return sorted(words)


def _balanced(w, k):
  stack = []
  for t in w:
    if t < k:
      stack.append(t)
    elif not stack or stack.pop() != t - k:
      return False
  return not stack


# ---------------------------------------------------------------- grammar

def test_defaults_are_mahto():
  g = DyckPCFG()
  assert g.p == (0.25, 0.25) and g.q == 0.25 and g.eps == pytest.approx(.25)
  assert g.vocab == ("(", "[", ")", "]") and g.end_target == 4
  assert g.decode(g.encode("([])")) == "([])"


@pytest.mark.parametrize("kwargs,match", [
    (dict(p=(0.0, 0.25)), r"p\[0\] must be in \(0, 1\)"),
    (dict(p=(0.25, 1.2)), r"p\[1\] must be in \(0, 1\)"),
    (dict(p=()), "one probability per bracket type"),
    (dict(q=1.0), r"q must be a finite number in \(0, 1\)"),
    (dict(q=0), r"q must be a finite number in \(0, 1\)"),
    (dict(p=(0.4, 0.4), q=0.2), r"sum\(p\) \+ q must be < 1"),
    (dict(p="ab"), "p must be a sequence")])
def test_bad_hyperparameters(kwargs, match):
  with pytest.raises(ValueError, match=match):
    DyckPCFG(**kwargs)


def test_hashable_with_list_p():
  assert hash(DyckPCFG(p=[0.2, 0.3])) == hash(DyckPCFG(p=(0.2, 0.3)))


# ---------------------------------------------------------------- sampling

@pytest.mark.parametrize("args,match", [
    ((5, 10, 4), "min_length=10 > max_length=4"),
    ((5, 5, 5), "lengths are even"),
    ((5, -2, 4), "min_length must be"),
    ((5, 2, 4, -1), "seed must be")])
def test_bad_sample_arguments(args, match):
  with pytest.raises(ValueError, match=match):
    DyckPCFG().sample(*args)


def test_samples_balanced_within_lengths_and_seeded():
  g = DyckPCFG()
  seqs = g.sample(300, 4, 40, seed=2)
  assert all(4 <= s.size <= 40 and _balanced(s.tolist(), 2) for s in seqs)
  again = g.sample(300, 4, 40, seed=2)
  assert all(np.array_equal(a, b) for a, b in zip(seqs, again))
  other = g.sample(300, 4, 40, seed=3)
  assert not all(a.size == b.size and np.array_equal(a, b)
                 for a, b in zip(seqs, other))


def test_sample_frequencies_match_inside_probabilities():
  """Exact conditioning on the length bounds: word frequencies follow the
  grammar's probabilities renormalised over words of length 2..6."""
  p, q = (0.3, 0.15), 0.25
  g = DyckPCFG(p, q)
  words = [w for w in all_words(2, 6) if len(w) >= 2]
  probs = np.array([inside_probability(w, p, q) for w in words])
  probs /= probs.sum()
  seqs = g.sample(8000, 2, 6, seed=0)
  counts = collections.Counter(tuple(s.tolist()) for s in seqs)
  assert set(counts) <= set(words)
  obs = np.array([counts[w] for w in words])
  assert stats.chisquare(obs, probs * len(seqs)).pvalue > 1e-3


def test_num_sequences_counts_words():
  g = DyckPCFG()
  assert g.num_sequences(0, 6) == len(all_words(2, 6)) == 1 + 2 + 8 + 40
  assert DyckPCFG(p=(0.3,), q=0.3).num_sequences(2, 8) == 1 + 2 + 5 + 14


def test_unique_sampling_exhausts_and_excludes():
  g = DyckPCFG()
  seqs = g.sample(10, 2, 4, seed=0, unique=True)  # all 2 + 8 such words
  assert {tuple(s.tolist()) for s in seqs} == {
      w for w in all_words(2, 4) if len(w) >= 2}
  with pytest.raises(ValueError, match="num=11 distinct sequences but only "
                     "10 exist"):
    g.sample(11, 2, 4, seed=0, unique=True)
  exclude = {(0, 2), (1, 3)}
  rest = g.sample(8, 2, 4, seed=1, unique=True, exclude=exclude)
  assert len(rest) == 8 and not exclude & {tuple(s.tolist()) for s in rest}
  with pytest.raises(ValueError, match="only 8 exist"):
    g.sample(9, 2, 4, seed=1, unique=True, exclude=exclude)


def test_exclude_takes_samples_and_counts_only_possible_words():
  g = DyckPCFG()
  train = g.sample(5, 2, 4, seed=0, unique=True)
  rest = g.sample(5, 2, 4, seed=1, unique=True, exclude=train)
  words = {w for w in all_words(2, 4) if len(w) >= 2}
  assert ({tuple(s.tolist()) for s in train}
          | {tuple(s.tolist()) for s in rest}) == words
  # Only "()" is possible; an unbalanced or too long tuple takes no room.
  last = g.sample(1, 2, 2, unique=True, exclude=[(1, 3), (0, 0), [0, 1, 3, 2]])
  assert [s.tolist() for s in last] == [[0, 2]]
  with pytest.raises(ValueError, match=r"exclude\[1\] must be a 1-D "
                                       "sequence of ids"):
    g.sample(1, 2, 4, unique=True, exclude=[(0, 2), "()"])
  with pytest.raises(ValueError, match="exclude is only honoured with "
                                       "unique=True"):
    g.sample(5, 2, 4, exclude=train)


def test_without_unique_duplicates_occur():
  seqs = DyckPCFG().sample(200, 2, 4, seed=0)
  assert len({tuple(s.tolist()) for s in seqs}) < 200


# ---------------------------------------------------------------- targets

def test_targets_hand_case():
  g = DyckPCFG()
  #          (  [  )  ]  END
  expected = [[1, 1, 0, 1, 0],   # after [
              [1, 1, 1, 0, 0],   # after [(
              [1, 1, 0, 1, 0],   # after [()
              [1, 1, 0, 0, 1],   # after [()]: all closed, END admissible
              [1, 1, 1, 0, 0],   # after [()](
              [1, 1, 0, 0, 1]]   # after [()](): end of the sequence
  np.testing.assert_array_equal(g.targets(g.encode("[()]()")), expected)
  np.testing.assert_array_equal(g.closing_targets(g.encode("[()]()")),
                                np.array(expected)[:, 2:4])


def test_targets_against_stack_simulation():
  g = DyckPCFG()
  for s in g.sample(100, 2, 60, seed=4):
    np.testing.assert_array_equal(g.targets(s), naive_targets(s.tolist(), 2))
  prefix = g.encode("(([")
  np.testing.assert_array_equal(g.targets(prefix),
                                naive_targets(prefix.tolist(), 2))
  assert g.targets(np.zeros(0, np.int32)).shape == (0, 5)


@pytest.mark.parametrize("text,match", [
    ("(]", r"\] at position 1 does not close \( at position 0"),
    ("())", "closing bracket at position 2 has no open")])
def test_targets_reject_invalid(text, match):
  g = DyckPCFG()
  with pytest.raises(ValueError, match=match):
    g.targets(g.encode(text))
  with pytest.raises(ValueError, match="token 7 at position 0"):
    g.targets(np.array([7]))


# ---------------------------------------------------------------- timescales

@pytest.mark.parametrize("text,expected", [
    ("", 0), ("()", 1), ("([])", 3), ("()[]", 1), ("(()())", 5),
    ("[()][[()]]", 5)])
def test_max_timescale_hand_cases(text, expected):
  g = DyckPCFG()
  assert g.max_timescale(g.encode(text)) == expected


def test_timescales_in_closing_order():
  g = DyckPCFG()
  np.testing.assert_array_equal(g.timescales(g.encode("([])[]")), [1, 3, 1])
  with pytest.raises(ValueError, match="leaves 1 brackets unclosed"):
    g.timescales(g.encode("(()"))


# ---------------------------------------------------------------- presets

def test_presets():
  mahto = pcfg.PRESETS["mahto"]
  assert mahto.grammar == DyckPCFG((0.25, 0.25), 0.25)
  assert {s: (v.num, v.max_length) for s, v in mahto.splits} == {
      "train": (10_000, 200), "dev": (2_000, 200), "test": (5_000, 200)}
  suzgun = dict(pcfg.PRESETS["suzgun"].splits)
  assert (suzgun["train"].min_length, suzgun["train"].max_length) == (2, 50)
  assert (suzgun["test"].min_length, suzgun["test"].max_length) == (52, 100)
  assert pcfg.PRESETS["suzgun"].unique


def test_make_splits_lengths_and_cross_split_dedup():
  out = pcfg.make_splits("suzgun", seed=0, scale=0.01)
  assert [len(v) for v in out.values()] == [100, 50]
  assert all(2 <= s.size <= 50 for s in out["train"])
  assert all(52 <= s.size <= 100 for s in out["test"])
  # Same bounds for every split: dedup must work across splits.
  tiny = pcfg.PCFGPreset(DyckPCFG(), (
      ("train", pcfg.SplitSpec(6, 2, 4)), ("test", pcfg.SplitSpec(4, 2, 4))),
                         unique=True)
  out = pcfg.make_splits(tiny, seed=3)
  train = {tuple(s.tolist()) for s in out["train"]}
  test = {tuple(s.tolist()) for s in out["test"]}
  assert len(train) == 6 and len(test) == 4 and not train & test
  with pytest.raises(ValueError, match="unknown preset"):
    pcfg.make_splits("nope")


def test_decode_and_sample_check_their_arguments():
  g = DyckPCFG()
  assert g.decode([0, 2]) == "()"
  four = DyckPCFG(p=(0.1,) * 4, q=0.2)     # k = 4: one character each
  assert four.decode([0, 1, 2, 3, 7, 6, 5, 4]) == "([{<>}])"
  big = DyckPCFG(p=(0.1,) * 5, q=0.2)      # k > 4: symbols "(3" and "3)"
  assert big.decode([3, 8, 0, 5]) == "(3 3) (0 0)"
  np.testing.assert_array_equal(big.encode(big.decode([3, 8, 0, 5])),
                                [3, 8, 0, 5])
  with pytest.raises(ValueError, match=r"decode: id -1 at position 1 is "
                                       r"outside \[0, 4\)"):
    g.decode([0, -1])
  with pytest.raises(TypeError, match="sample: unique must be a bool"):
    g.sample(3, 2, 4, unique="no")
