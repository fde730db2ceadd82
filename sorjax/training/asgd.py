"""NT-ASGD (Merity, Keskar & Socher 2017, AWD-LSTM) as optax-style pieces.

optax has no averaged SGD, so this module supplies the two halves:

- `iterate_averaging()`: a transformation that leaves updates unchanged and,
  once `active`, keeps the running mean of the parameters *after* each update
  (the ASGD average; evaluate and checkpoint with `averaged_params`).
- `NonMonotoneTrigger`: the non-monotone criterion on validation losses,
  checked once per evaluation: start averaging when the loss is worse than
  the best loss seen more than `n` evaluations ago.

Chain the averaging last: `optax.chain(optax.clip_by_global_norm(c),
optax.sgd(lr), iterate_averaging())`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from sorjax.checks import check_int


class AveragingState(NamedTuple):
  active: jax.Array    # bool: averaging has started
  count: jax.Array     # int32: iterates averaged so far
  average: Any         # running mean of the iterates (params pytree)


def iterate_averaging() -> optax.GradientTransformation:
  """Identity on updates; tracks the mean of iterates once activated."""

  def init_fn(params):
    return AveragingState(jnp.asarray(False), jnp.asarray(0, jnp.int32),
                          jax.tree_util.tree_map(jnp.array, params))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("iterate_averaging needs params in update()")
    new_params = optax.apply_updates(params, updates)
    count = state.count + state.active.astype(jnp.int32)
    # Running mean: avg += (p - avg) / count; before activation avg tracks p.
    w = jnp.where(state.active,
                  1.0 / jnp.maximum(count, 1).astype(jnp.float32), 1.0)
    average = jax.tree_util.tree_map(
        lambda a, p: a + w.astype(a.dtype) * (p - a), state.average,
        new_params)
    return updates, AveragingState(state.active, count, average)

  return optax.GradientTransformation(init_fn, update_fn)


def _find(state) -> AveragingState:
  found = [s for s in jax.tree_util.tree_leaves(
      state, is_leaf=lambda s: isinstance(s, AveragingState))
           if isinstance(s, AveragingState)]
  if len(found) != 1:
    raise ValueError(
        f"expected one iterate_averaging state in the optimizer state, "
        f"found {len(found)}")
  return found[0]


def start_averaging(opt_state):
  """Returns opt_state with averaging switched on (count restarts at 0)."""
  def switch(s):
    if isinstance(s, AveragingState):
      return AveragingState(jnp.asarray(True), jnp.asarray(0, jnp.int32),
                            s.average)
    return s
  _find(opt_state)
  return jax.tree_util.tree_map(
      switch, opt_state, is_leaf=lambda s: isinstance(s, AveragingState))


def averaging_active(opt_state) -> bool:
  return bool(_find(opt_state).active)


def averaged_params(opt_state, params):
  """The ASGD average once averaging has started, else `params`."""
  s = _find(opt_state)
  return jax.lax.cond(s.active & (s.count > 0), lambda: s.average,
                      lambda: params)


def evaluated_params(optim_name: str, state):
  """The params a train state is evaluated with, per replica (the leading
  axis): under nt_asgd the ASGD average once averaging has started, as
  the loop evaluates, selects `best/` and AWD-LSTM saves; else
  `state.params` (`state.opt_state` is read under nt_asgd only)."""
  if optim_name != "nt_asgd":
    return state.params
  return jax.vmap(averaged_params)(state.opt_state, state.params)


@dataclasses.dataclass
class NonMonotoneTrigger:
  """AWD-LSTM's trigger: switch when val > min(val[:-n]) (n = non-monotone
  interval, 5 in the paper). Host-side; its state is `losses`, saved with
  checkpoints as a list."""
  n: int = 5
  losses: list[float] = dataclasses.field(default_factory=list)

  def __post_init__(self):
    check_int("NonMonotoneTrigger: n (the non-monotone interval)", self.n, 1)

  def observe(self, val_loss: float) -> bool:
    """Records one validation loss; True when averaging should start now."""
    fire = (len(self.losses) > self.n
            and val_loss > min(self.losses[:-self.n]))
    self.losses.append(float(val_loss))
    return fire
