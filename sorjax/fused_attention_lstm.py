"""The attention LSTM's recurrence (mix="states") as one primitive with a
hand-written VJP.

    g_t      = h_{t-1} [W_h[1] | .. | W_h[S]] + gx_t          (one matmul)
    h_t^(s), c_t^(s) = LSTM update of cell s's gates g_t^(s)   # eq. (c)
    h_t      = sum_s alpha_{t,s} h_t^(s)                       # eq. (d)
    c_t      = sum_s alpha_{t,s} c_t^(s)                       # eq. (e)

(`sorjax.cells.attention_lstm`; gx_t = x_t W_x[s] + b[s] and alpha_t are its
hoisted `precompute`.) `sorjax.unroll` runs it for `attention_lstm` with
mix="states" on the batched-weight-gradient path. What it saves over that
generic path (`unroll._fused_scan`, which keeps z_t = h_{t-1} W for every
step, [T, B, S*4H], and the carries (h, c)):

- The forward writes every cell's gate activations A_t over gx_t
  ([B, T, S*4H], batch-major, `fused_lstm.scan_overwrite` along axis 1)
  and stacks only h_t and c_{t-1}; the backward recomputes each cell's
  c_t^(s) and tanh from A_t and c_{t-1} and writes dz_t, the cotangent of
  gx_t, over A_t. The activations are one elementwise map over the gates
  (`fused_lstm`'s A = s tanh(s z + gamma) + delta, per-column constants).
- dW = sum_t h_{t-1}^T dz_t is one matmul after the loop.

Measured against the generic path (S = 2; forward + backward to the
params and x, two threads, six alternating timings; medians): 1.18x at
B=32 T=100 H=256, 1.14x at B=64 T=100 H=512, with 0.64x its temporary
memory at both (BUILD_NOTES, "The attention LSTM's own VJP").

mix="gates" and `assignment_lstm` mix the gates by alpha_t before one LSTM
update; they stay on the generic path.

Forward-mode autodiff (jvp, jacfwd) is not defined through this primitive
(a `jax.custom_vjp`); reverse mode, vmap and jit are.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sorjax.cells.attention_lstm import SecondOrderInputs, recurrent_matrix
from sorjax.cells.base import LSTMCarry
from sorjax.fused_lstm import (_activation_consts, batch_major_mask,
                                check_unroll, scan_overwrite)

Array = jax.Array


def _consts(S, H, forget_bias, dtype):
  """(s, gamma, delta) of `fused_lstm._activation_consts` for S cells side
  by side: [S*4H] each."""
  return tuple(jnp.tile(a, S)
               for a in _activation_consts(H, forget_bias, dtype, False))


def _cells(A, c_prev, S):
  """Each cell's (i, f, g, o) activations [B, S, H] from A [B, S*4H], and
  its new memory c_t^(s) = f c_{t-1} + i g (eq. (c))."""
  B, H = c_prev.shape
  i, f, g, o = jnp.split(A.reshape(B, S, 4 * H), 4, axis=-1)
  return i, f, g, o, f * c_prev[:, None, :] + i * g


def _forward(unroll, forget_bias, W, gx, alpha, mask, h0, c0):
  """The loop over axis 1 of gx [B, T, S*4H] (and alpha [B, T, S], mask
  [B, T, 1]); returns the final (h, c), ys and c_{t-1} ([T, B, H],
  stacked) and the activations A_t written over gx."""
  S = alpha.shape[-1]
  s, gamma, delta = _consts(S, h0.shape[-1], forget_bias, W.dtype)

  def body(carry, gx_t, x):
    h, c = carry
    a, m = x if mask is not None else (x, None)
    A = s * jnp.tanh(s * (h @ W + gx_t) + gamma) + delta    # sigma / tanh
    _, _, _, o, cs = _cells(A, c, S)                         # eq. (c)
    h_new = jnp.einsum("bs,bsh->bh", a, o * jnp.tanh(cs))    # eq. (d)
    c_new = jnp.einsum("bs,bsh->bh", a, cs)                  # eq. (e)
    if m is None:
      return (h_new, c_new), (h_new, c), A
    h_new, c_new = jnp.where(m, h_new, h), jnp.where(m, c_new, c)
    return (h_new, c_new), (jnp.where(m, h_new, 0), c), A

  xs = alpha if mask is None else (alpha, mask)
  final, (ys, cs), As = scan_overwrite(body, (h0, c0), gx, xs, unroll=unroll,
                                       axis=1, xs_axis=1)
  return final, jnp.swapaxes(ys, 0, 1), cs, As


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _layer(unroll, forget_bias, W, gx, alpha, mask, h0, c0):
  final, ys, _, _ = _forward(unroll, forget_bias, W, gx, alpha, mask, h0, c0)
  return final, ys


def _layer_fwd(unroll, forget_bias, W, gx, alpha, mask, h0, c0):
  final, ys, cs, As = _forward(unroll, forget_bias, W, gx, alpha, mask, h0,
                               c0)
  return (final, ys), (W, alpha, mask, h0, ys, cs, As)


def _layer_bwd(unroll, forget_bias, res, cot):
  W, alpha, mask, h0, ys, cs, As = res
  (dh_T, dc_T), dys = cot
  S = alpha.shape[-1]
  s, _, delta = _consts(S, h0.shape[-1], forget_bias, W.dtype)
  Wt = W.T  # once: a per-step dot on a transposed operand is slower on CPU
  hp = jnp.concatenate([h0[:, None], ys[:, :-1]], axis=1)   # h_{t-1}

  def body(carry, A, x):  # A = A_t, overwritten with dz_t
    dh, dc = carry
    h_prev, c_prev, dy, a, m = x if mask is not None else (*x, None)
    i, f, g, o, cs_ = _cells(A, c_prev, S)
    tc = jnp.tanh(cs_)
    dh_t, dc_t = dy + dh, dc                                 # dL/dh_t, dL/dc_t
    if m is not None:  # a padded step passed its carry through
      dh_t, dc_t = jnp.where(m, dh_t, 0), jnp.where(m, dc_t, 0)
    da = (jnp.einsum("bh,bsh->bs", dh_t, o * tc)             # through (d)
          + jnp.einsum("bh,bsh->bs", dc_t, cs_))             # and (e)
    dh_s = a[:, :, None] * dh_t[:, None, :]                  # dL/dh_t^(s)
    dc_s = a[:, :, None] * dc_t[:, None, :] + dh_s * o * (1 - tc * tc)
    dA = jnp.concatenate([dc_s * g, dc_s * c_prev[:, None, :], dc_s * i,
                          dh_s * tc], axis=-1).reshape(A.shape)
    u = (A - delta) / s                                      # tanh(s z + gamma)
    dz = dA * (s * s) * (1 - u * u)
    dh_prev = dz @ Wt                                        # through h_{t-1} W
    dc_prev = jnp.sum(dc_s * f, axis=1)                      # through c_{t-1}
    if m is not None:
      dh_prev = jnp.where(m, dh_prev, dh)
      dc_prev = jnp.where(m, dc_prev, dc)
    return (dh_prev, dc_prev), da, dz

  xs = (hp, jnp.swapaxes(cs, 0, 1), dys, alpha)
  (dh0, dc0), das, dzs = scan_overwrite(
      body, (dh_T, dc_T), As, xs if mask is None else (*xs, mask),
      reverse=True, unroll=unroll, axis=1, xs_axis=1)
  # dW = sum_t h_{t-1}^T dz_t over all T*B rows, in at least float32.
  acc = W.dtype if jnp.finfo(W.dtype).bits >= 32 else jnp.float32
  dW = jnp.einsum("rh,rn->hn", hp.reshape(-1, hp.shape[-1]),
                  dzs.reshape(-1, dzs.shape[-1]),
                  preferred_element_type=acc).astype(W.dtype)
  return dW, dzs, jnp.swapaxes(das, 0, 1), None, dh0, dc0


_layer.defvjp(_layer_fwd, _layer_bwd)


class AttentionLSTMArgs(NamedTuple):
  """What `attention_lstm_layer` needs from the cell and its params."""
  W: Array            # [H, S*4H], `recurrent_matrix`
  forget_bias: float


def layer_args(cell, params) -> AttentionLSTMArgs | None:
  """The layer arguments of an `attention_lstm` cell with mix="states" (its
  precompute gives the layer's xp); None for every other cell."""
  from sorjax.cells.attention_lstm import AttentionLSTM
  if type(cell) is not AttentionLSTM or cell.mix != "states":
    return None
  return AttentionLSTMArgs(recurrent_matrix(params), float(cell.forget_bias))


def run_layer(args: AttentionLSTMArgs, xp, carry, lengths=None, unroll=None):
  """`attention_lstm_layer` from `layer_args`."""
  return attention_lstm_layer(args.W, args.forget_bias, xp, carry, lengths,
                              unroll)


def attention_lstm_layer(W: Array, forget_bias: float, xp: SecondOrderInputs,
                         carry: LSTMCarry, lengths: Array | None = None,
                         unroll: int | None = None
                         ) -> tuple[LSTMCarry, Array]:
  """Runs the attention LSTM's recurrence (mix="states") over batch-major
  precomputed inputs.

  Args:
    W: [W_h[1] | .. | W_h[S]] [H, S*4H] (`recurrent_matrix`; gates i, f, g, o
      per cell).
    forget_bias: added to every cell's forget gate.
    xp: `SecondOrderInputs` (gx [B, T, S, 4H], alpha [B, T, S]):
      `AttentionLSTM.precompute` of the inputs [B, T, D].
    carry: initial `LSTMCarry` (h, c), each [B, H].
    lengths: optional int [B]; steps t >= lengths[b] keep the carry and
      output zeros, as `sorjax.unroll`.
    unroll: steps per loop iteration in both loops (`scan_overwrite`);
      None is 1.

  Returns:
    (final carry, ys [B, T, H]).
  """
  where = "attention_lstm_layer"
  if W.ndim != 2 or W.shape[1] % (4 * W.shape[0]):
    raise ValueError(f"{where}: W must be [H, S*4H], got {W.shape}")
  H = W.shape[0]
  S = W.shape[1] // (4 * H)
  gx, alpha = xp
  if gx.ndim != 4 or gx.shape[2:] != (S, 4 * H):
    raise ValueError(f"{where}: xp.gx must be [B, T, S, 4H] = [., ., {S}, "
                     f"{4 * H}], got {gx.shape}")
  B, T = gx.shape[:2]
  if alpha.shape != (B, T, S):
    raise ValueError(f"{where}: xp.alpha must be [B, T, S] = [{B}, {T}, "
                     f"{S}], got {alpha.shape}")
  if carry.h.shape != (B, H) or carry.c.shape != (B, H):
    raise ValueError(f"{where}: carry (h, c) must be [B, H] = [{B}, {H}] "
                     f"each; got {carry.h.shape}, {carry.c.shape}")
  if T == 0:
    raise ValueError(f"{where}: the inputs have no time steps (T = 0)")
  check_unroll(where, unroll)
  (h, c), ys = _layer(1 if unroll is None else int(unroll),
                      float(forget_bias), W, gx.reshape(B, T, S * 4 * H),
                      alpha, batch_major_mask(where, lengths, B, T), carry.h,
                      carry.c)
  return LSTMCarry(h, c), ys
