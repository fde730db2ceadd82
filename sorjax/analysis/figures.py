"""Figures written at the end of a training run (`config.figures`)."""

from __future__ import annotations

import os

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sorjax.analysis import dyck_metrics  # noqa: E402


def ldpa_figure(task, params, path: str, temperature: float = 1.0,
                splits=("dev", "test")) -> str:
  """LDPA vs closing distance (Lin et al. Fig. 2) for a Dyck LM task."""
  fig, ax = plt.subplots(figsize=(6, 3.5))
  for split in splits:
    counts = {}
    for batch, seqs, lp in task.log_probs(params, split, temperature):
      tokens = np.concatenate([batch.inputs[:, :1], batch.targets], 1)
      dist = np.zeros(tokens.shape, np.int64)
      for r, s in enumerate(seqs):
        if s is not None:
          dist[r, :len(s)] = task.lang.closing_distances(s)
      counts = dyck_metrics.merge(counts, dyck_metrics.ldpa(
          np.exp(lp), tokens, dist, task.k))
    d = np.array(sorted(counts))
    acc = np.array([counts[x][0] / counts[x][1] for x in d])
    ax.plot(d, acc, marker=".", label=f"{split} (WCPA {acc.min():.2f})")
  ax.set_xlabel("closing distance")
  ax.set_ylabel("LDPA")
  ax.set_ylim(-0.02, 1.02)
  ax.legend()
  ax.set_title(f"Dyck-({task.k},{task.lang.m}) bracket prediction")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def make(name: str, task, state, config, workdir: str) -> str:
  os.makedirs(os.path.join(workdir, "figures"), exist_ok=True)
  path = os.path.join(workdir, "figures", f"{name}.png")
  params = jax.tree_util.tree_map(lambda a: a[0], jax.device_get(state.params))
  tau = config.temperature.eval_value or config.temperature.init
  if name == "ldpa":
    if not hasattr(task, "lang"):
      raise ValueError(f"figure 'ldpa' needs a Dyck task, not {task.name!r}")
    return ldpa_figure(task, params, path, tau)
  raise ValueError(f"unknown figure {name!r}; known: ldpa")
