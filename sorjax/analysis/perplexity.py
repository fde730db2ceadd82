"""Perplexity on any split, by training frequency, and the bootstrap CI of
the difference between two runs (Mahto et al. 3.2.2, Table 1).

    perplexity(run, "test")           # cross-entropy, perplexity, bits
    frequency(run, "test")            # per frequency bin
    compare_frequency(run_a, run_b)   # + mean difference and 95% CI

Cross-entropy is in nats per predicted symbol; bits = nats / ln 2 (bits per
character on a character corpus, Maupome & Meurs' BPC). Dyck LMs add the
oracle's perplexity and the ratio to it (Lin et al. Table 1).

Frequency bins (Table 1) count each word type in the tokens the model was
trained on (`task.split_ids["train"]`, a prefix when data.max_train_tokens
cut it): above 10K (count > 10,000), 1K-10K (1,000 <= count <= 10,000),
100-1K (100 <= count < 1,000), below 100 (count < 100). A bin's perplexity
is exp(mean NLL of the test tokens of that type).

Bootstrap (3.2.2): the split's scored tokens, in corpus order, are cut into
consecutive 100-token chunks (the last may be shorter); 10,000 resamples of
chunks with replacement, the same chunks for both runs (paired); per
resample and bin, perplexity(run A) - perplexity(run B). We report the mean
of those differences and the 2.5 / 97.5 percentiles, computed with
`scipy.stats.bootstrap(method="percentile")`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import scipy.stats

from sorjax import checks
from sorjax.analysis.common import (check_split, fail, figure, require_task,
                                    save, temperature)

BINS = (("above 10K", 10_001, None), ("1K-10K", 1_000, 10_001),
        ("100-1K", 100, 1_000), ("below 100", 0, 100))
ALL = "all tokens"
LN2 = math.log(2.0)


def perplexity(run, split: str | None = None, tau: float | None = None
               ) -> dict:
  """Cross-entropy (nats), perplexity and bits per symbol of a split, plus
  the oracle's perplexity and the ratio to it for Dyck LMs."""
  name = "perplexity"
  require_task(name, run, ("lm", "dyck_lm"))
  split = check_split(name, run, split)
  res = run.task.evaluate(run.params, split, temperature(run, tau))
  loss = float(res["loss"])
  out = {"split": split, "cross_entropy": loss,
         "perplexity": math.exp(min(loss, 700.0)),
         "bits_per_symbol": loss / LN2}
  # the task's own count: per character, also when a symbol is a bigram
  # and, with data.documents, the mean over lines of each line's own
  # per-symbol (document_loss) and per-character cost
  for k in ("bits_per_char", "document_loss", "document_bits_per_char",
            "oracle_perplexity", "perplexity_ratio", "wcpa",
            "close_accuracy"):
    if k in res:
      out[k] = float(res[k])
  if "oracle_perplexity" in res:
    out["oracle_cross_entropy"] = math.log(res["oracle_perplexity"])
  return out


# ---------------------------------------------------------------- per token

class TokenLosses(NamedTuple):
  targets: np.ndarray   # int64 [n] the scored token ids
  nll: np.ndarray       # float64 [n] their NLL (nats)
  index: np.ndarray     # int64 [n] their positions in the split's stream


def token_nll(run, split: str, tau: float | None = None) -> TokenLosses:
  """Every scored token of an LM split, in corpus order. The task streams
  the split as `task.eval_streams(split)` rows of N consecutive tokens
  (data.eval_batch_size, or test_batch_size for the test split; row r holds
  tokens r*N .. r*N + N - 1; the trailing len % B are dropped), each row's
  first token without context and not scored; or, with data.documents,
  reads it line by line, every token scored."""
  require_task("token_nll", run, ("lm",))
  split = check_split("token_nll", run, split)
  targets, nll, index = [], [], []
  for b in run.task.token_losses(run.params, split, temperature(run, tau)):
    scored = b.positions >= 0
    targets.append(b.targets[scored])
    nll.append(b.nll[scored])
    index.append(b.positions[scored])
  index = np.concatenate(index).astype(np.int64)
  order = np.argsort(index, kind="stable")
  return TokenLosses(np.concatenate(targets).astype(np.int64)[order],
                     np.concatenate(nll).astype(np.float64)[order],
                     index[order])


def train_counts(run) -> np.ndarray:
  """Occurrences of each id in the tokens the run was trained on."""
  return np.bincount(run.task.split_ids["train"],
                     minlength=len(run.task.vocab))


def frequency_bin(counts: np.ndarray) -> np.ndarray:
  """Index into BINS of each training count."""
  counts = np.asarray(counts)
  out = np.full(counts.shape, -1, np.int64)
  for i, (_, lo, hi) in enumerate(BINS):
    out[(counts >= lo) & (counts < (np.inf if hi is None else hi))] = i
  return out


def binned(nll: np.ndarray, bins: np.ndarray) -> dict:
  """Per bin (and over all tokens): token count, cross-entropy and
  perplexity (None for an empty bin)."""
  out = {}
  for i, (name, _, _) in enumerate(BINS + ((ALL, None, None),)):
    sel = np.ones(nll.shape, bool) if name == ALL else bins == i
    n = int(sel.sum())
    ce = float(nll[sel].mean()) if n else None
    out[name] = {"tokens": n, "cross_entropy": ce,
                 "perplexity": None if ce is None else math.exp(ce)}
  return out


def frequency(run, split: str | None = None, tau: float | None = None
              ) -> dict:
  """Perplexity per training-frequency bin of an LM run (Table 1 rows)."""
  name = "frequency"
  require_task(name, run, ("lm",))
  split = check_split(name, run, split)
  targets, nll, _ = token_nll(run, split, tau)
  bins = frequency_bin(train_counts(run)[targets])
  return {"split": split, "bins": binned(nll, bins),
          "bin_edges": {n: [lo, hi] for n, lo, hi in BINS}}


# ---------------------------------------------------------------- bootstrap

def chunk_sums(nll: np.ndarray, bins: np.ndarray, chunk: int
               ) -> tuple[np.ndarray, np.ndarray]:
  """Per consecutive chunk of `chunk` tokens and per bin (the last column:
  all tokens): NLL sums and token counts, each [num_chunks, len(BINS)+1]."""
  n_chunks = -(-nll.size // chunk)
  idx = np.arange(nll.size) // chunk
  nb = len(BINS) + 1
  sums = np.zeros((n_chunks, nb))
  counts = np.zeros((n_chunks, nb))
  for b in range(nb):
    sel = np.ones(nll.shape, bool) if b == nb - 1 else bins == b
    sums[:, b] = np.bincount(idx[sel], nll[sel], minlength=n_chunks)
    counts[:, b] = np.bincount(idx[sel], minlength=n_chunks)
  return sums, counts


def bootstrap_difference(nll_a: np.ndarray, nll_b: np.ndarray,
                         bins: np.ndarray, chunk: int = 100,
                         num_resamples: int = 10_000, seed: int = 0,
                         confidence: float = 0.95) -> dict:
  """Per bin: mean over resamples of perplexity(A) - perplexity(B) and its
  percentile CI; chunks resampled with replacement, paired across runs."""
  nll_a, nll_b = np.asarray(nll_a, np.float64), np.asarray(nll_b, np.float64)
  if nll_a.shape != nll_b.shape or nll_a.ndim != 1:
    raise ValueError(f"bootstrap_difference: the runs' token losses must be "
                     f"aligned 1-D arrays, got {nll_a.shape} and "
                     f"{nll_b.shape}")
  checks.check_int("bootstrap_difference: chunk", chunk, 1)
  checks.check_int("bootstrap_difference: num_resamples", num_resamples, 1)
  sa, n = chunk_sums(nll_a, bins, chunk)
  sb, _ = chunk_sums(nll_b, bins, chunk)
  rng = np.random.default_rng(seed)
  out = {}
  for b, (name, _, _) in enumerate(BINS + ((ALL, None, None),)):
    point = float(_ppl_diff(sa[:, b], sb[:, b], n[:, b]))
    if n[:, b].sum() == 0 or sa.shape[0] < 2:
      out[name] = {"mean_diff": None, "ci": [None, None], "diff": point,
                   "empty_resamples": None}
      continue
    with np.errstate(invalid="ignore", divide="ignore"):
      res = scipy.stats.bootstrap(
          (sa[:, b], sb[:, b], n[:, b]), _ppl_diff, paired=True,
          vectorized=True, n_resamples=num_resamples, method="percentile",
          confidence_level=confidence, rng=rng)
    dist = res.bootstrap_distribution
    empty = int(np.sum(~np.isfinite(dist)))
    out[name] = {"mean_diff": float(np.nanmean(dist)),
                 "ci": [float(res.confidence_interval.low),
                        float(res.confidence_interval.high)],
                 "diff": point, "empty_resamples": empty}
  return {"chunk": chunk, "num_chunks": int(sa.shape[0]),
          "num_resamples": num_resamples, "confidence": confidence,
          "seed": seed, "bins": out}


def _ppl_diff(sum_a, sum_b, count, axis=-1):
  """perplexity(A) - perplexity(B) from chunk sums (resamples on `axis`)."""
  total = np.sum(count, axis=axis)
  with np.errstate(invalid="ignore", divide="ignore"):
    return (np.exp(np.sum(sum_a, axis=axis) / total)
            - np.exp(np.sum(sum_b, axis=axis) / total))


def compare_frequency(run_a, run_b, split: str | None = None,
                      num_resamples: int = 10_000, chunk: int = 100,
                      seed: int = 0, tau_a: float | None = None,
                      tau_b: float | None = None) -> dict:
  """Both runs' binned perplexities and the bootstrap CI of A - B (Mahto
  Table 1: baseline - multi-timescale). Bins come from run A's training
  counts; both runs must score the same tokens."""
  name = "frequency"
  require_task(name, run_a, ("lm",))
  require_task(name, run_b, ("lm",))
  split = check_split(name, run_a, split)
  check_split(name, run_b, split)
  t_a, nll_a, _ = token_nll(run_a, split, tau_a)
  t_b, nll_b, _ = token_nll(run_b, split, tau_b)
  if t_a.shape != t_b.shape or not np.array_equal(t_a, t_b):
    raise fail(name, run_b, f"cannot compare with {run_a.workdir}: the runs "
               f"score different {split!r} tokens ({t_a.size} vs "
               f"{t_b.size}; same corpus, vocabulary, data.eval_batch_size and "
               "test_batch_size are needed)")
  bins = frequency_bin(train_counts(run_a)[t_a])
  return {"split": split, "runs": [run_a.workdir, run_b.workdir],
          "a": binned(nll_a, bins), "b": binned(nll_b, bins),
          "bootstrap": bootstrap_difference(nll_a, nll_b, bins, chunk,
                                            num_resamples, seed)}


# ---------------------------------------------------------------- figures

def plot_frequency(result: dict, path: str, labels=("run", "other")) -> str:
  """Perplexity per frequency bin (log scale); with a comparison, both runs
  and the bootstrap CI of their difference."""
  names = [n for n, _, _ in BINS] + [ALL]
  compared = "bootstrap" in result
  fig, axes = figure(2 if compared else 1, size=(11 if compared else 6, 3.8))
  ax = axes[0, 0]
  tables = [result["a"], result["b"]] if compared else [result["bins"]]
  x = np.arange(len(names))
  width = 0.8 / len(tables)
  for i, (table, label) in enumerate(zip(tables, labels)):
    ppl = [table[n]["perplexity"] or np.nan for n in names]
    ax.bar(x + (i - (len(tables) - 1) / 2) * width, ppl, width, label=label)
  ax.set_yscale("log")
  ax.set_xticks(x, [f"{n}\n({tables[0][n]['tokens']})" for n in names],
                fontsize=8)
  ax.set_ylabel(f"{result['split']} perplexity")
  ax.set_title("perplexity by training frequency")
  if compared:
    ax.legend()
    ax = axes[0, 1]
    boot = result["bootstrap"]["bins"]
    mean = np.array([boot[n]["mean_diff"] if boot[n]["mean_diff"] is not None
                     else np.nan for n in names])
    lo = np.array([boot[n]["ci"][0] if boot[n]["ci"][0] is not None
                   else np.nan for n in names])
    hi = np.array([boot[n]["ci"][1] if boot[n]["ci"][1] is not None
                   else np.nan for n in names])
    ax.errorbar(x, mean, yerr=[mean - lo, hi - mean], fmt="o", capsize=4)
    ax.axhline(0.0, color="gray", lw=0.8)
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylabel(f"perplexity {labels[0]} - {labels[1]}")
    conf = result["bootstrap"]["confidence"]
    ax.set_title(f"bootstrap mean and {conf:.0%} CI "
                 f"({result['bootstrap']['num_resamples']} resamples)")
  return save(fig, path)


__all__ = ["ALL", "BINS", "binned", "bootstrap_difference", "chunk_sums",
           "compare_frequency", "frequency", "frequency_bin", "perplexity",
           "plot_frequency", "TokenLosses", "token_nll", "train_counts"]
