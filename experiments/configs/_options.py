"""Helpers of the paper configs (the leading underscore keeps this module
out of the list of experiment configs).

Config strings, `--config=experiments/configs/<name>.py:<string>`:
ml_collections passes everything after the colon to `get_config`; the paper
configs read it as comma-separated options ("attention,m6"). Errors name the
config file, the string and what it accepts.

`overridable(config)`: ml_collections cannot override a field whose value is
None from the command line (`--config.train.max_steps=3` fails with "Type
NoneType ... is not supported for overriding"), so the optional fields get
typed placeholders (None until set).
"""

from __future__ import annotations

from typing import Sequence

import ml_collections
from ml_collections.config_dict import placeholder

from sorjax.training.tasks.common import ConfigError

# Optional (None by default) fields of common.config / base_config and
# their types once set. Fields whose values are tuples or specs
# (model.layers, num_matrices, timescales, locked_dropout) are left alone:
# the launchers read their overrides as Python literals
# (`experiments.train.LITERAL_FIELDS`).
OPTIONAL = {
    "train.max_steps": int, "early_stopping.patience": int,
    "early_stopping.stop_below": float,
    "temperature.eval_value": float, "optim.clip_norm": float,
    "optim.momentum": float, "optim.total_steps": int,
    "optim.end_value": float,
    "data.preset": str, "data.num_train": int, "data.num_dev": int,
    "data.num_test": int, "data.max_length": int, "data.data_dir": str,
    "data.manual_dir": str, "data.pad_to": int, "data.max_train_tokens": int,
    "data.test_batch_size": int, "data.folds": int, "data.bptt": int,
    "data.eval_bptt": int,
    "data.max_eval_tokens": int, "data.train_sentence_cutoff": int,
    "model.cell": str, "model.hidden_size": int, "model.budget": int,
    "model.intermediate_ratio": float, "model.embedding_init": str,
    "model.assignment": str, "model.activation": str,
    "model.forget_bias": float, "model.intermediate_size": int,
    "model.bias_init": str, "model.head_units": int,
    "model.head_init": str,
    "model.use_D": bool, "model.use_E": bool, "model.general": bool,
    "model.candidate_activation": str, "model.num_cells": int,
    "model.learn_embedding": bool, "model.fused_grad": bool,
    "model.unroll": int, "replica_batch_size": int,
}


def overridable(config: ml_collections.ConfigDict
                ) -> ml_collections.ConfigDict:
  """`config` with every None field of OPTIONAL made a typed placeholder."""
  for path, kind in OPTIONAL.items():
    *parents, leaf = path.split(".")
    node = config
    for p in parents:
      node = node.get(p) if node is not None else None
    if node is not None and leaf in node and node[leaf] is None:
      node[leaf] = placeholder(kind)
  return config


class Options:
  """The comma-separated parts of one config string, read in order."""

  def __init__(self, config: str, string: str | None, usage: str):
    self.config, self.string, self.usage = config, string or "", usage
    self.parts = [p.strip() for p in self.string.split(",")] if string else []
    self._next = 0

  def error(self, msg: str) -> ConfigError:
    return ConfigError(f"{self.config}.py:{self.string!r}: {msg} (usage: "
                       f"{self.config}.py:{self.usage})")

  def take(self, what: str, default: str | None = None) -> str:
    """The next part, or `default` when the string has no more positional
    parts (none left, or the next is a `key=value` one)."""
    if self._next < len(self.parts) and not (
        default is not None and "=" in self.parts[self._next]):
      value = self.parts[self._next]
      self._next += 1
      if not value:
        raise self.error(f"empty {what}")
      return value
    if default is None:
      raise self.error(f"missing {what}")
    return default

  def choice(self, what: str, choices: Sequence[str],
             default: str | None = None) -> str:
    value = self.take(what, default)
    if value not in choices:
      raise self.error(f"{what} must be one of {', '.join(choices)}; got "
                       f"{value!r}")
    return value

  def number(self, what: str, default: str | None = None, *,
             cast=float, positive: bool = True):
    return self._cast(what, self.take(what, default), cast, positive)

  def _cast(self, what: str, value: str, cast, positive: bool):
    try:
      out = cast(value)
    except ValueError:
      kind = "an integer" if cast is int else "a number"
      raise self.error(f"{what} must be {kind}, got {value!r}") from None
    if positive and not out > 0:
      raise self.error(f"{what} must be > 0, got {value!r}")
    return out

  def flag(self, name: str) -> bool:
    """Whether the next part is the literal `name` (consumed if so)."""
    if self._next < len(self.parts) and self.parts[self._next] == name:
      self._next += 1
      return True
    return False

  def keyed(self, key: str) -> str | None:
    """The value of a `key=value` next part (consumed), else None."""
    if self._next < len(self.parts) and self.parts[self._next].startswith(
        key + "="):
      self._next += 1
      return self.parts[self._next - 1][len(key) + 1:]
    return None

  def keyed_number(self, key: str, what: str, cast=int):
    """The value of a `key=<number>` next part (consumed; > 0), else None."""
    value = self.keyed(key)
    return None if value is None else self._cast(f"{key}=: {what}", value,
                                                 cast, True)

  def done(self) -> None:
    """Raises if parts are left over (nothing is ignored silently)."""
    if self._next < len(self.parts):
      raise self.error(f"unexpected {', '.join(self.parts[self._next:])!r}")
