"""Multi-timescale LSTM (Mahto, Vo, Turek & Huth, sec. 2.3).

An LSTM (gate order i, f, g, o as `lstm`) whose unit j has an assigned
timescale T_j. Its forget and input biases are set from T_j and fixed:

    b_f = -log(e^{1/T} - 1)                                       # eq. 5
    b_i = -b_f                        # so that i_t ~ 1 - f_t (sec. 2.3)

With no input, sigma(b_f) = e^{-1/T}, so the memory decays as
c_t = e^{-t/T} c_0 (eq. 1-2): T is the unit's forgetting time.

Params: W_x [D, 4H], W_h [H, 4H] as `lstm`, and b_go [2H], the biases of the
g and o gates only. Holding just the trainable slices (instead of a full
b [4H] with two slices masked out of the optimiser) keeps every array in
params trainable and used, so no optimiser or weight decay can move the
fixed biases; `fixed_arrays()` returns b_i and b_f. With a "learned" spec
b_if [2H] (b_i then b_f) joins params, initialised from eq. 5, and nothing
is fixed.

`timescales` (static, hashable) is one of:

    (T_1, ..., T_H)                  one timescale per unit
    ("constant", T)                  every unit T
    ("inverse_gamma", alpha)         quantiles of InvGamma(alpha, beta=1) at
                                     q_j = j / (H + 1), j = 1..H (sec. 2.2)
    ("groups", ((kind, value, n), ...))  consecutive unit groups, kind
                                     "constant" (value T) or "inverse_gamma"
                                     (value alpha), the n summing to H
    ("learned", spec)                spec's timescales initialise trainable
                                     forget/input biases

Mahto et al.'s language model (sec. 3.1.1): layer 1 half T = 3, half T = 4,
("groups", (("constant", 3.0, 575), ("constant", 4.0, 575))); layer 2
("inverse_gamma", 0.56); layer 3 a plain `lstm`. Their Dyck-2 model: one
256-unit layer with ("inverse_gamma", 1.5).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sorjax import checks
from sorjax.cells import base
from sorjax.cells.lstm import lstm_update

_KINDS = ("constant", "inverse_gamma")


def forget_bias(T) -> np.ndarray:
  """Eq. 5, b_f = -log(e^{1/T} - 1), in float64; written as
  -(1/T + log(1 - e^{-1/T})) so small T does not overflow."""
  u = 1.0 / np.asarray(T, np.float64)
  return -(u + np.log(-np.expm1(-u)))


def timescale(b_f) -> np.ndarray:
  """Eq. 2, T = 1 / log(1 + e^{-b_f}): the timescale a forget bias gives."""
  return 1.0 / np.log1p(np.exp(-np.asarray(b_f, np.float64)))


def inverse_gamma_timescales(n: int, alpha: float) -> np.ndarray:
  """n timescales at the quantiles j/(n+1), j = 1..n, of InvGamma(alpha, 1):
  evenly spread in probability, never 0 or inf (the open interval)."""
  import scipy.stats  # only this function needs scipy
  q = np.linspace(0.0, 1.0, n + 2)[1:-1]
  with np.errstate(divide="ignore", over="ignore"):  # inf is checked by callers
    return scipy.stats.invgamma.ppf(q, alpha)


def _err(msg: str) -> ValueError:
  return ValueError(f"mts_lstm: timescales {msg}")


def _hashable(spec):
  """Lists / arrays in a spec -> tuples, numbers -> floats."""
  if isinstance(spec, (str, bool)):
    return spec
  if isinstance(spec, np.ndarray):
    return tuple(float(v) for v in spec.reshape(-1)) if spec.ndim else \
        float(spec)
  if isinstance(spec, (list, tuple)):
    return tuple(_hashable(v) for v in spec)
  if isinstance(spec, (int, float, np.number)):
    return float(spec)
  raise _err(f"must be numbers or a spec tuple, got {spec!r}")


def _positive(name: str, value) -> float:
  return float(checks.check_number(f"mts_lstm: timescales {name}", value,
                                   "> 0", lambda v: v > 0))


def _group(kind, value, n: int) -> np.ndarray:
  if kind == "constant":
    return np.full(n, _positive("constant T", value))
  if kind == "inverse_gamma":
    T = inverse_gamma_timescales(n, _positive("inverse_gamma alpha", value))
    if not np.all(np.isfinite(T) & (T > 0)):
      raise _err(f"('inverse_gamma', {value}) over {n} units gives timescales "
                 f"that are 0 or inf in float64; use a larger alpha")
    return T
  raise _err(f"kind must be one of {_KINDS + ('groups', 'learned')}, "
             f"got {kind!r}")


@functools.lru_cache(maxsize=64)
def resolve(spec: tuple, hidden_size: int) -> tuple[np.ndarray, bool]:
  """(T [H] in float64, learned?) for a hashable timescales spec."""
  learned = False
  if spec and spec[0] == "learned":
    if len(spec) != 2 or not isinstance(spec[1], tuple):
      raise _err(f"('learned', spec) takes one inner spec, got {spec!r}")
    spec, learned = spec[1], True
  if not spec:
    raise _err("must not be empty")
  if isinstance(spec[0], str):
    kind = spec[0]
    if kind == "groups":
      if len(spec) != 2 or not all(isinstance(g, tuple) and len(g) == 3
                                   for g in spec[1]):
        raise _err(f"('groups', ((kind, value, n), ...)) expected, got "
                   f"{spec!r}")
      counts = [g[2] for g in spec[1]]
      if any(not isinstance(c, float) or c != int(c) or c < 1
             for c in counts) or sum(counts) != hidden_size:
        raise _err(f"group sizes {counts} must be positive ints summing to "
                   f"hidden_size={hidden_size}")
      T = np.concatenate([_group(k, v, int(n)) for k, v, n in spec[1]])
    elif len(spec) == 2:
      T = _group(kind, spec[1], hidden_size)
    else:
      raise _err(f"({kind!r}, value) expected, got {spec!r}")
  else:
    if len(spec) != hidden_size:
      raise _err(f"must give one timescale per unit: {len(spec)} values for "
                 f"hidden_size={hidden_size}")
    T = np.array([_positive(f"[{j}]", v) for j, v in enumerate(spec)])
  T.setflags(write=False)
  return T, learned


@dataclasses.dataclass(frozen=True)
class MTSLSTM:
  """Multi-timescale LSTM.

  Attributes:
    hidden_size: H.
    timescales: per-unit timescales or a spec (see the module docstring).
    bias_init: the g and o gates' biases b_go start at "zeros" or
      "uniform" (U(-1/sqrt(H), 1/sqrt(H)), as the weights; Mahto et al.
      3.1.1: all biases but the i and f ones of eq. 5 drawn uniformly).
  """
  hidden_size: int
  timescales: Any
  bias_init: str = "zeros"

  def __post_init__(self):
    base.check_positive_int("mts_lstm", "hidden_size", self.hidden_size)
    base.check_choice("mts_lstm", "bias_init", self.bias_init,
                      base.BIAS_INITS)
    object.__setattr__(self, "timescales", _hashable(self.timescales))
    if not isinstance(self.timescales, tuple):
      raise _err(f"must be a sequence or a spec tuple, got "
                 f"{self.timescales!r}")
    resolve(self.timescales, self.hidden_size)  # validate now

  @property
  def learned(self) -> bool:
    """Whether the forget/input biases are trainable (a "learned" spec)."""
    return resolve(self.timescales, self.hidden_size)[1]

  def unit_timescales(self) -> np.ndarray:
    """The assigned timescale T of every unit, [H] float64."""
    return resolve(self.timescales, self.hidden_size)[0]

  def fixed_arrays(self) -> dict[str, np.ndarray]:
    """b_i, b_f [H] of eq. 5 (float64); empty for a "learned" spec."""
    if self.learned:
      return {}
    b_f = forget_bias(self.unit_timescales())
    return {"b_i": -b_f, "b_f": b_f}

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    """W_x, W_h as `lstm`; b_go by bias_init; b_if from eq. 5 if
    learned."""
    base.check_init(self, key, dtype)
    base.check_positive_int("mts_lstm", "input_size", input_size)
    H = self.hidden_size
    kx, kh = jax.random.split(key)
    params = {"W_x": base.uniform(kx, (input_size, 4 * H), H, dtype),
              "W_h": base.uniform(kh, (H, 4 * H), H, dtype),
              "b_go": base.lstm_bias(key, self.bias_init, (2 * H,), H,
                                     dtype)}
    if self.learned:
      b_f = forget_bias(self.unit_timescales())
      params["b_if"] = jnp.asarray(np.concatenate([-b_f, b_f]), dtype)
    return params

  def initial_carry(self, params, batch_shape=()):
    batch_shape = base.batch_shape(batch_shape)
    z = jnp.zeros((*batch_shape, self.hidden_size), base.param_dtype(params))
    return base.LSTMCarry(z, z)

  def bias(self, params) -> jax.Array:
    """The full gate bias [b_i, b_f, b_g, b_o] [4H]."""
    dtype = params["b_go"].dtype
    if self.learned:
      b_if = params["b_if"]
    else:
      fixed = self.fixed_arrays()                                   # eq. 5
      b_if = jnp.asarray(np.concatenate([fixed["b_i"], fixed["b_f"]]), dtype)
    return jnp.concatenate([b_if, params["b_go"]])

  def precompute(self, params, xs):
    base.check_precompute(self, params, xs)
    return base.affine(xs, params["W_x"], self.bias(params))

  # Split step (see sorjax.unroll): z = h_{t-1} W_h, then the rest.
  def split(self, params):
    return params["W_h"], {}

  def recurrent_input(self, carry):
    return carry.h

  def post(self, q, carry, xp, z):
    new = lstm_update(xp + z, carry.c)
    return new, new.h

  def step(self, params, carry, xp):
    return base.split_step(self, params, carry, xp)
