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
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from sorjax.checks import check_int
from sorjax.layer_scan import check_lengths


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
  checkpoint: str | None = None  # the step as asked: "best", "latest"
                                 # (None: a step number)

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
    check_int("replica", r)
    if not 0 <= r < self.num_replicas:
      raise ValueError(f"replica {r} out of range: the run has "
                       f"{self.num_replicas}")
    return dataclasses.replace(self, replica=r)

  def eval_temperature(self) -> float:
    """The temperature the loop evaluated this checkpoint at: eval_value,
    else the schedule (floor and per-step decay included) at the epoch
    just trained for an end-of-epoch checkpoint (as the loop's evaluation
    reads it), or at the current epoch for one saved mid-epoch."""
    from sorjax.training.schedules import TemperatureSchedule
    schedule = TemperatureSchedule(**self.config.temperature.to_dict())
    epoch = int(self.meta.get("epoch", 0))
    if self.meta.get("position") is None and epoch > 0:
      epoch -= 1
    return float(schedule.evaluation(self.step, epoch))

  def encode(self, text: str) -> np.ndarray:
    """Symbols of one line -> ids, with the run's vocabulary (an LM's
    tokenizer) or language (a Dyck run's space-separated symbols)."""
    if not isinstance(text, str):
      raise TypeError(f"encode: text must be a str, got "
                      f"{type(text).__name__}")
    if hasattr(self.task, "encode_text"):
      return self.task.encode_text(text)
    if hasattr(getattr(self.task, "lang", None), "encode"):
      return self.task.lang.encode(text)
    raise ValueError(f"text needs a run of a text or bracket task (lm, "
                     f"dyck_*); this run's task {self.task.name!r} cannot "
                     f"encode text")

  def log_probs(self, tokens, lengths=None, temperature=None) -> np.ndarray:
    """Next-token log-probabilities [B, T, V] of int tokens [B, T] (or [T],
    or a string for the run's tokenizer): row t is p(token t+1 | ..t), so
    begin a sequence as the run's were: a Dyck run's with START, a
    document LM's line after <eos>. With `lengths`, a row's steps from its
    length on are padding: the head of a zero trunk output whatever the
    tokens there (mask them). `temperature`: the attention LSTM's softmax
    tau (default `eval_temperature()`); refused for a model without one
    (it is not a sampling temperature)."""
    if self.task.name not in ("lm", "dyck_lm"):
      raise ValueError(f"log_probs needs a next-token task (lm, dyck_lm); "
                       f"this run is {self.task.name!r}")
    if temperature is not None and "temperature" not in self.task.aux:
      check_temperature("log_probs", temperature)
      raise ValueError(
          f"log_probs: temperature={temperature!r} is the attention "
          f"LSTM's softmax tau, which this run's cells "
          f"({', '.join(type(c).__name__ for c in self.task.cells)}) do not "
          "have; it is not a sampling temperature (divide the logits)")
    tokens = self._tokens(tokens)
    squeeze = tokens.ndim == 1
    if squeeze:
      tokens = tokens[None]
    if lengths is not None:
      lengths = check_lengths("log_probs", np.atleast_1d(lengths)
                              if squeeze else lengths, *tokens.shape)
    tau = check_temperature("log_probs", self.eval_temperature()
                            if temperature is None else temperature)
    out = np.asarray(_log_probs(self.task, self.params,
                                jnp.asarray(tokens, jnp.int32), lengths,
                                jnp.float32(tau)))
    return out[0] if squeeze else out

  def _tokens(self, tokens) -> np.ndarray:
    """`tokens` as a checked int array [B, T] or [T]."""
    if isinstance(tokens, str):
      tokens = self.encode(tokens)
    try:
      tokens = np.asarray(tokens)
    except ValueError as e:     # ragged nested lists
      raise ValueError(f"tokens must be a rectangular int array [B, T] or "
                       f"[T] ({e})") from None
    if tokens.size == 0 and tokens.dtype == np.float64:   # [] is float
      tokens = tokens.astype(np.int32)
    if tokens.ndim not in (1, 2) or not np.issubdtype(tokens.dtype,
                                                      np.integer):
      raise ValueError(f"tokens must be int [B, T] or [T], got "
                       f"{tokens.dtype} {tokens.shape}")
    V = self.task.model.vocab_size
    if tokens.size and (tokens.min() < 0 or tokens.max() >= V):
      raise ValueError(f"token ids must be in [0, {V}), got "
                       f"[{tokens.min()}, {tokens.max()}]")
    return tokens


def check_temperature(where: str, value) -> float:
  """`value` as a float; a ValueError naming `where` unless finite and > 0
  (tau = 0 divides by zero, a negative one inverts the distribution)."""
  try:
    tau = math.nan if isinstance(value, (str, bytes, bool)) else float(value)
  except (TypeError, ValueError):
    tau = math.nan
  if not (math.isfinite(tau) and tau > 0):
    raise ValueError(f"{where}: temperature must be a finite number > 0, "
                     f"got {value!r}")
  return tau


@functools.partial(jax.jit, static_argnums=0)
def _log_probs(task, params, tokens, lengths, temperature):
  logits, _ = task.apply(params, tokens, lengths, temperature=temperature)
  return jax.nn.log_softmax(logits.astype(jnp.float32), -1)


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's resolved config.json; a ValueError naming the file and what
  is wrong with it (not JSON, not an object, a section missing)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: {workdir} is not a sorjax "
                            "run directory (no resolved config)")
  raw = read_config_json(path)
  _check_sections(path, raw)
  from sorjax.training.config import base_config
  from sorjax.training.tasks import as_trained
  from sorjax.training.tasks.common import field_at
  base = base_config()
  for k in LATER_SECTIONS:  # what a run written before them did
    raw.setdefault(k, base[k].to_dict())
  raw, why = as_trained(raw)    # fields read otherwise then than now
  for field, reason in why.items():
    logging.warning("%s: %s reads as %r, what the run trained with (%s)",
                    path, field, field_at(raw, field), reason)
  return ml_collections.ConfigDict(raw)


# Sections of `base_config()` added after runs were written without them:
# absent from a config.json, they read as their defaults.
LATER_SECTIONS = ("selection",)


def read_config_json(path: str) -> dict:
  """A run's config.json as a dict; a ValueError naming the file and what
  is wrong with it (not a file, not JSON, not an object)."""
  if not os.path.isfile(path):
    raise ValueError(f"{path} is not a file")
  try:
    with open(path, encoding="utf-8") as f:
      raw = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON (line {e.lineno}, column "
                     f"{e.colno}: {e.msg})") from None
  except (OSError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} cannot be read ({e})") from None
  if not isinstance(raw, dict):
    raise ValueError(f"{path} must hold a JSON object, got "
                     f"{type(raw).__name__}")
  return raw


def _check_sections(path: str, raw: dict) -> None:
  """Every top-level section of `base_config()` (plus task, model, data)
  is present, sections as objects and task a name."""
  from sorjax.training.config import base_config
  base = base_config()
  sections = [k for k in base if isinstance(base[k],
                                            ml_collections.ConfigDict)]
  for k in ["task", "model", "data"] + sections:
    if k not in raw and k not in LATER_SECTIONS:
      raise ValueError(f"{path} has no section {k!r} (a run's config has "
                       f"task, model, data, {', '.join(sections)})")
  if not isinstance(raw["task"], str) or not raw["task"]:
    raise ValueError(f"{path}: 'task' must be a task name, got "
                     f"{raw['task']!r}")
  for k in ["model", "data"] + sections:
    if k in raw and not isinstance(raw[k], dict):
      raise ValueError(f"{path}: section {k!r} must be a JSON object, got "
                       f"{type(raw[k]).__name__}")


def _check_config_matches(workdir: str, step: int, config, meta) -> None:
  """The model is rebuilt from config.json: an edit that keeps the arrays'
  shapes (another activation, a misspelt field) would restore the weights
  into another model. Each checkpoint keeps the config it was trained
  with; fields a resume may change (loop.RESUMABLE) may differ."""
  from sorjax.training.loop import config_changes, shown_changes
  from sorjax.training.tasks import added_fields
  saved = meta.get("config")
  if saved is None:          # written before checkpoints held their config
    return
  changes = config_changes(saved, config.to_dict(),
                           added_fields(config.get("task")))
  if changes:
    raise ValueError(
        f"{workdir}/config.json differs from the config checkpoint {step} "
        f"was trained with: {shown_changes(changes)} (trained -> "
        "config.json). Restoring "
        "would load its weights into another model; undo the edit (the "
        "checkpoint's meta keeps its config under 'config')")


def restore(workdir: str, step: str | int = "best", replica: int = 0) -> Run:
  """Restores the run in workdir (~ expands): step "best", "latest" or an
  int checkpoint step. Its params are those the run was evaluated with:
  under NT-ASGD the average, once averaging has started."""
  from sorjax.training.checkpoint import Checkpointer
  from sorjax.training.loop import Trainer
  from sorjax.training.tasks import make_task

  check_int("restore: replica", replica)   # before any reading
  workdir = os.path.abspath(os.path.expanduser(workdir))
  config = load_config(workdir)
  task = make_task(config)
  trainer = Trainer(task, config, workdir)
  target = jax.eval_shape(trainer.init_state)
  ckpt = Checkpointer(workdir, read_only=True)
  try:
    s, state, meta = ckpt.restore(target, step)
  finally:
    ckpt.close()
  _check_config_matches(workdir, s, config, meta)
  from sorjax.training.asgd import evaluated_params
  # NT-ASGD: the averaged weights, which the run's metrics were made with
  params = evaluated_params(config.optim.name, state)
  return Run(workdir, s, config, task, params, meta,
             checkpoint=step if isinstance(step, str) else None
             ).with_replica(replica)
