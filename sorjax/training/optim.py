"""Optimisers from a config: optax base optimisers, LR schedules, clipping,
reduce-on-plateau and NT-ASGD, in one `optax.inject_hyperparams` wrapper.

The wrapper exposes two multipliers of the learning rate in the optimizer
state, so they can change without recompiling:

- `plateau_scale`: set once per evaluation from
  `optax.contrib.reduce_on_plateau` (`Plateau` below), monitoring a loss
  (it misbehaves on negative values, so never a negated accuracy);
- `step_scale`: set per step, e.g. AWD-LSTM's seq_len / bptt rescaling.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
import optax

from sorjax.checks import check_bool, check_number
from sorjax.training import asgd

OPTIMIZERS = ("adam", "sgd", "adagrad", "nt_asgd")
SCHEDULES = ("constant", "warmup_constant", "exponential", "cosine",
             "warmup_cosine")


def _get(cfg: Mapping[str, Any], key: str, default=None):
  return cfg[key] if key in cfg and cfg[key] is not None else default


# (field, rule, test, integer, optional) of the optim fields a config may
# set; a field absent from the dict (an older config.json) is not checked.
_POSITIVE = ("> 0", lambda v: v > 0)
_NON_NEGATIVE = (">= 0", lambda v: v >= 0)
_AT_LEAST_1 = (">= 1", lambda v: v >= 1)
_UNIT = ("in [0, 1)", lambda v: 0 <= v < 1)
_SCHEDULE_FIELDS = (
    ("learning_rate", *_POSITIVE, False, False),
    ("warmup_steps", *_NON_NEGATIVE, True, True),
    ("decay_steps", *_AT_LEAST_1, True, True),
    ("decay_rate", *_POSITIVE, False, True),
    ("total_steps", *_AT_LEAST_1, True, True),
    ("end_value", *_NON_NEGATIVE, False, True),
    ("alpha", "in [0, 1]", lambda v: 0 <= v <= 1, False, True))
_OPTIMIZER_FIELDS = (
    ("clip_norm", *_POSITIVE, False, True),
    ("weight_decay", *_NON_NEGATIVE, False, True),
    ("momentum", *_UNIT, False, True),
    ("b1", *_UNIT, False, True),
    ("b2", *_UNIT, False, True),
    # eps = 0 divides 0 by 0 for a parameter whose gradients are all 0
    ("eps", *_POSITIVE, False, True),
    ("initial_accumulator", *_NON_NEGATIVE, False, True))


def _check_fields(cfg: Mapping[str, Any], fields) -> None:
  for key, rule, ok, integer, optional in fields:
    if key in cfg or not optional:
      check_number(f"optim.{key}", cfg[key], rule, ok, integer=integer,
                   optional=optional)


def _check_schedule(cfg: Mapping[str, Any], kind: str) -> None:
  _check_fields(cfg, _SCHEDULE_FIELDS)
  check_bool("optim.staircase", _get(cfg, "staircase", True),
             error=ValueError)
  total, warmup = _get(cfg, "total_steps"), _get(cfg, "warmup_steps", 0)
  if kind == "warmup_cosine" and total is not None and total <= warmup:
    raise ValueError(f"optim.total_steps={total} must exceed "
                     f"optim.warmup_steps={warmup} (warmup_cosine counts "
                     "the warmup in its total)")


# The optim fields each optimizer and schedule reads (beyond name,
# learning_rate, schedule, clip_norm and weight_decay, read by all).
OPTIMIZER_READS = {"adam": ("b1", "b2", "eps"), "sgd": ("momentum",),
                   "nt_asgd": ("momentum",),
                   "adagrad": ("initial_accumulator",)}
SCHEDULE_READS = {
    "constant": (), "warmup_constant": ("warmup_steps",),
    "exponential": ("warmup_steps", "decay_steps", "decay_rate",
                    "staircase", "end_value"),
    "cosine": ("total_steps", "end_value", "alpha"),
    "warmup_cosine": ("warmup_steps", "total_steps", "end_value")}


def _check_read(cfg: Mapping[str, Any], reads: dict, chosen: str,
                what: str) -> None:
  """A field of `reads`' other entries set in cfg away from its default
  (`base_config().optim`; None where it has none) but not read by `chosen`:
  a ValueError naming it, since it would change nothing."""
  from sorjax.training.config import base_config
  defaults = base_config().optim
  for key in sorted({k for v in reads.values() for k in v}
                    - set(reads.get(chosen, ()))):
    value = _get(cfg, key)
    if value is not None and value != defaults.get(key):
      readers = [n for n, v in reads.items() if key in v]
      raise ValueError(
          f"optim.{key}={value!r} is read by {what} {', '.join(readers)} "
          f"only, not {chosen!r}: leave it at {defaults.get(key)!r}")


def learning_rate_schedule(cfg: Mapping[str, Any]) -> optax.Schedule:
  """cfg.learning_rate and cfg.schedule in SCHEDULES (+ its fields).

  warmup_steps: warmup_constant and warmup_cosine ramp linearly from 0 over
  them (0: none, full rate from step 0); exponential holds the full rate
  that long before decaying (optax's transition_begin), no ramp."""
  kind = _get(cfg, "schedule", "constant")
  if kind not in SCHEDULES:
    raise ValueError(f"optim.schedule must be one of {SCHEDULES}, got "
                     f"{kind!r}")
  _check_schedule(cfg, kind)
  _check_read(cfg, SCHEDULE_READS, kind, "the schedules")
  lr = float(cfg["learning_rate"])
  warmup = int(_get(cfg, "warmup_steps", 0))
  if kind == "constant":
    return optax.constant_schedule(lr)
  if kind == "warmup_constant":
    if warmup == 0:        # no warmup: step 0 at the full rate, not at 0
      return optax.constant_schedule(lr)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, lr, warmup),
         optax.constant_schedule(lr)], [warmup])
  if kind == "exponential":
    return optax.exponential_decay(
        lr, transition_steps=int(_get(cfg, "decay_steps", 1)),
        decay_rate=float(_get(cfg, "decay_rate", 0.5)),
        transition_begin=warmup, staircase=bool(_get(cfg, "staircase", True)),
        end_value=_get(cfg, "end_value"))
  if kind in ("cosine", "warmup_cosine"):
    total = _get(cfg, "total_steps")
    if total is None:
      raise ValueError(f"optim.schedule={kind!r} needs optim.total_steps")
    if kind == "cosine":  # decays to end_value = alpha * lr
      end, alpha = _get(cfg, "end_value"), _get(cfg, "alpha")
      if end is not None and alpha is not None:
        raise ValueError("optim.end_value and optim.alpha both set: the "
                         "cosine schedule ends at end_value = alpha * lr")
      if end is not None:
        if end > lr:
          raise ValueError(f"optim.end_value={end} exceeds "
                           f"optim.learning_rate={lr}: cosine decays")
        alpha = end / lr
      return optax.cosine_decay_schedule(lr, int(total),
                                         float(alpha or 0.0))
    return optax.warmup_cosine_decay_schedule(
        0.0, lr, warmup, int(total), float(_get(cfg, "end_value", 0.0)))
  raise ValueError(f"optim.schedule must be one of {SCHEDULES}, got {kind!r}")


def make_optimizer(cfg: Mapping[str, Any]) -> optax.GradientTransformation:
  """Builds the optimizer described by `cfg` (a dict / ConfigDict):

  name: adam | sgd | adagrad | nt_asgd;  learning_rate, schedule fields;
  clip_norm (global norm, optional); weight_decay (L2 added to gradients,
  optional); momentum (sgd); b1, b2, eps (adam); initial_accumulator (adagrad).
  """
  name = cfg["name"]
  if name not in OPTIMIZERS:
    raise ValueError(f"optim.name must be one of {OPTIMIZERS}, got {name!r}")
  _check_fields(cfg, _OPTIMIZER_FIELDS)
  _check_read(cfg, OPTIMIZER_READS, name, "the optimizers")
  schedule = learning_rate_schedule(cfg)
  clip = _get(cfg, "clip_norm")
  wd = _get(cfg, "weight_decay", 0.0)

  def build(plateau_scale, step_scale):
    lr = lambda count: schedule(count) * plateau_scale * step_scale
    parts = []
    if clip:
      parts.append(optax.clip_by_global_norm(float(clip)))
    if wd:
      parts.append(optax.add_decayed_weights(float(wd)))
    if name == "adam":
      parts.append(optax.adam(lr, b1=float(_get(cfg, "b1", 0.9)),
                              b2=float(_get(cfg, "b2", 0.999)),
                              eps=float(_get(cfg, "eps", 1e-8))))
    elif name in ("sgd", "nt_asgd"):
      parts.append(optax.sgd(lr, momentum=_get(cfg, "momentum")))
    else:
      parts.append(optax.adagrad(
          lr, initial_accumulator_value=float(
              _get(cfg, "initial_accumulator", 0.1))))
    if name == "nt_asgd":
      parts.append(asgd.iterate_averaging())
    return optax.chain(*parts)

  return optax.inject_hyperparams(build)(plateau_scale=1.0, step_scale=1.0)


def set_hyperparam(opt_state, name: str, value):
  """Returns opt_state with an injected hyperparameter replaced."""
  hp = dict(opt_state.hyperparams)
  if name not in hp:
    raise KeyError(f"optimizer has no hyperparameter {name!r}: {sorted(hp)}")
  hp[name] = jnp.asarray(value, hp[name].dtype)
  return opt_state._replace(hyperparams=hp)


class Plateau:
  """Reduce-on-plateau at evaluation time with optax.contrib.reduce_on_plateau.

  `patience` follows PyTorch's ReduceLROnPlateau (reduce when more than
  `patience` evaluations fail to improve), which the papers' code used;
  optax counts differently (reduce after `patience`), hence the +1.
  """

  def __init__(self, factor: float = 0.5, patience: int = 3,
               rtol: float = 1e-4, min_scale: float = 0.0):
    check_number("plateau.factor", factor, "in (0, 1)",
                 lambda v: 0 < v < 1)
    # PyTorch's patience 0: reduce after the first evaluation that fails
    check_number("plateau.patience", patience, ">= 0", lambda v: v >= 0,
                 integer=True)
    self._tx = optax.contrib.reduce_on_plateau(
        factor=factor, patience=patience + 1, rtol=rtol, min_scale=min_scale)

  def init(self):
    return self._tx.init({})

  def update(self, state, loss: float):
    """New plateau state after one evaluation of a loss (must be >= 0)."""
    if not loss >= 0:
      raise ValueError(
          f"plateau monitors a non-negative loss; got {loss} (monitor a loss, "
          "not a negated accuracy)")
    _, state = self._tx.update({}, state, value=jnp.float32(loss))
    return state


MODES = ("min", "max")


def check_mode(mode: Any) -> None:
  """`selection.mode`: "min" or "max"; ValueError naming the field."""
  if mode not in MODES:
    raise ValueError(f"selection.mode must be 'min' or 'max', got {mode!r}")


def check_selection(metric: Any, mode: Any) -> None:
  """`selection.metric` (a metric name the task's evaluate returns) and
  `selection.mode` ("min" or "max"); ValueError naming the field."""
  if not isinstance(metric, str) or not metric:
    raise ValueError(f"selection.metric must be the name of an evaluation "
                     f"metric (e.g. 'loss', 'accuracy'), got {metric!r}")
  check_mode(mode)


def selection_of(config: Mapping[str, Any]) -> tuple[str, str]:
  """(metric, mode) of a config's (or a config.json dict's) selection,
  checked; ("loss", "min") where it has none (runs written before it)."""
  sel = config.get("selection") or {}
  metric, mode = sel.get("metric", "loss"), sel.get("mode", "min")
  check_selection(metric, mode)
  return metric, mode


def better(mode: str, value: float, best: float, min_delta: float = 0.0
           ) -> bool:
  """value improves on best by more than min_delta in `mode`'s direction."""
  return value < best - min_delta if mode == "min" else value > best + min_delta


def worst(mode: str) -> float:
  """The starting best of `mode`: any finite value improves on it."""
  return float("inf") if mode == "min" else float("-inf")


class EarlyStopping:
  """Stops after `patience` evaluations without improving the best value of
  the monitored metric: lower is better with mode "min" (a loss), higher
  with "max" (an accuracy)."""

  def __init__(self, patience: int, min_delta: float = 0.0,
               mode: str = "min"):
    check_number("early_stopping.patience", patience, ">= 1",
                 lambda v: v >= 1, integer=True)
    check_mode(mode)
    self.patience, self.min_delta, self.mode = patience, min_delta, mode
    self.best, self.bad = worst(mode), 0

  def update(self, value: float) -> tuple[bool, bool]:
    """(improved, should_stop) after one evaluation."""
    improved = better(self.mode, value, self.best, self.min_delta)
    if improved:
      self.best, self.bad = float(value), 0
    else:
      self.bad += 1
    return improved, self.bad >= self.patience

  def state_dict(self) -> dict:
    return {"best": self.best, "bad": self.bad}

  def load_state_dict(self, d: Mapping[str, Any]) -> None:
    self.best, self.bad = float(d["best"]), int(d["bad"])
