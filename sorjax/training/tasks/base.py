"""Shared machinery of the sequence tasks: model variables, aux inputs,
padded batches, resumable epochs, jitted evaluation."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sorjax.data import batching
from sorjax.training.tasks.common import ConfigError
from sorjax.unroll import accepted_aux


def aux_names(cells) -> set[str]:
  """The aux inputs any of `cells` accepts (temperature, assignment)."""
  names = set()
  for c in cells:
    names |= accepted_aux(c, ("temperature", "assignment"))
  return names


def assignment_map(spec, vocab_size: int, num_cells: int, k: int | None
                   ) -> np.ndarray:
  """Token id -> cell (Lin et al. 3.2.1). spec: "bracket_type" (Dyck: type
  i's open and close brackets -> cell i, START/END -> cell 0) or a sequence
  of one cell index per token id."""
  if isinstance(spec, str):
    if spec != "bracket_type" or k is None:
      raise ConfigError(
          f"model.assignment={spec!r}: only 'bracket_type' (Dyck tasks) or "
          "an explicit tuple of one cell per token id are supported")
    ids = np.arange(vocab_size)
    out = np.where(ids < 2 * k, ids % k, 0)
  else:
    out = np.asarray(spec)
    if out.shape != (vocab_size,):
      raise ConfigError(f"model.assignment has {out.size} entries; the "
                        f"vocabulary has {vocab_size}")
  if k is not None and isinstance(spec, str) and k > num_cells:
    raise ConfigError(f"model.assignment='bracket_type' needs num_cells >= "
                      f"k={k}, got {num_cells}")
  if out.min() < 0 or out.max() >= num_cells:
    raise ConfigError(f"model.assignment must index cells 0..{num_cells - 1}")
  return out.astype(np.int32)


class ModelTask:
  """A flax model plus the aux its cells take; `self.model` set by subclasses.

  Non-trainable collections (frozen embeddings) are made once from the
  config and held as constants, so the optimizer never sees them.
  """
  model: Any
  vocab: Any = None

  def _setup_model(self, model, config, k=None):
    self.model = model
    self.cells = model.cells
    self.aux = aux_names(self.cells)
    self._assign = None
    if "assignment" in self.aux:
      spec = config.model.get("assignment")
      if spec is None:
        raise ConfigError("an assignment_lstm needs model.assignment "
                          "('bracket_type' or one cell per token id)")
      n = max(getattr(c, "num_cells", 0) for c in self.cells)
      self._assign = jnp.asarray(assignment_map(spec, model.vocab_size, n, k))
    dummy = jnp.zeros((1, 2), jnp.int32)
    # jitted: one compile, not one per operation of flax's init
    variables = jax.jit(lambda key, aux: model.init(key, dummy, **aux))(
        jax.random.key(0), self.aux_inputs(dummy, 1.0))
    self.constants = {k: v for k, v in variables.items() if k != "params"}

  def aux_inputs(self, tokens, temperature) -> dict:
    out = {}
    if "temperature" in self.aux:
      out["temperature"] = jnp.asarray(temperature, jnp.float32)
    if "assignment" in self.aux:
      out["assignment"] = jnp.take(self._assign, tokens, axis=0)
    return out

  def init_params(self, rng):
    dummy = jnp.zeros((1, 2), jnp.int32)
    return self.model.init(rng, dummy, **self.aux_inputs(dummy, 1.0))[
        "params"]

  def apply(self, params, tokens, lengths=None, carries=None, *, rng=None,
            temperature=1.0, mutable=False):
    """The model on tokens; with `mutable` (e.g. ["intermediates"]) the
    result is (output, sown variables), as flax's apply."""
    variables = {"params": params, **self.constants}
    return self.model.apply(
        variables, tokens, carries, lengths, deterministic=rng is None,
        rngs=None if rng is None else {"dropout": rng}, mutable=mutable,
        **self.aux_inputs(tokens, temperature))


class EpochBatches:
  """Resumable epochs over a SequenceBatcher for `Task.train_batches`."""

  def __init__(self, batcher: batching.SequenceBatcher, to_batch):
    self.batcher, self.to_batch = batcher, to_batch

  def __len__(self):
    return len(self.batcher)

  def __call__(self, epoch: int, position: dict | None):
    state = self.batcher.get_state()
    state.update(epoch=epoch, batch=(position or {}).get("batch", 0))
    self.batcher.set_state(state)
    for b in self.batcher:
      yield self.to_batch(b), {"batch": self.batcher.get_state()["batch"]}


class EpochModelTask(ModelTask):
  """A ModelTask that trains on `self.epochs` (an `EpochBatches`, set by the
  subclass) and starts every batch from the zero carry."""
  epochs: EpochBatches

  def num_train_batches(self):
    return len(self.epochs)

  def train_batches(self, epoch, position):
    return self.epochs(epoch, position)

  def init_carry(self, params):
    return ()


def masked_mean(values, mask):
  mask = mask.astype(values.dtype)
  return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def step_mask(lengths, T):
  return jnp.arange(T, dtype=jnp.int32)[None, :] < lengths[:, None]
