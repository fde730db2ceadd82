"""Tree classifier of Le & Zuidema (2016): word vectors -> a recursive cell
over the parse tree -> softmax on the root (Figure 1), or on every node for
SST's per-node labels.

    model = TreeClassifier(vocab_size=10_001, num_classes=10)   # RLSTM, n = 50
    schedule = sorjax.trees.encode(trees, vocab, max_leaves=..., ...)
    variables = model.init(key, schedule)
    logits = model.apply(variables, schedule)          # [B, C] (or [B, N, C])
    loss, accuracy = loss_and_accuracy(logits, schedule)

Parameters ("params"): embedding [V, n] (the leaves' word vectors, size n =
the cell's hidden_size: sec. 2), cell (the tree cell's dict, usable with
`sorjax.trees.run(model.cell, params["cell"], ...)`), classifier (Dense
kernel [n, C], bias [C]).

Sec. 3 trains with n = 50, tanh, word vectors drawn from U(-0.0001, 0.0001)
(`embed_init="le_zuidema"`, the default), AdaGrad at learning rate 0.05.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from sorjax import trees
from sorjax.cells import base
from sorjax.cells.tree import TreeLSTM
from sorjax.layer_scan import first_outside
from sorjax.models.initializers import uniform_symmetric

EMBED_INITS = ("le_zuidema", "normal")


class TreeClassifier(nn.Module):
  """Embedding -> tree cell over a `sorjax.trees` schedule -> classifier.

  Attributes:
    vocab_size: V.
    num_classes: C.
    cell: a tree cell (`sorjax.cells.make("tree_rnn" | "tree_lstm", ...)`);
      the word vectors have its hidden_size.
    per_node: classify every node ([B, N, C] logits) rather than the root.
    embed_init: "le_zuidema" (U(-1e-4, 1e-4), sec. 3) or "normal" (N(0, 1)).
    param_dtype: dtype of every parameter.
    remat: rematerialise each schedule step in the backward pass.
  """
  vocab_size: int
  num_classes: int
  cell: Any = TreeLSTM(hidden_size=50)
  per_node: bool = False
  embed_init: str = "le_zuidema"
  param_dtype: Any = jnp.float32
  remat: bool = False

  def __post_init__(self):
    name = type(self).__name__
    base.check_positive_int(name, "vocab_size", self.vocab_size)
    base.check_positive_int(name, "num_classes", self.num_classes)
    if not all(hasattr(self.cell, m) for m in ("hidden_size", "init", "leaf",
                                               "compose")):
      raise ValueError(f"{name}: cell must be a tree cell (hidden_size, init, "
                       f"leaf, compose), e.g. make('tree_lstm', ...); got "
                       f"{self.cell!r}")
    base.check_choice(name, "embed_init", self.embed_init, EMBED_INITS)
    base.check_bool(name, "remat", self.remat)
    base.check_float_dtype(f"{name}: param_dtype", self.param_dtype)
    super().__post_init__()

  @nn.compact
  def __call__(self, schedule: trees.Schedule) -> jax.Array:
    n = self.cell.hidden_size
    init = (uniform_symmetric(1e-4) if self.embed_init == "le_zuidema"
            else nn.initializers.normal(1.0))
    embedding = self.param("embedding", init, (self.vocab_size, n),
                           self.param_dtype)
    cell_params = self.param(
        "cell", lambda key: self.cell.init(key, n, self.param_dtype))
    _check_ids("TreeClassifier: schedule.tokens (word ids)", schedule.tokens,
               self.vocab_size, "vocab_size")
    x = jnp.take(embedding, jnp.asarray(schedule.tokens), axis=0)  # leaves x
    states, roots = trees.run(self.cell, cell_params, x, schedule,
                              remat=self.remat)
    h = states.h if self.per_node else roots.h
    return nn.Dense(self.num_classes, param_dtype=self.param_dtype,
                    name="classifier")(h)


def _check_ids(what: str, ids, n: int, name: str, allow: int | None = None
               ) -> None:
  """Concrete ids in [0, n) (or equal to `allow`); see `first_outside`."""
  bad = first_outside(ids, n, allow)
  if bad is not None:
    raise ValueError(f"{what} must be in [0, {name}={n}), got {bad[0]} at "
                     f"{list(bad[1])}")


def loss_and_accuracy(logits: jax.Array, schedule: trees.Schedule):
  """Mean softmax cross-entropy and accuracy over the labeled targets.

  Root logits [B, C] are scored against each root's label, per-node logits
  [B, N, C] against every node's; nodes without a label (-1) and padding do
  not count.
  """
  labels = jnp.asarray(schedule.labels)
  if logits.ndim == 2:
    labels = jnp.take_along_axis(labels, jnp.asarray(schedule.root)[:, None],
                                 axis=1)[:, 0]
  if logits.shape[:-1] != labels.shape:
    raise ValueError(
        f"loss_and_accuracy: logits {tuple(logits.shape)} do not match the "
        f"schedule's targets {tuple(labels.shape)} + [C]")
  # a label >= C would make the loss NaN (a clamped gather's fill)
  _check_ids("loss_and_accuracy: schedule.labels", labels, logits.shape[-1],
             "the logits' classes", allow=-1)
  mask = labels >= 0
  safe = jnp.where(mask, labels, 0)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
  count = jnp.maximum(jnp.sum(mask), 1).astype(jnp.float32)
  loss = jnp.sum(jnp.where(mask, nll, 0.0)) / count
  hit = (jnp.argmax(logits, -1) == safe) & mask
  return loss, jnp.sum(hit).astype(jnp.float32) / count


__all__ = ["EMBED_INITS", "TreeClassifier", "loss_and_accuracy",
           "uniform_symmetric"]
