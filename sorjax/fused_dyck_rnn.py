"""The Dyck-RNN's stack recurrence as a primitive with a hand-written VJP.

`sorjax.cells.dyck_rnn` (Renganathan & Singh eq. 3-5), with g_t and
u_t = g_t x_t W_hx hoisted (the cell's `precompute`):

    h_t = g_t push(h_{t-1}) + (1 - g_t) pop(h_{t-1}) + u_t       # eq. 4-5

push and pop (W_1 h, W_2 h) are shifts, and each is the other's
transpose, so the backward is shifts too:

    dh_{t-1} = pop(g_t dh_t) + push((1 - g_t) dh_t)
    dg_t     = sum_k dh_t[k] (push(h_{t-1}) - pop(h_{t-1}))[k],   du_t = dh_t

The forward writes h_t over u_t (batch-major, `layer_scan.scan_overwrite`
along axis 1), which becomes the output; the backward writes du_t over
h_t and stacks dg_t ([T, B, 1]). JAX's autodiff of the cell's scan, time-
major, keeps per-step residuals of the shifts and transposes x, the
precompute and the outputs between the batch-major model and its loop.

Measured against it (forward + backward to W_proj, W_hx and x, D = H,
two threads, six alternating timings, medians; BUILD_NOTES, "The
Dyck-RNN's own VJP"): 1.15x at B=32 T=100 H=128, 1.18x at H=256, 1.56x
at B=64 T=100 H=512, 1.19x at B=32 T=200 H=1024 (four timings), with
0.34x its temporary memory; 1.05x at H = 64 and 0.60x at B=10 T=200
H=12 (the Dyck experiments' size, where a step's few kernels are
overhead-bound and strided slices of batch-major buffers cost more), so
`sorjax.unroll` runs it from hidden size 128 (`FUSED_GRAD_MIN_HIDDEN`) or
when fused_grad=True.

Forward-mode autodiff (jvp, jacfwd) is not defined through this primitive
(`jax.custom_vjp`); reverse mode, vmap and jit are.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sorjax.cells import base
from sorjax.cells.dyck_rnn import pop, push
from sorjax.layer_scan import (batch_major_mask, check_state_layer,
                               previous_steps, scan_overwrite, unroll_steps,
                               valid_or, zero_padded)

Array = jax.Array


def _forward(unroll, g, u, mask, h0):
  """The forward loop over axis 1 of u [B, T, H] (and g [B, T, 1], mask
  [B, T, 1]); returns the final h and ys (h_t, 0 on padded steps) written
  over u."""
  def body(h, u_t, inp):
    g_t, m = inp if mask is not None else (inp[0], None)
    h_new = g_t * push(h) + (1 - g_t) * pop(h) + u_t               # eq. 4-5
    return valid_or(m, h_new, h), None, zero_padded(m, h_new)

  inputs = (g,) if mask is None else (g, mask)
  h, _, ys = scan_overwrite(body, h0, u, inputs, unroll=unroll, axis=1,
                            xs_axis=1)
  return h, ys


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _layer(unroll, g, u, mask, h0):
  return _forward(unroll, g, u, mask, h0)


def _layer_fwd(unroll, g, u, mask, h0):
  h, ys = _forward(unroll, g, u, mask, h0)
  return (h, ys), (g, mask, h0, ys)


def _layer_bwd(unroll, res, cot):
  g, mask, h0, ys = res
  dh_T, dys = cot
  hp = previous_steps(h0, ys, 1)                            # h_{t-1}

  def body(dh, _, inp):  # h_t -> du_t = dL/dh_t
    dy, g_t, h_prev, m = inp if mask is not None else (*inp, None)
    d = zero_padded(m, dy + dh)
    dg = jnp.sum(d * (push(h_prev) - pop(h_prev)), axis=-1, keepdims=True)
    dh_prev = pop(g_t * d) + push((1 - g_t) * d)           # W_1^T = W_2
    return valid_or(m, dh_prev, dh), dg, d

  inputs = (dys, g, hp) if mask is None else (dys, g, hp, mask)
  dh0, dgs, dus = scan_overwrite(body, dh_T, ys, inputs, reverse=True,
                                 unroll=unroll, axis=1, xs_axis=1)
  return jnp.swapaxes(dgs, 0, 1), dus, None, dh0


_layer.defvjp(_layer_fwd, _layer_bwd)


class DyckArgs(NamedTuple):
  """`dyck_rnn_layer` needs nothing from the params: the precompute holds
  g_t and u_t, and the shifts are fixed."""


def layer_args(cell, params) -> DyckArgs | None:
  """`DyckArgs()` for a `dyck_rnn` cell (its precompute gives the layer's
  inputs); None for every other cell."""
  from sorjax.cells.dyck_rnn import DyckRNN
  return DyckArgs() if type(cell) is DyckRNN else None


def run_layer(args: DyckArgs, xp, carry, lengths=None, unroll=None):
  """`dyck_rnn_layer` from `layer_args`."""
  return dyck_rnn_layer(xp, carry, lengths, unroll)


def dyck_rnn_layer(xp, carry: base.HCarry, lengths: Array | None = None,
                   unroll: int | None = None) -> tuple[base.HCarry, Array]:
  """Runs the Dyck-RNN's stack recurrence over batch-major precomputed
  inputs.

  Args:
    xp: `DyckInputs` (g [B, T, 1], the push weights, and u [B, T, H],
      what a push writes): the cell's `precompute` of the inputs.
    carry: initial `HCarry` (h [B, H], the stack).
    lengths: optional int [B]; steps t >= lengths[b] keep the carry and
      output zeros, as `sorjax.unroll`.
    unroll: steps per loop iteration in both loops; None is 1.

  Returns:
    (final carry, ys [B, T, H]).
  """
  where = "dyck_rnn_layer"
  g, u = xp
  H = carry.h.shape[-1]
  B, T = check_state_layer(where, H, u, "H", H, carry.h, name="xp.u")
  if g.shape != (B, T, 1):
    raise ValueError(f"{where}: xp.g must be [B, T, 1] = [{B}, {T}, 1], "
                     f"got {g.shape}")
  h, ys = _layer(unroll_steps(where, unroll), g, u,
                 batch_major_mask(where, lengths, B, T), carry.h)
  return base.HCarry(h), ys
