"""The fields every experiment config has (the loop's part); task- and
model-specific fields are added by `experiments/configs/*.py`."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import ml_collections


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.task = ""
  c.seed = 0
  c.num_replicas = 1
  # replicas vmapped at a time (a loop over such groups when fewer than a
  # device's replicas); None: the loop's rule (`loop.replica_batch_for`)
  c.replica_batch_size = None

  c.optim = ml_collections.ConfigDict(dict(
      name="adam", learning_rate=1e-3, schedule="constant", warmup_steps=0,
      decay_steps=1, decay_rate=0.5, total_steps=None, end_value=None,
      clip_norm=None, weight_decay=0.0, momentum=None, b1=0.9, b2=0.999,
      eps=1e-8, initial_accumulator=0.1))
  c.plateau = ml_collections.ConfigDict(dict(enabled=False, factor=0.5,
                                             patience=3))
  c.early_stopping = ml_collections.ConfigDict(dict(patience=None,
                                                     stop_below=None))
  # The first eval split's metric that picks the best checkpoint and whose
  # lack of improvement early stopping counts: "loss" / "min" by default;
  # e.g. "accuracy" / "max" (Le & Zuidema stop on development accuracy).
  # Plateau, NT-ASGD and early_stopping.stop_below follow the loss.
  c.selection = ml_collections.ConfigDict(dict(metric="loss", mode="min"))
  c.nt_asgd = ml_collections.ConfigDict(dict(nonmono=5))
  c.temperature = ml_collections.ConfigDict(dict(
      init=1.0, decay=1.0, per="epoch", floor=0.0, eval_value=None))
  c.train = ml_collections.ConfigDict(dict(
      num_epochs=10, max_steps=None, log_every=50, checkpoint_every=500,
      keep_checkpoints=3, tensorboard=True))
  return c


def fields_set(section: Mapping[str, Any], defaults: Mapping[str, Any],
               keys: Iterable[str] | None = None) -> list[str]:
  """The keys (default: all of `defaults`') whose value in `section`
  differs from `defaults`, in sorted order; a key `section` lacks (an
  older config.json) reads as its default. What the checks of fields a
  run would not read list."""
  keys = defaults.keys() if keys is None else keys
  return sorted(k for k in keys if section.get(k, defaults[k]) != defaults[k])
