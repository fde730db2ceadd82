"""The GRU's recurrence as a primitive with a hand-written VJP.

`sorjax.cells.gru` (reset gate after the recurrent matmul, gates r, z, n):

    hW_t = h_{t-1} W_h                                        (one matmul)
    r_t  = sigma(xr_t + hr_t),  z_t = sigma(xz_t + hz_t)
    n_t  = tanh(xn_t + r_t * hn'_t),  hn'_t = hn_t + b_hn
    h_t  = (1 - z_t) n_t + z_t h_{t-1}

with x_t [W_xr | W_xz | W_xn] + b the cell's hoisted `precompute`
([B, T, 3H]). `sorjax.unroll` runs this on the batched-weight-gradient
path. What it saves over that generic path (`unroll._fused_scan`, which
stacks h_{t-1} and hW_t for every step and recomputes the gates from them
backwards, time-major):

- The forward writes the activations (r_t, z_t, n_t) over the precompute
  and hn'_t into one [B, T, H] buffer, h_t into another (the output); the
  backward writes the precompute's cotangent (dr~_t, dz~_t, dn~_t, the
  pre-activation gradients) over the activations and dn~_t * r_t, the
  cotangent of hn_t, over hn'_t (`layer_scan.scan_overwrite` along
  axis 1: no transposes).
- dW_h = sum_t h_{t-1}^T [dr~_t | dz~_t | dn~_t r_t] after the loop: the
  r and z columns from one product with the precompute's cotangent (its
  first 2H columns), the n columns from one with the hn buffer, both from
  one transposed copy of h_{t-1} (`layer_scan.transposed_rows`: 1.02x at
  B=64 T=100 H=512, 1.015x at B=32 T=100 H=256, 1.01x at B=32 T=200
  H=1024). (Taking the r and z columns of a product with all of the
  cotangent instead was 0.96x.)

Measured against the generic path (forward + backward to the params and
x, two threads, six alternating timings; medians; BUILD_NOTES, "The GRU's
and the Elman RNN's own VJPs"): 1.55x at B=32 T=100 H=256 and 1.18x at
B=64 T=100 H=512, with 0.64x its temporary memory.

Forward-mode autodiff (jvp, jacfwd) is not defined through this primitive
(`jax.custom_vjp`); reverse mode, vmap and jit are.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sorjax.cells import base
from sorjax.layer_scan import (batch_major_mask, check_state_layer,
                               previous_steps, scan_overwrite, step_product,
                               sum_dtype, transposed_row_products,
                               transposed_rows, unroll_steps, valid_or,
                               zero_padded)

Array = jax.Array


def _forward(unroll, W, b_hn, xp, mask, h0):
  """The forward loop over axis 1 of xp [B, T, 3H] (and mask [B, T, 1]);
  returns the final h and the buffers ((r, z, n) over xp, hn', ys)."""
  B, T, _ = xp.shape
  H = h0.shape[-1]
  times_W = step_product(W)

  def body(h, b, m):  # b = (xp_t, _, _), overwritten with the saved values
    x_t = b[0]
    hW = times_W(h)
    rz = jax.nn.sigmoid(x_t[:, :2 * H] + hW[:, :2 * H])
    r, z = rz[:, :H], rz[:, H:]
    hn = hW[:, 2 * H:] + b_hn[None, :]
    n = jnp.tanh(x_t[:, 2 * H:] + r * hn)
    h_new = (1 - z) * n + z * h
    return (valid_or(m, h_new, h), None,
            (jnp.concatenate([rz, n], -1), hn, zero_padded(m, h_new)))

  bufs = (xp, jnp.zeros((B, T, H), xp.dtype), jnp.zeros((B, T, H), xp.dtype))
  h, _, saved = scan_overwrite(body, h0, bufs, mask, unroll=unroll, axis=1,
                               xs_axis=1)
  return h, saved


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _layer(unroll, W, b_hn, xp, mask, h0):
  h, (_, _, ys) = _forward(unroll, W, b_hn, xp, mask, h0)
  return h, ys


def _layer_fwd(unroll, W, b_hn, xp, mask, h0):
  h, saved = _forward(unroll, W, b_hn, xp, mask, h0)
  return (h, saved[2]), (W, mask, h0, saved)


def _layer_bwd(unroll, res, cot):
  W, mask, h0, (A, hn, ys) = res
  dh_T, dys = cot
  H = h0.shape[-1]
  times_Wt = step_product(W.T)
  hp = previous_steps(h0, ys, 1)

  def body(dh, b, inp):  # b = (A_t, hn'_t), overwritten with cotangents
    A_t, hn_t = b
    h_prev, dy, m = inp if mask is not None else (*inp, None)
    r, z, n = A_t[:, :H], A_t[:, H:2 * H], A_t[:, 2 * H:]
    dh_new = dy + dh
    dn = dh_new * (1 - z) * (1 - n * n)                      # through tanh
    drz = jnp.concatenate([dn * hn_t * r * (1 - r),          # through sigma
                           dh_new * (h_prev - n) * z * (1 - z)], -1)
    dn, drz = zero_padded(m, (dn, drz))
    dhn = dn * r
    dh_prev = valid_or(
        m, dh_new * z + times_Wt(jnp.concatenate([drz, dhn], -1)), dh)
    return dh_prev, None, (jnp.concatenate([drz, dn], -1), dhn)

  inputs = (hp, dys) if mask is None else (hp, dys, mask)
  dh0, _, (dxp, dhn) = scan_overwrite(body, dh_T, (A, hn), inputs,
                                      reverse=True, unroll=unroll, axis=1,
                                      xs_axis=1)
  dtype = W.dtype
  hT = transposed_rows(hp)  # [H, T*B], once for both products
  dW = jnp.concatenate([transposed_row_products(hT, dxp[..., :2 * H], dtype),
                        transposed_row_products(hT, dhn, dtype)], -1)
  db_hn = jnp.sum(dhn.reshape(-1, H), axis=0,
                  dtype=sum_dtype(dtype)).astype(dtype)
  return dW, db_hn, dxp, None, dh0


_layer.defvjp(_layer_fwd, _layer_bwd)


class GRUArgs(NamedTuple):
  """What `gru_layer` needs from a `gru` cell's params."""
  W_h: Array   # [H, 3H], gates r, z, n
  b_hn: Array  # [H]


def layer_args(cell, params) -> GRUArgs | None:
  """The layer arguments of a `gru` cell (its precompute gives the layer's
  xp); None for every other cell."""
  from sorjax.cells.gru import GRU
  if type(cell) is not GRU:
    return None
  return GRUArgs(params["W_h"], params["b_hn"])


def run_layer(args: GRUArgs, xp, carry, lengths=None, unroll=None):
  """`gru_layer` from `layer_args`."""
  return gru_layer(args.W_h, args.b_hn, xp, carry, lengths, unroll)


def gru_layer(W_h: Array, b_hn: Array, xp: Array, carry: base.HCarry,
              lengths: Array | None = None, unroll: int | None = None
              ) -> tuple[base.HCarry, Array]:
  """Runs the GRU recurrence over batch-major precomputed inputs.

  Args:
    W_h: recurrent weights [H, 3H] = [W_hr | W_hz | W_hn].
    b_hn: the recurrent bias of n [H].
    xp: [B, T, 3H], x_t W_x + b (`GRU.precompute` of the inputs [B, T, D]).
    carry: initial `HCarry` (h [B, H]).
    lengths: optional int [B]; steps t >= lengths[b] keep the carry and
      output zeros, as `sorjax.unroll`.
    unroll: steps per loop iteration in both loops (`scan_overwrite`);
      None is 1.

  Returns:
    (final carry, ys [B, T, H]).
  """
  where = "gru_layer"
  if W_h.ndim != 2 or W_h.shape[1] != 3 * W_h.shape[0]:
    raise ValueError(f"{where}: W_h must be [H, 3H], got shape {W_h.shape}")
  H = W_h.shape[0]
  if b_hn.shape != (H,):
    raise ValueError(f"{where}: b_hn must be [H] = [{H}], got {b_hn.shape}")
  B, T = check_state_layer(where, H, xp, "3H", 3 * H, carry.h)
  h, ys = _layer(unroll_steps(where, unroll), W_h, b_hn, xp,
                 batch_major_mask(where, lengths, B, T), carry.h)
  return base.HCarry(h), ys
