"""Second-order LSTMs of Lin, Benditshtull & Spinner (sec. 3.2): S LSTM cells.

S LSTM cells share the state (h, c); cell s has its own W_x[s], W_h[s], b[s]
(its W_hh^(s)). The attention model (sec. 3.2.2) runs every cell on
(x_t, h_{t-1}, c_{t-1}) and mixes their new states; in row form
(`x @ W`, our V [D, S] is the paper's V [S, embedding_dim] transposed):

    e_t = x_t V                                                   # eq. (a)
    alpha_t = softmax(e_t / tau)                                  # eq. (b)
    h_t^(s), c_t^(s) = LSTMCell^(s)(x_t, (h_{t-1}, c_{t-1}))      # eq. (c)
    h_t = sum_s alpha_{t,s} h_t^(s)                               # eq. (d)
    c_t = sum_s alpha_{t,s} c_t^(s)                               # eq. (e)

The paper mixes the cells' *output states* (d)-(e), after each cell's
nonlinearities: that is `mix="states"`, the default. `mix="gates"` instead
mixes the transition matrices themselves, W_hh(t) = sum_s alpha_{t,s} W_h[s]
(and likewise W_x, b): sec. 3.2's "S transition weight matrices" read
literally as a second-order RNN. By linearity that equals mixing each cell's
pre-activation gates, so it needs no per-example matrix either. The two agree
when alpha is one-hot (tau -> 0, as the paper anneals it).

The assignment model (sec. 3.2.1) replaces alpha_t by one_hot(s(x_t)), a
fixed token -> cell map given per token as the aux `assignment`.

Cost: the input side x_t W_x[s] + b[s] of all S cells is one [D, S*4H]
matmul over all steps (`precompute`); the recurrent side h_{t-1} W_h[s] of
all S cells is one [H, S*4H] matmul per step; nothing is [B, H, H].
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sorjax.cells import base
from sorjax.cells.lstm import lstm_update
from sorjax.layer_scan import concrete


class SecondOrderInputs(NamedTuple):
  """Input-only terms of one or all steps."""
  gx: jax.Array     # x_t W_x[s] + b[s]: [..., S, 4H] (mix="states") or
                    # their alpha-mixture [..., 4H] (mix="gates", assignment)
  alpha: jax.Array  # mixing weights alpha_t, eq. (b) or one-hot: [..., S]


def init_cells(key, num_cells: int, input_size: int, hidden_size: int,
               dtype: Any) -> dict:
  """W_x [S, D, 4H], W_h [S, H, 4H] ~ U(+-1/sqrt(H)) as in `lstm`; b = 0."""
  S, D, H = num_cells, input_size, hidden_size
  kx, kh = jax.random.split(key)
  return {"W_x": base.uniform(kx, (S, D, 4 * H), H, dtype),
          "W_h": base.uniform(kh, (S, H, 4 * H), H, dtype),
          "b": base.zeros((S, 4 * H), dtype)}


def cell_gates_x(params, xs) -> jax.Array:
  """x W_x[s] + b[s] for every cell s: [..., S, 4H], one [D, S*4H] matmul.
  Its weight gradient reads x's rows transposed once (`base.input_products`:
  [D, T*B] x [T*B, S*4H] from x^T in memory ran 2x the rows-contracted
  product on a Zen 3 EPYC at D = 512, S*4H = 4096)."""
  S, D, G = params["W_x"].shape
  z, = base.input_products(
      xs, jnp.transpose(params["W_x"], (1, 0, 2)).reshape(D, S * G))
  z = z.reshape(*z.shape[:-1], S, G)
  return z + base.lift(params["b"], z.ndim)


def recurrent_matrix(params) -> jax.Array:
  """[W_h[1] | .. | W_h[S]] [H, S*4H]: every cell's h side in one matrix."""
  S, H, G = params["W_h"].shape
  return jnp.transpose(params["W_h"], (1, 0, 2)).reshape(H, S * G)


def per_cell(z, num_cells: int) -> jax.Array:
  """[..., S*4H] -> [..., S, 4H]: h W_h[s] of every cell s."""
  return z.reshape(*z.shape[:-1], num_cells, z.shape[-1] // num_cells)


def mix_cells(alpha, z) -> jax.Array:
  """sum_s alpha[s] z[s]: [..., S] x [..., S, N] -> [..., N]."""
  return jnp.einsum("...s,...sn->...n", alpha, z)


def _check_numeric_temperature(temperature) -> None:
  """A number or an array of numbers (ints or floats), as its dtype says:
  jnp.asarray would fail on a string naming nothing, and take a bool as
  1.0."""
  kind = getattr(temperature, "dtype", None)
  if kind is None:
    try:
      kind = np.asarray(temperature).dtype
    except (TypeError, ValueError):  # ragged lists
      kind = None
  if kind is None or not (jnp.issubdtype(kind, jnp.integer)
                          or jnp.issubdtype(kind, jnp.floating)):
    got = (f"an array of {kind}" if hasattr(temperature, "dtype")
           else repr(temperature))
    raise ValueError(f"attention_lstm: temperature must be a number > 0 or "
                     f"an array of them (one per token), got {got}")


def _check_cells(cell: str, hidden_size, num_cells) -> None:
  base.check_positive_int(cell, "hidden_size", hidden_size)
  base.check_positive_int(cell, "num_cells", num_cells)


def _initial_carry(hidden_size, params, batch_shape):
  z = jnp.zeros((*batch_shape, hidden_size), base.param_dtype(params))
  return base.LSTMCarry(z, z)


class _SplitStep:
  """The split step of both cells (see sorjax.unroll): z = h_{t-1} [W_h[1] |
  .. | W_h[S]], one [H, S*4H] matmul, then the rest (`post`)."""

  def split(self, params):
    return recurrent_matrix(params), {}

  def recurrent_input(self, carry):
    return carry.h

  def step(self, params, carry, xp):
    return base.split_step(self, params, carry, xp)


def _mixed_gates_post(num_cells, carry, xp, z, forget_bias):
  """One LSTM step with the alpha-mixed gates (the W_hh(t) mixture)."""
  gates = xp.gx + mix_cells(xp.alpha, per_cell(z, num_cells))
  new = lstm_update(gates, carry.c, forget_bias)
  return new, new.h


@dataclasses.dataclass(frozen=True)
class AttentionLSTM(_SplitStep):
  """Attention second-order LSTM (Lin et al. sec. 3.2.2).

  Attributes:
    hidden_size: H (the paper: 3m for m-bounded Dyck-2, 600 for WikiText-2).
    num_cells: S, the number of LSTM cells (the paper: 2 and 5).
    mix: "states" mixes the cells' new (h, c) as eq. (d)-(e) (the paper);
      "gates" mixes their weights, W_hh(t) = sum_s alpha_s W_h[s].
    forget_bias: added to every cell's forget gate, as in `lstm` (0 in the
      paper's PyTorch LSTMCells).

  Aux `temperature` (tau of eq. (b)): a positive scalar or one per token;
  1.0 when not given. The paper starts at 1, multiplies by 0.9 each epoch and
  tests at a very low tau, where alpha is one-hot. A non-numeric one (a
  string, a bool) is an error; a concrete value must be finite and > 0,
  but a traced one (under jit) cannot be checked: there tau = 0 runs as
  the smallest normal number (one-hot alpha, as tau -> 0), and a negative
  tau or NaN gives NaN.
  """
  hidden_size: int
  num_cells: int
  mix: str = "states"
  forget_bias: float = 0.0

  def __post_init__(self):
    _check_cells("attention_lstm", self.hidden_size, self.num_cells)
    base.check_finite_real("attention_lstm", "forget_bias", self.forget_bias)
    base.check_choice("attention_lstm", "mix", self.mix, ("states", "gates"))

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    """The S cells as in `lstm`; V ~ U(+-1/sqrt(D)) (a linear layer on x)."""
    base.check_init(self, key, dtype)
    base.check_positive_int("attention_lstm", "input_size", input_size)
    kc, kv = jax.random.split(key)
    params = init_cells(kc, self.num_cells, input_size, self.hidden_size,
                        dtype)
    params["V"] = base.uniform(kv, (input_size, self.num_cells), input_size,
                               dtype)
    return params

  def initial_carry(self, params, batch_shape=()):
    batch_shape = base.batch_shape(batch_shape)
    return _initial_carry(self.hidden_size, params, batch_shape)

  def attention(self, params, xs, temperature=1.0) -> jax.Array:
    """alpha = softmax(x V / tau), eq. (a)-(b): [..., S] for xs [..., D]."""
    base.check_input("attention_lstm", xs, params["V"].shape[0])
    e = xs @ params["V"]                                           # eq. (a)
    _check_numeric_temperature(temperature)
    tau = jnp.asarray(temperature)
    t = concrete(tau)
    if t is not None and not (np.all(np.isfinite(t)) and np.all(t > 0)):
      raise ValueError(
          f"attention_lstm: temperature must be finite and > 0, got {t}")
    if tau.ndim not in (0, e.ndim - 1) or (
        tau.ndim and tau.shape != e.shape[:-1]):
      raise ValueError(
          f"attention_lstm: temperature must be a scalar or one per token "
          f"(shape {tuple(e.shape[:-1])}); got shape {tuple(tau.shape)}")
    # At least the smallest normal number: XLA flushes a subnormal tau to
    # 0, and tau -> 0 is the limit Lin et al. evaluate at (argmax). A traced
    # tau < 0 (unchecked above) gives NaN, which the training loop stops
    # on, not a silent argmax.
    tau = tau.astype(e.dtype)
    tau = jnp.where(tau < 0, jnp.nan,
                    jnp.maximum(tau, jnp.finfo(e.dtype).tiny))
    tau = base.lift(tau, e.ndim) if tau.ndim == 0 else tau[..., None]
    # Shifted before dividing: at a tiny tau, e / tau overflows to inf and
    # softmax's own shift gives inf - inf = NaN. The same softmax.
    e = e - jax.lax.stop_gradient(jnp.max(e, axis=-1, keepdims=True))
    return jax.nn.softmax(e / tau, axis=-1)                        # eq. (b)

  def precompute(self, params, xs, temperature=1.0):
    base.check_precompute(self, params, xs)
    alpha = self.attention(params, xs, temperature)
    gx = cell_gates_x(params, xs)
    if self.mix == "gates":
      gx = mix_cells(alpha, gx)
    return SecondOrderInputs(gx, alpha)

  def post(self, q, carry, xp, z):
    S = self.num_cells
    if self.mix == "gates":
      return _mixed_gates_post(S, carry, xp, z, self.forget_bias)
    gates = xp.gx + per_cell(z, S)                            # [..., S, 4H]
    cells = lstm_update(gates, carry.c[..., None, :], self.forget_bias)  # eq. (c)
    new = base.LSTMCarry(mix_cells(xp.alpha, cells.h),        # eq. (d)
                         mix_cells(xp.alpha, cells.c))        # eq. (e)
    return new, new.h


@dataclasses.dataclass(frozen=True)
class AssignmentLSTM(_SplitStep):
  """Assignment second-order LSTM (Lin et al. sec. 3.2.1).

  Token t runs through cell `assignment[t]` only: eq. (c)-(e) with alpha_t =
  one_hot(assignment[t]). With a one-hot alpha, mixing the new states equals
  mixing the weights, so the step mixes the gates (one LSTM update instead of
  S) and never gathers a per-example [H, 4H] matrix.

  Params W_x, W_h, b as `attention_lstm`. There is no attention vector V: the
  assignment replaces it, and an untrained parameter would mislead.

  Attributes:
    hidden_size: H.
    num_cells: S (the paper: 2 for Dyck-2, one per bracket type).
    forget_bias: as in `lstm`.

  Aux `assignment` (required): the int cell index of each token, [B, T] in
  `sorjax.unroll`. Indices outside [0, S) raise an error when the array is
  concrete; under `jit` they turn that step's outputs to NaN rather than
  silently running no cell. Padded steps therefore need a valid index too.
  """
  hidden_size: int
  num_cells: int
  forget_bias: float = 0.0

  def __post_init__(self):
    _check_cells("assignment_lstm", self.hidden_size, self.num_cells)
    base.check_finite_real("assignment_lstm", "forget_bias", self.forget_bias)

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    base.check_init(self, key, dtype)
    base.check_positive_int("assignment_lstm", "input_size", input_size)
    return init_cells(key, self.num_cells, input_size, self.hidden_size,
                      dtype)

  def initial_carry(self, params, batch_shape=()):
    batch_shape = base.batch_shape(batch_shape)
    return _initial_carry(self.hidden_size, params, batch_shape)

  def one_hot(self, assignment, batch_shape, dtype) -> jax.Array:
    """alpha_t = one_hot(assignment_t) [..., S], validated against xs."""
    if assignment is None:
      raise ValueError(
          "assignment_lstm: aux 'assignment' is required (an int cell index "
          "per token, [B, T] in sorjax.unroll)")
    a = jnp.asarray(assignment)
    if not jnp.issubdtype(a.dtype, jnp.integer):
      raise ValueError(
          f"assignment_lstm: assignment must hold int cell indices, got "
          f"dtype {a.dtype}")
    if a.shape != tuple(batch_shape):
      raise ValueError(
          f"assignment_lstm: assignment must have one index per token, shape "
          f"{tuple(batch_shape)}; got {tuple(a.shape)}")
    S = self.num_cells
    v = concrete(a)
    if v is not None and v.size and (v.min() < 0 or v.max() >= S):
      raise ValueError(
          f"assignment_lstm: assignment indices must be in [0, {S}) "
          f"(num_cells={S}); got values in [{v.min()}, {v.max()}]")
    valid = (a >= 0) & (a < S)
    return jnp.where(valid[..., None], jax.nn.one_hot(a, S, dtype=dtype),
                     jnp.array(np.nan, dtype))

  def precompute(self, params, xs, assignment=None):
    base.check_precompute(self, params, xs)
    alpha = self.one_hot(assignment, xs.shape[:-1],
                         base.param_dtype(params))
    return SecondOrderInputs(mix_cells(alpha, cell_gates_x(params, xs)), alpha)

  def post(self, q, carry, xp, z):
    return _mixed_gates_post(self.num_cells, carry, xp, z, self.forget_bias)
