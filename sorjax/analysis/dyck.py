"""Bracket-language analyses of restored runs.

    ldpa(run)                 LDPA per closing distance and WCPA, the 80%
                              rule of Lin et al. 4.2 (`dyck_metrics`), for
                              dyck_lm and dyck_closing runs; plot_ldpa draws
                              Lin et al. Fig. 2.
    pcfg_timescales(run)      per-sequence accuracy against the sequence's
                              maximum timescale on the Dyck-2 PCFG (Mahto et
                              al. Fig. 2 left) and the distribution of all
                              training timescales (Fig. 2 right).

A PCFG sequence is correct when every step's thresholded prediction of the
admissible closing brackets is (Mahto 3.2.3, as `DyckPCFGTask.evaluate`).
"""

from __future__ import annotations

import numpy as np

from sorjax import checks
from sorjax.analysis import dyck_metrics
from sorjax.analysis.common import (check_split, figure, require_task, save,
                                    temperature)
from sorjax.training.tasks.base import step_mask


def ldpa_counts(run, split: str, tau: float | None = None
                ) -> dict[int, tuple[int, int]]:
  """{closing distance: (correct, total)} over a split."""
  task = run.task
  counts = {}
  for batch, seqs, lp in task.log_probs(run.params, split,
                                        temperature(run, tau)):
    counts = dyck_metrics.merge(counts, task.ldpa_batch(batch, seqs, lp))
  return counts


def ldpa(run, splits=("dev", "test"), tau: float | None = None) -> dict:
  """Per split: LDPA per closing distance, WCPA and overall closing
  accuracy, with the 80% rule."""
  name = "ldpa"
  require_task(name, run, ("dyck_lm", "dyck_closing"))
  out = {"k": run.task.k, "m": run.task.lang.m,
         "threshold": dyck_metrics.THRESHOLD, "splits": {}}
  for split in splits:
    split = check_split(name, run, split)
    counts = ldpa_counts(run, split, tau)
    out["splits"][split] = {
        "ldpa": {d: {"correct": c, "total": n, "accuracy": c / n}
                 for d, (c, n) in sorted(counts.items())},
        "wcpa": dyck_metrics.wcpa(counts),
        "close_accuracy": dyck_metrics.accuracy(counts)}
  return out


def plot_ldpa(result: dict, path: str, label: str = "") -> str:
  """LDPA vs closing distance per split (Lin et al. Fig. 2)."""
  fig, axes = figure()
  ax = axes[0, 0]
  for split, r in result["splits"].items():
    d = np.array([int(x) for x in r["ldpa"]])
    acc = np.array([v["accuracy"] for v in r["ldpa"].values()])
    ax.plot(d, acc, marker=".", label=f"{label}{split} (WCPA {r['wcpa']:.2f})")
  ax.set_xlabel("closing distance")
  ax.set_ylabel("LDPA")
  ax.set_ylim(-0.02, 1.02)
  ax.legend()
  ax.set_title(f"Dyck-({result['k']},{result['m']}) bracket prediction")
  return save(fig, path)


# ---------------------------------------------------------------- PCFG

def sequence_correct(task, params, split: str, tau: float
                     ) -> tuple[np.ndarray, np.ndarray]:
  """(sequence indices, correct?) over a PCFG split."""
  idx, ok_all = [], []
  for batch, b, probs, _ in task.predictions(params, split, tau):
    mask = np.asarray(step_mask(batch.lengths, probs.shape[1]))
    ok = np.all((probs > 0.5) == (b["targets"] > 0.5), -1) | ~mask
    real = batch.index >= 0
    idx.append(batch.index[real])
    ok_all.append(np.all(ok, -1)[real])
  return np.concatenate(idx), np.concatenate(ok_all)


def pcfg_timescales(run, split: str | None = None, bin_width: int = 25,
                    tau: float | None = None) -> dict:
  """Accuracy per bin of the sequences' maximum timescale, and the
  distribution of every pair's timescale in the training data."""
  name = "pcfg_timescales"
  require_task(name, run, ("dyck_pcfg",))
  split = check_split(name, run, split)
  checks.check_int(f"{name}: bin_width", bin_width, 1)
  task = run.task
  idx, ok = sequence_correct(task, run.params, split, temperature(run, tau))
  seqs = task.splits[split]
  max_ts = np.array([task.grammar.max_timescale(seqs[i]) for i in idx])
  edges = np.arange(0, max_ts.max() + bin_width + 1, bin_width)
  which = np.digitize(max_ts, edges) - 1    # bin [edges[i], edges[i+1])
  bins = []
  for i in range(len(edges) - 1):
    sel = which == i
    if sel.any():
      bins.append({"low": int(edges[i]), "high": int(edges[i + 1]),
                   "sequences": int(sel.sum()), "correct": int(ok[sel].sum()),
                   "accuracy": float(ok[sel].mean())})
  train_ts = np.concatenate([task.grammar.timescales(s)
                             for s in task.splits["train"]])
  hist = np.bincount(train_ts)
  return {"split": split, "sequence_accuracy": float(ok.mean()),
          "sequences": int(ok.size), "bin_width": bin_width, "bins": bins,
          "per_sequence": {"max_timescale": max_ts, "correct": ok},
          "train_timescales": {"timescale": np.flatnonzero(hist),
                               "count": hist[hist > 0]}}


def plot_pcfg_timescales(result: dict, path: str) -> str:
  """Accuracy vs maximum timescale; training timescale distribution."""
  fig, axes = figure(2, size=(10, 3.6))
  ax = axes[0, 0]
  mid = [(b["low"] + b["high"]) / 2 for b in result["bins"]]
  ax.plot(mid, [100 * b["accuracy"] for b in result["bins"]], marker="o")
  ax.set_xlabel("maximum timescale in the sequence")
  ax.set_ylabel("% sequences correct")
  ax.set_ylim(-2, 102)
  ax.set_title(f"{result['split']}: {100 * result['sequence_accuracy']:.1f}% "
               f"of {result['sequences']} correct")
  ax = axes[0, 1]
  t = result["train_timescales"]
  ax.loglog(t["timescale"], t["count"], marker=".", ls="none")
  ax.set_xlabel("timescale (closing - opening position)")
  ax.set_ylabel("count in train")
  ax.set_title("timescales of the training data")
  return save(fig, path)


__all__ = ["ldpa", "ldpa_counts", "pcfg_timescales", "plot_ldpa",
           "plot_pcfg_timescales", "sequence_correct"]
