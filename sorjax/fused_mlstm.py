"""The multiplicative LSTM's recurrence as a primitive with a hand-written
VJP.

`sorjax.cells.mlstm` (Krause et al.), with mx_t = x_t W_mx and
gx_t = x_t W_x hoisted (the cell's `precompute`, run with b = 0:
`precompute_params`):

    z_t = h_{t-1} W_mh,   m_t = mx_t * z_t
    [i, f, g, o] = act(gx_t + m_t W_m + b)   (sigma, sigma, g's act, sigma)
    c_t = f c_{t-1} + i g,   h_t = o tanh(c_t)

The generic fused path (`unroll._fused_scan`) saves h_{t-1}, z_t, m_t and
m_t W_m for every step and recomputes the gates' activations from them in
the backward, time-major. Here the forward writes the activations A_t over
gx_t (`fused_lstm`'s one map A = s tanh(s p + gamma) + delta; g's columns
are p itself for Krause's linear candidate), z_t and m_t into batch-major
buffers, and stacks c_{t-1}; the backward writes the gates' cotangent dp_t
over A_t, dmx_t = dm_t * z_t over z_t and dz_t = dm_t * mx_t over mx_t,
with dm_t = dp_t W_m^T. dW_m = sum_t m_t^T dp_t and dW_mh = sum_t
h_{t-1}^T dz_t are one matmul each after the loop, db = sum_t dp_t one
sum. b is added inside the step's map, not to the hoisted gx: no pass over
[B, T, 4H] for it and one such temporary less (B=64 T=100 H=512: the
training step's temporaries 163 -> 138 MiB).

Measured against the generic path (forward + backward to the params and x,
M = H, two threads, six alternating timings, medians; BUILD_NOTES, "The
multiplicative LSTM's own VJP"): 1.10x at B=32 T=100 H=256, 1.06x at
B=64 T=100 H=512 and 1.02x at B=32 T=200 H=1024 (four timings), with 0.67x
its temporary memory.

Forward-mode autodiff (jvp, jacfwd) is not defined through this primitive
(`jax.custom_vjp`); reverse mode, vmap and jit are.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sorjax.cells.base import LSTMCarry
from sorjax.fused_lstm import activation_consts
from sorjax.layer_scan import (batch_major_mask, check_lstm_state,
                               previous_steps, row_products, scan_overwrite,
                               step_product, sum_dtype, unroll_steps,
                               valid_or, zero_padded)

Array = jax.Array


def _map(H, candidate, dtype):
  """(s, gamma, delta, lin): `fused_lstm.activation_consts` [1, 4H] and,
  for the identity candidate, a bool [1, 4H] marking g's columns, which
  stay linear (None for tanh)."""
  s, gamma, delta = activation_consts(H, 0.0, dtype, False)
  lin = None
  if candidate == "identity":
    lin = jnp.asarray(np.repeat([False, False, True, False], H)[None])
  return s, gamma, delta, lin


def _forward(unroll, candidate, W_mh, W_m, b, gx, mx, mask, h0, c0):
  """The forward loop over axis 1 of gx [B, T, 4H] and mx [B, T, M] (and
  mask [B, T, 1]); b [1, 4H]. Returns the final (h, c), ys [B, T, H] and the
  residuals: A_t over gx, z_t and m_t [B, T, M], c_{t-1} [T, B, H]."""
  s, gamma, delta, lin = _map(h0.shape[-1], candidate, W_m.dtype)
  hW_mh, mW_m = step_product(W_mh), step_product(W_m)

  def body(carry, buf, inp):
    h, c = carry
    gx_t = buf[0]
    mx_t, msk = inp if mask is not None else (inp[0], None)
    z = hW_mh(h)
    m = mx_t * z
    p = gx_t + mW_m(m) + b
    A = s * jnp.tanh(s * p + gamma) + delta
    if lin is not None:
      A = jnp.where(lin, p, A)                      # Krause's linear hat-h_t
    i, f, g, o = jnp.split(A, 4, axis=-1)
    c_new = f * c + i * g
    h_new = o * jnp.tanh(c_new)
    return (valid_or(msk, (h_new, c_new), carry),
            (zero_padded(msk, h_new), c), (A, z, m))

  inputs = (mx,) if mask is None else (mx, mask)
  final, (ys, cs), bufs = scan_overwrite(
      body, (h0, c0), (gx, jnp.zeros_like(mx), jnp.zeros_like(mx)), inputs,
      unroll=unroll, axis=1, xs_axis=1)
  return final, jnp.swapaxes(ys, 0, 1), cs, bufs


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _layer(unroll, candidate, W_mh, W_m, b, gx, mx, mask, h0, c0):
  final, ys, _, _ = _forward(unroll, candidate, W_mh, W_m, b, gx, mx, mask,
                             h0, c0)
  return final, ys


def _layer_fwd(unroll, candidate, W_mh, W_m, b, gx, mx, mask, h0, c0):
  final, ys, cs, (As, zs, ms) = _forward(unroll, candidate, W_mh, W_m, b, gx,
                                         mx, mask, h0, c0)
  return (final, ys), (W_mh, W_m, mx, mask, h0, ys, cs, As, zs, ms)


def _layer_bwd(unroll, candidate, res, cot):
  W_mh, W_m, mx, mask, h0, ys, cs, As, zs, ms = res
  (dh_T, dc_T), dys = cot
  s, _, delta, lin = _map(h0.shape[-1], candidate, W_m.dtype)
  dpW_mt, dzW_mht = step_product(W_m.T), step_product(W_mh.T)
  hp = previous_steps(h0, ys, 1)                            # h_{t-1}

  def body(carry, buf, inp):  # (A_t, z_t, mx_t) -> (dp_t, dmx_t, dz_t)
    dh, dc = carry
    A, z, mx_t = buf
    c_prev, dy, msk = inp if mask is not None else (*inp, None)
    dh_t, dc_t = zero_padded(msk, (dy + dh, dc))             # dL/dh_t, dL/dc_t
    i, f, g, o = jnp.split(A, 4, axis=-1)
    tc = jnp.tanh(f * c_prev + i * g)                       # tanh(c_t)
    dct = dc_t + dh_t * o * (1 - tc * tc)
    dA = jnp.concatenate([dct * g, dct * c_prev, dct * i, dh_t * tc], -1)
    u = (A - delta) / s                                      # tanh(s p + gamma)
    dp = dA * (s * s) * (1 - u * u)
    if lin is not None:
      dp = jnp.where(lin, dA, dp)
    dm = dpW_mt(dp)
    dz = dm * mx_t
    return (valid_or(msk, (dzW_mht(dz), dct * f), carry), None,
            (dp, dm * z, dz))

  inputs = (jnp.swapaxes(cs, 0, 1), dys)
  (dh0, dc0), _, (dps, dmxs, dzs) = scan_overwrite(
      body, (dh_T, dc_T), (As, zs, mx),
      inputs if mask is None else (*inputs, mask), reverse=True,
      unroll=unroll, axis=1, xs_axis=1)
  db = jnp.sum(dps, axis=(0, 1), dtype=sum_dtype(W_m.dtype))
  return (row_products(hp, dzs, W_mh.dtype),                # dW_mh
          row_products(ms, dps, W_m.dtype),                 # dW_m
          db.astype(W_m.dtype)[None], dps, dmxs, None, dh0, dc0)


_layer.defvjp(_layer_fwd, _layer_bwd)


class MLSTMArgs(NamedTuple):
  """What `mlstm_layer` needs from an `mlstm` cell's params."""
  W_mh: Array  # [H, M]
  W_m: Array   # [M, 4H]
  candidate_activation: str
  b: Array     # [4H], added in the layer's map (`precompute_params`)


def layer_args(cell, params) -> MLSTMArgs | None:
  """The layer arguments of an `mlstm` cell (the cell's precompute on
  `precompute_params` gives the layer's xp); None for every other cell."""
  from sorjax.cells.mlstm import MLSTM
  if type(cell) is not MLSTM:
    return None
  return MLSTMArgs(params["W_mh"], params["W_m"], cell.candidate_activation,
                   params["b"])


def precompute_params(args: MLSTMArgs, params):
  """The params the cell's `precompute` runs on for `run_layer(args, ..)`:
  b is zero there, as the layer adds it in its map; XLA drops the + 0, and
  b's gradient comes from the layer."""
  del args
  return {**params, "b": jnp.zeros_like(params["b"])}


def run_layer(args: MLSTMArgs, xp, carry, lengths=None, unroll=None):
  """`mlstm_layer` from `layer_args`; xp from the cell's precompute on
  `precompute_params(args, params)`."""
  return mlstm_layer(args.W_mh, args.W_m, xp, carry, lengths, unroll,
                     candidate_activation=args.candidate_activation,
                     b=args.b)


def mlstm_layer(W_mh: Array, W_m: Array, xp, carry: LSTMCarry,
                lengths: Array | None = None, unroll: int | None = None,
                candidate_activation: str = "identity",
                b: Array | None = None) -> tuple[LSTMCarry, Array]:
  """Runs the multiplicative LSTM over batch-major precomputed inputs.

  Args:
    W_mh: [H, M], h_{t-1}'s weights into m_t.
    W_m: [M, 4H], m_t's weights into the gates (i, f, g, o).
    xp: `MLSTMInputs` (mx [B, T, M], gx [B, T, 4H]): the cell's
      `precompute` of the inputs [B, T, D].
    carry: initial `LSTMCarry` (h, c), each [B, H].
    lengths: optional int [B]; steps t >= lengths[b] keep the carry and
      output zeros, as `sorjax.unroll`.
    unroll: steps per loop iteration in both loops (`scan_overwrite`);
      None is 1.
    candidate_activation: g's activation, "identity" (Krause's) or
      "tanh", as the cell's attribute.
    b: the gate bias [4H], added inside the layer's step (xp.gx then holds
      x_t W_x alone, the cell's precompute with b = 0,
      `precompute_params`); None when xp.gx holds it already.

  Returns:
    (final carry, ys [B, T, H]).
  """
  where = "mlstm_layer"
  if W_mh.ndim != 2 or W_m.ndim != 2 or W_m.shape != (
      W_mh.shape[1], 4 * W_mh.shape[0]):
    raise ValueError(f"{where}: W_mh must be [H, M] and W_m [M, 4H], got "
                     f"{W_mh.shape} and {W_m.shape}")
  if candidate_activation not in ("identity", "tanh"):
    raise ValueError(f"{where}: candidate_activation must be 'identity' or "
                     f"'tanh', got {candidate_activation!r}")
  H, M = W_mh.shape
  mx, gx = xp
  if gx.ndim != 3 or gx.shape[-1] != 4 * H:
    raise ValueError(f"{where}: xp.gx must be [B, T, 4H] with H = {H}, got "
                     f"{gx.shape}")
  B, T = gx.shape[:2]
  if mx.shape != (B, T, M):
    raise ValueError(f"{where}: xp.mx must be [B, T, M] = [{B}, {T}, {M}], "
                     f"got {mx.shape}")
  check_lstm_state(where, carry, B, H, T)
  if b is not None and jnp.shape(b) != (4 * H,):
    raise ValueError(f"{where}: b must be [4H] = [{4 * H}], got shape "
                     f"{jnp.shape(b)}")
  b = (jnp.zeros((1, 4 * H), W_m.dtype) if b is None
       else jnp.reshape(b, (1, -1)).astype(W_m.dtype))
  (h, c), ys = _layer(unroll_steps(where, unroll),
                      candidate_activation, W_mh, W_m, b, gx, mx,
                      batch_major_mask(where, lengths, B, T), carry.h,
                      carry.c)
  return LSTMCarry(h, c), ys
