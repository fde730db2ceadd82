"""The mmRNN recurrence as one primitive with a hand-written VJP.

    z_t   = h_{t-1} [W[1] | .. | W[K] | P_h]                (one matmul)
    v_t   = softmax(v_{t-1} P_v + z_t's last K + vx_t)      # eq. 6
    pre_t = sum_k v_t[k] (h_{t-1} W[k]) + hx_t              # eq. 7-8
    h_t   = tanh(pre_t)

(`sorjax.cells.mm_rnn`; hx_t = x_t W_hx + b and vx_t = x_t P_x are its
hoisted `precompute`.) `sorjax.unroll` runs it for an `mm_rnn` cell on the
batched-weight-gradient path. What it saves over that generic path
(`unroll._fused_scan`, which keeps z_t for the backward and writes dz_t over
it):

- No [T, B, K*H + K] stack of z_t. The backward needs z_t only for the
  gradient of the mixture weights, dL/dv_t[k] = (h_{t-1} W[k]) . dpre_t.
  That is h_{t-1} . (dpre_t W[k]^T), and G_t = dpre_t [W[1]^T | .. |
  W[K]^T] is the matmul the backward does anyway (dh_{t-1} = sum_k v_t[k]
  G_t[k] + dlogits_t P_h^T), so the dot products come from it and h_{t-1}.
  After the loop, dW[k] = sum_t h_{t-1}^T (v_t[k] dpre_t): K matmuls over
  all T*B rows, the same FLOPs as the generic dW = sum_t h_{t-1}^T dz_t.
- No fresh buffers in either loop: the forward writes (h_t, v_t) over
  (hx_t, vx_t), the backward writes (dpre_t, dlogits_t) -- the cotangents
  of (hx_t, vx_t) -- over them (`fused_lstm.scan_overwrite`).
- Batch-major throughout: the loops step along axis 1 of [B, T, ...], so
  neither x, nor ys, nor their cotangents are transposed to time-major.

Against that generic path (forward + backward, two threads, six
alternating timings each): 1.10-1.14x at B=32 T=100 H=256, 0.97-1.03x at
B=64 T=100 H=512, 0.96-1.00x at B=32 T=200 H=1024, with 0.81-0.84x its
temporary memory at all three (BUILD_NOTES, "mm_rnn's own VJP").

Forward-mode autodiff (jvp, jacfwd) is not defined through this primitive
(a `jax.custom_vjp`); reverse mode, vmap and jit are.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sorjax.cells.mm_rnn import MMRNNCarry, MMRNNInputs, fused_recurrent, mix
from sorjax.fused_lstm import check_unroll, scan_overwrite

Array = jax.Array


def _forward(unroll, W, P_h, P_v, hx, vx, mask, h0, v0):
  """The forward loop over axis 1 of hx [B, T, H], vx [B, T, K] (and of
  mask [B, T, 1]); returns the final (h, v) and (ys, vs): y_t (0 on padded
  steps) and v_t (the carried v there) written over hx and vx."""
  K, H, _ = W.shape
  Wc = fused_recurrent([W], [P_h])                          # [H, K*H + K]

  def body(carry, b, m):
    h, v = carry
    hx_t, vx_t = b
    z = h @ Wc
    v_new = jax.nn.softmax(v @ P_v + z[:, K * H:] + vx_t)   # eq. 6
    h_new = jnp.tanh(mix(v_new, z[:, :K * H]) + hx_t)       # eq. 7-8
    if m is None:
      return (h_new, v_new), None, (h_new, v_new)
    h_new, v_new = jnp.where(m, h_new, h), jnp.where(m, v_new, v)
    return (h_new, v_new), None, (jnp.where(m, h_new, 0), v_new)

  (h, v), _, (ys, vs) = scan_overwrite(body, (h0, v0), (hx, vx), mask,
                                       unroll=unroll, axis=1, xs_axis=1)
  return (h, v), ys, vs


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _layer(unroll, W, P_h, P_v, hx, vx, mask, h0, v0):
  final, ys, _ = _forward(unroll, W, P_h, P_v, hx, vx, mask, h0, v0)
  return final, ys


def _layer_fwd(unroll, W, P_h, P_v, hx, vx, mask, h0, v0):
  final, ys, vs = _forward(unroll, W, P_h, P_v, hx, vx, mask, h0, v0)
  return (final, ys), (W, P_h, P_v, mask, h0, v0, ys, vs)


def _layer_bwd(unroll, res, cot):
  W, P_h, P_v, mask, h0, v0, ys, vs = res
  (dh_T, dv_T), dys = cot
  K, H, _ = W.shape
  B = ys.shape[0]
  # [W[1]^T | .. | W[K]^T] once: a per-step dot on a transposed operand is
  # slower on CPU.
  Wt = jnp.transpose(W, (2, 0, 1)).reshape(H, K * H)
  P_hT, P_vT = P_h.T, P_v.T
  # h_{t-1} and v_{t-1}: y_t is the carry h_t on valid steps, and valid steps
  # form a prefix, so every step that uses h_{t-1} (dpre_t != 0) finds it.
  hp = jnp.concatenate([h0[:, None], ys[:, :-1]], axis=1)
  vp = jnp.concatenate([v0[:, None], vs[:, :-1]], axis=1)

  def body(carry, b, inp):  # b = (y_t, v_t), overwritten with (dpre_t, dlog_t)
    dh, dv = carry
    h, v = b
    h_prev, dy, m = inp if mask is not None else (*inp, None)
    dpre = (dy + dh) * (1 - h * h)                          # through tanh
    if m is not None:  # a padded step passed its carry through
      dpre = jnp.where(m, dpre, 0)
    G = (dpre @ Wt).reshape(B, K, H)                        # dpre W[k]^T
    # As batched dots: as multiply-sums XLA:CPU made them YNNPACK reductions
    # of ~65 us a step at B=64 H=512, against ~7 us.
    dv_t = jnp.einsum("bkh,bh->bk", G, h_prev) + dv         # dL/dv_t
    dlog = v * (dv_t - jnp.sum(v * dv_t, axis=-1, keepdims=True))  # softmax
    dh_prev = jnp.einsum("bk,bkh->bh", v, G) + dlog @ P_hT
    dv_prev = dlog @ P_vT
    if m is not None:
      dlog = jnp.where(m, dlog, 0)
      dh_prev = jnp.where(m, dh_prev, dh)
      dv_prev = jnp.where(m, dv_prev, dv)
    return (dh_prev, dv_prev), None, (dpre, dlog)

  inputs = (hp, dys) if mask is None else (hp, dys, mask)
  (dh0, dv0), _, (dpre, dlog) = scan_overwrite(
      body, (dh_T, dv_T), (ys, vs), inputs, reverse=True, unroll=unroll,
      axis=1, xs_axis=1)
  # Sums over all T*B rows, accumulated in at least float32.
  acc = W.dtype if jnp.finfo(W.dtype).bits >= 32 else jnp.float32
  rows = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
  wsum = lambda a, d: jnp.einsum(  # noqa: E731
      "rh,rn->hn", rows(a), d, preferred_element_type=acc).astype(W.dtype)
  dP = rows(dlog)
  v_rows, d_rows = rows(vs), rows(dpre)
  dW = jnp.stack([wsum(hp, d_rows * v_rows[:, k:k + 1])      # sum_t h_{t-1}^T
                  for k in range(K)])                        # (v_t[k] dpre_t)
  return (dW, wsum(hp, dP), wsum(vp, dP), dpre, dlog, None, dh0, dv0)


_layer.defvjp(_layer_fwd, _layer_bwd)


class MMRNNArgs(NamedTuple):
  """What `mm_rnn_layer` needs from an `mm_rnn` cell's params."""
  W: Array    # [K, H, H], the choice matrices
  P_h: Array  # [H, K], W_proj's h rows
  P_v: Array  # [K, K], W_proj's v rows


def mm_rnn_args(cell, params) -> MMRNNArgs | None:
  """`MMRNNArgs` of an `mm_rnn` cell (its precompute gives the layer's xp);
  None for every other cell."""
  from sorjax.cells.mm_rnn import MMRNN
  if type(cell) is not MMRNN:
    return None
  H, K = cell.hidden_size, cell.num_matrices
  P = params["W_proj"]
  return MMRNNArgs(params["W"], P[K:K + H], P[:K])


def mm_rnn_layer(W: Array, P_h: Array, P_v: Array, xp: MMRNNInputs,
                 carry: MMRNNCarry, lengths: Array | None = None,
                 unroll: int | None = None) -> tuple[MMRNNCarry, Array]:
  """Runs the mmRNN recurrence over batch-major precomputed inputs.

  Args:
    W: choice matrices [K, H, H].
    P_h: W_proj's h rows [H, K]; P_v: its v rows [K, K].
    xp: `MMRNNInputs` (hx [B, T, H], vx [B, T, K]): `MMRNN.precompute` of
      the inputs [B, T, D].
    carry: initial `MMRNNCarry` (h [B, H], v [B, K]).
    lengths: optional int [B]; steps t >= lengths[b] keep the carry and
      output zeros, as `sorjax.unroll`.
    unroll: steps per loop iteration in both loops (`scan_overwrite`);
      None is 1.

  Returns:
    (final carry, ys [B, T, H]).
  """
  where = "mm_rnn_layer"
  if W.ndim != 3 or W.shape[1] != W.shape[2]:
    raise ValueError(f"{where}: W must be [K, H, H], got {W.shape}")
  K, H, _ = W.shape
  if P_h.shape != (H, K) or P_v.shape != (K, K):
    raise ValueError(f"{where}: P_h must be [H, K] = [{H}, {K}] and P_v "
                     f"[K, K]; got {P_h.shape}, {P_v.shape}")
  hx, vx = xp
  if hx.ndim != 3 or hx.shape[2] != H:
    raise ValueError(f"{where}: xp.hx must be [B, T, H] with H = {H}, got "
                     f"{hx.shape}")
  B, T = hx.shape[:2]
  if vx.shape != (B, T, K):
    raise ValueError(f"{where}: xp.vx must be [B, T, K] = [{B}, {T}, {K}], "
                     f"got {vx.shape}")
  if carry.h.shape != (B, H) or carry.v.shape != (B, K):
    raise ValueError(f"{where}: carry must be (h [B, H], v [B, K]) = "
                     f"([{B}, {H}], [{B}, {K}]); got {carry.h.shape}, "
                     f"{carry.v.shape}")
  if T == 0:
    raise ValueError(f"{where}: the inputs have no time steps (T = 0)")
  check_unroll(where, unroll)
  mask = None
  if lengths is not None:
    lengths = jnp.asarray(lengths)
    if lengths.shape != (B,):
      raise ValueError(f"{where}: lengths must have shape [B] = [{B}], got "
                       f"{lengths.shape}")
    mask = (jnp.arange(T, dtype=jnp.int32)[None, :]
            < lengths.astype(jnp.int32)[:, None])[:, :, None]  # [B, T, 1]
  (h, v), ys = _layer(1 if unroll is None else int(unroll), W, P_h, P_v, hx,
                      vx, mask, carry.h, carry.v)
  return MMRNNCarry(h, v), ys
