"""The gradient-norm ratio of Le & Zuidema (2016), sec. 3.3, Fig. 5-7:

    ratio = || dJ / dx_keyword || / || dJ / dx_root ||

per keyword tree, where J is the tree's cross-entropy at the root, x_keyword
the keyword leaf's vector (its word vector: leaves are the word vectors,
sec. 2) and x_root the root node's vector p (what the classifier reads).
ratio << 1: the error signal vanishes on its way down to the keyword;
>> 1: it explodes.

The paper records the ratios while training; the trees task logs their
medians per depth after every epoch (`metrics.jsonl`, split
"epoch_metrics"), and here they are recomputed from the run's end-of-epoch
checkpoints (keep them all with train.keep_checkpoints >=
train.num_epochs) and from the initial params
(epoch 0), on the first `max_trees` trees of a split (the training trees,
as the paper, by default). A checkpoint holds the params at the end of its
epoch, so epoch e's ratios are those the next epoch's first steps see.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.ticker import MaxNLocator

from sorjax import trees
from sorjax.analysis.common import (CheckpointReader, checkpoint_steps,
                                    check_split, fail, figure, require_task,
                                    save)
from sorjax.cells import base


@functools.partial(jax.jit, static_argnums=0)
def _ratios(cell, params, batch, keyword_index):
  sched = trees.Schedule(**batch)
  labels = jnp.take_along_axis(sched.labels, sched.root[:, None], 1)[:, 0]
  x = jnp.take(params["embedding"], sched.tokens, axis=0)      # leaves x
  clf = params["classifier"]

  def J(x, delta):   # sum over trees of each tree's root cross-entropy
    _, roots = trees.run(cell, params["cell"], x, sched)
    logits = base.affine(roots.h + delta, clf["kernel"], clf["bias"])
    lp = jax.nn.log_softmax(logits.astype(jnp.float32))
    nll = -jnp.take_along_axis(lp, jnp.maximum(labels, 0)[:, None], 1)[:, 0]
    return jnp.sum(jnp.where(labels >= 0, nll, 0.0))

  delta = jnp.zeros(x.shape[:1] + x.shape[2:], x.dtype)
  g_x, g_root = jax.grad(J, (0, 1))(x, delta)
  g_kw = jnp.take_along_axis(g_x, keyword_index[:, None, None], 1)[:, 0]
  return (jnp.linalg.norm(g_kw.astype(jnp.float32), axis=-1),
          jnp.linalg.norm(g_root.astype(jnp.float32), axis=-1))


def tree_ratios(task, params, split: str, max_trees: int | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(keyword depths, ||dJ/dx_keyword||, ||dJ/dx_root||) per tree."""
  examples = task.examples[split][:max_trees]
  ts = task.split_trees[split][:len(examples)]
  B = task.eval_batch_size
  num, den = [], []
  for i in range(0, len(ts), B):
    chunk = ts[i:i + B]
    batch = task._batch(task._pad(chunk, B), B)
    kw = np.zeros(B, np.int32)
    kw[:len(chunk)] = [ex.keyword_index for ex in examples[i:i + B]]
    a, b = _ratios(task.cell, params, batch, jnp.asarray(kw))
    num.append(np.asarray(a)[:len(chunk)])
    den.append(np.asarray(b)[:len(chunk)])
  depth = np.array([ex.keyword_depth for ex in examples])
  return depth, np.concatenate(num), np.concatenate(den)


def depth_stats(depth: np.ndarray, ratio: np.ndarray) -> dict:
  """Per keyword depth: count, median, quartiles, mean and geometric mean
  of the ratios (zero denominators give inf and are counted)."""
  out = {}
  for d in np.unique(depth):
    r = ratio[depth == d]
    fin = r[np.isfinite(r)]
    q = np.quantile(fin, [0.25, 0.5, 0.75]) if fin.size else [np.nan] * 3
    with np.errstate(divide="ignore"):
      gmean = float(np.exp(np.mean(np.log(fin)))) if fin.size else None
    out[int(d)] = {"trees": int(r.size), "non_finite": int(r.size - fin.size),
                   "q25": float(q[0]), "median": float(q[1]),
                   "q75": float(q[2]), "mean": float(np.mean(fin))
                   if fin.size else None, "geometric_mean": gmean}
  return out


def require_keyword_trees(run) -> None:
  """An error unless `run` is a trees run on the keyword dataset."""
  name = "gradient_ratio"
  require_task(name, run, ("trees",))
  if run.config.data.dataset != "keyword":
    raise fail(name, run, "needs the keyword-tree task (data.dataset="
               f"'keyword', Le & Zuidema 3): its trees mark the keyword "
               f"leaf; this run uses data.dataset={run.config.data.dataset!r}")


def gradient_ratio(run, split: str | None = None,
                   max_trees: int | None = 1000, initial: bool = True
                   ) -> dict:
  """The ratios per keyword depth for the initial params (epoch 0) and
  every kept end-of-epoch checkpoint, plus the dev accuracy per epoch."""
  name = "gradient_ratio"
  require_keyword_trees(run)
  task = run.task
  split = check_split(name, run, split, default="train")
  reader = CheckpointReader(run)
  by_epoch, finished = {}, 0
  for step in checkpoint_steps(run.workdir):
    params, meta = reader.params(step)
    finished = max(finished, int(meta.get("epoch", 0)))
    if meta.get("position") is None:       # end of an epoch
      by_epoch[int(meta["epoch"])] = (step, params)
  if initial:
    by_epoch.setdefault(0, (0, reader.initial_params()))
  if len(by_epoch) <= int(initial):
    if not finished:
      raise fail(name, run, "the run has not finished an epoch yet (every "
                 f"checkpoint in {run.workdir}/checkpoints is mid-epoch); "
                 "its ratios are read at the ends of epochs")
    raise fail(name, run, "no end-of-epoch checkpoint is kept in "
               f"{run.workdir}/checkpoints; set train.keep_checkpoints >= "
               "train.num_epochs to keep one per epoch")
  epochs = []
  for epoch in sorted(by_epoch):
    step, params = by_epoch[epoch]
    depth, num, den = tree_ratios(task, params, split, max_trees)
    with np.errstate(divide="ignore", invalid="ignore"):
      ratio = num / den
    epochs.append({"epoch": epoch, "step": step, "trees": int(depth.size),
                   "depths": depth_stats(depth, ratio)})
  return {"split": split, "epochs": epochs,
          "dev_accuracy": _dev_accuracy(run)}


def _dev_accuracy(run) -> dict[int, float]:
  from sorjax.training.metrics import read_metrics
  try:
    records = read_metrics(run.workdir, "dev")
  except FileNotFoundError:
    return {}
  return {int(r["epoch"]): float(r["accuracy"]) for r in records
          if r.get("replica", 0) == run.replica and "accuracy" in r}


def plot_gradient_ratio(result: dict, path: str, max_lines: int = 6) -> str:
  """Median ratio (IQR shaded) vs keyword depth per epoch (Fig. 5-6), and
  vs epoch for a few depths with the dev accuracy (Fig. 7)."""
  fig, axes = figure(2, size=(11, 4))
  ax = axes[0, 0]
  epochs = [dict(e, depths={int(k): v for k, v in e["depths"].items()})
            for e in result["epochs"]]     # int keys, also from JSON
  for e in epochs:
    d = np.array(sorted(e["depths"]))
    med = np.array([e["depths"][k]["median"] for k in d])
    lo = np.array([e["depths"][k]["q25"] for k in d])
    hi = np.array([e["depths"][k]["q75"] for k in d])
    ax.plot(d, med, marker=".", label=f"epoch {e['epoch']}")
    ax.fill_between(d, lo, hi, alpha=0.15)
  ax.set_yscale("log")
  ax.set_xlabel("keyword depth")
  ax.set_ylabel("||dJ/dx_keyword|| / ||dJ/dx_root||")
  ax.legend(fontsize=7)
  ax = axes[0, 1]
  depths = sorted({d for e in epochs for d in e["depths"]})
  pick = [depths[i] for i in np.unique(np.linspace(
      0, len(depths) - 1, min(max_lines, len(depths))).astype(int))]
  for d in pick:
    ep = [e["epoch"] for e in epochs if d in e["depths"]]
    med = [e["depths"][d]["median"] for e in epochs if d in e["depths"]]
    ax.plot(ep, med, marker=".", label=f"depth {d}")
  ax.set_yscale("log")
  ax.set_xlabel("epoch")
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.set_ylabel("median ratio")
  ax.legend(fontsize=7, loc="upper left")
  acc = {int(k): v for k, v in result["dev_accuracy"].items()}
  if acc:
    twin = ax.twinx()
    ep = sorted(acc)
    twin.plot(ep, [acc[e] for e in ep], color="black", ls="--",
              label="dev accuracy")
    twin.set_ylim(0, 1)
    twin.set_ylabel("dev accuracy (dashed)")
  return save(fig, path)


__all__ = ["depth_stats", "gradient_ratio", "plot_gradient_ratio",
           "require_keyword_trees", "tree_ratios"]
