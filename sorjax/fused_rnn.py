"""The Elman RNN's recurrence as a primitive with a hand-written VJP.

`sorjax.cells.rnn` (Maupome & Meurs eq. 1):

    h_t = phi(xp_t + h_{t-1} W),   xp_t = x_t U + b   (the hoisted precompute)

`sorjax.unroll` runs this on the batched-weight-gradient path. The generic
fused path (`unroll._fused_scan`) stacks h_{t-1} and z_t = h_{t-1} W for
every step, time-major. Here the forward writes h_t over xp_t (the
batch-major precompute becomes the output) and the backward writes
dpre_t = dL/d(xp_t + z_t) over h_t (`layer_scan.scan_overwrite` along
axis 1), which is the precompute's cotangent; dW = sum_t h_{t-1}^T dpre_t
is one matmul after the loop.

Measured against the generic path (forward + backward to the params and
x, two threads, six alternating timings; medians; BUILD_NOTES, "The GRU's
and the Elman RNN's own VJPs"): 1.10x at B=32 T=100 H=256 and 1.13x at
B=64 T=100 H=512, with 0.60x its temporary memory.

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
                               previous_steps, row_products, scan_overwrite,
                               step_product, unroll_steps, valid_or,
                               zero_padded)

Array = jax.Array

DERIVATIVE = {  # phi'(pre) from h = phi(pre)
    "tanh": lambda h: 1 - h * h,
    "identity": jnp.ones_like,
    "relu": lambda h: (h > 0).astype(h.dtype),
}


def _forward(unroll, act, W, xp, mask, h0):
  """The forward loop over axis 1 of xp [B, T, H] (and mask [B, T, 1]);
  returns the final h and ys (h_t, 0 on padded steps) written over xp."""
  phi = base.activation(act)
  hW = step_product(W)

  def body(h, x_t, m):
    h_new = phi(x_t + hW(h))
    return valid_or(m, h_new, h), None, zero_padded(m, h_new)

  h, _, ys = scan_overwrite(body, h0, xp, mask, unroll=unroll, axis=1,
                            xs_axis=1)
  return h, ys


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _layer(unroll, act, W, xp, mask, h0):
  return _forward(unroll, act, W, xp, mask, h0)


def _layer_fwd(unroll, act, W, xp, mask, h0):
  h, ys = _forward(unroll, act, W, xp, mask, h0)
  return (h, ys), (W, mask, h0, ys)


def _layer_bwd(unroll, act, res, cot):
  W, mask, h0, ys = res
  dh_T, dys = cot
  dphi = DERIVATIVE[act]
  dpreWt = step_product(W.T)
  hp = previous_steps(h0, ys, 1)

  def body(dh, h, inp):  # h = h_t, overwritten with dpre_t
    dy, m = inp if mask is not None else (inp[0], None)
    dpre = zero_padded(m, (dy + dh) * dphi(h))
    return valid_or(m, dpreWt(dpre), dh), None, dpre

  inputs = (dys,) if mask is None else (dys, mask)
  dh0, _, dxp = scan_overwrite(body, dh_T, ys, inputs, reverse=True,
                               unroll=unroll, axis=1, xs_axis=1)
  return row_products(hp, dxp, W.dtype), dxp, None, dh0


_layer.defvjp(_layer_fwd, _layer_bwd)


class RNNArgs(NamedTuple):
  """What `rnn_layer` needs from an `rnn` cell's params."""
  W: Array  # [H, H]
  activation: str


def layer_args(cell, params) -> RNNArgs | None:
  """The layer arguments of an `rnn` cell (its precompute gives the
  layer's xp); None for every other cell."""
  from sorjax.cells.rnn import RNN
  if type(cell) is not RNN:
    return None
  return RNNArgs(params["W"], cell.activation)


def run_layer(args: RNNArgs, xp, carry, lengths=None, unroll=None):
  """`rnn_layer` from `layer_args`."""
  return rnn_layer(args.W, xp, carry, lengths, unroll,
                   activation=args.activation)


def rnn_layer(W: Array, xp: Array, carry: base.HCarry,
              lengths: Array | None = None, unroll: int | None = None,
              activation: str = "tanh") -> tuple[base.HCarry, Array]:
  """Runs the Elman recurrence over batch-major precomputed inputs.

  Args:
    W: recurrent weights [H, H].
    xp: [B, T, H], x_t U + b (`RNN.precompute` of the inputs [B, T, D]).
    carry: initial `HCarry` (h [B, H]).
    lengths: optional int [B]; steps t >= lengths[b] keep the carry and
      output zeros, as `sorjax.unroll`.
    unroll: steps per loop iteration in both loops (`scan_overwrite`);
      None is 1.
    activation: phi, "tanh", "identity" or "relu".

  Returns:
    (final carry, ys [B, T, H]).
  """
  where = "rnn_layer"
  if W.ndim != 2 or W.shape[0] != W.shape[1]:
    raise ValueError(f"{where}: W must be [H, H], got shape {W.shape}")
  H = W.shape[0]
  B, T = check_state_layer(where, H, xp, "H", H, carry.h)
  if activation not in DERIVATIVE:
    raise ValueError(f"{where}: activation must be one of "
                     f"{sorted(DERIVATIVE)}, got {activation!r}")
  h, ys = _layer(unroll_steps(where, unroll), activation, W, xp,
                 batch_major_mask(where, lengths, B, T), carry.h)
  return base.HCarry(h), ys
