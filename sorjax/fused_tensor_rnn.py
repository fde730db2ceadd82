"""The second-order tensor RNN's recurrence as a primitive with a
hand-written VJP.

`sorjax.cells.tensor_rnn` (Maupome & Meurs eq. 5), A [D, H, H]:

    h_t[j] = phi(sum_{d,i} x_t[d] h_{t-1}[i] A[d, i, j] + b[j])

Every per-step quantity here is small ([B, H] or [B, D]) except the one
[B, D*H] product of each loop step, which nothing keeps:

- forward: z_t = h_{t-1} [A[0] | .. | A[D-1]] ([H, D*H], one matmul, A
  transposed once before the loop), then pre_t = sum_d x_t[d] z_t[d]
  (eq. 5); h_t is written into a batch-major buffer that becomes the
  output;
- backward: w_t = dpre_t A^T with A read as its [D*H, H] rows (one matmul,
  no copy of A), w_t[d] = A[d] dpre_t; then dh_{t-1} = sum_d x_t[d] w_t[d]
  and dx_t[d] = h_{t-1} . w_t[d], both elementwise. dpre_t is written over
  h_t;
- after the loop: dA[d] = sum_r (x_r[d] h_{r-1})^T dpre_r over the T*B
  rows, one [H, T*B] x [T*B, H] matmul per d (`lax.map` over d), and
  db = sum_r dpre_r.

JAX's autodiff of the cell's scan (the path `unroll` took before: the
generic fused path's stacked dz_t [T, B, D*H] is 4.8x its memory) saves
z_t for every step ([T, B, D*H]: D times the hidden states) and adds
h_{t-1}^T (x_t (x) dpre_t) into the whole [H, D*H] accumulator of dA at
every step. Measured against it (forward + backward to A, b and x, two
threads, D = 32, alternating timings, medians; BUILD_NOTES, "The tensor
RNN's own VJP"): 1.77x at B=32 T=100 H=256, 1.29-1.34x at B=64 T=100
H=512, 1.59-1.62x at B=32 T=200 H=1024 and 1.62-1.93x at H = 16-128, with
0.10-0.16x its temporary memory.

Forward-mode autodiff (jvp, jacfwd) is not defined through this primitive
(`jax.custom_vjp`); reverse mode, vmap and jit are.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sorjax import fused_rnn
from sorjax.cells import base
from sorjax.layer_scan import (batch_major_mask, check_state_layer,
                               previous_steps, scan_overwrite, sum_dtype,
                               unroll_steps, valid_or, zero_padded)

Array = jax.Array

# phi'(pre) from h = phi(pre), for the cell's two activations.
_DERIVATIVE = {k: fused_rnn.DERIVATIVE[k] for k in ("tanh", "identity")}


def _forward(unroll, act, A, b, xs, mask, h0):
  """The forward loop over axis 1 of xs [B, T, D] (and mask [B, T, 1]);
  returns the final h and ys [B, T, H] (h_t, 0 on padded steps)."""
  D, H, _ = A.shape
  A_ij = jnp.transpose(A, (1, 0, 2)).reshape(H, D * H)  # [i, (d, j)]
  phi = base.activation(act)
  ys = jnp.zeros(xs.shape[:2] + (H,), h0.dtype)

  def body(h, _, inp):
    x, m = inp if mask is not None else (inp[0], None)
    z = (h @ A_ij).reshape(*h.shape[:-1], D, H)  # h_{t-1}^T A[d], all d
    h_new = phi(jnp.einsum("bd,bdj->bj", x, z) + b[None])  # eq. 5
    return valid_or(m, h_new, h), None, zero_padded(m, h_new)

  inputs = (xs,) if mask is None else (xs, mask)
  h, _, ys = scan_overwrite(body, h0, ys, inputs, unroll=unroll, axis=1,
                            xs_axis=1)
  return h, ys


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _layer(unroll, act, A, b, xs, mask, h0):
  return _forward(unroll, act, A, b, xs, mask, h0)


def _layer_fwd(unroll, act, A, b, xs, mask, h0):
  h, ys = _forward(unroll, act, A, b, xs, mask, h0)
  return (h, ys), (A, xs, mask, h0, ys)


def _layer_bwd(unroll, act, res, cot):
  A, xs, mask, h0, ys = res
  dh_T, dys = cot
  D, H, _ = A.shape
  A_dij = A.reshape(D * H, H)  # [(d, i), j]: A itself, read transposed
  dphi = _DERIVATIVE[act]
  hp = previous_steps(h0, ys, 1)

  def body(dh, buf, inp):  # (h_t, 0) -> (dpre_t, dx_t)
    h = buf[0]
    dy, x, h_prev, m = inp if mask is not None else (*inp, None)
    dpre = zero_padded(m, (dy + dh) * dphi(h))
    w = jnp.einsum("bj,rj->br", dpre, A_dij).reshape(  # A[d] dpre_t, all d
        *h.shape[:-1], D, H)
    dh_prev = valid_or(m, jnp.einsum("bd,bdi->bi", x, w), dh)
    return dh_prev, None, (dpre, jnp.einsum("bi,bdi->bd", h_prev, w))

  inputs = (dys, xs, hp) if mask is None else (dys, xs, hp, mask)
  dh0, _, (dpre, dxs) = scan_overwrite(
      body, dh_T, (ys, jnp.zeros_like(xs)), inputs, reverse=True,
      unroll=unroll, axis=1, xs_axis=1)
  acc = sum_dtype(A.dtype)
  h_rows, d_rows = hp.reshape(-1, H), dpre.reshape(-1, H)
  dA = jax.lax.map(  # dA[d] = sum_r x_r[d] h_{r-1}^T dpre_r
      lambda x_d: jnp.einsum("ri,rj->ij", h_rows * x_d[:, None], d_rows,
                             preferred_element_type=acc),
      xs.reshape(-1, D).T)
  db = jnp.sum(d_rows, axis=0, dtype=acc)
  return dA.astype(A.dtype), db.astype(A.dtype), dxs, None, dh0


_layer.defvjp(_layer_fwd, _layer_bwd)


class TensorArgs(NamedTuple):
  """What `tensor_rnn_layer` needs from a `tensor_rnn` cell's params."""
  A: Array  # [D, H, H]
  b: Array  # [H]
  activation: str


def layer_args(cell, params) -> TensorArgs | None:
  """The layer arguments of a `tensor_rnn` cell (its precompute is the
  identity: the layer reads x_t); None for every other cell."""
  from sorjax.cells.tensor_rnn import TensorRNN
  if type(cell) is not TensorRNN:
    return None
  return TensorArgs(params["A"], params["b"], cell.activation)


def run_layer(args: TensorArgs, xs, carry, lengths=None, unroll=None):
  """`tensor_rnn_layer` from `layer_args`."""
  return tensor_rnn_layer(args.A, args.b, xs, carry, lengths, unroll,
                          activation=args.activation)


def tensor_rnn_layer(A: Array, b: Array, xs: Array, carry: base.HCarry,
                     lengths: Array | None = None, unroll: int | None = None,
                     activation: str = "tanh") -> tuple[base.HCarry, Array]:
  """Runs the tensor RNN (eq. 5) over batch-major inputs.

  Args:
    A: the third-order weights [D, H, H] (A[d, i, j] multiplies x[d] and
      h[i] into unit j).
    b: bias [H].
    xs: inputs [B, T, D].
    carry: initial `HCarry` (h [B, H]).
    lengths: optional int [B]; steps t >= lengths[b] keep the carry and
      output zeros, as `sorjax.unroll`.
    unroll: steps per loop iteration in both loops (`scan_overwrite`);
      None is 1.
    activation: phi, "tanh" or "identity".

  Returns:
    (final carry, ys [B, T, H]).
  """
  where = "tensor_rnn_layer"
  if A.ndim != 3 or A.shape[1] != A.shape[2]:
    raise ValueError(f"{where}: A must be [D, H, H], got shape {A.shape}")
  D, H, _ = A.shape
  if b.shape != (H,):
    raise ValueError(f"{where}: b must be [H] = [{H}], got {b.shape}")
  B, T = check_state_layer(where, H, xs, "D", D, carry.h, name="xs",
                           sizes=f"D = {D}")
  if activation not in _DERIVATIVE:
    raise ValueError(f"{where}: activation must be one of "
                     f"{sorted(_DERIVATIVE)}, got {activation!r}")
  h, ys = _layer(unroll_steps(where, unroll), activation, A, b, xs,
                 batch_major_mask(where, lengths, B, T), carry.h)
  return base.HCarry(h), ys
