"""Dyck-(k, m) against naive references: a Python stack, hand-computed
probabilities, and brute-force enumeration of the sampling process."""

import collections
import itertools
import math

import numpy as np
import pytest
from scipy import stats

from sorjax.data import dyck
from sorjax.data.dyck import DyckKM


# ---------------------------------------------------------------- references

def naive_stack(seq, k, m):
  """Checks START brackets END with a list stack; returns max depth."""
  seq = list(seq)
  assert seq[0] == 2 * k and seq[-1] == 2 * k + 1
  stack, deepest = [], 0
  for t in seq[1:-1]:
    if t < k:
      stack.append(t)
      deepest = max(deepest, len(stack))
    else:
      assert k <= t < 2 * k and stack and stack.pop() == t - k
  assert not stack
  assert deepest <= m
  return deepest


def step_probs(k, m, depth, n, min_length):
  """The automaton with END redrawn before min_length: a dict over
  'open' (each type), 'close', 'end'."""
  if depth == 0:
    if n < min_length:
      return {"open": 1 / k, "close": 0.0, "end": 0.0}
    return {"open": 1 / (2 * k), "close": 0.0, "end": 0.5}
  if depth < m:
    return {"open": 1 / (2 * k), "close": 0.5, "end": 0.0}
  return {"open": 0.0, "close": 1.0, "end": 0.0}


def enumerate_words(k, m, max_length):
  """Every Dyck-(k, m) word with <= max_length brackets, as id tuples."""
  out = []

  def grow(word, stack):
    if not stack:
      out.append(tuple(word))
    if len(word) + len(stack) + 2 <= max_length and len(stack) < m:
      for i in range(k):
        grow(word + [i], stack + [i])
    if stack and len(word) + len(stack) <= max_length:
      grow(word + [k + stack[-1]], stack[:-1])

  grow([], [])
  return sorted(set(out))


def word_probability(k, m, word, min_length):
  p, stack = 1.0, []
  for n, t in enumerate(word):
    q = step_probs(k, m, len(stack), n, min_length)
    if t < k:
      p *= q["open"]
      stack.append(t)
    else:
      p *= q["close"]
      stack.pop()
  return p * step_probs(k, m, 0, len(word), min_length)["end"]


def brute_force_process(k, m, min_length, max_length):
  """{sample (with START, END): probability} of the sampling process."""
  words = [w for w in enumerate_words(k, m, max_length)
           if len(w) >= min_length]
  probs = np.array([word_probability(k, m, w, min_length) for w in words])
  probs /= probs.sum()                       # rejection of longer samples
  return {(2 * k, *w, 2 * k + 1): p for w, p in zip(words, probs)}


# ---------------------------------------------------------------- vocabulary

def test_vocab_layout_and_round_trip():
  lang = DyckKM(2, 3)
  assert lang.vocab == ("(", "[", ")", "]", "START", "END")
  assert (lang.start, lang.end, lang.vocab_size) == (4, 5, 6)
  seq = lang.encode("START ( [ ] ) END")
  np.testing.assert_array_equal(seq, [4, 0, 1, 3, 2, 5])
  assert lang.decode(seq) == "START ( [ ] ) END"
  big = DyckKM(6, 2)
  assert big.vocab[0] == "(0" and big.vocab[6] == "0)"
  assert len(set(big.vocab)) == big.vocab_size
  with pytest.raises(ValueError, match="unknown symbol '<'"):
    lang.encode("START < END")


@pytest.mark.parametrize("kwargs,match", [
    (dict(k=0, m=3), "k must be"), (dict(k=2, m=0), "m must be"),
    (dict(k=True, m=3), "k must be"), (dict(k=2, m=2.0), "m must be")])
def test_bad_hyperparameters(kwargs, match):
  with pytest.raises(ValueError, match=match):
    DyckKM(**kwargs)


@pytest.mark.parametrize("args,match", [
    ((5, 10, 4), "min_length=10 > max_length=4"),
    ((5, 3, 3), r"\[3, 3\]: lengths are even"),
    ((5, -1, 4), "min_length must be"),
    ((-1, 0, 4), "num must be"),
    ((5, 0, 4, -3), "seed must be")])
def test_bad_sample_arguments(args, match):
  with pytest.raises(ValueError, match=match):
    DyckKM(2, 3).sample(*args)


# ---------------------------------------------------------------- sampling

@pytest.mark.parametrize("k,m", [(1, 1), (2, 2), (3, 4)])
def test_samples_are_bounded_dyck_words_within_lengths(k, m):
  lang = DyckKM(k, m)
  seqs = lang.sample(300, 6, 30, seed=1)
  assert len(seqs) == 300
  deepest = 0
  for s in seqs:
    assert s.dtype == np.int32
    assert 6 <= s.size - 2 <= 30
    deepest = max(deepest, naive_stack(s, k, m))
  assert deepest == m                         # the bound is reached


def test_default_lengths_are_hewitts():
  lang = DyckKM(2, 3)
  L = 8 * 3 * 1 + 60
  assert lang.max_train_length == L
  assert lang.default_lengths() == {"train": (1, L), "dev": (1, L),
                                    "test": (L + 1, 2 * L)}
  assert all(s.size - 2 <= L for s in lang.sample(200, seed=0))
  assert all(L + 1 <= s.size - 2 <= 2 * L
             for s in lang.sample(20, L + 1, 2 * L, seed=0))


def test_seeds_reproduce_and_differ():
  lang = DyckKM(2, 4)
  a, b, c = (lang.sample(50, 2, 60, seed=s) for s in (7, 7, 8))
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(x.size == y.size and np.array_equal(x, y)
                 for x, y in zip(a, c))


def test_next_token_frequencies_match_the_automaton():
  """Without bounds in play, counts of each move per stack state follow
  the automaton's probabilities (chi-square)."""
  k, m = 2, 3
  seqs = DyckKM(k, m).sample(3000, 0, 4000, seed=3)
  counts = collections.defaultdict(collections.Counter)
  for s in seqs:
    stack = []
    for t in s[1:]:
      kind = "empty" if not stack else ("full" if len(stack) == m else "mid")
      if t == 2 * k + 1:
        counts[kind]["end"] += 1
      elif t < k:
        counts[kind][f"open{t}"] += 1
        stack.append(t)
      else:
        counts[kind]["close"] += 1
        stack.pop()
  expected = {"empty": {"end": .5, "open0": .25, "open1": .25},
              "mid": {"close": .5, "open0": .25, "open1": .25}}
  for kind, probs in expected.items():
    obs = np.array([counts[kind][s] for s in probs])
    assert obs.sum() == sum(counts[kind].values())
    p = stats.chisquare(obs, obs.sum() * np.array(list(probs.values()))).pvalue
    assert p > 1e-3, (kind, obs)
  assert set(counts["full"]) == {"close"}


def test_sampler_matches_brute_force_process():
  """Whole-sample frequencies under min/max bounds (redraw + rejection)."""
  k, m, lo, hi = 2, 2, 2, 6
  process = brute_force_process(k, m, lo, hi)
  seqs = DyckKM(k, m).sample(8000, lo, hi, seed=5)
  counts = collections.Counter(tuple(s.tolist()) for s in seqs)
  assert set(counts) <= set(process)
  keys = sorted(process)
  obs = np.array([counts[w] for w in keys])
  exp = np.array([process[w] for w in keys]) * len(seqs)
  assert stats.chisquare(obs, exp).pvalue > 1e-3


# ---------------------------------------------------------------- oracle

def test_oracle_hand_computed():
  lang = DyckKM(2, 2)
  seq = lang.encode("START ( [ ] ) END")
  #            (     [     )     ]    START  END
  expected = [[1/4, 1/4, 0,    0,    0,    1/2],   # after START, d = 0
              [1/4, 1/4, 1/2,  0,    0,    0],     # after (, d = 1
              [0,   0,   0,    1,    0,    0],     # after ( [, d = m
              [1/4, 1/4, 1/2,  0,    0,    0],     # after ( [ ]
              [1/4, 1/4, 0,    0,    0,    1/2]]   # after ( [ ] )
  np.testing.assert_allclose(lang.oracle(seq), expected, atol=1e-15)
  # Redraw before min_length=2: the first bracket is an open, 1/2 each.
  np.testing.assert_allclose(lang.oracle(seq, 2, 100)[0],
                             [1/2, 1/2, 0, 0, 0, 0], atol=1e-12)


def test_oracle_hand_computed_with_max_length():
  # k = m = 1, max 2: "" w.p. 1/2 and "()" w.p. 1/4 are accepted.
  lang = DyckKM(1, 1)
  seq = lang.encode("START ( ) END")
  #          (     )   START  END
  expected = [[1/3, 0,   0,    2/3],
              [0,   1,   0,    0],
              [0,   0,   0,    1]]     # 2 brackets = max: END for sure
  np.testing.assert_allclose(lang.oracle(seq, 0, 2), expected, atol=1e-15)


def test_oracle_min_length_defaults_to_samples():
  # sample(num, max_length=2) draws min_length 1: only "()" is accepted.
  lang = DyckKM(1, 1)
  seq = lang.sample(1, max_length=2)[0]
  assert lang.decode(seq) == "START ( ) END"
  #          (  )  START END
  expected = [[1, 0, 0, 0],
              [0, 1, 0, 0],
              [0, 0, 0, 1]]
  np.testing.assert_allclose(lang.oracle(seq, max_length=2), expected,
                             atol=1e-15)
  assert lang.oracle_score([seq], max_length=2).cross_entropy == 0
  # Without bounds it stays the automaton: END right after START is 1/2.
  assert lang.oracle(seq)[0, lang.end] == 0.5


@pytest.mark.parametrize("k,m,lo,hi", [(2, 2, 2, 6), (1, 3, 0, 8),
                                       (2, 1, 4, 6)])
def test_oracle_equals_brute_force_conditionals(k, m, lo, hi):
  process = brute_force_process(k, m, lo, hi)
  mass = collections.Counter()
  for w, p in process.items():
    for t in range(1, len(w) + 1):
      mass[w[:t]] += p
  lang = DyckKM(k, m)
  for w in process:
    rows = lang.oracle(np.array(w), lo, hi)
    assert rows.shape == (len(w) - 1, 2 * k + 2)
    for t in range(len(w) - 1):
      ref = [mass[w[:t + 1] + (a,)] / mass[w[:t + 1]]
             for a in range(2 * k + 2)]
      np.testing.assert_allclose(rows[t], ref, atol=1e-12)


@pytest.mark.parametrize("bounds", [(None, None), (1, None), (2, 40)])
def test_oracle_rows_sum_to_one_and_zero_illegal(bounds):
  k, m = 3, 3
  lang = DyckKM(k, m)
  for s in lang.sample(40, 2, 40, seed=9):
    rows = lang.oracle(s, *bounds)
    np.testing.assert_allclose(rows.sum(1), 1.0, atol=1e-12)
    stack = []
    for t in range(s.size - 1):
      legal = set()
      if len(stack) < m:
        legal |= set(range(k))
      if stack:
        legal.add(k + stack[-1])
      else:
        legal.add(2 * k + 1)
      illegal = sorted(set(range(2 * k + 2)) - legal)
      assert np.all(rows[t, illegal] == 0), (t, rows[t])
      assert rows[t, s[t + 1]] > 0
      tok = s[t + 1]
      if tok < k:
        stack.append(tok)
      elif tok < 2 * k:
        stack.pop()


def test_oracle_on_a_prefix():
  lang = DyckKM(2, 3)
  rows = lang.oracle(lang.encode("START ( ("))
  assert rows.shape == (2, 6)
  np.testing.assert_allclose(rows[1], [1/4, 1/4, 1/2, 0, 0, 0])


@pytest.mark.parametrize("text,match", [
    ("( ) END", "must start with START"),
    ("START ( ] END", r"\] at position 2 does not close \( at position 1"),
    ("START ) END", "closing bracket at position 1 has no open"),
    ("START ( ( ( ) ) ) END", "position 3 makes 3 unclosed brackets > m=2"),
    ("START ( END ) END", "END only at the end"),
    ("START ( END", "END at position 2 with 1 unclosed")])
def test_oracle_rejects_invalid_sequences(text, match):
  lang = DyckKM(2, 2)
  with pytest.raises(ValueError, match=match):
    lang.oracle(lang.encode(text))


def test_oracle_rejects_sequences_outside_bounds():
  lang = DyckKM(2, 2)
  seq = lang.encode("START ( ) END")
  with pytest.raises(ValueError, match="2 brackets < min_length=4"):
    lang.oracle(seq, 4, 10)
  with pytest.raises(ValueError, match="2 brackets > max_length=0"):
    lang.oracle(seq, 0, 0)
  with pytest.raises(ValueError, match="token 9 at position 1"):
    lang.oracle(np.array([4, 9, 5]))


# ---------------------------------------------------------------- distances

def test_closing_distances_hand_written():
  lang = DyckKM(2, 3)
  seq = lang.encode("START ( [ ] ( ) ) [ [ ] ] END")
  np.testing.assert_array_equal(lang.closing_distances(seq),
                                [0, 0, 0, 1, 0, 1, 5, 0, 0, 1, 3, 0])


def test_closing_distances_against_stack_on_samples():
  lang = DyckKM(2, 5)
  for s in lang.sample(30, 10, 80, seed=2):
    ref, stack = np.zeros(s.size, int), []
    for t, tok in enumerate(s):
      if tok < 2:
        stack.append(t)
      elif tok < 4:
        ref[t] = t - stack.pop()
    np.testing.assert_array_equal(lang.closing_distances(s), ref)


# ---------------------------------------------------------------- scores

def test_oracle_score_hand_computed():
  lang = DyckKM(1, 1)
  score = lang.oracle_score([lang.encode("START ( ) END")] * 3)
  # Predicted: ( w.p. 1/2, ) w.p. 1, END w.p. 1/2.
  ce = 2 * math.log(2) / 3
  assert score.num_tokens == 9
  assert score.cross_entropy == pytest.approx(ce)
  assert score.bits_per_token == pytest.approx(2 / 3)
  assert score.perplexity == pytest.approx(math.exp(ce))


def test_oracle_score_is_mean_log_loss_and_exact_process_is_lower():
  lang = DyckKM(2, 3)
  seqs = lang.sample(400, 10, 40, seed=4)
  nll = sum(-np.log(lang.oracle(s, 10, 40)[np.arange(s.size - 1), s[1:]]).sum()
            for s in seqs)
  score = lang.oracle_score(seqs, 10, 40)
  assert score.num_tokens == sum(s.size - 1 for s in seqs)
  assert score.cross_entropy == pytest.approx(nll / score.num_tokens)
  # The bounds carry information, so the exact oracle beats the automaton.
  assert score.cross_entropy < lang.oracle_score(seqs).cross_entropy - 0.01


def test_oracle_score_names_the_bad_sequence():
  lang = DyckKM(2, 2)
  good = lang.encode("START ( ) END")
  with pytest.raises(ValueError, match="sequence 1: .*does not close"):
    lang.oracle_score([good, lang.encode("START ( ] END")])


# ---------------------------------------------------------------- presets

def test_lin_presets():
  for m in (4, 6, 8):
    preset = dyck.PRESETS[f"lin_m{m}"]
    assert preset.language == DyckKM(2, m)
    L = 8 * m * (m - 2) + 60
    assert dict(preset.splits) == {
        "train": dyck.SplitSpec(10_000, 1, L),
        "dev": dyck.SplitSpec(4_000, 1, L),
        "test": dyck.SplitSpec(10_000, L + 1, 2 * L)}


def test_make_splits_scaled_and_seeded():
  a = dyck.make_splits("lin_m4", seed=1, scale=0.002)
  b = dyck.make_splits("lin_m4", seed=1, scale=0.002)
  assert {s: len(v) for s, v in a.items()} == {"train": 20, "dev": 8,
                                               "test": 20}
  for split in a:
    assert all(np.array_equal(x, y) for x, y in zip(a[split], b[split]))
  assert all(125 <= s.size - 2 <= 248 for s in a["test"])
  assert not np.array_equal(a["train"][0], a["dev"][0]) or not np.array_equal(
      a["train"][1], a["dev"][1])
  with pytest.raises(ValueError, match="unknown preset 'lin_m5'"):
    dyck.make_splits("lin_m5")


def test_bracket_pairs_matches_stack():
  rng = np.random.default_rng(0)
  for s in DyckKM(1, 6).sample(20, 10, 60, seed=rng.integers(100)):
    is_open = s[1:-1] == 0
    opens, closes, depth = dyck.bracket_pairs(is_open)
    stack, ref = [], {}
    for t, o in enumerate(is_open):
      if o:
        stack.append(t)
      else:
        ref[t] = stack.pop()
    assert dict(zip(closes.tolist(), opens.tolist())) == ref
    np.testing.assert_array_equal(depth, np.cumsum(np.where(is_open, 1, -1)))
  assert list(itertools.chain(*dyck.bracket_pairs(np.array([], bool)))) == []


def test_decode_checks_the_ids():
  lang = DyckKM(2, 4)
  assert lang.decode([4, 0, 1, 3, 2, 5]) == "START ( [ ] ) END"
  for ids, bad in (([4, -1], -1), ([4, 9], 9)):
    with pytest.raises(ValueError, match=rf"decode: id {bad} at position 1 "
                                         r"is outside \[0, 6\)"):
      lang.decode(ids)
  with pytest.raises(ValueError, match="decode: ids must be integers"):
    lang.decode([4.0, 5.0])


def test_split_spec_needs_a_sample():
  for num in (0, -3):   # make_splits would keep max(1, ...) = 1 sample
    with pytest.raises(ValueError, match="SplitSpec: num must be an int >= 1"):
      dyck.hewitt_splits(DyckKM(2, 4), num, 10, 10)
  with pytest.raises(ValueError, match="SplitSpec: min_length=5 > "
                                       "max_length=4"):
    dyck.SplitSpec(1, 5, 4)
  with pytest.raises(ValueError, match=r"make_splits: scale must be a finite number "
                                       r"in \(0, 1\], got '1'"):
    dyck.make_splits("lin_m4", scale="1")
