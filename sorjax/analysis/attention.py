"""Second-order LSTMs of Lin, Benditshtull & Spinner (sec. 5): are the S
cells different, and which tokens go to which cell?

    principal_angles(run)   principal angles between the subspaces of every
                            pair of hidden-to-hidden matrices W_hh^(s)
                            (PABS, Fig. 4-5)
    attention_map(run)      alpha_t per token of sample sequences; rendered
                            by heatmap_html / plot_heatmap with each token
                            coloured by s* = argmax_s alpha_{t,s} and its
                            intensity alpha_{t,s*} (Fig. 6)

W_hh^(s) is PyTorch's weight_hh of LSTM cell s, [4H, H]; ours is its
transpose W_h[s] [H, 4H] (row convention). The angles are those between the
column spaces of the weight_hh matrices (subspaces of dimension H of
R^{4H}), `scipy.linalg.subspace_angles(W_h[s].T, W_h[r].T)`, listed in
increasing order (principal vector 1 = the smallest angle). All angles > 0
means the subspaces intersect only in 0: the cells differ.
"""

from __future__ import annotations

import html
import itertools

import numpy as np
import scipy.linalg

from sorjax.analysis import traces
from sorjax.analysis.common import (MULTI_CELL_LSTMS, cell_name,
                                    check_split, fail, figure, layer_cells,
                                    require_layers, require_task, save,
                                    temperature)

TOKEN_TASKS = ("lm", "dyck_lm", "dyck_closing", "dyck_pcfg")
WHAT = "S hidden-to-hidden matrices W_h[s] (Lin et al. 3.2)"


def pabs(W_a: np.ndarray, W_b: np.ndarray) -> np.ndarray:
  """Principal angles in degrees, increasing, between the column spaces of
  weight_hh = W_a.T and W_b.T (W_* [H, 4H] in our row convention)."""
  theta = scipy.linalg.subspace_angles(np.asarray(W_a, np.float64).T,
                                       np.asarray(W_b, np.float64).T)
  return np.sort(np.degrees(theta))


def principal_angles(run) -> dict:
  """Per multi-cell LSTM layer: the angles of every pair of cells."""
  name = "principal_angles"
  require_task(name, run, TOKEN_TASKS)
  layers = require_layers(name, run, MULTI_CELL_LSTMS, WHAT)
  cells = layer_cells(run)
  out = {"layers": {}}
  for l in layers:
    W = np.asarray(run.params[f"layer_{l}"]["W_h"])        # [S, H, 4H]
    pairs = {f"{s}-{r}": pabs(W[s], W[r])
             for s, r in itertools.combinations(range(W.shape[0]), 2)}
    out["layers"][l] = {"cell": cell_name(cells[l]), "num_cells": W.shape[0],
                        "hidden_size": W.shape[1], "degrees": pairs,
                        "min_degrees": min((float(v.min()) for v in
                                            pairs.values()), default=None)}
  return out


def plot_principal_angles(result: dict, path: str) -> str:
  layers = result["layers"]
  fig, axes = figure(len(layers), size=(5.0 * len(layers), 3.6))
  for ax, (l, r) in zip(axes[0], layers.items()):
    for pair, deg in r["degrees"].items():
      deg = np.asarray(deg)
      ax.plot(np.arange(1, deg.size + 1), deg, marker=".",
              label=f"cells {pair}")
    ax.set_ylim(0, 90)
    ax.set_xlabel("principal vector")
    ax.set_ylabel("angle (degrees)")
    ax.set_title(f"layer {l}: PABS of W_hh^(s)", fontsize=10)
    ax.legend(fontsize=7)
  return save(fig, path)


# ---------------------------------------------------------------- heatmaps

def _samples(run, split, num, text):
  """(tokens [N, T], lengths [N], symbol strings per sequence)."""
  if text is not None:
    ids = np.asarray(run.encode(text), np.int32)
    return ids[None], np.array([ids.size], np.int32), [_symbols(run, ids)]
  tokens, lengths = traces.sample(run.task, split, num)
  return tokens, lengths, [_symbols(run, tokens[i, :n])
                           for i, n in enumerate(lengths)]


def _symbols(run, ids) -> list[str]:
  task = run.task
  if task.name == "lm":
    return list(task.vocab.decode(ids))
  vocab = task.lang.vocab if hasattr(task, "lang") else task.grammar.vocab
  return [vocab[int(i)] for i in ids]


def attention_map(run, split: str | None = None, num: int = 4,
                  text: str | None = None, tau: float | None = None) -> dict:
  """alpha_t of each multi-cell LSTM layer for the first `num` sequences of
  a split (`traces.sample`: an LM split's first windows, each from a zero
  state), or for `text` encoded with the run's vocabulary."""
  name = "attention_heatmap"
  require_task(name, run, TOKEN_TASKS)
  layers = require_layers(name, run, MULTI_CELL_LSTMS, WHAT)
  split = check_split(name, run, split)
  tau = temperature(run, tau)
  tokens, lengths, symbols = _samples(run, split, num, text)
  if not symbols or not any(len(s) for s in symbols):
    raise fail(name, run, f"no tokens to show from split {split!r}")
  out = traces.trace(run.task, run.params, tokens, lengths, tau)
  res = {"split": None if text is not None else split, "temperature": tau,
         "layers": {}}
  for l in layers:
    alpha = np.asarray(out.layers[l].alpha, np.float64)
    res["layers"][l] = {
        "num_cells": alpha.shape[-1],
        "sequences": [{"tokens": symbols[i],
                       "alpha": alpha[i, :len(symbols[i])]}
                      for i in range(len(symbols))]}
  return res


_PALETTE = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40),
            (148, 103, 189), (140, 86, 75), (227, 119, 194), (127, 127, 127),
            (188, 189, 34), (23, 190, 207))


def _colour(s: int, w: float) -> tuple[float, float, float, float]:
  r, g, b = _PALETTE[s % len(_PALETTE)]
  return (r / 255, g / 255, b / 255, float(w))


def heatmap_html(result: dict) -> str:
  """One block per layer and sequence: token t on the colour of
  s* = argmax alpha_t with opacity alpha_{t,s*} (Lin et al. Fig. 6)."""
  parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'>"
           "<title>attention heatmap</title><style>body{font-family:"
           "monospace} span.t{padding:1px 3px;margin:1px;display:"
           "inline-block;border-radius:3px}</style></head><body>"]
  for l, r in result["layers"].items():
    legend = " ".join(
        f"<span class='t' style='background:rgba{_rgba(s, 1.0)}'>cell {s}"
        "</span>" for s in range(r["num_cells"]))
    parts.append(f"<h3>layer {l}</h3><p>{legend}</p>")
    for seq in r["sequences"]:
      alpha = np.asarray(seq["alpha"])
      spans = []
      for tok, a in zip(seq["tokens"], alpha):
        s = int(np.argmax(a))
        spans.append(
            f"<span class='t' title='cell {s}: {a[s]:.3f}' style='background:"
            f"rgba{_rgba(s, a[s])}'>{html.escape(tok)}</span>")
      parts.append("<p>" + "".join(spans) + "</p>")
  parts.append("</body></html>")
  return "\n".join(parts)


def _rgba(s, w):
  r, g, b = _PALETTE[s % len(_PALETTE)]
  return (r, g, b, round(float(w), 3))


def plot_heatmap(result: dict, path: str, width: int = 80) -> str:
  """The same heatmap as a PNG: tokens wrapped at `width` characters,
  each layer's sequences under a "layer l" heading (as the HTML's)."""
  rows = []                          # (layer, [(token, s*, weight), ...])
  for l, r in result["layers"].items():
    rows.append((l, None))           # the layer's heading
    for seq in r["sequences"]:
      line, used = [], 0
      for tok, a in zip(seq["tokens"], np.asarray(seq["alpha"])):
        s = int(np.argmax(a))
        if used + len(tok) + 1 > width and line:
          rows.append((l, line))
          line, used = [], 0
        line.append((tok, s, float(a[s])))
        used += len(tok) + 1
      rows.append((l, line))
  fig, axes = figure(1, 1, size=(0.11 * width + 1, 0.32 * len(rows) + 0.8))
  ax = axes[0, 0]
  ax.set_xlim(0, width)
  ax.set_ylim(len(rows), -0.5)
  ax.axis("off")
  for y, (l, line) in enumerate(rows):
    if line is None:
      ax.text(0, y, f"layer {l}", fontsize=9, fontweight="bold",
              va="center")
      continue
    x = 0.0
    for tok, s, w in line:
      ax.text(x, y, tok, family="monospace", fontsize=8, va="center",
              bbox=dict(facecolor=_colour(s, w), edgecolor="none", pad=1.5))
      x += len(tok) + 1
  cells = max(r["num_cells"] for r in result["layers"].values())
  for s in range(cells):  # legend patches
    ax.scatter([], [], color=_colour(s, 1.0)[:3], label=f"cell {s}")
  ax.legend(loc="lower right", fontsize=7, ncol=cells, frameon=False,
            bbox_to_anchor=(1.0, 1.0))
  return save(fig, path)


__all__ = ["attention_map", "heatmap_html", "pabs", "plot_heatmap",
           "plot_principal_angles", "principal_angles"]
