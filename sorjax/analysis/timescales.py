"""Unit timescales of LSTM layers (Mahto, Vo, Turek & Huth).

    estimate(run)        T_est = -1 / log(f_bar) per unit (eq. 3), f_bar the
                         mean forget gate over a split's sequences; against
                         the assigned timescales (mts_lstm) or those its
                         forget bias implies (eq. 2), with correlations (Fig.
                         4); KS statistics against inverse-gamma and narrow
                         Gaussian families (Fig. 1)
    forget_heatmap(run)  one sequence's forget gates, units sorted by their
                         mean and averaged in groups (A.3, Fig. 5)
    word_ablation(run)   decay of the cell-state change after removing one
                         word, per layer (Fig. 6) and per group of units
                         sorted by timescale (Fig. 7-8)

Only lstm and mts_lstm layers have the forget gates these use; other
layers of a stack are run but not analysed.

Procedures the paper leaves open, as done here:
* f_bar averages every valid step of the split (N sequences x K steps in
  eq. 3); LM splits stream in the task's eval windows, state carried.
* Fig. 1's families: InvGamma(alpha, scale 1) over an alpha grid and
  N(mu, sigma=0.1) over a mu grid; the KS statistic is
  `scipy.stats.kstest(T_est, family.cdf)` on the units' finite T_est
  (f_bar = 1 in float32 gives T = inf, counted and left out).
* Word ablation (A.4): the ablated run sees x_t = 0 at one position t0 and
  starts from the same state; the change is ||c_t - c~_t||_2 over a layer's
  (or a group's) units, divided by its value at t0, then averaged over
  sequences for each t - t0. Groups: units sorted by assigned timescale
  (mts_lstm) or by T_est (lstm), cut into consecutive groups.
"""

from __future__ import annotations

import numpy as np
import scipy.stats

from sorjax import checks
from sorjax.analysis import traces
from sorjax.analysis.common import (FORGET_GATE_CELLS, cell_name,
                                    check_split, fail, figure, layer_cells,
                                    require_layers, require_task, save,
                                    temperature)
from sorjax.cells import mts_lstm

TOKEN_TASKS = ("lm", "dyck_lm", "dyck_closing", "dyck_pcfg")
ALPHAS = tuple(np.round(np.linspace(0.1, 3.0, 30), 3))
MUS = tuple(np.round(np.linspace(0.1, 5.0, 50), 3))
SIGMA = 0.1


def _layers(name, run) -> list[int]:
  require_task(name, run, TOKEN_TASKS)
  return require_layers(name, run, FORGET_GATE_CELLS, "forget gates")


def timescale_from_forget(f_bar) -> np.ndarray:
  """Eq. 3: T_est = -1 / log(f_bar), in float64 (f_bar = 1 -> inf)."""
  f = np.asarray(f_bar, np.float64)
  with np.errstate(divide="ignore"):
    return np.where(f >= 1.0, np.inf, -1.0 / np.log(f))


def bias_timescales(cell, params) -> np.ndarray:
  """Eq. 2: the timescale each unit's forget bias alone gives."""
  H = cell.hidden_size
  if cell_name(cell) == "mts_lstm":
    b_f = np.asarray(cell.bias(params), np.float64)[H:2 * H]
  else:
    b_f = np.asarray(params["b"], np.float64)[H:2 * H] + cell.forget_bias
  return mts_lstm.timescale(b_f)


def assigned_timescales(cell) -> np.ndarray | None:
  """mts_lstm's assigned T per unit (its spec's, even when learned)."""
  return cell.unit_timescales() if cell_name(cell) == "mts_lstm" else None


def mean_forget_gates(run, split: str, tau: float | None = None,
                      max_tokens: int | None = None,
                      max_sequences: int | None = None) -> dict[int, dict]:
  """Per lstm-like layer: f_bar [H] and the number of steps averaged."""
  layers = _layers("mean_forget_gates", run)
  sums = {l: 0.0 for l in layers}
  steps = 0
  for out, mask in traces.split_traces(run.task, run.params, split,
                                       temperature(run, tau), max_tokens,
                                       max_sequences):
    m = mask[..., None]
    for l in layers:
      f = np.asarray(out.layers[l].f, np.float64)
      sums[l] = sums[l] + np.sum(np.where(m, f, 0.0), axis=(0, 1))
    steps += int(mask.sum())
  return {l: {"mean_forget": sums[l] / steps, "steps": steps}
          for l in layers}


def correlation(reference, estimate) -> dict:
  """Pearson r of log10 T and Spearman rho over units where both are
  finite and positive (None when undefined, e.g. constant timescales)."""
  a, b = np.asarray(reference, np.float64), np.asarray(estimate, np.float64)
  ok = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
  out = {"units": int(ok.sum()), "pearson_log10": None, "spearman": None}
  if ok.sum() >= 2 and np.ptp(a[ok]) > 0 and np.ptp(b[ok]) > 0:
    out["pearson_log10"] = float(scipy.stats.pearsonr(
        np.log10(a[ok]), np.log10(b[ok])).statistic)
    out["spearman"] = float(scipy.stats.spearmanr(a[ok], b[ok]).statistic)
  return out


def ks_fit(T, alphas=ALPHAS, mus=MUS, sigma: float = SIGMA) -> dict:
  """KS statistic of the finite T against InvGamma(alpha, scale=1) for each
  alpha and N(mu, sigma) for each mu (Mahto Fig. 1); the best of each."""
  T = np.asarray(T, np.float64)
  finite = T[np.isfinite(T)]
  if finite.size == 0:
    raise ValueError("ks_fit: no finite timescales to fit")
  ig = [float(scipy.stats.kstest(finite, scipy.stats.invgamma(a).cdf)
              .statistic) for a in alphas]
  ng = [float(scipy.stats.kstest(finite, scipy.stats.norm(m, sigma).cdf)
              .statistic) for m in mus]
  return {"units": int(finite.size), "non_finite": int(T.size - finite.size),
          "inverse_gamma": {"alpha": list(alphas), "ks": ig,
                            "best_alpha": float(alphas[int(np.argmin(ig))]),
                            "best_ks": min(ig)},
          "narrow_gaussian": {"mu": list(mus), "sigma": sigma, "ks": ng,
                              "best_mu": float(mus[int(np.argmin(ng))]),
                              "best_ks": min(ng)},
          "best_family": ("inverse_gamma" if min(ig) <= min(ng)
                          else "narrow_gaussian")}


def estimate(run, split: str | None = None, tau: float | None = None,
             max_tokens: int | None = None,
             max_sequences: int | None = None, alphas=ALPHAS, mus=MUS,
             sigma: float = SIGMA) -> dict:
  """T_est per unit of every lstm / mts_lstm layer, its correlation with
  the assigned (or bias) timescales, and the KS fits of all units."""
  name = "timescales"
  layers = _layers(name, run)
  split = check_split(name, run, split)
  stats = mean_forget_gates(run, split, tau, max_tokens, max_sequences)
  cells = layer_cells(run)
  out = {"split": split, "steps": stats[layers[0]]["steps"], "layers": {}}
  pooled = []
  for l in layers:
    cell, params = cells[l], run.params[f"layer_{l}"]
    T_est = timescale_from_forget(stats[l]["mean_forget"])
    assigned = assigned_timescales(cell)
    bias_T = bias_timescales(cell, params)
    ref = assigned if assigned is not None else bias_T
    out["layers"][l] = {
        "cell": cell_name(cell), "mean_forget": stats[l]["mean_forget"],
        "T_est": T_est, "assigned": assigned, "bias_timescale": bias_T,
        "reference": "assigned" if assigned is not None else
                     "bias_timescale",
        "correlation": correlation(ref, T_est),
        "ks": ks_fit(T_est, alphas, mus, sigma)}
    pooled.append(T_est)
  out["ks"] = ks_fit(np.concatenate(pooled), alphas, mus, sigma)
  return out


def plot_scatter(result: dict, path: str) -> str:
  """Reference (assigned or bias) vs estimated timescale per unit, one
  panel per layer, log-log (Mahto Fig. 4)."""
  layers = result["layers"]
  fig, axes = figure(len(layers), size=(4.2 * len(layers), 4.0))
  for ax, (l, r) in zip(axes[0], layers.items()):
    ref = np.asarray(r["assigned"] if r["assigned"] is not None
                     else r["bias_timescale"], np.float64)
    est = np.asarray(r["T_est"], np.float64)
    ok = np.isfinite(ref) & np.isfinite(est) & (ref > 0) & (est > 0)
    ax.loglog(ref[ok], est[ok], ".", alpha=0.7)
    if ok.any():
      lo = min(ref[ok].min(), est[ok].min())
      hi = max(ref[ok].max(), est[ok].max())
      ax.plot([lo, hi], [lo, hi], color="gray", lw=0.8)
    c = r["correlation"]["pearson_log10"]
    ax.set_title(f"layer {l} ({r['cell']})" +
                 ("" if c is None else f": r(log) = {c:.2f}"))
    ax.set_xlabel(f"{r['reference'].replace('_', ' ')} T")
    ax.set_ylabel("estimated T (eq. 3)")
  return save(fig, path)


def plot_ks(result: dict, path: str) -> str:
  """The empirical CDF of T_est (all layers) with the best fit of each
  family, and the KS statistic along each family's grid (Mahto Fig. 1)."""
  ks = result["ks"]
  T = np.concatenate([np.asarray(r["T_est"], np.float64)
                      for r in result["layers"].values()])
  T = np.sort(T[np.isfinite(T)])
  fig, axes = figure(3, size=(13, 3.6))
  ax = axes[0, 0]
  ax.step(T, np.arange(1, T.size + 1) / T.size, where="post",
          label=f"T_est ({T.size} units)")
  grid = np.geomspace(max(T.min() / 2, 1e-3), T.max() * 2, 400)
  ig, ng = ks["inverse_gamma"], ks["narrow_gaussian"]
  a, mu = ig["best_alpha"], ng["best_mu"]
  ax.plot(grid, scipy.stats.invgamma(a).cdf(grid), "--",
          label=f"InvGamma(alpha={a:g}): KS {ig['best_ks']:.2f}")
  ax.plot(grid, scipy.stats.norm(mu, ng["sigma"]).cdf(grid), ":",
          label=f"N(mu={mu:g}, {ng['sigma']:g}): KS {ng['best_ks']:.2f}")
  ax.set_xscale("log")
  ax.set_xlabel("timescale T")
  ax.set_ylabel("cumulative fraction of units")
  ax.legend(fontsize=7)
  for ax, fam, key in ((axes[0, 1], "inverse_gamma", "alpha"),
                       (axes[0, 2], "narrow_gaussian", "mu")):
    ax.plot(ks[fam][key], ks[fam]["ks"], marker=".")
    ax.set_xlabel(key)
    ax.set_ylabel("KS statistic")
    ax.set_title(fam.replace("_", " "))
  return save(fig, path)


# ---------------------------------------------------------------- heatmap

def group_rows(values: np.ndarray, order: np.ndarray, group: int
               ) -> np.ndarray:
  """values [H, ...] reordered by `order`, then averaged over consecutive
  groups of `group` units (the last group may be smaller)."""
  v = np.asarray(values, np.float64)[order]
  starts = np.arange(0, v.shape[0], group)
  return np.stack([v[s:s + group].mean(0) for s in starts])


def forget_heatmap(run, split: str | None = None, index: int = 0,
                   group: int | None = None, tau: float | None = None
                   ) -> dict:
  """Forget gates of sequence `index` of a split (`traces.sample`; an LM
  split's index-th window of eval_bptt tokens, from a zero state), per
  lstm-like layer: units sorted by increasing mean gate over the sequence,
  averaged in groups of `group` (default 10, or 1 below 100 units)."""
  name = "forget_heatmap"
  layers = _layers(name, run)
  split = check_split(name, run, split)
  checks.check_int(f"{name}: index", index, 0)
  tokens, lengths = traces.sample(run.task, split, index + 1)
  if index >= len(lengths) or lengths[index] == 0:
    raise ValueError(f"{name}: index {index} out of range: split {split!r} "
                     f"has {len(lengths)} sequences")
  tokens, lengths = tokens[index:index + 1], lengths[index:index + 1]
  out = traces.trace(run.task, run.params, tokens, lengths,
                     temperature(run, tau))
  n = int(lengths[0])
  cells = layer_cells(run)
  res = {"split": split, "index": index, "length": n,
         "tokens": np.asarray(tokens[0, :n]), "layers": {}}
  for l in layers:
    f = np.asarray(out.layers[l].f[0, :n], np.float64).T         # [H, T]
    H = f.shape[0]
    g = group or (10 if H >= 100 else 1)
    order = np.argsort(f.mean(1), kind="stable")
    assigned = assigned_timescales(cells[l])
    res["layers"][l] = {
        "cell": cell_name(cells[l]), "group": g, "order": order,
        "gates": group_rows(f, order, g),
        "assigned": None if assigned is None else
                    group_rows(assigned, order, g)}
  return res


def plot_forget_heatmap(result: dict, path: str) -> str:
  layers = result["layers"]
  fig, axes = figure(1, len(layers), size=(8, 2.6 * len(layers)))
  for ax, (l, r) in zip(axes[:, 0], layers.items()):
    g = np.asarray(r["gates"])
    im = ax.imshow(g, aspect="auto", vmin=0.0, vmax=1.0, cmap="viridis",
                   interpolation="nearest")
    ax.set_title(f"layer {l} ({r['cell']}): units sorted by mean forget "
                 f"gate, groups of {r['group']}", fontsize=9)
    ax.set_xlabel("time step")
    if r["assigned"] is not None:
      step = max(1, len(g) // 8)
      rows = np.arange(0, len(g), step)
      ax.set_yticks(rows, [f"T={np.asarray(r['assigned'])[i]:.3g}"
                           for i in rows], fontsize=7)
    else:
      ax.set_ylabel("unit group")
    fig.colorbar(im, ax=ax, label="f_t")
  return save(fig, path)


# ---------------------------------------------------------------- ablation

def word_ablation(run, split: str | None = None, position: int = 0,
                  group_size: int | None = None, tau: float | None = None,
                  max_tokens: int | None = None,
                  max_sequences: int | None = 256) -> dict:
  """Normalised cell-state change after zeroing the input at `position`,
  per lstm-like layer and per group of units sorted by timescale. Dyck
  splits: the first max_sequences sequences; LM splits: the windows of
  eval_bptt tokens of the first max_tokens tokens (default max_sequences
  windows), each ablated at `position` from the state the stream reached;
  with data.documents, its first max_sequences lines, each from h_0.
  Sequences that end before `position` (whole batches of them, such as a
  bucket of short lines) are left out; `sequences` counts the rest."""
  name = "word_ablation"
  layers = _layers(name, run)
  split = check_split(name, run, split)
  checks.check_int(f"{name}: position", position, 0)
  tau = temperature(run, tau)
  task = run.task
  if (task.name == "lm" and not task.documents and max_tokens is None
      and max_sequences):
    # every window is kept in memory: as many windows as max_sequences
    max_tokens = int(max_sequences) * task.data_cfg.eval_bptt
  deltas = {l: [] for l in layers}      # per batch [B, T - position, H]
  valid = []
  f_sum, steps, longest = {l: 0.0 for l in layers}, 0, 0
  carries = None
  for tokens, lengths, carry_over in traces.batches(
      task, split, max_tokens, max_sequences):
    start = carries if carry_over else None
    base = traces.trace(task, run.params, tokens, lengths, tau, start)
    carries = base.final
    T = np.shape(tokens)[1]
    mask = np.arange(T)[None, :] < np.asarray(lengths)[:, None]
    for l in layers:  # f_bar (T_est) over every valid step read
      f = np.asarray(base.layers[l].f, np.float64)
      f_sum[l] = f_sum[l] + np.sum(np.where(mask[..., None], f, 0.0), (0, 1))
    steps += int(mask.sum())
    longest = max(longest, int(np.max(lengths, initial=0)))
    if T <= position:  # no sequence of this batch (a bucket of short
      continue         # lines, say) reaches `position`
    abl = traces.trace(task, run.params, tokens, lengths, tau, start,
                       ablate=position)
    valid.append(mask[:, position:])
    for l in layers:
      d = np.asarray(base.layers[l].c, np.float64) - np.asarray(
          abl.layers[l].c, np.float64)
      deltas[l].append(d[:, position:])
  if not steps:
    raise fail(name, run, f"split {split!r} has no sequences")
  if not any(v[:, 0].any() for v in valid):
    raise ValueError(f"{name}: position {position} is beyond every sequence "
                     f"read of split {split!r} (the longest has {longest} "
                     "steps)")
  K = max(v.shape[1] for v in valid)
  valid = np.concatenate([_pad(v, K) for v in valid])
  valid &= valid[:, :1]                 # sequences that reach `position`
  cells = layer_cells(run)
  res = {"split": split, "position": position,
         "sequences": int(valid[:, 0].sum()), "layers": {}}
  for l in layers:
    d = np.concatenate([_pad(x, K) for x in deltas[l]])   # [N, K, H]
    H = d.shape[-1]
    assigned = assigned_timescales(cells[l])
    T_key = (assigned if assigned is not None else
             timescale_from_forget(f_sum[l] / steps))
    order = np.argsort(T_key, kind="stable")
    size = group_size or min(100, max(1, H // 4))
    groups = [order[s:s + size] for s in range(0, H, size)]
    res["layers"][l] = {
        "cell": cell_name(cells[l]), "group_by":
        "assigned" if assigned is not None else "T_est",
        "curve": decay_curve(d, valid),
        "groups": [{"units": g, "mean_timescale": float(np.mean(T_key[g])),
                    "curve": decay_curve(d[..., g], valid)} for g in groups]}
  return res


def _pad(a, K):
  pad = [(0, 0)] * a.ndim
  pad[1] = (0, K - a.shape[1])
  return np.pad(a, pad)


def decay_curve(delta: np.ndarray, valid: np.ndarray) -> dict:
  """delta [N, K, U] state differences from the ablated step on; valid
  [N, K]. Per sequence ||delta_t|| / ||delta_0||, averaged over the
  sequences valid at each t (sequences with ||delta_0|| = 0 are skipped
  and counted)."""
  norm = np.linalg.norm(delta, axis=-1)            # [N, K]
  first = norm[:, 0]
  use = valid & (first > 0)[:, None]
  with np.errstate(invalid="ignore", divide="ignore"):
    ratio = np.where(use, norm / np.where(first > 0, first, 1.0)[:, None],
                     0.0)
  count = use.sum(0)
  with np.errstate(invalid="ignore", divide="ignore"):
    mean = np.where(count > 0, ratio.sum(0) / np.maximum(count, 1), np.nan)
  K = int(np.max(np.flatnonzero(count > 0), initial=-1)) + 1
  return {"mean": mean[:K], "sequences": count[:K],
          "skipped": int(np.sum(valid[:, 0] & (first == 0)))}


def plot_ablation(result: dict, path: str) -> str:
  """Per-layer decay curves (Fig. 6) and per-group curves of each layer
  (Fig. 7-8)."""
  layers = result["layers"]
  n = 1 + len(layers)
  fig, axes = figure(n, size=(4.2 * n, 3.6))
  ax = axes[0, 0]
  for l, r in layers.items():
    ax.plot(r["curve"]["mean"], label=f"layer {l} ({r['cell']})")
  ax.set_xlabel(f"steps after the ablated word (t0 = {result['position']})")
  ax.set_ylabel("normalised cell-state change")
  ax.legend(fontsize=8)
  for ax, (l, r) in zip(axes[0, 1:], layers.items()):
    for g in r["groups"]:
      ax.plot(g["curve"]["mean"], label=f"T~{g['mean_timescale']:.3g}")
    ax.set_title(f"layer {l}: unit groups by {r['group_by']}", fontsize=9)
    ax.set_xlabel("steps after the ablated word")
    ax.legend(fontsize=6, ncol=2)
  return save(fig, path)


__all__ = ["ALPHAS", "MUS", "assigned_timescales", "bias_timescales",
           "correlation", "decay_curve", "estimate", "forget_heatmap",
           "group_rows", "ks_fit", "mean_forget_gates", "plot_ablation",
           "plot_forget_heatmap", "plot_ks", "plot_scatter",
           "timescale_from_forget", "word_ablation"]
