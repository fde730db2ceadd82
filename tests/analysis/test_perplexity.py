"""Frequency-binned perplexity and the paired bootstrap (Mahto 3.2.2):
bins on hand counts, stream-order reassembly, CIs against a NumPy loop."""

import itertools
import math
import types

import numpy as np
import pytest

from sorjax.analysis import perplexity as P
from sorjax.analysis.common import AnalysisError
from sorjax.data import batching
from sorjax.training.tasks.lm import ScoredBatch


def test_bins_follow_table_1_edges():
  counts = np.array([0, 99, 100, 999, 1000, 10_000, 10_001, 50_000])
  assert P.frequency_bin(counts).tolist() == [3, 3, 2, 2, 1, 1, 0, 0]
  assert [n for n, _, _ in P.BINS] == ["above 10K", "1K-10K", "100-1K",
                                       "below 100"]


def test_binned_perplexity_by_hand():
  nll = np.array([math.log(2), math.log(8), math.log(4), 1.0])
  out = P.binned(nll, np.array([0, 0, 2, 2]))
  assert out["above 10K"]["perplexity"] == pytest.approx(4.0)  # exp(mean)
  assert out["above 10K"]["tokens"] == 2
  assert out["1K-10K"] == {"tokens": 0, "cross_entropy": None,
                           "perplexity": None}
  assert out["100-1K"]["cross_entropy"] == pytest.approx((math.log(4) + 1) / 2)
  assert out[P.ALL]["tokens"] == 4


def test_chunk_sums_by_hand():
  nll = np.arange(1.0, 6.0)            # 1 2 3 4 5
  bins = np.array([0, 1, 0, 0, 3])
  sums, counts = P.chunk_sums(nll, bins, chunk=2)
  np.testing.assert_allclose(sums[:, 0], [1, 7, 0])
  np.testing.assert_allclose(counts[:, 0], [1, 2, 0])
  np.testing.assert_allclose(sums[:, -1], [3, 7, 5])   # all tokens
  np.testing.assert_allclose(counts[:, 3], [0, 0, 1])


def test_bootstrap_of_a_constant_difference_is_that_constant():
  nll_a = np.full(250, math.log(4.0))
  nll_b = np.full(250, math.log(2.0))
  out = P.bootstrap_difference(nll_a, nll_b, np.zeros(250, int),
                               num_resamples=200)
  assert out["num_chunks"] == 3                       # 100, 100, 50
  for key in ("above 10K", P.ALL):
    assert out["bins"][key]["mean_diff"] == pytest.approx(2.0)
    assert out["bins"][key]["ci"] == pytest.approx([2.0, 2.0])
  assert out["bins"]["below 100"]["mean_diff"] is None   # no such tokens
  # One chunk: nothing to resample, the point difference alone
  one = P.bootstrap_difference(nll_a[:50], nll_b[:50], np.zeros(50, int),
                               num_resamples=50)
  assert one["num_chunks"] == 1
  assert one["bins"][P.ALL] == {"mean_diff": None, "ci": [None, None],
                                "diff": pytest.approx(2.0),
                                "empty_resamples": None}


def test_bootstrap_matches_a_naive_resampling_loop():
  rng = np.random.default_rng(0)
  n = 2_000
  nll_b = rng.exponential(1.5, n)
  nll_a = nll_b + rng.normal(0.05, 0.3, n)
  bins = rng.integers(0, 4, n)
  out = P.bootstrap_difference(nll_a, nll_b, bins, num_resamples=4000,
                               seed=1)["bins"]
  chunks = np.arange(n) // 100
  ref_rng = np.random.default_rng(7)
  diffs = {b: [] for b in (0, None)}
  for _ in range(4000):
    pick = ref_rng.integers(0, 20, 20)
    sel = np.concatenate([np.flatnonzero(chunks == c) for c in pick])
    for b in diffs:
      s = sel if b is None else sel[bins[sel] == b]
      diffs[b].append(math.exp(nll_a[s].mean()) - math.exp(nll_b[s].mean()))
  for b, key in ((0, "above 10K"), (None, P.ALL)):
    d = np.array(diffs[b])
    assert out[key]["mean_diff"] == pytest.approx(d.mean(), abs=0.02)
    lo, hi = np.percentile(d, [2.5, 97.5])
    assert out[key]["ci"][0] == pytest.approx(lo, abs=0.04)
    assert out[key]["ci"][1] == pytest.approx(hi, abs=0.04)
  with pytest.raises(ValueError, match="aligned 1-D"):
    P.bootstrap_difference(nll_a, nll_b[:-1], bins)


def test_bootstrap_reports_the_mean_not_the_median_of_the_resamples():
  # mean_diff is the mean over resamples (module docstring), on a skewed
  # case: 3 chunks, all 27 equally likely resamples enumerated exactly.
  nll_a = np.array([0.0, 0.0, 1.0, 1.0, 4.0, 4.0])     # chunks of 2 tokens
  out = P.bootstrap_difference(nll_a, np.zeros(6), np.zeros(6, int), chunk=2,
                               num_resamples=10_000, seed=3)["bins"]
  means = nll_a.reshape(3, 2).mean(1)
  d = np.array([math.exp(means[list(p)].mean()) - 1.0
                for p in itertools.product(range(3), repeat=3)])
  assert np.median(d) == pytest.approx(math.expm1(5 / 3))  # 4.29 vs mean 7.78
  for key in ("above 10K", P.ALL):
    assert out[key]["diff"] == pytest.approx(math.expm1(5 / 3))
    assert out[key]["mean_diff"] == pytest.approx(d.mean(), abs=0.4)  # 4 se


class _StreamTask:
  """token_losses like LanguageModelTask's: B streams, windows of bptt;
  the 'loss' of a target is its position in the split (to check order)."""
  name = "lm"

  def __init__(self, ids, B=3, bptt=4):
    self.split_ids = {"train": ids, "test": ids}
    self.B, self.bptt = B, bptt
    self.vocab = list(range(int(ids.max()) + 1))

  def token_losses(self, params, split, temperature):
    ids = self.split_ids[split]
    pos = np.arange(ids.size)
    b = batching.StreamBatcher(ids, self.B, self.bptt, pad_to=self.bptt)
    p = batching.StreamBatcher(pos, self.B, self.bptt, pad_to=self.bptt)
    for batch, where in zip(b, p):
      scored = np.arange(self.bptt)[None] < batch.lengths[:, None]
      yield ScoredBatch(batch.inputs, batch.targets, batch.lengths,
                        where.targets.astype(np.float32),
                        np.where(scored, where.targets, -1))


def _run(task):
  return types.SimpleNamespace(task=task, params=None, workdir="/fake",
                               eval_temperature=lambda: 1.0)


def test_perplexity_reports_the_tasks_bits_per_character():
  """On the character-bigram corpus a symbol is two characters: bits per
  character is the task's nll / characters, not the loss / ln 2 (which
  the analysis reported)."""
  class BigramTask(_StreamTask):
    bits = True

    def evaluate(self, params, split, temperature):
      return {"loss": 2.0, "perplexity": math.exp(2.0),
              "bits_per_char": 2.0 / 2 / math.log(2),
              "oracle_perplexity": 3.0}
  run = _run(BigramTask(np.arange(10, dtype=np.int32)))
  res = P.perplexity(run, "test")
  assert res["bits_per_char"] == pytest.approx(1 / math.log(2))
  assert res["bits_per_symbol"] == pytest.approx(2 / math.log(2))
  assert res["perplexity"] == pytest.approx(math.exp(2.0))
  assert res["oracle_cross_entropy"] == pytest.approx(math.log(3.0))  # nats


def test_token_nll_reassembles_the_corpus_order():
  ids = np.random.default_rng(0).integers(0, 50, 23).astype(np.int32)
  out = P.token_nll(_run(_StreamTask(ids)), "test")
  N = 23 // 3
  want = [r * N + j for r in range(3) for j in range(1, N)]
  assert out.index.tolist() == want             # row starts are unscored
  np.testing.assert_array_equal(out.nll, want)  # 'loss' = its position
  np.testing.assert_array_equal(out.targets, ids[want])


def test_frequency_bins_by_training_counts_and_run_checks():
  ids = np.array([0] * 120 + [1] * 5 + [2] * 20, np.int32)
  ids = np.random.default_rng(1).permutation(ids)
  run = _run(_StreamTask(ids, B=1, bptt=50))
  res = P.frequency(run, "test")
  # 'loss' = position t, so a bin's perplexity is exp(mean position).
  pos = np.arange(1, ids.size)
  for name, tok in (("100-1K", 0), ("below 100", 1)):
    sel = ids[1:] == tok if tok == 0 else ids[1:] != 0
    assert res["bins"][name]["tokens"] == int(sel.sum())
    assert res["bins"][name]["cross_entropy"] == pytest.approx(
        pos[sel].mean())
  with pytest.raises(AnalysisError, match="unknown split 'valid'"):
    P.frequency(run, "valid")
  run.task.name = "dyck_lm"
  with pytest.raises(AnalysisError, match="needs a 'lm' run"):
    P.frequency(run, "test")


def test_compare_needs_the_same_tokens(tmp_path):
  ids = np.arange(40, dtype=np.int32) % 7
  a = _run(_StreamTask(ids, B=2, bptt=5))
  b = _run(_StreamTask(ids, B=4, bptt=5))
  with pytest.raises(AnalysisError, match="score different 'test' tokens"):
    P.compare_frequency(a, b, "test", num_resamples=10)
  res = P.compare_frequency(a, _run(_StreamTask(ids, B=2, bptt=5)), "test",
                            num_resamples=50, chunk=5)
  assert res["bootstrap"]["num_chunks"] == 8           # 38 scored tokens
  assert res["bootstrap"]["bins"][P.ALL]["ci"] == [0.0, 0.0]
  assert P.plot_frequency(res, str(tmp_path / "f.png"))
  assert (tmp_path / "f.png").stat().st_size > 0
