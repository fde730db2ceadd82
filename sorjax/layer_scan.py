"""What every fused layer shares: its loops, its padding rule, its checks.

The layer modules (`fused_lstm`, `fused_rnn`, `fused_gru`, `fused_mlstm`,
`fused_tensor_rnn`, `fused_dyck_rnn`, `fused_attention_lstm`,
`fused_mm_rnn`) and `sorjax.unroll`'s generic fused backward each run
their forward and backward loops through the two scans below, found with
`jax.profiler` traces of the compiled loops and measured
(benchmarks/small_model.md):

- Scan inputs reach the body through the carry, sliced one step ahead
  (`scan_prefetch`). A dynamic slice of a scan input that is used more than
  once inside a fusion is emitted as an outlined helper whose index load
  LLVM cannot hoist, which blocks vectorisation of the whole fusion.
- Per-step buffers are reused in place (`scan_overwrite`): a forward
  writes its step's result (the LSTM's gate activations A_t) over the
  step's input (xp_t) once it has read it, and a backward writes dz_t over
  A_t. A stacked scan output would instead be a fresh zero-filled
  [T, B, 4H] buffer on every call; at B=32 H=256 that fill ran beside the
  x W_x matmul and slowed it by a third (two threads).
- unroll u > 1 runs chunks of u steps, each chunk read and written once
  (`_chunked`; BUILD_NOTES, "Unrolled fused loops in chunks").

Padding (`lengths`): valid steps form a prefix of each example; a padded
step keeps its carry and outputs zeros (`valid_or`, `zero_padded`), as
`sorjax.unroll`'s plain scan does. The weight gradients are sums over all
T*B rows, one matmul each after the backward loop (`row_products`),
accumulated in at least float32 (`sum_dtype`).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from sorjax import checks


def check_unroll(where: str, unroll) -> None:
  """Raises unless `unroll` is None or a positive int (names `where`)."""
  checks.check_int(f"{where}: unroll", unroll, 1, optional=True)


def unroll_steps(where: str, unroll, default: int = 1) -> int:
  """The steps per loop iteration for a layer's `unroll` argument: `default`
  for None, the int given otherwise (`check_unroll` names `where`)."""
  check_unroll(where, unroll)
  return default if unroll is None else int(unroll)


def _scan_ahead(where, body, carry, buf, xs, reverse, unroll, axis=0,
                xs_axis=0):
  """The loop of `scan_prefetch` (buf None) and `scan_overwrite`: step t
  gets buf[t] (indexed along `axis`) and x_t (along `xs_axis`) in its
  carry, sliced by step t - 1 (t + 1 when reverse), and body's w_t is
  written over buf[t].
  With unroll u > 1 the loop steps through chunks of u steps: one slice of
  u steps ahead, u bodies, one write of u steps (`_chunked`)."""
  tmap = jax.tree_util.tree_map
  lens = ([a.shape[axis] for a in jax.tree_util.tree_leaves(buf)]
          + [a.shape[xs_axis] for a in jax.tree_util.tree_leaves(xs)])
  if not lens:
    raise ValueError(f"{where}: buf and xs hold no arrays to scan over")
  if len(set(lens)) != 1:
    raise ValueError(f"{where}: buf (along axis {axis}) and xs (along axis "
                     f"{xs_axis}) must have one length, got {lens}")
  n = lens[0]
  if n == 0:  # as lax.scan: the carry unchanged, empty ys of body's shapes
    step = (tmap(lambda a: jax.ShapeDtypeStruct(
        a.shape[:axis] + a.shape[axis + 1:], a.dtype), buf),
            tmap(lambda a: jax.ShapeDtypeStruct(
                a.shape[:xs_axis] + a.shape[xs_axis + 1:], a.dtype), xs))
    y = jax.eval_shape(lambda c, bx: body(c, *bx)[1], carry, step)
    return carry, tmap(lambda s: jnp.zeros((0, *s.shape), s.dtype), y), buf
  if unroll < 1:
    raise ValueError(f"{where}: unroll must be >= 1, got {unroll}")
  u = min(int(unroll), n)
  r = n % u  # the last r steps (the first ones when reverse) one at a time
  parts = [(0, n - r, u), (n - r, n, 1)] if r else [(0, n, u)]
  ys = []
  for lo, hi, k in (parts[::-1] if reverse else parts):
    carry, y, buf = _chunked(body, carry, buf, xs, reverse, k, axis, xs_axis,
                             lo, hi)
    ys.append(y)
  ys = ys[::-1] if reverse else ys
  if len(ys) == 1:
    return carry, ys[0], buf
  return carry, tmap(lambda *a: jnp.concatenate(a), *ys), buf


def _chunked(body, carry, buf, xs, reverse, u, axis, xs_axis, lo, hi):
  """Steps lo .. hi - 1 (hi - lo a multiple of u) in chunks of u steps.

  Each chunk of buf and xs reaches the loop iteration through its carry,
  sliced by the iteration before; the chunk's u results go over buf in one
  write. Unrolling `lax.scan` instead let XLA fuse the inner steps' slices
  of the updated buf into their consumers, which then had to run before the
  next write: XLA copied the whole buf on every iteration (0.4-0.5x at
  B=10 H=12; benchmarks/small_model.md)."""
  tmap = jax.tree_util.tree_map
  m = (hi - lo) // u

  def chunk(tree, k, ax):  # u = 1: the step itself, no chunk axis
    if u == 1:
      return tmap(lambda a: jax.lax.dynamic_index_in_dim(a, lo + k, ax, False),
                  tree)
    return tmap(lambda a: jax.lax.dynamic_slice_in_dim(a, lo + k * u, u, ax),
                tree)

  def wrapped(state, k):
    c, b_k, x_k, b = state
    if u == 1:
      c, y, w = body(c, b_k, x_k)
      b = tmap(lambda b_, w_: jax.lax.dynamic_update_index_in_dim(
          b_, w_.astype(b_.dtype), lo + k, axis), b, w)
    else:
      ys, ws = [None] * u, [None] * u
      for j in (range(u - 1, -1, -1) if reverse else range(u)):
        c, ys[j], ws[j] = body(
            c, tmap(lambda a: jax.lax.index_in_dim(a, j, axis, False), b_k),
            tmap(lambda a: jax.lax.index_in_dim(a, j, xs_axis, False), x_k))
      y = tmap(lambda *y_: jnp.stack(y_), *ys)
      b = tmap(lambda b_, *w_: jax.lax.dynamic_update_slice_in_dim(
          b_, jnp.stack(w_, axis).astype(b_.dtype), lo + k * u, axis), b, *ws)
    nxt = jnp.clip(k - 1 if reverse else k + 1, 0, m - 1)
    return (c, chunk(b, nxt, axis), chunk(xs, nxt, xs_axis), b), y

  k0 = m - 1 if reverse else 0
  (carry, _, _, buf), ys = jax.lax.scan(
      wrapped, (carry, chunk(buf, k0, axis), chunk(xs, k0, xs_axis), buf),
      jnp.arange(m, dtype=jnp.int32), reverse=reverse)
  if u > 1:
    ys = tmap(lambda a: a.reshape(m * u, *a.shape[2:]), ys)
  return carry, ys, buf


def scan_prefetch(body: Callable, carry: Any, xs: Any, reverse: bool = False,
                  unroll: int = 1):
  """`jax.lax.scan(body, carry, xs, reverse=reverse)`, with x_t handed to the
  body as a carried buffer that the previous step sliced (module doc).

  xs must have at least one step along its leading axis.
  """
  def step(c, _, x):
    c, y = body(c, x)
    return c, y, None
  carry, ys, _ = _scan_ahead("scan_prefetch", step, carry, None, xs, reverse,
                             unroll)
  return carry, ys


def scan_overwrite(body: Callable, carry: Any, buf: Any, xs: Any,
                   reverse: bool = False, unroll: int = 1, axis: int = 0,
                   xs_axis: int = 0):
  """A scan that consumes buf[t] and writes a result of the same shape over
  it: body(carry, buf[t], x_t) -> (carry, y_t, w_t), and buf[t] = w_t after
  step t (module doc). buf is an array or a pytree of arrays (w_t has its
  structure), stepped along `axis`; xs, which may be None, along
  `xs_axis`. The ys are stacked along axis 0.
  Returns (carry, ys, buf with every w_t). Like `scan_prefetch`, buf[t] and
  x_t reach step t sliced one step ahead.

  Because buf is a loop carry, XLA updates it in place when the caller's
  buffer is dead afterwards, and copies it once otherwise. With unroll
  u > 1 each loop iteration runs u steps on a chunk of u steps of buf and
  xs (sliced one iteration ahead) and writes the chunk back at once; the
  n % u steps left run one per iteration.
  """
  return _scan_ahead("scan_overwrite", body, carry, buf, xs, reverse, unroll,
                     axis, xs_axis)


def concrete(x) -> np.ndarray | None:
  """x as a NumPy array, or None if it is traced: value checks run on
  concrete arguments only (shapes and dtypes are checked either way)."""
  try:
    return np.asarray(x)
  except (jax.errors.TracerArrayConversionError,
          jax.errors.ConcretizationTypeError):
    return None


def first_outside(ids, n: int, allow: int | None = None
                  ) -> tuple[int, tuple[int, ...]] | None:
  """(value, index) of the first concrete id outside [0, n) (other than
  `allow`), or None: all in range, or traced (inside jit, unchecked). Out
  of range, a gather reads another row (negative) or NaN (clamped fill)."""
  v = concrete(ids)
  if v is None or not v.size:
    return None
  bad = (v < 0) | (v >= n)
  if allow is not None:
    bad &= v != allow
  if not bad.any():
    return None
  at = tuple(int(i) for i in np.argwhere(bad)[0])
  return int(v[at]), at


def check_lengths(where: str, lengths, B: int, T: int | None = None):
  """`lengths` as an int32 [B] array (None for None); a ValueError naming
  it otherwise: a shape other than [B], a dtype other than an integer one
  (a float length would be truncated) and, when lengths is concrete and T
  given, a value outside [0, T] (reversed, such a length would gather
  steps that do not exist)."""
  if lengths is None:
    return None
  # Concrete values are checked as given, before any cast: jnp.asarray
  # casts int64 to int32, which wraps a length past 2^31 into range.
  v = None if T is None else concrete(lengths)
  a = jnp.asarray(lengths) if v is None else v
  if a.shape != (B,):
    raise ValueError(f"{where}: lengths must have shape [B] = [{B}], got "
                     f"{a.shape}")
  if not jnp.issubdtype(a.dtype, jnp.integer):
    raise ValueError(f"{where}: lengths must be integers, got {a.dtype}")
  if v is not None and ((v < 0) | (v > T)).any():
    bad = sorted({int(n) for n in v[(v < 0) | (v > T)]})
    raise ValueError(f"{where}: lengths must be in [0, T] = [0, {T}], got "
                     f"{bad[:5]}")
  return jnp.asarray(a).astype(jnp.int32)


def valid_steps(where: str, lengths, B: int, T: int):
  """The valid steps of `lengths` [B] as a bool [B, T] (None for None)."""
  lengths = check_lengths(where, lengths, B, T)
  if lengths is None:
    return None
  return jnp.arange(T, dtype=jnp.int32)[None, :] < lengths[:, None]


def batch_major_mask(where: str, lengths, B: int, T: int):
  """The valid steps of `lengths` [B] as a bool [B, T, 1] mask (None for
  None), for layers that step along axis 1 of [B, T, ...] buffers."""
  valid = valid_steps(where, lengths, B, T)
  return None if valid is None else valid[:, :, None]


def valid_or(m, new, old):
  """new on a step's valid rows and old on its padded ones (m: the step's
  [B, 1] slice of the mask, None when nothing is padded); new and old are
  arrays or pytrees of one structure. A padded step keeps its carry, and
  in the backward passes the carry's cotangent through."""
  if m is None:
    return new
  return jax.tree_util.tree_map(lambda n, o: jnp.where(m, n, o), new, old)


def zero_padded(m, a):
  """a (an array or a pytree) with its padded rows zeroed: a padded step's
  output, and the cotangents that reach its step."""
  if m is None:
    return a
  return jax.tree_util.tree_map(lambda x: jnp.where(m, x, 0), a)


def check_state_layer(where: str, H: int, xp, width: str, n: int, h,
                      name: str = "xp", sizes: str | None = None):
  """Checks a batch-major layer's inputs xp [B, T, n] (named `name` in the
  message, where `width` spells n, e.g. "3H", and `sizes` gives the sizes
  it uses, by default "H = ..") and its initial state h [B, H]; returns
  (B, T)."""
  if xp.ndim != 3 or xp.shape[-1] != n:
    raise ValueError(f"{where}: {name} must be [B, T, {width}] with "
                     f"{sizes or f'H = {H}'}, got {xp.shape}")
  B, T = xp.shape[:2]
  if T == 0:
    raise ValueError(f"{where}: the inputs have no time steps (T = 0)")
  if h.shape != (B, H):
    raise ValueError(f"{where}: carry.h must be [B, H] = [{B}, {H}], got "
                     f"{h.shape}")
  return B, T


def check_lstm_state(where: str, carry, B: int, H: int, T: int) -> None:
  """Checks an LSTM-like layer's initial carry (h, c), each [B, H], and
  that its inputs have time steps."""
  if carry.h.shape != (B, H) or carry.c.shape != (B, H):
    raise ValueError(f"{where}: carry (h, c) must be [B, H] = [{B}, {H}] "
                     f"each; got {carry.h.shape}, {carry.c.shape}")
  if T == 0:
    raise ValueError(f"{where}: the inputs have no time steps (T = 0)")


def sum_dtype(dtype):
  """The dtype the layers accumulate weight and bias sums over T*B rows
  in: dtype itself from 32 bits, else float32 (a bfloat16 accumulator
  fails the tests)."""
  return dtype if jnp.finfo(dtype).bits >= 32 else jnp.float32


# row_products reads a^T from memory (`transposed_rows`) when d is at least
# this many times as wide as a.
WIDE_ROWS = 2

# A loop's per-step product a @ W runs gate-major on CPU, (W^T a^T)^T with
# W^T made once (`step_product`), when W [K, N] has at least
# STEP_GATE_MAJOR_ELEMS[i] elements for a of at most STEP_GATE_MAJOR_ROWS[i]
# rows (measured per shape, BUILD_NOTES "Per-step products gate-major").
STEP_GATE_MAJOR_ROWS = (32, 64)
STEP_GATE_MAJOR_ELEMS = (1 << 17, 1 << 20)


def gate_major_step(rows: int, K: int, N: int) -> bool:
  """Whether `step_product` multiplies a [rows, K] by W [K, N] gate-major
  on CPU."""
  return any(rows <= r and K * N >= e
             for r, e in zip(STEP_GATE_MAJOR_ROWS, STEP_GATE_MAJOR_ELEMS))


def step_product(W):
  """a -> a @ W for the per-step products of a loop, with W [K, N] laid out
  once (call it outside the loop; inside, the function only multiplies).

  On CPU, where `gate_major_step` says so (a large W, few rows of a), the
  product runs gate-major: W^T [N, K] (made once) times a^T gives y^T
  [N, rows], an optimization barrier keeps that layout, and y is read
  from it transposed. Without the barrier XLA folds the transpose back
  into the dot, and its dot of a by W, from either layout of W, ran
  slower. Scans of 100 products on a Zen 3 EPYC (YNNPACK dots, two
  threads, ad hoc), against what this function gave before (a @ W, or W^T
  [N, K] contracted along both last axes for K*N >= 1M and K >= 1024):

    B x K x N                             gate-major speed-up
    8-32 x 256-512 x 1024-2048            1.15-1.66x
    32 x 1024 x 4096, 32 x 4096 x 1024    1.39-1.6x
    64 x 256-4096 x 512-4096              1.05-1.19x
    128 x 256-512 x 1024-2048             1.01-1.03x
    64 x 64 x 256, 32 x 32 x 128          0.95-1.02x
    10 x 12 x 48                          0.63x

  On that machine whole training steps gained up to 1.38x at B = 32 and
  1.13x at B = 64 with H = 1024, but lost 2-4% at B = 128 and at B = 64
  with weights under 1M elements, hence the bounds of `gate_major_step`;
  on a Zen 4 (AVX-512) 1.09-1.30x at B=32 T=200 H=1024 and within the
  noise at H <= 512 (BUILD_NOTES, "Per-step products gate-major"). A
  backward product by W^T is step_product(W.T): it reads W itself (the two
  transposes cancel). Other platforms multiply a @ W, whose dots take any
  layout (`jax.lax.platform_dependent`; on CPU only the gate-major branch
  is compiled)."""
  K, N = W.shape
  Wt = W.T  # unused (and dropped by XLA) where no product is gate-major

  def gate_major(a):  # y^T [N, ...] in memory, then y [..., N]
    yT = jax.lax.dot_general(Wt, a, (((1,), (a.ndim - 1,)), ((), ())))
    return jnp.moveaxis(jax.lax.optimization_barrier(yT), 0, -1)

  def product(a):
    if not gate_major_step(math.prod(a.shape[:-1]), K, N):
      return a @ W
    return jax.lax.platform_dependent(a, cpu=gate_major,
                                      default=lambda a: a @ W)

  return product


def row_products(a, d, dtype):
  """sum_r a_r^T d_r over all leading rows of a [..., m] and d [..., n]
  (the T*B tokens): a weight gradient as one [m, n] matmul, accumulated in
  `sum_dtype(dtype)` and returned in dtype.

  With n >= WIDE_ROWS * m the product reads a^T from memory
  (`transposed_rows`, on CPU): the rows-contracted dot that the einsum
  below compiles to ran 1.6-2.1x slower than from a^T on a Zen 3 EPYC
  ([6400, 512]^T x [6400, 2048]: 152-165 against 98-100 ms; x [6400,
  4096]: 380-409 against 191-199 ms) and 1.06-1.5x on session 26's Zen 4,
  where a pass over a costs ~5 ms. For n = m it was 1.05-1.08x, which the
  pass would eat (BUILD_NOTES, "Wide weight sums from transposed rows")."""
  if d.shape[-1] >= WIDE_ROWS * a.shape[-1]:
    return transposed_row_products(transposed_rows(a), d, dtype)
  return jnp.einsum("rm,rn->mn", a.reshape(-1, a.shape[-1]),
                    d.reshape(-1, d.shape[-1]),
                    preferred_element_type=sum_dtype(dtype)).astype(dtype)


def transposed_rows(a):
  """The rows of a [..., m] (the T*B tokens) as one [m, R] array, made once:
  the left operand of `transposed_row_products` for weight sums that share
  a. XLA:CPU runs a^T d with both operands contracted along their rows
  (what `row_products` asks for) 1.06-1.5x slower than from a^T in memory
  ([6400, 512]^T x [6400, 512]: 23.4 against 17.9 ms; [6400, 512]^T x
  [6400, 4]: 4.6 against 0.3 ms), so on CPU the transpose is made in
  memory and kept from being folded back into each product. The pass over
  a costs about what one product gains, so this pays only where products
  share a (BUILD_NOTES, "Weight sums from transposed rows") or where the
  other operand is wide (`row_products`). Other platforms get the plain
  transpose, which their dots fold.

  On CPU a's last axis goes first and the leading axes are flattened after
  it: that reshape needs the transposed array in memory, so XLA makes it
  in one pass. Flattened first, the 2-D transpose behind an optimization
  barrier compiled to three passes over a in mm_rnn's backward: the
  barrier held a plain copy of a (the transpose's layout made free), a^T
  was made from it for the loop of products, and again from a for the
  product after the loop (25 MB more temporaries at B=64 T=100 H=512).
  With fewer than two leading axes longer than 1 there is no such
  reshape, and only the barrier remains."""
  m = a.shape[-1]
  lead = tuple(n for n in a.shape[:-1] if n != 1)

  def cpu(r):
    if len(lead) < 2:
      return jax.lax.optimization_barrier(r.reshape(-1, m).T)
    r = jnp.moveaxis(r.reshape(*lead, m), -1, 0)           # [m, *lead]
    return jax.lax.optimization_barrier(r.reshape(m, -1))

  return jax.lax.platform_dependent(a, cpu=cpu,
                                    default=lambda r: r.reshape(-1, m).T)


def transposed_row_products(aT, d, dtype):
  """`row_products(a, d, dtype)` from aT = `transposed_rows(a)` [m, R] and
  d [..., n] with R leading rows: one [m, R] x [R, n] matmul, accumulated
  in `sum_dtype(dtype)` and returned in dtype."""
  return jnp.matmul(aT, d.reshape(-1, d.shape[-1]),
                    preferred_element_type=sum_dtype(dtype)).astype(dtype)


def previous_steps(first, seq, axis: int):
  """[first, seq_0, .., seq_{T-2}] along `axis` (seq's time axis; first has
  no such axis): the value before each step, h_{t-1} from h_0 and the
  outputs. y_t is the carry h_t on valid steps and valid steps form a
  prefix, so every step whose gradient uses h_{t-1} finds it there (a
  padded step's zeros meet a zero cotangent)."""
  return jnp.concatenate(
      [jnp.expand_dims(first, axis),
       jax.lax.slice_in_dim(seq, 0, seq.shape[axis] - 1, axis=axis)], axis)
