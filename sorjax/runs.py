"""Restore a trained run from its work directory alone.

    run = sorjax.restore("/tmp/run", step="best")      # or "latest" or an int
    run.config, run.params, run.model, run.vocab
    lp = run.log_probs(tokens)     # [B, T, V] next-token log-probabilities

No target pytree to build by hand (orbax#487, #986): the resolved config
saved with the run rebuilds the task, whose abstract train state tells
orbax what to read.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np


@dataclasses.dataclass
class Run:
  """A restored run. `params` are replica `replica`'s; `all_params` keeps
  the leading replica axis."""
  workdir: str
  step: int
  config: ml_collections.ConfigDict
  task: Any
  all_params: Any
  meta: dict
  replica: int = 0

  @property
  def params(self):
    return jax.tree_util.tree_map(lambda a: a[self.replica], self.all_params)

  @property
  def model(self):
    return self.task.model

  @property
  def vocab(self):
    return self.task.vocab

  @property
  def num_replicas(self) -> int:
    return int(jax.tree_util.tree_leaves(self.all_params)[0].shape[0])

  def with_replica(self, r: int) -> "Run":
    if not 0 <= r < self.num_replicas:
      raise ValueError(f"replica {r} out of range: the run has "
                       f"{self.num_replicas}")
    return dataclasses.replace(self, replica=r)

  def eval_temperature(self) -> float:
    t = self.config.temperature
    return float(t.eval_value if t.eval_value is not None else
                 t.init * t.decay ** self.meta.get("epoch", 0))

  def encode(self, text: str) -> np.ndarray:
    """Symbols of one line -> ids, with the run's vocabulary / language."""
    if hasattr(self.task, "encode_text"):
      return self.task.encode_text(text)
    raise ValueError(f"task {self.task.name!r} cannot encode text")

  def log_probs(self, tokens, lengths=None, temperature=None) -> np.ndarray:
    """Next-token log-probabilities [B, T, V] of int tokens [B, T] (or [T],
    or a string for the run's tokenizer): row t is p(token t+1 | ..t)."""
    if self.task.name not in ("lm", "dyck_lm"):
      raise ValueError(f"log_probs needs a next-token task (lm, dyck_lm); "
                       f"this run is {self.task.name!r}")
    if isinstance(tokens, str):
      tokens = self.encode(tokens)
    tokens = np.asarray(tokens)
    squeeze = tokens.ndim == 1
    if squeeze:
      tokens = tokens[None]
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
      raise ValueError(f"tokens must be int [B, T] or [T], got "
                       f"{tokens.dtype} {tokens.shape}")
    V = self.task.model.vocab_size
    if tokens.size and (tokens.min() < 0 or tokens.max() >= V):
      raise ValueError(f"token ids must be in [0, {V}), got "
                       f"[{tokens.min()}, {tokens.max()}]")
    tau = self.eval_temperature() if temperature is None else temperature
    out = np.asarray(_log_probs(self.task, self.params,
                                jnp.asarray(tokens, jnp.int32),
                                None if lengths is None else
                                jnp.asarray(lengths, jnp.int32),
                                jnp.float32(tau)))
    return out[0] if squeeze else out


@functools.partial(jax.jit, static_argnums=0)
def _log_probs(task, params, tokens, lengths, temperature):
  logits, _ = task.apply(params, tokens, lengths, temperature=temperature)
  return jax.nn.log_softmax(logits.astype(jnp.float32), -1)


def load_config(workdir: str) -> ml_collections.ConfigDict:
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: {workdir} is not a sorjax "
                            "run directory (no resolved config)")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def restore(workdir: str, step: str | int = "best", replica: int = 0) -> Run:
  """Restores a run: step "best", "latest" or an int checkpoint step."""
  from sorjax.training.checkpoint import Checkpointer
  from sorjax.training.loop import Trainer
  from sorjax.training.tasks import make_task

  workdir = os.path.abspath(workdir)
  config = load_config(workdir)
  task = make_task(config)
  trainer = Trainer(task, config, workdir)
  target = jax.eval_shape(trainer.init_state)
  ckpt = Checkpointer(workdir, read_only=True)
  try:
    s, state, meta = ckpt.restore(target, step)
  finally:
    ckpt.close()
  return Run(workdir, s, config, task, state.params, meta).with_replica(
      replica)
