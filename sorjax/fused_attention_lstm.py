"""The attention and assignment LSTMs' recurrences as primitives with
hand-written VJPs.

mix="states" (attention_lstm's default, Lin et al. eq. (c)-(e)):

    g_t      = h_{t-1} [W_h[1] | .. | W_h[S]] + gx_t          (one matmul)
    h_t^(s), c_t^(s) = LSTM update of cell s's gates g_t^(s)   # eq. (c)
    h_t      = sum_s alpha_{t,s} h_t^(s)                       # eq. (d)
    c_t      = sum_s alpha_{t,s} c_t^(s)                       # eq. (e)

mix="gates" (and assignment_lstm, whose alpha_t is one-hot): one LSTM
update of the gates gx_t + sum_s alpha_{t,s} (h_{t-1} W_h[s]), gx_t being
alpha-mixed already.

(`sorjax.cells.attention_lstm`; gx_t and alpha_t are the cells' hoisted
`precompute`.) `sorjax.unroll` runs these on the batched-weight-gradient
path. What they save over that generic path (`unroll._fused_scan`, which
keeps z_t = h_{t-1} W for every step, [T, B, S*4H], and the carries (h, c)):

- The forwards write the gate activations A_t (every cell's with
  mix="states") over gx_t ([B, T, .], batch-major, `layer_scan.
  scan_overwrite` along axis 1) and stack only h_t and c_{t-1}; the
  backwards rebuild c_t from A_t and c_{t-1} and write the cotangent of
  gx_t over A_t. The activations are one elementwise map over the gates
  (`fused_lstm`'s A = s tanh(s z + gamma) + delta, per-column constants).
- mix="states": the bias b enters the activation map (s (g + b) + gamma,
  as `fused_lstm`), so the hoisted gx_t is x_t W_x[s] alone: no pass
  over [B, T, S*4H] to add b and one such temporary less (B=64 T=100
  H=512: the training step's temporaries 246 -> 171 MiB). dW = sum_t
  h_{t-1}^T dz_t, one matmul after the loop, and db = sum_t dz_t.
  mix="gates": the mixture's backward needs no z_t (as `fused_mm_rnn`'s):
  G_t = dg_t [W_h[1]^T | .. | W_h[S]^T] gives dh_{t-1} = sum_s alpha_s
  G_t[s] and dalpha_s = h_{t-1} . G_t[s], and dW_h[s] = sum_t h_{t-1}^T
  (alpha_t,s dg_t), one matmul per cell after the loop.

Measured against the generic path (S = 2; forward + backward to the
params and x, two threads, six alternating timings; medians) at B=32
T=100 H=256 and B=64 T=100 H=512: mix="states" 1.18x and 1.14x with 0.64x
its temporary memory; mix="gates" 1.21x and 1.11x (0.82x); assignment_lstm
1.24x and 1.09x (0.72x) (BUILD_NOTES, "The attention LSTMs' own VJPs").

Forward-mode autodiff (jvp, jacfwd) is not defined through these primitives
(`jax.custom_vjp`); reverse mode, vmap and jit are.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sorjax.cells.attention_lstm import SecondOrderInputs, recurrent_matrix
from sorjax.cells.base import LSTMCarry
from sorjax.fused_lstm import activation_consts
from sorjax.layer_scan import (batch_major_mask, check_lstm_state,
                               previous_steps, row_products, scan_overwrite,
                               step_product, sum_dtype, unroll_steps,
                               valid_or, zero_padded)

Array = jax.Array


def _consts(S, H, forget_bias, dtype):
  """(s, gamma, delta) of `fused_lstm.activation_consts` for S cells side
  by side: [S*4H] each."""
  return tuple(jnp.tile(a, S)
               for a in activation_consts(H, forget_bias, dtype, False))


def _cells(A, c_prev, S):
  """Each cell's (i, f, g, o) activations [B, S, H] from A [B, S*4H], and
  its new memory c_t^(s) = f c_{t-1} + i g (eq. (c))."""
  B, H = c_prev.shape
  i, f, g, o = jnp.split(A.reshape(B, S, 4 * H), 4, axis=-1)
  return i, f, g, o, f * c_prev[:, None, :] + i * g


def _loop(update, gx, alpha, mask, h0, c0, unroll):
  """The forward loop over axis 1 of gx [B, T, .] (and alpha [B, T, S],
  mask [B, T, 1]): update(h, c, gx_t, alpha_t) -> (A_t, h_t, c_t). Returns
  the final (h, c), ys [B, T, H], c_{t-1} ([T, B, H], stacked) and the
  activations A_t written over gx; padded steps keep the carry and emit
  zeros."""
  def body(carry, gx_t, x):
    h, c = carry
    a, m = x if mask is not None else (x, None)
    A, h_new, c_new = update(h, c, gx_t, a)
    return valid_or(m, (h_new, c_new), carry), (zero_padded(m, h_new), c), A

  xs = alpha if mask is None else (alpha, mask)
  final, (ys, cs), As = scan_overwrite(body, (h0, c0), gx, xs, unroll=unroll,
                                       axis=1, xs_axis=1)
  return final, jnp.swapaxes(ys, 0, 1), cs, As


def _back_loop(grad, As, res_inputs, mask, dh_T, dc_T, unroll):
  """The backward loop (reverse, along axis 1): grad(A_t, h_{t-1}, c_{t-1},
  alpha_t, dL/dh_t, dL/dc_t) -> (dh_{t-1}, dc_{t-1}, dalpha_t, dz_t), with
  dz_t written over A_t. res_inputs = (h_{t-1} [B, T, H], c_{t-1}
  [T, B, H], dys [B, T, H], alpha); a padded step passes the carry's
  cotangent through. Returns ((dh_0, dc_0), dalpha [B, T, S], dz)."""
  hp, cs, dys, alpha = res_inputs

  def body(carry, A, x):
    dh, dc = carry
    h_prev, c_prev, dy, a, m = x if mask is not None else (*x, None)
    dh_t, dc_t = zero_padded(m, (dy + dh, dc))               # dL/dh_t, dL/dc_t
    dh_prev, dc_prev, da, dz = grad(A, h_prev, c_prev, a, dh_t, dc_t)
    return valid_or(m, (dh_prev, dc_prev), carry), da, dz

  xs = (hp, jnp.swapaxes(cs, 0, 1), dys, alpha)
  d0, das, dzs = scan_overwrite(body, (dh_T, dc_T), As,
                                xs if mask is None else (*xs, mask),
                                reverse=True, unroll=unroll, axis=1,
                                xs_axis=1)
  return d0, jnp.swapaxes(das, 0, 1), dzs


def _forward(unroll, forget_bias, W, b, gx, alpha, mask, h0, c0):
  """mix="states": every cell's activations over gx [B, T, S*4H]; b
  [1, S*4H] enters the map."""
  S = alpha.shape[-1]
  s, gamma, delta = _consts(S, h0.shape[-1], forget_bias, W.dtype)
  gamma = gamma + s * b  # s (g + b) + gamma: b costs nothing per step
  hW = step_product(W)

  def update(h, c, gx_t, a):
    A = s * jnp.tanh(s * (hW(h) + gx_t) + gamma) + delta    # sigma / tanh
    _, _, _, o, cs = _cells(A, c, S)                         # eq. (c)
    return (A, jnp.einsum("bs,bsh->bh", a, o * jnp.tanh(cs)),  # eq. (d)
            jnp.einsum("bs,bsh->bh", a, cs))                 # eq. (e)

  return _loop(update, gx, alpha, mask, h0, c0, unroll)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _layer(unroll, forget_bias, W, b, gx, alpha, mask, h0, c0):
  final, ys, _, _ = _forward(unroll, forget_bias, W, b, gx, alpha, mask, h0,
                             c0)
  return final, ys


def _layer_fwd(unroll, forget_bias, W, b, gx, alpha, mask, h0, c0):
  final, ys, cs, As = _forward(unroll, forget_bias, W, b, gx, alpha, mask,
                               h0, c0)
  return (final, ys), (W, alpha, mask, h0, ys, cs, As)


def _layer_bwd(unroll, forget_bias, res, cot):
  W, alpha, mask, h0, ys, cs, As = res
  (dh_T, dc_T), dys = cot
  S = alpha.shape[-1]
  s, _, delta = _consts(S, h0.shape[-1], forget_bias, W.dtype)
  dzWt = step_product(W.T)
  hp = previous_steps(h0, ys, 1)                            # h_{t-1}

  def grad(A, h_prev, c_prev, a, dh_t, dc_t):
    i, f, g, o, cs_ = _cells(A, c_prev, S)
    tc = jnp.tanh(cs_)
    da = (jnp.einsum("bh,bsh->bs", dh_t, o * tc)             # through (d)
          + jnp.einsum("bh,bsh->bs", dc_t, cs_))             # and (e)
    dh_s = a[:, :, None] * dh_t[:, None, :]                  # dL/dh_t^(s)
    dc_s = a[:, :, None] * dc_t[:, None, :] + dh_s * o * (1 - tc * tc)
    dA = jnp.concatenate([dc_s * g, dc_s * c_prev[:, None, :], dc_s * i,
                          dh_s * tc], axis=-1).reshape(A.shape)
    u = (A - delta) / s                                      # tanh(s z + gamma)
    dz = dA * (s * s) * (1 - u * u)
    return (dzWt(dz),                                        # through h_{t-1} W
            jnp.sum(dc_s * f, axis=1), da, dz)               # through c_{t-1}

  (dh0, dc0), das, dzs = _back_loop(grad, As, (hp, cs, dys, alpha), mask,
                                    dh_T, dc_T, unroll)
  # dW = sum_t h_{t-1}^T dz_t and db = sum_t dz_t over all T*B rows, in at
  # least float32.
  db = jnp.sum(dzs, axis=(0, 1), dtype=sum_dtype(W.dtype)).astype(W.dtype)
  return (row_products(hp, dzs, W.dtype), db[None], dzs, das, None, dh0,
          dc0)


_layer.defvjp(_layer_fwd, _layer_bwd)


# ------------------------------------- mixed gates (mix="gates", assignment)

def _gates_forward(unroll, forget_bias, W, gx, alpha, mask, h0, c0):
  """mix="gates" / assignment_lstm: one LSTM update of the alpha-mixed gates
  gx_t + sum_s alpha_s (h_{t-1} W_h[s]); A_t written over gx [B, T, 4H]."""
  S = alpha.shape[-1]
  B, H = h0.shape
  s, gamma, delta = activation_consts(H, forget_bias, W.dtype, False)
  hW = step_product(W)

  def update(h, c, gx_t, a):
    g = gx_t + jnp.einsum("bs,bsn->bn", a, hW(h).reshape(B, S, 4 * H))
    A = s * jnp.tanh(s * g + gamma) + delta
    i, f, gg, o = jnp.split(A, 4, axis=-1)
    c_new = f * c + i * gg
    return A, o * jnp.tanh(c_new), c_new

  return _loop(update, gx, alpha, mask, h0, c0, unroll)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _gates_layer(unroll, forget_bias, W, gx, alpha, mask, h0, c0):
  final, ys, _, _ = _gates_forward(unroll, forget_bias, W, gx, alpha, mask,
                                   h0, c0)
  return final, ys


def _gates_layer_fwd(unroll, forget_bias, W, gx, alpha, mask, h0, c0):
  final, ys, cs, As = _gates_forward(unroll, forget_bias, W, gx, alpha, mask,
                                     h0, c0)
  return (final, ys), (W, alpha, mask, h0, ys, cs, As)


def _gates_layer_bwd(unroll, forget_bias, res, cot):
  """The backward of the mixed gates needs no saved z_t (as
  `fused_mm_rnn`): G_t = dg_t [W_h[1]^T | .. | W_h[S]^T] gives dh_{t-1} =
  sum_s alpha_s G_t[s] and dalpha_s = h_{t-1} . G_t[s]; dW_h[s] =
  sum_t h_{t-1}^T (alpha_t,s dg_t), one matmul per cell after the loop."""
  W, alpha, mask, h0, ys, cs, As = res
  (dh_T, dc_T), dys = cot
  S = alpha.shape[-1]
  B, H = h0.shape
  s, _, delta = activation_consts(H, forget_bias, W.dtype, False)
  dgWt = step_product(jnp.transpose(W.reshape(H, S, 4 * H),
                                    (2, 1, 0)).reshape(4 * H, S * H))
  hp = previous_steps(h0, ys, 1)                            # h_{t-1}

  def grad(A, h_prev, c_prev, a, dh_t, dc_t):
    i, f, gg, o = jnp.split(A, 4, axis=-1)
    tc = jnp.tanh(f * c_prev + i * gg)                       # tanh(c_t)
    dct = dc_t + dh_t * o * (1 - tc * tc)
    dA = jnp.concatenate([dct * gg, dct * c_prev, dct * i, dh_t * tc], -1)
    u = (A - delta) / s
    dg = dA * (s * s) * (1 - u * u)                          # dL/d gates
    G = dgWt(dg).reshape(B, S, H)                            # dg W_h[s]^T
    return (jnp.einsum("bs,bsh->bh", a, G), dct * f,
            jnp.einsum("bsh,bh->bs", G, h_prev), dg)         # dL/dalpha_s

  (dh0, dc0), das, dgs = _back_loop(grad, As, (hp, cs, dys, alpha), mask,
                                    dh_T, dc_T, unroll)
  rows = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
  hr, ar, dr = rows(hp), rows(alpha), rows(dgs)

  def one(k, dW):  # cell k's block: sum_t h_{t-1}^T (alpha_t,k dg_t)
    a_k = jax.lax.dynamic_slice_in_dim(ar, k, 1, axis=1)
    blk = row_products(hr, dr * a_k, W.dtype)
    return jax.lax.dynamic_update_slice_in_dim(dW, blk, k * 4 * H, axis=1)

  dW = jax.lax.fori_loop(0, S, one, jnp.zeros_like(W))
  return dW, dgs, das, None, dh0, dc0


_gates_layer.defvjp(_gates_layer_fwd, _gates_layer_bwd)


class AttentionLSTMArgs(NamedTuple):
  """What `attention_lstm_layer` needs from the cell and its params."""
  W: Array            # [H, S*4H], `recurrent_matrix`
  forget_bias: float
  mix: str            # "states" or "gates" (assignment_lstm: "gates")
  b: Array | None     # [S, 4H] with mix="states", added in the layer's map;
                      # None with "gates", whose gx holds the mixed b


def layer_args(cell, params) -> AttentionLSTMArgs | None:
  """The layer arguments of an `attention_lstm` (either mix) or
  `assignment_lstm` cell (the cell's precompute on `precompute_params`
  gives the layer's xp); None for every other cell."""
  from sorjax.cells.attention_lstm import AssignmentLSTM, AttentionLSTM
  if type(cell) is AttentionLSTM:
    mix = cell.mix
  elif type(cell) is AssignmentLSTM:
    mix = "gates"
  else:
    return None
  return AttentionLSTMArgs(recurrent_matrix(params), float(cell.forget_bias),
                           mix, params["b"] if mix == "states" else None)


def precompute_params(args: AttentionLSTMArgs, params):
  """The params the cell's `precompute` runs on for `run_layer(args, ..)`:
  with args.b (mix="states") b is zero there, as the layer adds it in its
  map; XLA drops the + 0, and b's gradient comes from the layer."""
  if args.b is None:
    return params
  return {**params, "b": jnp.zeros_like(params["b"])}


def run_layer(args: AttentionLSTMArgs, xp, carry, lengths=None, unroll=None):
  """`attention_lstm_layer` from `layer_args`; xp from the cell's
  precompute on `precompute_params(args, params)`."""
  return attention_lstm_layer(args.W, args.forget_bias, xp, carry, lengths,
                              unroll, mix=args.mix, b=args.b)


def attention_lstm_layer(W: Array, forget_bias: float, xp: SecondOrderInputs,
                         carry: LSTMCarry, lengths: Array | None = None,
                         unroll: int | None = None, mix: str = "states",
                         b: Array | None = None) -> tuple[LSTMCarry, Array]:
  """Runs the attention LSTM's recurrence over batch-major precomputed
  inputs.

  Args:
    W: [W_h[1] | .. | W_h[S]] [H, S*4H] (`recurrent_matrix`; gates i, f, g, o
      per cell).
    forget_bias: added to every cell's forget gate.
    xp: `SecondOrderInputs` (gx, alpha [B, T, S]): the cell's `precompute`
      of the inputs [B, T, D]; gx is [B, T, S, 4H] for mix="states" and the
      alpha-mixed [B, T, 4H] for mix="gates" (and `assignment_lstm`).
    carry: initial `LSTMCarry` (h, c), each [B, H].
    lengths: optional int [B]; steps t >= lengths[b] keep the carry and
      output zeros, as `sorjax.unroll`.
    unroll: steps per loop iteration in both loops (`scan_overwrite`);
      None is 1.
    mix: "states" (eq. (d)-(e)) or "gates" (the alpha-mixed gates of one
      LSTM update), as the cells' attribute.
    b: mix="states" only: the cells' bias [S, 4H], added to the gates
      inside the layer's activation map (xp.gx then holds x_t W_x[s]
      alone, the cell's precompute with b = 0, `precompute_params`); None
      when xp.gx holds it already.

  Returns:
    (final carry, ys [B, T, H]).
  """
  where = "attention_lstm_layer"
  if W.ndim != 2 or W.shape[1] % (4 * W.shape[0]):
    raise ValueError(f"{where}: W must be [H, S*4H], got {W.shape}")
  if mix not in ("states", "gates"):
    raise ValueError(f"{where}: mix must be 'states' or 'gates', got "
                     f"{mix!r}")
  H = W.shape[0]
  S = W.shape[1] // (4 * H)
  gx, alpha = xp
  want = (S, 4 * H) if mix == "states" else (4 * H,)
  if gx.ndim != 2 + len(want) or gx.shape[2:] != want:
    raise ValueError(f"{where}: xp.gx must be [B, T, "
                     f"{', '.join(map(str, want))}] for mix={mix!r}, got "
                     f"{gx.shape}")
  B, T = gx.shape[:2]
  if alpha.shape != (B, T, S):
    raise ValueError(f"{where}: xp.alpha must be [B, T, S] = [{B}, {T}, "
                     f"{S}], got {alpha.shape}")
  check_lstm_state(where, carry, B, H, T)
  if b is not None and (mix != "states" or jnp.shape(b) != (S, 4 * H)):
    raise ValueError(f"{where}: b must be [S, 4H] = [{S}, {4 * H}] with "
                     f"mix='states' (with 'gates' xp.gx holds the mixed "
                     f"bias), got shape {jnp.shape(b)} with mix={mix!r}")
  steps = unroll_steps(where, unroll)
  if mix == "states":
    b = (jnp.zeros((1, S * 4 * H), W.dtype) if b is None
         else jnp.reshape(b, (1, -1)).astype(W.dtype))
    layer = functools.partial(_layer, steps, float(forget_bias), W, b)
  else:
    layer = functools.partial(_gates_layer, steps, float(forget_bias), W)
  (h, c), ys = layer(gx.reshape(B, T, math.prod(want)), alpha,
                     batch_major_mask(where, lengths, B, T), carry.h, carry.c)
  return LSTMCarry(h, c), ys
