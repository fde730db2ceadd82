"""The LSTM recurrence as one primitive with a hand-written VJP.

    z_t = xp_t + h_{t-1} W_h            (xp_t = x_t W_x + b, hoisted)
    [i, f, g, o] = z_t                  (gate order of `sorjax.cells.lstm`)
    c_t = sigma(f + forget_bias) c_{t-1} + sigma(i) tanh(g)
    h_t = sigma(o) tanh(c_t)

`lstm_scan` computes what `sorjax.unroll` computes for an `lstm` cell (same
masking by `lengths`: padded steps keep the carry and emit zeros), faster in
the small-model regime, where XLA:CPU's per-step cost is elementwise code
and kernel count, not FLOPs. Measured per core (benchmarks/small_model.md,
paired rounds, machine loaded): 1.0-1.3x the autodiff scan at B=10 T=200
H=12, 1.2x at B=32 T=100 H=256, 1.05x at B=64 T=100 H=512. What makes the
difference, each measured:

- Transposed, gate-major layout. The state is h^T [H, B] and the gates
  z^T = W_h^T h^T [4H, B], so gate k is one contiguous run of H*B values.
  XLA:CPU fully unrolls loop fusions whose minor dimension is small
  (<= ~48) into scalar code; with [B, 4H] rows split into four [B, H]
  slices every sigmoid/tanh at H=12 ran scalar. Flat [H*B] operands are
  vectorised.
- Scan inputs reach the body through the carry, sliced one step ahead
  (`scan_prefetch`). A dynamic slice of a scan input that is used more than
  once inside a fusion is emitted as an outlined helper whose index load
  LLVM cannot hoist, which blocks vectorisation of the whole fusion.
- A hand-written backward: it saves the four gate activations and c_{t-1}
  (one [4, H*B] and one [H*B] slice per step, instead of autodiff's dozen
  residual slices) and recomputes only tanh(c_t); the weight gradient
  dW_h = sum_t h_{t-1}^T dz_t is ONE matmul after the backward loop
  (what cuDNN and oneDNN do), not T small ones.

Forward-mode autodiff (jvp, jacfwd) is not defined through this primitive
(a `jax.custom_vjp`); reverse mode, vmap and jit are.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from sorjax.cells.base import LSTMCarry

Array = jax.Array

# lstm_scan's default layout: batch-major below this hidden size, gate-major
# from it (module doc).
GATE_MAJOR_FROM = 512


def scan_prefetch(body: Callable, carry: Any, xs: Any, reverse: bool = False,
                  unroll: int = 1):
  """`jax.lax.scan(body, carry, xs, reverse=reverse)`, with x_t handed to the
  body as a carried buffer that the previous step sliced (see module doc).

  xs must have at least one step along its leading axis.
  """
  n = jax.tree_util.tree_leaves(xs)[0].shape[0]
  if n == 0:
    raise ValueError("scan_prefetch: xs has no steps (leading axis 0)")

  def at(t):
    return jax.tree_util.tree_map(
        lambda a: jax.lax.dynamic_index_in_dim(a, t, keepdims=False), xs)

  def wrapped(state, t):
    c, x = state
    c, y = body(c, x)
    nxt = jnp.clip(t - 1 if reverse else t + 1, 0, n - 1)
    return (c, at(nxt)), y

  first = at(n - 1 if reverse else 0)
  (carry, _), ys = jax.lax.scan(wrapped, (carry, first),
                                jnp.arange(n, dtype=jnp.int32),
                                reverse=reverse, unroll=unroll)
  return carry, ys


def _activation_consts(H: int, forget_bias: float, dtype, tr: bool):
  """(alpha, beta, gamma, delta) per gate row of z, in z's layout, such that
  A = alpha tanh(beta z + gamma) + delta is [sigma(i), sigma(f +
  forget_bias), tanh(g), sigma(o)]: sigma(x) = tanh(x / 2) / 2 + 1 / 2.
  One elementwise map over all of z, vectorised along its minor axis."""
  s = np.repeat(np.array([0.5, 0.5, 1.0, 0.5]), H)       # alpha = beta
  gamma = np.repeat(np.array([0.0, 0.5 * forget_bias, 0.0, 0.0]), H)
  delta = np.repeat(np.array([0.5, 0.5, 0.0, 0.5]), H)
  shape = (4 * H, 1) if tr else (1, 4 * H)
  return tuple(jnp.asarray(v.reshape(shape), dtype) for v in (s, gamma, delta))


def _forward(forget_bias, unroll, tr, W2, xp2, mask, h0, c0):
  """The forward loop. Gate-major (tr): state h^T [H, B], z^T = W_h^T h^T
  [4H, B], xp2 [T, 4H, B]; batch-major: state h [B, H], z = h W_h [B, 4H],
  xp2 [T, B, 4H]. Returns the final (h, c), ys [T, *h.shape] and the
  residuals (activations A_t in z's layout, c_{t-1})."""
  ax = 0 if tr else -1                                     # z's gate axis
  H = W2.shape[1] if tr else W2.shape[0]
  s, gamma, delta = _activation_consts(H, forget_bias, W2.dtype, tr)

  def body(carry, inp):
    h, c = carry
    x, m = inp if mask is not None else (inp, None)
    A = s * jnp.tanh(s * (x + (W2 @ h if tr else h @ W2)) + gamma) + delta
    si, sf, tg, so = jnp.split(A, 4, axis=ax)
    c_new = sf * c + si * tg                               # c_t
    h_new = so * jnp.tanh(c_new)                           # h_t
    if m is not None:  # padded steps keep the carry and emit zeros
      y = jnp.where(m, h_new, jnp.zeros_like(h_new))
      h_new, c_new = jnp.where(m, h_new, h), jnp.where(m, c_new, c)
    else:
      y = h_new
    return (h_new, c_new), (y, A, c)

  inputs = xp2 if mask is None else (xp2, mask)
  (h, c), (ys, As, cs) = scan_prefetch(body, (h0, c0), inputs, unroll=unroll)
  return (h, c), ys, (As, cs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _scan(forget_bias, unroll, tr, W2, xp2, mask, h0, c0):
  (h, c), ys, _ = _forward(forget_bias, unroll, tr, W2, xp2, mask, h0, c0)
  return (h, c), ys


def _scan_fwd(forget_bias, unroll, tr, W2, xp2, mask, h0, c0):
  (h, c), ys, (As, cs) = _forward(forget_bias, unroll, tr, W2, xp2, mask, h0,
                                  c0)
  return ((h, c), ys), (W2, mask, h0, ys, As, cs)


def _scan_bwd(forget_bias, unroll, tr, res, cot):
  W2, mask, h0, ys, As, cs = res
  (dh_T, dc_T), dys = cot
  ax = 0 if tr else -1
  H = W2.shape[1] if tr else W2.shape[0]
  s, _, delta = _activation_consts(H, forget_bias, W2.dtype, tr)
  W2t = W2.T  # once: [H, 4H] (gate-major) or [4H, H]

  def body(carry, inp):
    dh, dc = carry
    if mask is None:
      (A, c0, dy), m = inp, None
    else:
      A, c0, dy, m = inp
    si, sf, tg, so = jnp.split(A, 4, axis=ax)
    tc = jnp.tanh(sf * c0 + si * tg)                       # tanh(c_t)
    dh_t = dh + dy                                         # dL/dh_t
    dc_t = dc
    if m is not None:  # a padded step passed its carry through
      dh_t = jnp.where(m, dh_t, jnp.zeros_like(dh_t))
      dc_t = jnp.where(m, dc_t, jnp.zeros_like(dc_t))
    dct = dc_t + dh_t * so * (1 - tc * tc)                 # dL/dc_t, total
    dA = jnp.concatenate([dct * tg, dct * c0, dct * si, dh_t * tc], axis=ax)
    u = (A - delta) / s                                    # tanh(beta z + gamma)
    dz = dA * (s * s) * (1 - u * u)                        # dA/dz = alpha beta (1 - u^2)
    dh_prev = W2t @ dz if tr else dz @ W2t                 # through h_{t-1} W_h
    dc_prev = dct * sf                                     # through c_{t-1}
    if m is not None:
      dh_prev = dh_prev + jnp.where(m, jnp.zeros_like(dh), dh)
      dc_prev = dc_prev + jnp.where(m, jnp.zeros_like(dc), dc)
    return (dh_prev, dc_prev), dz

  inputs = (As, cs, dys) if mask is None else (As, cs, dys, mask)
  (dh0, dc0), dzs = scan_prefetch(body, (dh_T, dc_T), inputs, reverse=True,
                                  unroll=unroll)
  # h_{t-1}: the carry before step t. y_t equals the carry h_t on valid steps
  # and valid steps form a prefix, so dz_t = 0 wherever y_{t-1} is a padding 0.
  hprev = jnp.concatenate([h0[None], ys[:-1]], axis=0)
  if tr:                                                   # one matmul each
    dW2 = jnp.einsum("tnb,thb->nh", dzs, hprev)            # dW_h^T
  else:
    dW2 = jnp.einsum("tbh,tbn->hn", hprev, dzs)            # dW_h
  return dW2, dzs, None, dh0, dc0   # no cotangent for the mask


_scan.defvjp(_scan_fwd, _scan_bwd)


def lstm_args(cell, params) -> tuple[Array, float] | None:
  """(W_h, forget_bias) when `cell`'s step is exactly the recurrence above
  (`lstm`, `mts_lstm`: x W_x + b and fixed biases are in `precompute`), so
  that `lstm_scan(*lstm_args(cell, params)[:1], cell.precompute(...), ...)`
  equals a scan of `cell.step`; None for every other cell."""
  from sorjax.cells.lstm import LSTM
  from sorjax.cells.mts_lstm import MTSLSTM
  if type(cell) is LSTM:
    return params["W_h"], float(cell.forget_bias)
  if type(cell) is MTSLSTM:
    return params["W_h"], 0.0
  return None


def lstm_scan(W_h: Array, xp: Array, carry: LSTMCarry,
              lengths: Array | None = None, forget_bias: float = 0.0,
              unroll: int = 1, layout: str | None = None
              ) -> tuple[LSTMCarry, Array]:
  """Runs the LSTM recurrence over time-major gate inputs.

  Args:
    W_h: recurrent weights [H, 4H] (gate order i, f, g, o).
    xp: x_t W_x + b for every step, time-major [T, B, 4H] (what
      `lstm.precompute` returns for [T, B, D] inputs).
    carry: initial `LSTMCarry` (h, c), each [B, H].
    lengths: optional int [B]; steps t >= lengths[b] keep the carry and
      output zeros, as `sorjax.unroll`.
    forget_bias: added to the forget gate's pre-activation.
    unroll: `lax.scan` unroll factor of both loops.
    layout: "gate_major" (state h^T [H, B]; xp and ys transposed around the
      loops) or "batch_major" (state h [B, H]; no transposes); None picks
      gate_major for H >= GATE_MAJOR_FROM (module doc).

  Returns:
    (final carry, ys [T, B, H]).
  """
  if xp.ndim != 3:
    raise ValueError(f"lstm_scan: xp must be [T, B, 4H], got shape "
                     f"{xp.shape}")
  T, B, G = xp.shape
  H = W_h.shape[0]
  if W_h.shape != (H, 4 * H) or G != 4 * H:
    raise ValueError(f"lstm_scan: W_h must be [H, 4H] and xp [T, B, 4H]; got "
                     f"W_h {W_h.shape}, xp {xp.shape}")
  for name, a in (("h", carry.h), ("c", carry.c)):
    if a.shape != (B, H):
      raise ValueError(f"lstm_scan: carry.{name} must be [B, H] = [{B}, {H}],"
                       f" got {a.shape}")
  if T == 0:
    raise ValueError("lstm_scan: xp has no time steps (T = 0)")
  mask = None
  if lengths is not None:
    lengths = jnp.asarray(lengths)
    if lengths.shape != (B,):
      raise ValueError(f"lstm_scan: lengths must have shape [B] = [{B}], got "
                       f"{lengths.shape}")
    mask = (jnp.arange(T, dtype=jnp.int32)[:, None]
            < lengths.astype(jnp.int32)[None, :])                 # [T, B]
  if layout is None:
    layout = "gate_major" if H >= GATE_MAJOR_FROM else "batch_major"
  if layout not in ("gate_major", "batch_major"):
    raise ValueError(f"lstm_scan: layout must be None, 'gate_major' or "
                     f"'batch_major', got {layout!r}")
  fb, n = float(forget_bias), int(unroll)
  if layout == "batch_major":
    if mask is not None:
      mask = jnp.broadcast_to(mask[:, :, None], (T, B, H))
    (h, c), ys = _scan(fb, n, False, W_h, xp, mask, carry.h, carry.c)
    return LSTMCarry(h, c), ys
  if mask is not None:
    mask = jnp.broadcast_to(mask[:, None, :], (T, H, B))
  (hT, cT), ysT = _scan(fb, n, True, W_h.T, jnp.swapaxes(xp, 1, 2), mask,
                        carry.h.T, carry.c.T)
  return LSTMCarry(hT.T, cT.T), jnp.swapaxes(ysT, 1, 2)
