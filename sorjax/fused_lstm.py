"""The LSTM layer as one primitive with a hand-written VJP.

    z_t = xp_t + h_{t-1} W_h            (xp_t = x_t W_x + b, hoisted)
    [i, f, g, o] = z_t                  (gate order of `sorjax.cells.lstm`)
    c_t = sigma(f + forget_bias) c_{t-1} + sigma(i) tanh(g)
    h_t = sigma(o) tanh(c_t)

`lstm_layer` (inputs x_t, weights W_x, b, W_h) and `lstm_scan` (a
precomputed xp) compute what `sorjax.unroll` computes for an `lstm` cell
(same masking by `lengths`: padded steps keep the carry and emit zeros),
with fewer and cheaper XLA:CPU kernels than autodiff of a scan. What makes
the difference, each found with `jax.profiler` traces of the compiled loops
and measured (benchmarks/small_model.md, "lstm paths" and "lstm_layer
layouts"):

- The whole layer is one VJP: x W_x for all steps is one matmul before the
  loop, b is added inside it (no pass over [T, B, 4H] for the bias), and
  after the backward loop dW_h, dW_x, dx are one matmul each and db one sum.

- All four activations are ONE elementwise map over z in its own layout,
  A = alpha tanh(beta z + gamma) + delta with per-gate-row constants
  (sigma(x) = tanh(x / 2) / 2 + 1 / 2 for i, f, o; tanh for g), and the
  backward's dA/dz = alpha beta (1 - ((A - delta) / alpha)^2) likewise.
  Slicing z into four gates and stacking their activations instead was one
  fusion of ~120 us per step at B=32 H=256 (two threads); the map is ~20.
- Two layouts. Batch-major (default below GATE_MAJOR_FROM, and at every
  size on GPU and TPU): state h [B, H],
  z = h W_h [B, 4H], xp and ys used as they come; its per-step products
  go through `layer_scan.step_product` like the other layers' (so they
  too run gate-major where `layer_scan.gate_major_step` says so, e.g. at
  B <= 32 from H = 256; 1.00x there on the Zen 4). Gate-major: state h^T [H, B], z^T = W_h^T h^T [4H, B], where
  XLA:CPU's per-step products run faster from H = 512 (B=64 H=512: 200 vs
  183 GFLOP/s forward). Its [4H, T, B] buffers keep time inside, so x^T
  [D, T*B] gives xp^T = W_x^T x^T in one matmul and the weight sums read
  dz^T as [4H, T*B] rows; only the [T, B, D] / [T, B, H] arrays (x, dx,
  ys, dys, h_{t-1}) are transposed. Buffers [T, 4H, B] instead cost two
  transposes of a [T, B, 4H] array per call and made gate-major lose
  below H = 1024.
- The [T, B, 4H] buffers are reused in place, and the scans' inputs
  reach each step sliced one step ahead (`sorjax.layer_scan`): the
  forward writes A_t over xp_t once it has read it, and the backward
  writes dz_t over A_t.
- In float32 on CPU the maps' tanh is `sorjax.rational_tanh` (x P(x^2) /
  Q(x^2)) where that pays (`tanh_for`): XLA:CPU's cost model counts an
  HLO tanh as no flops, so the map looked I/O-bound and ran on one thread
  while the other slept; written out, it is split over both (B=32 H=256
  1.19x). At B=10 H=12 nothing is split and the arithmetic is simply
  faster than XLA's tanh (1.18x); maps of B * 4H in between lose to the
  split's hand-offs (0.91-0.99x) and keep `jnp.tanh`.
- The backward saves the activations A_t and c_{t-1} and recomputes only
  tanh(c_t); dW_h = sum_t h_{t-1}^T dz_t is ONE matmul after the backward
  loop (what cuDNN and oneDNN do), not T small ones.

Forward-mode autodiff (jvp, jacfwd) is not defined through this primitive
(a `jax.custom_vjp`); reverse mode, vmap and jit are.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sorjax import rational_tanh
from sorjax.cells.base import LSTMCarry, check_input
from sorjax.layer_scan import (previous_steps, row_products, scan_overwrite,
                               step_product, sum_dtype, unroll_steps,
                               valid_steps)

Array = jax.Array

# The default layout on CPU: batch-major below this hidden size, gate-major
# from it (module doc; benchmarks/small_model.md, "gate-major with time
# inside"). Other platforms stay batch-major (`_run`).
GATE_MAJOR_FROM = 512

# unroll=None: batch-major loops of at most this hidden size run chunks of 2
# steps (1.08-1.24x unroll=1 at B=10 H=12..32: fewer loop-carry copies and
# slices per step); every other shape runs 1 (unroll 2 measured 0.92-1.16x
# at H = 64-1024, mixed; BUILD_NOTES "Unrolled fused loops in chunks").
AUTO_UNROLL_MAX_H = 32

# Where the maps use the rational tanh (`tanh_for`; forward + backward of
# the layer against jnp.tanh, two threads: B=32 H=256 1.19x, B=10 H=12
# 1.18x, H = 512 / 1024 1.00-1.03x; B=32 H=32-128 0.91-0.99x, B=128 H=64
# 0.95x, where the split maps are too small to pay).
RATIONAL_FROM_H = 256
RATIONAL_MAX_GATES = 1024


def default_unroll(H: int, layout: str) -> int:
  """The unroll factor `lstm_layer` / `lstm_scan` use for unroll=None."""
  return 2 if layout == "batch_major" and H <= AUTO_UNROLL_MAX_H else 1


def _unroll_factor(where: str, unroll, H: int, tr: bool) -> int:
  return unroll_steps(where, unroll,
                      default_unroll(H, "gate_major" if tr else "batch_major"))


def tanh_for(B: int, H: int):
  """The tanh of the layer's maps at batch B and hidden size H: the
  rational form (`sorjax.rational_tanh`) from H = RATIONAL_FROM_H, where
  XLA:CPU then splits the step's maps over threads, and while a step's gate
  map has at most RATIONAL_MAX_GATES elements (B * 4H), where it is not
  split and the plain arithmetic beats XLA's tanh kernel; `jnp.tanh` in
  between, where a split map costs more in thread hand-offs than it saves
  (module doc)."""
  if H >= RATIONAL_FROM_H or B * 4 * H <= RATIONAL_MAX_GATES:
    return rational_tanh.tanh
  return jnp.tanh


def activation_consts(H: int, forget_bias: float, dtype, tr: bool):
  """(s, gamma, delta) per gate row of z, in z's layout, such that
  A = s tanh(s z + gamma) + delta (alpha = beta = s in the module doc) is
  [sigma(i), sigma(f + forget_bias), tanh(g), sigma(o)]: sigma(x) =
  tanh(x / 2) / 2 + 1 / 2. One elementwise map over all of z, vectorised
  along its minor axis."""
  s = np.repeat(np.array([0.5, 0.5, 1.0, 0.5]), H)       # alpha = beta
  gamma = np.repeat(np.array([0.0, 0.5 * forget_bias, 0.0, 0.0]), H)
  delta = np.repeat(np.array([0.5, 0.5, 0.0, 0.5]), H)
  shape = (4 * H, 1) if tr else (1, 4 * H)
  return tuple(jnp.asarray(v.reshape(shape), dtype) for v in (s, gamma, delta))


def _forward(forget_bias, unroll, tr, W2, b2, xp2, mask, h0, c0):
  """The forward loop. Gate-major (tr): state h^T [H, B], z^T = W_h^T h^T
  [4H, B], xp2 [4H, T, B] (time inside, so that the products before and
  after the loops see [4H, T*B] rows); batch-major: state h [B, H],
  z = h W_h [B, 4H], xp2 [T, B, 4H]. b2 is the bias in z's layout. Returns
  the final (h, c), ys [T, *h.shape] and the residuals (activations A_t
  over xp2, c_{t-1} [T, *h.shape])."""
  ax = 0 if tr else -1                                     # z's gate axis
  H, B = h0.shape if tr else h0.shape[::-1]
  s, gamma, delta = activation_consts(H, forget_bias, W2.dtype, tr)
  tanh = tanh_for(B, H)
  gamma = gamma + s * b2  # the bias enters the map: s (z + b) + gamma
  times_W = (lambda h: W2 @ h) if tr else step_product(W2)

  def body(carry, x, m):  # x = xp_t, overwritten with A_t
    h, c = carry
    A = s * tanh(s * (x + times_W(h)) + gamma) + delta
    si, sf, tg, so = jnp.split(A, 4, axis=ax)
    c_new = sf * c + si * tg                               # c_t
    h_new = so * tanh(c_new)                               # h_t
    if m is not None:  # padded steps keep the carry and emit zeros
      y = jnp.where(m, h_new, jnp.zeros_like(h_new))
      h_new, c_new = jnp.where(m, h_new, h), jnp.where(m, c_new, c)
    else:
      y = h_new
    return (h_new, c_new), (y, c), A

  (h, c), (ys, cs), As = scan_overwrite(body, (h0, c0), xp2, mask,
                                        unroll=unroll, axis=1 if tr else 0)
  return (h, c), ys, (As, cs)


def _layer_forward(forget_bias, unroll, tr, W_h, W_x, b, xs, mask, h0, c0):
  """x_t W_x (all steps, one matmul; xs is xp when W_x is None), the loop in
  its layout, and the results back in [B, ...] order. Also returns the
  inputs as dW_x wants them ([D, T*B] rows gate-major, xs batch-major;
  None without W_x, so that no residual holds xp while it is overwritten)."""
  if tr:  # x^T [D, T*B] (one pass over x), then xp^T = W_x^T x^T [4H, T*B]
    T, B, D = xs.shape
    xT = jnp.transpose(xs, (2, 0, 1)).reshape(D, T * B)
    xp2 = (xT if W_x is None else W_x.T @ xT).reshape(-1, T, B)
    (h, c), ys2, res = _forward(forget_bias, unroll, True, W_h.T, b[:, None],
                                xp2, mask, h0.T, c0.T)
    return ((h.T, c.T), jnp.swapaxes(ys2, 1, 2), ys2, res,
            None if W_x is None else xT)
  xp = xs if W_x is None else jnp.einsum("tbd,dn->tbn", xs, W_x)
  (h, c), ys, res = _forward(forget_bias, unroll, False, W_h, b[None], xp,
                             mask, h0, c0)
  return (h, c), ys, ys, res, None if W_x is None else xs


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _layer(forget_bias, unroll, tr, W_h, W_x, b, xs, mask, h0, c0):
  final, ys, _, _, _ = _layer_forward(forget_bias, unroll, tr, W_h, W_x, b,
                                      xs, mask, h0, c0)
  return final, ys


def _layer_fwd(forget_bias, unroll, tr, W_h, W_x, b, xs, mask, h0, c0):
  final, ys, ys2, (As, cs), x_in = _layer_forward(
      forget_bias, unroll, tr, W_h, W_x, b, xs, mask, h0, c0)
  return (final, ys), (W_h, W_x, x_in, mask, h0, ys2, As, cs)


def _layer_bwd(forget_bias, unroll, tr, res, cot):
  W_h, W_x, x_in, mask, h0, ys2, As, cs = res
  (dh_T, dc_T), dys = cot
  ax = 0 if tr else -1
  s, _, delta = activation_consts(W_h.shape[0], forget_bias, W_h.dtype, tr)
  tanh = tanh_for(h0.shape[0], W_h.shape[0])  # h0 [B, H], as the forward's
  if tr:  # into the loop's layout
    h0, dh_T, dc_T, dys = h0.T, dh_T.T, dc_T.T, jnp.swapaxes(dys, 1, 2)
  times_Wt = (lambda dz: W_h @ dz) if tr else step_product(W_h.T)

  def body(carry, A, inp):  # A = A_t, overwritten with dz_t
    dh, dc = carry
    if mask is None:
      (c0, dy), m = inp, None
    else:
      c0, dy, m = inp
    si, sf, tg, so = jnp.split(A, 4, axis=ax)
    tc = tanh(sf * c0 + si * tg)                           # tanh(c_t)
    dh_t = dh + dy                                         # dL/dh_t
    dc_t = dc
    if m is not None:  # a padded step passed its carry through
      dh_t = jnp.where(m, dh_t, jnp.zeros_like(dh_t))
      dc_t = jnp.where(m, dc_t, jnp.zeros_like(dc_t))
    dct = dc_t + dh_t * so * (1 - tc * tc)                 # dL/dc_t, total
    dA = jnp.concatenate([dct * tg, dct * c0, dct * si, dh_t * tc], axis=ax)
    u = (A - delta) / s                                    # tanh(beta z + gamma)
    dz = dA * (s * s) * (1 - u * u)                        # dA/dz = alpha beta (1 - u^2)
    dh_prev = times_Wt(dz)                                 # through h_{t-1} W_h
    dc_prev = dct * sf                                     # through c_{t-1}
    if m is not None:
      dh_prev = dh_prev + jnp.where(m, jnp.zeros_like(dh), dh)
      dc_prev = dc_prev + jnp.where(m, jnp.zeros_like(dc), dc)
    return (dh_prev, dc_prev), None, dz

  inputs = (cs, dys) if mask is None else (cs, dys, mask)
  (dh0, dc0), _, dzs = scan_overwrite(body, (dh_T, dc_T), As, inputs,
                                      reverse=True, unroll=unroll,
                                      axis=1 if tr else 0)
  hprev = previous_steps(h0, ys2, 0)  # h_{t-1}, the carry before step t
  # Sums over all T*B rows, accumulated in at least float32.
  acc = sum_dtype(W_h.dtype)
  wsum = lambda spec, a, d: jnp.einsum(  # noqa: E731
      spec, a, d, preferred_element_type=acc).astype(W_h.dtype)
  if tr:
    # dz^T [4H, T, B] is already [4H, T*B] rows; h_{t-1}^T [T, H, B] goes to
    # [H, T*B] in the concatenation's own pass.
    n, T, B = dzs.shape
    dZ = dzs.reshape(n, T * B)
    hT = jnp.transpose(hprev, (1, 0, 2)).reshape(-1, T * B)
    dW_h = wsum("hk,nk->hn", hT, dZ)                       # sum_t h_{t-1}^T dz_t
    db = jnp.sum(dZ, axis=1, dtype=acc).astype(W_h.dtype)
    if W_x is None:
      dW_x, dxs = None, jnp.transpose(dzs, (1, 2, 0))
    else:
      dW_x = wsum("dk,nk->dn", x_in, dZ)
      dxs = jnp.transpose((W_x @ dZ).reshape(-1, T, B), (1, 2, 0))
    return dW_h, dW_x, db, dxs, None, dh0.T, dc0.T
  # The weight sums contract ONE axis of T*B rows: contracting (t, b) as two
  # axes, XLA:CPU transposed dz to [B, T, 4H] first (a pass over it).
  dW_h = row_products(hprev, dzs, W_h.dtype)  # sum_t h_{t-1}^T dz_t
  db = jnp.sum(dzs, axis=(0, 1), dtype=acc).astype(W_h.dtype)
  if W_x is None:
    dW_x, dxs = None, dzs
  else:  # through x_t W_x, one matmul each
    dW_x = row_products(x_in, dzs, W_h.dtype)
    dxs = jnp.einsum("tbn,dn->tbd", dzs, W_x)
  return dW_h, dW_x, db, dxs, None, dh0, dc0  # no cotangent for the mask


_layer.defvjp(_layer_fwd, _layer_bwd)


class LSTMArgs(NamedTuple):
  """What `lstm_layer` needs from an `lstm` / `mts_lstm` cell's params."""
  W_h: Array           # [H, 4H]
  W_x: Array           # [D, 4H]
  b: Array             # [4H], the full gate bias
  forget_bias: float
  name: str            # the cell's registry name, for error messages


def lstm_args(cell, params) -> LSTMArgs | None:
  """The arguments of `lstm_layer` when `cell`'s step is exactly the
  recurrence above with precompute = x W_x + b (`lstm`; `mts_lstm`, whose
  fixed biases are part of b), so that `lstm_layer(*args[:3], xs, carry,
  forget_bias=args.forget_bias)` equals a scan of `cell.step`; None for
  every other cell."""
  from sorjax.cells.lstm import LSTM
  from sorjax.cells.mts_lstm import MTSLSTM
  if type(cell) is LSTM:
    return LSTMArgs(params["W_h"], params["W_x"], params["b"],
                    float(cell.forget_bias), "lstm")
  if type(cell) is MTSLSTM:
    return LSTMArgs(params["W_h"], params["W_x"], cell.bias(params), 0.0,
                    "mts_lstm")
  return None


def _checked(where, W_h, x, carry, lengths, layout):
  """Validates the common arguments; returns the valid steps as a bool
  [T, B] (None without lengths)."""
  if x.ndim != 3:
    raise ValueError(f"{where}: inputs must be time-major [T, B, .], got "
                     f"shape {x.shape}")
  T, B, _ = x.shape
  if W_h.ndim != 2 or W_h.shape[1] != 4 * W_h.shape[0]:
    raise ValueError(f"{where}: W_h must be [H, 4H], got {W_h.shape}")
  H = W_h.shape[0]
  for name, a in (("h", carry.h), ("c", carry.c)):
    if a.shape != (B, H):
      raise ValueError(f"{where}: carry.{name} must be [B, H] = [{B}, {H}],"
                       f" got {a.shape}")
  if T == 0:
    raise ValueError(f"{where}: the inputs have no time steps (T = 0)")
  if layout not in (None, "gate_major", "batch_major"):
    raise ValueError(f"{where}: layout must be None, 'gate_major' or "
                     f"'batch_major', got {layout!r}")
  valid = valid_steps(where, lengths, B, T)
  return None if valid is None else valid.T                       # [T, B]


def _run(where, forget_bias, unroll, layout, W_h, W_x, b, xs, valid, h0, c0):
  """`_layer` in `layout`, the mask of valid steps [T, B] broadcast to the
  loop's state layout ([T, H, B] gate-major, [T, B, H] batch-major).
  layout=None: gate-major from GATE_MAJOR_FROM on CPU only, whose
  per-step products it was measured faster for; other platforms keep the
  batch-major layout (no transposes around the loops, and the batch not
  the minor axis of every buffer), chosen when the computation is lowered
  for them (`jax.lax.platform_dependent`, as `layer_scan.step_product`)."""
  H = W_h.shape[0]
  unrolls = {tr: _unroll_factor(where, unroll, H, tr) for tr in (False, True)}

  def in_layout(tr):
    def run(W_h, W_x, b, xs, valid, h0, c0):
      mask = valid
      if valid is not None:  # in the state's layout: [T, H, B] or [T, B, H]
        T, B = valid.shape
        mask = jnp.broadcast_to(
            valid[:, None, :] if tr else valid[:, :, None],
            (T, H, B) if tr else (T, B, H))
      return _layer(float(forget_bias), unrolls[tr], tr, W_h, W_x, b, xs,
                    mask, h0, c0)
    return run

  args = (W_h, W_x, b, xs, valid, h0, c0)
  if layout is not None:
    return in_layout(layout == "gate_major")(*args)
  if H < GATE_MAJOR_FROM:
    return in_layout(False)(*args)
  return jax.lax.platform_dependent(*args, cpu=in_layout(True),
                                    default=in_layout(False))


def lstm_layer(W_h: Array, W_x: Array, b: Array, xs: Array,
               carry: LSTMCarry, lengths: Array | None = None,
               forget_bias: float = 0.0, unroll: int | None = None,
               layout: str | None = None, name: str = "lstm_layer"
               ) -> tuple[LSTMCarry, Array]:
  """An LSTM layer over time-major inputs: xp_t = x_t W_x + b for all steps
  in one matmul, then the recurrence, all in one VJP. Its backward forms
  dW_x = sum_t x_t^T dz_t and dx_t = dz_t W_x^T as one matmul each and sums
  db, and adds b inside the loop, saving passes over [T, B, 4H] that
  `lstm_scan` of a precomputed xp leaves to autodiff.

  Args:
    W_h: recurrent weights [H, 4H] (gate order i, f, g, o).
    W_x: input weights [D, 4H].
    b: gate bias [4H].
    xs: inputs, time-major [T, B, D].
    carry, lengths, forget_bias, unroll, layout: as `lstm_scan`.
    name: names the caller in the input-size error.

  Returns:
    (final carry, ys [T, B, H]).
  """
  valid = _checked(name, W_h, xs, carry, lengths, layout)
  H = W_h.shape[0]
  check_input(name, xs, W_x.shape[0])
  if W_x.shape != (W_x.shape[0], 4 * H) or b.shape != (4 * H,):
    raise ValueError(f"{name}: W_x must be [D, 4H] and b [4H] with H = {H}; "
                     f"got W_x {W_x.shape}, b {b.shape}")
  (h, c), ys = _run(name, forget_bias, unroll, layout, W_h, W_x, b, xs,
                    valid, carry.h, carry.c)
  return LSTMCarry(h, c), ys


def lstm_scan(W_h: Array, xp: Array, carry: LSTMCarry,
              lengths: Array | None = None, forget_bias: float = 0.0,
              unroll: int | None = None, layout: str | None = None
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
    unroll: steps per loop iteration in both loops (chunks of `unroll`
      steps, each read and written once; see `scan_overwrite`); None picks
      `default_unroll(H, layout)`: 2 batch-major up to H = 32, else 1.
    layout: "gate_major" (state h^T [H, B]; buffers [4H, T, B], the inputs
      and outputs transposed around the loops) or "batch_major" (state
      h [B, H]; no transposes); None picks gate_major for
      H >= GATE_MAJOR_FROM on CPU and batch_major on other platforms
      (module doc).

  Returns:
    (final carry, ys [T, B, H]).
  """
  valid = _checked("lstm_scan", W_h, xp, carry, lengths, layout)
  H = W_h.shape[0]
  if xp.shape[-1] != 4 * H:
    raise ValueError(f"lstm_scan: xp must be [T, B, 4H] with H = {H} (W_h "
                     f"{W_h.shape}), got xp {xp.shape}")
  (h, c), ys = _run("lstm_scan", forget_bias, unroll, layout, W_h, None,
                    jnp.zeros((4 * H,), xp.dtype), xp, valid, carry.h,
                    carry.c)
  return LSTMCarry(h, c), ys
