"""The multi-matrix cells' recurrences (mm_rnn, mm_lstm) as primitives with
hand-written VJPs.

Both mix, per group n of choice matrices (mm_rnn: one group; mm_lstm: one
per gate c, i, f, o), the products of h_{t-1} with K_n matrices W_n[k] by a
key vector v_n:

    z_t     = h_{t-1} [W_1[1] | .. | W_N[K_N]]                (one matmul)
    v_n,t   = softmax(v_n,t-1 P_v,n + h_{t-1} P_h,n + vx_n,t)  # eq. 6 / 9-15
    pre_n,t = sum_k v_n,t[k] (h_{t-1} W_n[k])                 # eq. 7 / 10-16

then mm_rnn: h_t = tanh(pre_t + hx_t) (eq. 8); mm_lstm: the LSTM update of
the gates pre_n,t + gx_n,t (eq. 17-22). (`sorjax.cells.mm_rnn`,
`sorjax.cells.mm_lstm`; hx / gx and vx are their hoisted `precompute`.)
`sorjax.unroll` runs these on the batched-weight-gradient path. What they
save over that generic path (`unroll._fused_scan`, which keeps z_t for the
backward and writes dz_t over it):

- No [T, B, sum_n K_n H + sum_n K_n] stack of z_t. The backward needs z_t
  only for the gradient of the key vectors, dL/dv_n,t[k] =
  (h_{t-1} W_n[k]) . dpre_n,t. That is h_{t-1} . (dpre_n,t W_n[k]^T), and
  G_n,t = dpre_n,t [W_n[1]^T | .. | W_n[K_n]^T] is the product the backward
  needs anyway (dh_{t-1} = sum_n sum_k v_n,t[k] G_n,t[k] + dlogits_t P_h^T,
  the FLOPs of the generic dz_t W^T), so the dot products come from it and
  h_{t-1}. After the loop dW_n[k] = sum_t h_{t-1}^T (v_n,t[k] dpre_n,t):
  sum_n K_n matmuls over all T*B rows, the FLOPs of the generic
  dW = sum_t h_{t-1}^T dz_t, which share one transposed copy of h_{t-1}'s
  rows (`layer_scan.transposed_rows`).
- The loops overwrite the batch-major precompute buffers instead of
  stacking fresh ones (`layer_scan.scan_overwrite` along axis 1). mm_rnn's
  forward writes (h_t, v_t) over (hx_t, vx_t); mm_lstm's writes its gate
  activations and v_t over (gx_t, vx_t) and stacks h_t and c_{t-1}. The
  backwards write (dpre_t, dlogits_t), the cotangents of those inputs,
  over the same buffers.

Measured against the generic path (forward + backward to the params and
x, two threads, six alternating timings; medians; BUILD_NOTES, "The
multi-matrix cells' own VJPs"): mm_rnn 1.12x at B=32 T=100 H=256, 1.06x
at B=64 T=100 H=512, 1.00x at B=32 T=200 H=1024; mm_lstm 1.15x and 1.14x
at the first two; half the temporary memory at every one of them.

Forward-mode autodiff (jvp, jacfwd) is not defined through these primitives
(`jax.custom_vjp`); reverse mode, vmap and jit are.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sorjax.cells.mm_lstm import MMLSTMCarry, MMLSTMInputs
from sorjax.cells.mm_rnn import MMRNNCarry, MMRNNInputs, fused_recurrent, mix
from sorjax.layer_scan import (batch_major_mask, previous_steps, row_products,
                               scan_overwrite, step_product,
                               transposed_row_products, transposed_rows,
                               unroll_steps, valid_or, zero_padded)

Array = jax.Array


# --------------------------------------------------------- the mixture, shared

def _offsets(Ks):
  out, o = [], 0
  for K in Ks:
    out.append(o)
    o += K
  return out


def _mix_forward(Ws, P_h, P_vs, hWc, h, v, vx_t):
  """z = h Wc (hWc: `step_product` of Wc = [W_1[1] | .. | W_N[K_N]]) and
  h P_h, then every group's keys (eq. 6 / 9-15) and mixture (eq. 7 /
  10-16). Returns (pre [B, N*H], v_new [B, sum K]). P_h is a product of
  its own: with its sum K columns appended, Wc's width stops being a
  multiple of H (2052 instead of 2048 at H = 512, K = 4), and XLA:CPU's
  per-step product ran 13% slower (B = 64, 327 vs 370 GFLOP/s)."""
  H = h.shape[-1]
  Ks = [W.shape[0] for W in Ws]
  z, zv = hWc(h), h @ P_h
  pre, vs, oW = [], [], 0
  for P_v, K, o in zip(P_vs, Ks, _offsets(Ks)):
    logits = v[:, o:o + K] @ P_v + zv[:, o:o + K] + vx_t[:, o:o + K]
    vs.append(jax.nn.softmax(logits, axis=-1))
    pre.append(mix(vs[-1], z[:, oW:oW + K * H]))
    oW += K * H
  return jnp.concatenate(pre, -1), jnp.concatenate(vs, -1)


def _transposed(Ws):
  """d -> d [W_n[1]^T | .. | W_n[K_n]^T] ([H, K_n*H]) per group, laid out
  once per call (`step_product`)."""
  return [step_product(jnp.transpose(W, (2, 0, 1)).reshape(W.shape[2], -1))
          for W in Ws]


def _mix_backward(Wts, P_hT, P_vTs, Ks, dpre, h_prev, v, dv):
  """The mixture's VJP from dpre [B, N*H] (Wts: `_transposed`): returns
  (dL/dh_{t-1} through the mixture and the keys, dL/dv_{t-1} [B, sum K],
  dlogits_t [B, sum K])."""
  B, H = h_prev.shape
  dh_prev, dlogs, dv_prev = 0, [], []
  for n, (Wt, P_vT, K, o) in enumerate(zip(Wts, P_vTs, Ks, _offsets(Ks))):
    G = Wt(dpre[:, n * H:(n + 1) * H]).reshape(B, K, H)  # dpre_n W_n[k]^T
    v_n = v[:, o:o + K]
    # Batched dots: as multiply-sums XLA:CPU made them YNNPACK reductions
    # of ~65 us a step at B=64 H=512, against ~7 us.
    dv_n = jnp.einsum("bkh,bh->bk", G, h_prev) + dv[:, o:o + K]
    dlog = v_n * (dv_n - jnp.sum(v_n * dv_n, axis=-1, keepdims=True))
    dh_prev = dh_prev + jnp.einsum("bk,bkh->bh", v_n, G)
    dlogs.append(dlog)
    dv_prev.append(dlog @ P_vT)
  dlog = jnp.concatenate(dlogs, -1)
  return (dh_prev + dlog @ P_hT, jnp.concatenate(dv_prev, -1), dlog)


def _sums(Ws, hp, vs, vp, dpre, dlog):
  """dW_n[k] = sum_t h_{t-1}^T (v_n,t[k] dpre_n,t), dP_h = sum_t h_{t-1}^T
  dlogits_t and dP_v,n = sum_t v_n,t-1^T dlogits_n,t, over all T*B rows of
  [B, T, .] arrays, accumulated in at least float32.

  The sum K + 1 products by h_{t-1} read it transposed once
  (`transposed_rows`; forward + backward, mm_rnn 1.03-1.05x at B=64 T=100
  H=512 and 1.08-1.10x at B=32 T=100 H=256, mm_lstm 1.05x and 1.08x). The
  sum K matrices come from a loop with one product per iteration, so one
  scaled copy v_n,t[k] dpre_n,t is live at a time: unrolled, XLA kept
  several (mm_lstm B=64 T=100 H=512: 267 MB of temporaries, 162 MB
  without these products)."""
  dtype = Ws[0].dtype
  rows = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
  hT = transposed_rows(hp)                                    # [H, T*B]
  wsum = lambda d: transposed_row_products(hT, d, dtype)  # noqa: E731
  H = hp.shape[-1]
  vr, vpr, dr, dl = rows(vs), rows(vp), rows(dpre), rows(dlog)
  Ks = [W.shape[0] for W in Ws]
  group = jnp.asarray(sum(([n] * K for n, K in enumerate(Ks)), []), jnp.int32)

  def one(j, dW):  # the j-th matrix overall: group n, key column j
    d_n = jax.lax.dynamic_slice_in_dim(dr, group[j] * H, H, axis=1)
    v_k = jax.lax.dynamic_slice_in_dim(vr, j, 1, axis=1)
    return jax.lax.dynamic_update_index_in_dim(dW, wsum(d_n * v_k), j, 0)

  dW = jax.lax.fori_loop(0, sum(Ks), one, jnp.zeros((sum(Ks), H, H), dtype))
  o = _offsets(Ks)
  return (tuple(dW[o[n]:o[n] + K] for n, K in enumerate(Ks)), wsum(dl),
          tuple(row_products(vpr[:, o[n]:o[n] + K], dl[:, o[n]:o[n] + K],
                             dtype) for n, K in enumerate(Ks)))


# ------------------------------------------------------------------- mm_rnn

def _rnn_forward(unroll, Ws, P_h, P_vs, hx, vx, mask, h0, v0):
  """The loop over axis 1 of hx [B, T, H], vx [B, T, K] (and mask
  [B, T, 1]); returns the final (h, v) and (ys, vs): y_t (0 on padded
  steps) and v_t (the carried v there) written over hx and vx."""
  hWc = step_product(fused_recurrent(Ws, []))

  def body(carry, b, m):
    h, v = carry
    hx_t, vx_t = b
    pre, v_new = _mix_forward(Ws, P_h, P_vs, hWc, h, v, vx_t)
    h_new = jnp.tanh(pre + hx_t)                             # eq. 8
    new = valid_or(m, (h_new, v_new), carry)
    return new, None, (zero_padded(m, h_new), new[1])

  (h, v), _, (ys, vs) = scan_overwrite(body, (h0, v0), (hx, vx), mask,
                                       unroll=unroll, axis=1, xs_axis=1)
  return (h, v), ys, vs


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _rnn_layer(unroll, Ws, P_h, P_vs, hx, vx, mask, h0, v0):
  final, ys, _ = _rnn_forward(unroll, Ws, P_h, P_vs, hx, vx, mask, h0, v0)
  return final, ys


def _rnn_layer_fwd(unroll, Ws, P_h, P_vs, hx, vx, mask, h0, v0):
  final, ys, vs = _rnn_forward(unroll, Ws, P_h, P_vs, hx, vx, mask, h0, v0)
  return (final, ys), (Ws, P_h, P_vs, mask, h0, v0, ys, vs)


def _rnn_layer_bwd(unroll, res, cot):
  Ws, P_h, P_vs, mask, h0, v0, ys, vs = res
  (dh_T, dv_T), dys = cot
  Ks = [W.shape[0] for W in Ws]
  Wts, P_hT, P_vTs = _transposed(Ws), P_h.T, [P.T for P in P_vs]
  hp = previous_steps(h0, ys, 1)

  def body(carry, b, inp):  # b = (y_t, v_t), overwritten with (dpre, dlog)
    dh, dv = carry
    h, v = b
    h_prev, dy, m = inp if mask is not None else (*inp, None)
    dpre = zero_padded(m, (dy + dh) * (1 - h * h))           # through tanh
    dh_prev, dv_prev, dlog = _mix_backward(Wts, P_hT, P_vTs, Ks, dpre,
                                           h_prev, v, dv)
    return (valid_or(m, (dh_prev, dv_prev), carry), None,
            (dpre, zero_padded(m, dlog)))

  inputs = (hp, dys) if mask is None else (hp, dys, mask)
  (dh0, dv0), _, (dpre, dlog) = scan_overwrite(
      body, (dh_T, dv_T), (ys, vs), inputs, reverse=True, unroll=unroll,
      axis=1, xs_axis=1)
  dWs, dP_h, dP_vs = _sums(Ws, hp, vs, previous_steps(v0, vs, 1), dpre, dlog)
  return dWs, dP_h, dP_vs, dpre, dlog, None, dh0, dv0


_rnn_layer.defvjp(_rnn_layer_fwd, _rnn_layer_bwd)


# ------------------------------------------------------------------ mm_lstm

def _lstm_forward(unroll, Ws, P_h, P_vs, gx, vx, mask, h0, c0, v0):
  """The loop over axis 1 of gx [B, T, 4H], vx [B, T, sum K] (and mask);
  returns the final (h, c, v), ys and c_{t-1} ([T, B, H], stacked), and
  the activations A_t = [c^_t, i_t, f_t, o_t] and v_t written over gx, vx."""
  hWc = step_product(fused_recurrent(Ws, []))
  H = h0.shape[-1]

  def body(carry, b, m):
    h, c, v = carry
    gx_t, vx_t = b
    pre, v_new = _mix_forward(Ws, P_h, P_vs, hWc, h, v, vx_t)
    a = pre + gx_t                                           # gates c, i, f, o
    A = jnp.concatenate([jnp.tanh(a[:, :H]),                 # eq. 20
                         jax.nn.sigmoid(a[:, H:])], -1)      # eq. 17-19
    c_hat, i, f, o = (A[:, k * H:(k + 1) * H] for k in range(4))
    c_new = f * c + i * c_hat                                # eq. 21
    h_new = o * jnp.tanh(c_new)                              # eq. 22
    new = valid_or(m, (h_new, c_new, v_new), carry)
    return new, (zero_padded(m, h_new), c), (A, new[2])

  final, (ys, cs), (As, vs) = scan_overwrite(
      body, (h0, c0, v0), (gx, vx), mask, unroll=unroll, axis=1, xs_axis=1)
  return final, jnp.swapaxes(ys, 0, 1), cs, As, vs


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _lstm_layer(unroll, Ws, P_h, P_vs, gx, vx, mask, h0, c0, v0):
  final, ys, _, _, _ = _lstm_forward(unroll, Ws, P_h, P_vs, gx, vx, mask,
                                     h0, c0, v0)
  return final, ys


def _lstm_layer_fwd(unroll, Ws, P_h, P_vs, gx, vx, mask, h0, c0, v0):
  final, ys, cs, As, vs = _lstm_forward(unroll, Ws, P_h, P_vs, gx, vx, mask,
                                        h0, c0, v0)
  return (final, ys), (Ws, P_h, P_vs, mask, h0, v0, ys, cs, As, vs)


def _lstm_layer_bwd(unroll, res, cot):
  Ws, P_h, P_vs, mask, h0, v0, ys, cs, As, vs = res
  (dh_T, dc_T, dv_T), dys = cot
  H = h0.shape[-1]
  Ks = [W.shape[0] for W in Ws]
  Wts, P_hT, P_vTs = _transposed(Ws), P_h.T, [P.T for P in P_vs]
  hp = previous_steps(h0, ys, 1)

  def body(carry, b, inp):  # b = (A_t, v_t), overwritten with (dpre, dlog)
    dh, dc, dv = carry
    A, v = b
    h_prev, c_prev, dy, m = inp if mask is not None else (*inp, None)
    c_hat, i, f, o = (A[:, k * H:(k + 1) * H] for k in range(4))
    tc = jnp.tanh(f * c_prev + i * c_hat)                    # tanh(c_t)
    dh_t, dc_t = zero_padded(m, (dy + dh, dc))
    dct = dc_t + dh_t * o * (1 - tc * tc)                    # dL/dc_t, total
    dpre = jnp.concatenate([dct * i * (1 - c_hat * c_hat),
                            dct * c_hat * i * (1 - i),
                            dct * c_prev * f * (1 - f),
                            dh_t * tc * o * (1 - o)], -1)
    dh_prev, dv_prev, dlog = _mix_backward(Wts, P_hT, P_vTs, Ks, dpre,
                                           h_prev, v, dv)
    return (valid_or(m, (dh_prev, dct * f, dv_prev), carry), None,
            (dpre, zero_padded(m, dlog)))

  cs = jnp.swapaxes(cs, 0, 1)  # batch-major like the other inputs
  inputs = (hp, cs, dys) if mask is None else (hp, cs, dys, mask)
  (dh0, dc0, dv0), _, (dpre, dlog) = scan_overwrite(
      body, (dh_T, dc_T, dv_T), (As, vs), inputs, reverse=True,
      unroll=unroll, axis=1, xs_axis=1)
  dWs, dP_h, dP_vs = _sums(Ws, hp, vs, previous_steps(v0, vs, 1), dpre, dlog)
  return dWs, dP_h, dP_vs, dpre, dlog, None, dh0, dc0, dv0


_lstm_layer.defvjp(_lstm_layer_fwd, _lstm_layer_bwd)


# ------------------------------------------------------------------ the API

def _check(where, Ws, P_h, P_vs, xs, n_x, carry_h, carry_vs):
  """Shapes of the common arguments; returns (B, T, H, Ks)."""
  for n, W in enumerate(Ws):
    if W.ndim != 3 or W.shape[1] != W.shape[2] or (
        W.shape[1] != Ws[0].shape[1]):
      raise ValueError(f"{where}: every W must be [K, H, H] with one H; W "
                       f"{n} is {W.shape}")
  Ks = tuple(W.shape[0] for W in Ws)
  H, Kt = Ws[0].shape[1], sum(Ks)
  if P_h.shape != (H, Kt):
    raise ValueError(f"{where}: P_h must be [H, sum K] = [{H}, {Kt}], got "
                     f"{P_h.shape}")
  for n, (P, K) in enumerate(zip(P_vs, Ks)):
    if P.shape != (K, K):
      raise ValueError(f"{where}: P_v {n} must be [K, K] = [{K}, {K}], got "
                       f"{P.shape}")
  gx, vx = xs
  if gx.ndim != 3 or gx.shape[2] != n_x * H:
    raise ValueError(f"{where}: xp's input terms must be [B, T, {n_x * H}] "
                     f"({n_x} x H, H = {H}), got {gx.shape}")
  B, T = gx.shape[:2]
  if vx.shape != (B, T, Kt):
    raise ValueError(f"{where}: xp.vx must be [B, T, sum K] = [{B}, {T}, "
                     f"{Kt}], got {vx.shape}")
  if carry_h.shape != (B, H) or any(v.shape != (B, K)
                                    for v, K in zip(carry_vs, Ks)):
    raise ValueError(f"{where}: carry must hold h [B, H] = [{B}, {H}] and "
                     f"keys [B, K] for K in {Ks}; got h {carry_h.shape}, "
                     f"keys {[v.shape for v in carry_vs]}")
  if T == 0:
    raise ValueError(f"{where}: the inputs have no time steps (T = 0)")
  return B, T, H, Ks


class MMRNNArgs(NamedTuple):
  """What `mm_rnn_layer` needs from an `mm_rnn` cell's params."""
  W: Array    # [K, H, H], the choice matrices
  P_h: Array  # [H, K], W_proj's h rows
  P_v: Array  # [K, K], W_proj's v rows


class MMLSTMArgs(NamedTuple):
  """What `mm_lstm_layer` needs from an `mm_lstm` cell's params (gates c,
  i, f, o)."""
  Ws: tuple     # W_g [K_g, H, H]
  P_h: Array    # [H, sum K_g], every W_g_proj's h rows side by side
  P_vs: tuple   # W_g_proj's v rows [K_g, K_g]


def layer_args(cell, params) -> MMRNNArgs | MMLSTMArgs | None:
  """The layer arguments of an `mm_rnn` or `mm_lstm` cell (its precompute
  gives the layer's xp); None for every other cell."""
  from sorjax.cells.mm_lstm import GATES, MMLSTM
  from sorjax.cells.mm_rnn import MMRNN
  H = cell.hidden_size
  if type(cell) is MMRNN:
    K = cell.num_matrices
    P = params["W_proj"]
    return MMRNNArgs(params["W"], P[K:K + H], P[:K])
  if type(cell) is MMLSTM:
    Ks = cell.num_matrices
    Ps = [params[f"W_{g}_proj"] for g in GATES]
    return MMLSTMArgs(tuple(params[f"W_{g}"] for g in GATES),
                      jnp.concatenate([P[K:K + H] for P, K in zip(Ps, Ks)],
                                      axis=1),
                      tuple(P[:K] for P, K in zip(Ps, Ks)))
  return None


def run_layer(args, xp, carry, lengths=None, unroll=None):
  """`mm_rnn_layer` or `mm_lstm_layer`, by the type of `args`."""
  run = mm_rnn_layer if isinstance(args, MMRNNArgs) else mm_lstm_layer
  return run(*args, xp, carry, lengths, unroll)


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
  B, T, _, _ = _check(where, (W,), P_h, (P_v,), xp, 1, carry.h, (carry.v,))
  (h, v), ys = _rnn_layer(unroll_steps(where, unroll), (W,), P_h, (P_v,),
                          xp.hx, xp.vx, batch_major_mask(where, lengths, B, T),
                          carry.h, carry.v)
  return MMRNNCarry(h, v), ys


def mm_lstm_layer(Ws, P_h: Array, P_vs, xp: MMLSTMInputs,
                  carry: MMLSTMCarry, lengths: Array | None = None,
                  unroll: int | None = None) -> tuple[MMLSTMCarry, Array]:
  """Runs the mmLSTM recurrence over batch-major precomputed inputs.

  Args:
    Ws: the four gates' choice matrices W_g [K_g, H, H], gates c, i, f, o.
    P_h: every W_g_proj's h rows side by side [H, sum K_g].
    P_vs: every W_g_proj's v rows [K_g, K_g].
    xp: `MMLSTMInputs` (gx [B, T, 4H], vx [B, T, sum K_g]):
      `MMLSTM.precompute` of the inputs [B, T, D].
    carry: initial `MMLSTMCarry`.
    lengths, unroll: as `mm_rnn_layer`.

  Returns:
    (final carry, ys [B, T, H]).
  """
  where = "mm_lstm_layer"
  keys = (carry.v_c, carry.v_i, carry.v_f, carry.v_o)
  if len(Ws) != 4 or len(P_vs) != 4:
    raise ValueError(f"{where}: Ws and P_vs must hold the 4 gates c, i, f, "
                     f"o; got {len(Ws)} and {len(P_vs)}")
  B, T, H, Ks = _check(where, tuple(Ws), P_h, tuple(P_vs), xp, 4, carry.h,
                       keys)
  if carry.c.shape != (B, H):
    raise ValueError(f"{where}: carry.c must be [B, H] = [{B}, {H}], got "
                     f"{carry.c.shape}")
  (h, c, v), ys = _lstm_layer(
      unroll_steps(where, unroll), tuple(Ws), P_h, tuple(P_vs),
      xp.gx, xp.vx, batch_major_mask(where, lengths, B, T), carry.h, carry.c,
      jnp.concatenate(keys, axis=-1))
  o = _offsets(Ks)
  return MMLSTMCarry(h, c, *(v[:, o[n]:o[n] + K]
                             for n, K in enumerate(Ks))), ys
