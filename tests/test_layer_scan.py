"""sorjax.layer_scan: the prefetching and overwriting scans against
`jax.lax.scan` of the same body (both directions, inner axes, chunks of
unrolled steps), and the padding and weight-sum helpers against hand-made
cases and NumPy loops."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sorjax.layer_scan import (batch_major_mask, check_lengths, check_unroll,
                               gate_major_step, previous_steps, row_products,
                               scan_overwrite, scan_prefetch, step_product,
                               STEP_GATE_MAJOR_ELEMS, STEP_GATE_MAJOR_ROWS,
                               sum_dtype,
                               transposed_row_products, transposed_rows,
                               unroll_steps, valid_or, WIDE_ROWS, zero_padded)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_prefetch_is_a_scan(reverse):
  xs = (jnp.arange(12.0).reshape(6, 2), jnp.arange(6.0))

  def body(c, x):
    a, b = x
    c = 0.5 * c + a * b
    return c, c + b

  ref = jax.lax.scan(body, jnp.ones(2), xs, reverse=reverse)
  got = scan_prefetch(body, jnp.ones(2), xs, reverse=reverse)
  for g, r in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(ref)):
    np.testing.assert_array_equal(g, r)
  # zero steps, as lax.scan: the carry back and empty ys
  empty = (xs[0][:0], xs[1][:0])
  ref = jax.lax.scan(body, jnp.ones(2), empty, reverse=reverse)
  got = scan_prefetch(body, jnp.ones(2), empty, reverse=reverse)
  assert got[1].shape == ref[1].shape == (0, 2)
  np.testing.assert_array_equal(got[0], ref[0])
  with pytest.raises(ValueError, match="no arrays to scan over"):
    scan_prefetch(body, jnp.ones(2), None)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("with_xs", [False, True])
def test_scan_overwrite_writes_each_step_over_its_input(reverse, with_xs):
  buf = jnp.arange(12.0).reshape(6, 2)
  xs = jnp.arange(6.0) + 10 if with_xs else None

  def body(c, b, x):  # w_t depends on the carry, so the order is checked
    x = 1.0 if x is None else x
    c = 0.5 * c + b * x
    return c, c.sum(), 2.0 * b + c

  def ref_body(c, inp):
    c, y, w = body(c, *inp)
    return c, (y, w)

  rc, (ry, rw) = jax.lax.scan(ref_body, jnp.ones(2), (buf, xs),
                              reverse=reverse)
  c, ys, w = jax.jit(lambda b: scan_overwrite(body, jnp.ones(2), b, xs,
                                              reverse=reverse))(buf)
  for g, r in ((c, rc), (ys, ry), (w, rw)):
    np.testing.assert_allclose(g, r, rtol=1e-6)
  c0, ys0, w0 = scan_overwrite(body, jnp.ones(2), buf[:0], None)
  assert ys0.shape == (0,) and w0.shape == (0, 2)
  np.testing.assert_array_equal(c0, jnp.ones(2))


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_overwrite_along_an_inner_axis(reverse):
  """axis=1: buf [N, T, M] is read and written at [:, t, :]; the result is
  the axis-0 scan of the moved buffer, moved back."""
  buf = jnp.arange(2.0 * 5 * 3).reshape(2, 5, 3)
  xs = jnp.arange(5.0)

  def body(c, b, x):
    c = 0.5 * c + b * x
    return c, c.sum(), b - c

  rc, ry, rw = scan_overwrite(body, jnp.ones((2, 3)),
                              jnp.moveaxis(buf, 1, 0), xs, reverse=reverse)
  c, ys, w = jax.jit(lambda b: scan_overwrite(
      body, jnp.ones((2, 3)), b, xs, reverse=reverse, axis=1))(buf)
  np.testing.assert_allclose(c, rc, rtol=1e-6)
  np.testing.assert_allclose(ys, ry, rtol=1e-6)
  np.testing.assert_allclose(w, jnp.moveaxis(rw, 0, 1), rtol=1e-6)
  with pytest.raises(ValueError, match=r"one length, got \[5, 4\]"):
    scan_overwrite(body, jnp.ones((2, 3)), buf, xs[:4], axis=1)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("unroll", [1, 3])
def test_scan_overwrite_steps_xs_along_xs_axis(reverse, unroll):
  """xs_axis=1: x_t = xs[:, t] (and buf along axis=1): the same as the
  scan of both moved to axis 0; ys stay stacked along axis 0."""
  n = 7
  buf = jnp.arange(2.0 * n * 3).reshape(2, n, 3) / 5
  xs = jnp.cos(jnp.arange(4.0 * n).reshape(4, n))

  def body(c, b, x):
    c = 0.5 * c + b * x[:2, None]
    return c, x, jnp.sin(b) + c

  rc, ry, rw = scan_overwrite(body, jnp.ones((2, 3)), jnp.moveaxis(buf, 1, 0),
                              xs.T, reverse=reverse, unroll=unroll)
  c, ys, w = jax.jit(lambda b, x: scan_overwrite(
      body, jnp.ones((2, 3)), b, x, reverse=reverse, unroll=unroll, axis=1,
      xs_axis=1))(buf, xs)
  np.testing.assert_allclose(c, rc, rtol=1e-6)
  np.testing.assert_allclose(ys, ry, rtol=1e-6)
  assert ys.shape == (n, 4)
  np.testing.assert_allclose(w, jnp.moveaxis(rw, 0, 1), rtol=1e-6)
  with pytest.raises(ValueError, match=r"xs \(along axis 1\) must have one "
                     r"length, got \[7, 6\]"):
    scan_overwrite(body, jnp.ones((2, 3)), buf, xs[:, :6], axis=1, xs_axis=1)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("n,unroll", [(8, 4), (7, 3), (7, 2), (5, 9), (1, 3),
                                      (6, 6)])
@pytest.mark.parametrize("axis", [0, 1])
def test_scan_overwrite_unrolled_in_chunks_is_the_scan(reverse, n, unroll,
                                                        axis):
  """unroll u > 1 runs chunks of u steps (and the n % u left one at a time):
  every step, in order, against lax.scan of the same body."""
  buf = jnp.arange(2.0 * n * 3).reshape(n, 2, 3) / 7
  xs = (jnp.arange(n, dtype=jnp.float32) + 1, jnp.arange(2.0 * n).reshape(n, 2))

  def body(c, b, x):  # w_t depends on the carry, so the order is checked
    a, v = x
    c = 0.5 * c + b * a + v[:, None]
    return c, (c.sum(), a), jnp.sin(b) + c

  def ref_body(c, inp):
    c, y, w = body(c, *inp)
    return c, (y, w)

  rc, (ry, rw) = jax.lax.scan(ref_body, jnp.ones((2, 3)), (buf, xs),
                              reverse=reverse)
  b_in = jnp.moveaxis(buf, 0, axis)
  c, ys, w = jax.jit(lambda b: scan_overwrite(
      body, jnp.ones((2, 3)), b, xs, reverse=reverse, unroll=unroll,
      axis=axis))(b_in)
  np.testing.assert_allclose(c, rc, rtol=1e-6)
  for g, r in zip(jax.tree_util.tree_leaves(ys), jax.tree_util.tree_leaves(ry)):
    np.testing.assert_allclose(g, r, rtol=1e-6)
  np.testing.assert_allclose(w, jnp.moveaxis(rw, 0, axis), rtol=1e-6)
  pc, pys = scan_prefetch(lambda c, x: body(c, x[0], x[1:])[:2], jnp.ones((2, 3)),
                          (buf, *xs), reverse=reverse, unroll=unroll)
  np.testing.assert_allclose(pc, rc, rtol=1e-6)
  np.testing.assert_allclose(pys[0], ry[0], rtol=1e-6)
  with pytest.raises(ValueError, match="unroll must be >= 1, got 0"):
    scan_overwrite(body, jnp.ones((2, 3)), buf, xs, unroll=0)


def test_padding_keeps_the_carry_and_zeroes_the_output():
  """valid_or picks new rows where the step is valid and old ones where it
  is padded, leaf by leaf of a pytree; zero_padded zeroes padded rows;
  neither touches anything without a mask."""
  m = jnp.array([[True], [False], [True]])                     # [B, 1]
  new = {"h": jnp.full((3, 2), 1.0), "c": jnp.full((3, 2), 2.0)}
  old = {"h": jnp.full((3, 2), -1.0), "c": jnp.full((3, 2), -2.0)}
  got = valid_or(m, new, old)
  np.testing.assert_array_equal(got["h"], [[1, 1], [-1, -1], [1, 1]])
  np.testing.assert_array_equal(got["c"], [[2, 2], [-2, -2], [2, 2]])
  np.testing.assert_array_equal(zero_padded(m, new["c"]),
                                [[2, 2], [0, 0], [2, 2]])
  assert valid_or(None, new, old) is new
  assert zero_padded(None, new) is new


def test_batch_major_mask_marks_a_prefix_of_each_example():
  m = batch_major_mask("f", [2, 0, 3], 3, 3)
  assert m.shape == (3, 3, 1) and m.dtype == jnp.bool_
  np.testing.assert_array_equal(m[..., 0], [[1, 1, 0], [0, 0, 0], [1, 1, 1]])
  assert batch_major_mask("f", None, 3, 3) is None
  with pytest.raises(ValueError, match=r"f: lengths must have shape \[B\] = "
                     r"\[3\], got \(2,\)"):
    check_lengths("f", jnp.array([1, 2]), 3)
  assert check_lengths("f", np.array([1, 2, 3], np.int64), 3).dtype == jnp.int32


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_check_unroll_names_the_caller(bad):
  check_unroll("f", None)
  check_unroll("f", np.int64(3))
  with pytest.raises(ValueError, match=r"f: unroll must be None or an int >= 1, "
                     r"got"):
    check_unroll("f", bad)
  with pytest.raises(ValueError, match=r"g: unroll must be None or an int >= 1, "
                     r"got"):
    unroll_steps("g", bad)
  assert unroll_steps("g", None) == 1 and unroll_steps("g", None, 2) == 2
  assert unroll_steps("g", np.int32(3), 2) == 3
  assert type(unroll_steps("g", np.int32(3))) is int


@pytest.mark.parametrize("axis", [0, 1])
def test_previous_steps_is_the_value_before_each_step(axis):
  """[first, seq_0, .., seq_{T-2}] along the time axis."""
  seq = np.arange(2.0 * 4 * 3).reshape(4, 2, 3)                # [T, B, H]
  first = -np.ones((2, 3))
  want = np.concatenate([first[None], seq[:-1]])
  got = previous_steps(jnp.asarray(first), jnp.moveaxis(seq, 0, axis), axis)
  np.testing.assert_array_equal(got, np.moveaxis(want, 0, axis))


@pytest.mark.parametrize("n", [2, 8, 9])  # narrow; wide from 2 * 4 on
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_row_products_sum_over_every_leading_row(dtype, n):
  """sum over all T*B rows of a_r^T d_r, a loop over rows in float64; in
  the input dtype, summed in at least float32; eagerly and jitted."""
  rng = np.random.default_rng(0)
  a, d = (np.asarray(jnp.asarray(rng.normal(size=s), dtype), np.float64)
          for s in ((5, 3, 4), (5, 3, n)))                     # as rounded
  want = np.zeros((4, n))
  for t in range(5):
    for b in range(3):
      want += np.outer(a[t, b], d[t, b])
  args = (jnp.asarray(a, dtype), jnp.asarray(d, dtype))
  got = row_products(*args, dtype)
  np.testing.assert_array_equal(
      jax.jit(row_products, static_argnums=2)(*args, dtype), got)
  assert got.dtype == dtype and got.shape == (4, n)
  tol = 1e-5 if dtype == jnp.float32 else 1e-2
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol,
                             atol=tol)
  assert sum_dtype(jnp.bfloat16) == jnp.float32
  assert sum_dtype(jnp.float32) == jnp.float32


@pytest.mark.parametrize("lead", [(5, 3), (15,), (1, 15), (5, 1, 3)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_transposed_row_products_sum_over_every_leading_row(dtype, lead):
  """The same sums from a's rows transposed once, for two products that
  share a (as the multi-matrix layers' weight sums do), jitted and vmapped;
  with two leading axes, with one (the barrier alone) and with axes of
  length 1 among them."""
  rng = np.random.default_rng(1)
  a, d, e = (np.asarray(jnp.asarray(rng.normal(size=lead + (n,)), dtype),
                        np.float64) for n in (4, 2, 6))
  want = [np.zeros((4, n)) for n in (2, 6)]
  for a_r, d_r, e_r in zip(a.reshape(-1, 4), d.reshape(-1, 2),
                           e.reshape(-1, 6)):
    want[0] += np.outer(a_r, d_r)
    want[1] += np.outer(a_r, e_r)

  @jax.jit
  def sums(a, d, e):
    aT = transposed_rows(a)
    assert aT.shape == (4, 15)
    return tuple(transposed_row_products(aT, x, dtype) for x in (d, e))

  args = [jnp.asarray(x, dtype) for x in (a, d, e)]
  tol = 1e-5 if dtype == jnp.float32 else 1e-2
  for got, w in zip(sums(*args), want):
    assert got.dtype == dtype and got.shape == w.shape
    np.testing.assert_allclose(np.asarray(got, np.float64), w, rtol=tol,
                               atol=tol)
  batched = jax.vmap(sums)(*[jnp.stack([x, 2 * x]) for x in args])
  for got, w in zip(batched, want):
    np.testing.assert_allclose(np.asarray(got[1], np.float64), 4 * w,
                               rtol=tol, atol=4 * tol)


def _cpu_operands():
  """a [6, 5, 8] and two right operands d, e sharing its rows, for the
  tests of the compiled transposed rows, which are made on CPU only."""
  if jax.default_backend() != "cpu":
    pytest.skip("a^T is made in memory on CPU only; other backends fold "
                "the transpose into their dots")
  return jnp.ones((6, 5, 8)), jnp.ones((6, 5, 3)), jnp.ones((6, 5, 7))


def _compiled_hlo(f, *args):
  """The text of f compiled for args."""
  return jax.jit(f).lower(*args).compile().as_text()


def _compiled_dots(f, *args, hlo=None):
  """The dot instructions of f compiled for args (or of hlo, its text)."""
  hlo = _compiled_hlo(f, *args) if hlo is None else hlo
  return [line for line in hlo.splitlines() if " dot(" in line]


def test_transposed_rows_stay_transposed_in_the_compiled_products():
  """On CPU the products read a^T from memory: no dot of the compiled sums
  contracts its left operand along dimension 0, the rows-contracted form
  that `row_products` gives and XLA:CPU runs slower."""
  a, d, e = _cpu_operands()

  def shared(a, d, e):
    aT = transposed_rows(a)
    return (transposed_row_products(aT, d, a.dtype),
            transposed_row_products(aT, e, a.dtype))

  def plain(a, d, e):
    return row_products(a, d, a.dtype), row_products(a, e, a.dtype)

  want = _compiled_dots(plain, a, d, e)  # it sees the rows-contracted form
  assert len(want) == 2
  assert all("lhs_contracting_dims={0}" in x for x in want)
  got = _compiled_dots(shared, a, d, e)
  assert len(got) == 2
  assert not any("lhs_contracting_dims={0}" in x for x in got), got


def test_row_products_read_wide_sums_from_transposed_rows():
  """On CPU a weight sum whose right operand is at least WIDE_ROWS times
  as wide as a reads a^T from memory; a narrower one keeps the
  rows-contracted dot, where one pass over a would cost what it gains."""
  a, _, _ = _cpu_operands()  # m = 8

  assert WIDE_ROWS == 2
  for n, rows_contracted in ((8, True), (15, True), (16, False), (40, False)):
    got = _compiled_dots(lambda a, d: row_products(a, d, a.dtype), a,
                         jnp.ones((6, 5, n)))
    assert len(got) == 1, got
    assert ("lhs_contracting_dims={0}" in got[0]) == rows_contracted, (n, got)


def test_transposed_rows_are_made_in_one_pass():
  """On CPU the compiled program forms a^T [m, R] once, although products
  in a loop and one after it read it (the layout of `fused_mm_rnn._sums`).
  Flattening a first and transposing the 2-D rows behind the barrier
  compiled to three [m, R] arrays here: a copy of a under the transpose's
  free layout, a^T made from that copy for the loop, and a^T made from a
  again for the other product."""
  a, d, e = _cpu_operands()

  def sums(a, d, e):
    aT = transposed_rows(a)

    def one(j, acc):
      dW = transposed_row_products(aT, d * (j + 1.0), a.dtype)
      return jax.lax.dynamic_update_index_in_dim(acc, dW, j, 0)

    dWs = jax.lax.fori_loop(0, 3, one, jnp.zeros((3, 8, 3)))
    return dWs, transposed_row_products(aT, e, a.dtype)

  hlo = jax.jit(sums).lower(a, d, e).compile().as_text()
  entry = hlo[hlo.index("\nENTRY"):].splitlines()
  made = [line for line in entry
          if re.search(r"= f32\[8,30\]\{[0-9,]+\} (?!bitcast|parameter)",
                       line)]
  assert len(made) == 1, made


def test_gate_major_step_bounds():
  """Gate-major from 2^17 weight elements with at most 32 rows of a, and
  from 2^20 with at most 64; plain beyond 64 rows or under the sizes."""
  assert STEP_GATE_MAJOR_ROWS == (32, 64)
  assert STEP_GATE_MAJOR_ELEMS == (1 << 17, 1 << 20)
  assert gate_major_step(32, 256, 512)           # 2^17, 32 rows
  assert not gate_major_step(32, 256, 511)
  assert not gate_major_step(33, 256, 512)       # 2^17 needs <= 32 rows
  assert gate_major_step(33, 1024, 1024)         # 2^20, 33-64 rows
  assert gate_major_step(64, 512, 2048)
  assert not gate_major_step(64, 1023, 1024)
  assert not gate_major_step(65, 4096, 4096)     # beyond 64 rows
  assert gate_major_step(1, 512, 256)


@pytest.mark.parametrize("rows,K,N,gate_major", [
    (3, 64, 256, False),       # small
    (3, 256, 512, True),       # 2^17 elements
    (3, 2048, 512, True),
    (48, 512, 256, False),     # 2^17 elements, but 48 rows
    (48, 1024, 1024, True)])   # 2^20 elements
def test_step_product_is_a_times_W_in_the_layout_of_its_size(rows, K, N,
                                                             gate_major):
  """step_product(W)(a) = a @ W (a float64 NumPy product), and
  step_product(W.T)(d) = d @ W^T; inside a loop, the compiled per-step dot
  of a large weight is gate-major (W^T by a^T, both contracted along their
  last axis, giving y^T [N, rows]) and that of a small one plain
  ([rows, N]), with no conditional left of `platform_dependent`."""
  rng = np.random.default_rng(0)
  W = jnp.asarray(rng.standard_normal((K, N)) / np.sqrt(K), jnp.float32)
  a = jnp.asarray(rng.standard_normal((rows, K)), jnp.float32)
  d = jnp.asarray(rng.standard_normal((rows, N)), jnp.float32)
  W64 = np.asarray(W, np.float64)
  np.testing.assert_allclose(jax.jit(step_product(W))(a),
                             np.asarray(a) @ W64, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(step_product(W.T)(d), np.asarray(d) @ W64.T,
                             rtol=1e-4, atol=1e-4)

  def loop(W, a):  # three steps, the weight laid out once outside
    times_W = step_product(W)
    widen = lambda y: jnp.tile(y, (1, -(-K // N)))[:, :K]  # noqa: E731
    return jax.lax.fori_loop(0, 3, lambda _, h: jnp.tanh(widen(times_W(h))),
                             a)

  hlo = _compiled_hlo(loop, W, a)
  assert "conditional" not in hlo
  dots = _compiled_dots(loop, hlo=hlo)
  assert len(dots) == 1, dots
  shape = f"f32[{N},{rows}]" if gate_major else f"f32[{rows},{N}]"
  assert f"= {shape}" in dots[0], dots
  assert ("lhs_contracting_dims={1}, rhs_contracting_dims={1}"
          in dots[0]) == gate_major, dots


@pytest.mark.parametrize("platform,gate_major", [
    ("cpu", True), ("cuda", False), ("tpu", False)])
def test_step_product_is_gate_major_on_cpu_only(platform, gate_major):
  """A weight within the gate-major rule lowers to the barrier-kept y^T
  product for CPU and to the plain a @ W for GPU and TPU
  (`jax.lax.platform_dependent`), exported without either device."""
  W = jnp.ones((512, 1024), jnp.float32)
  a = jnp.ones((8, 512), jnp.float32)
  assert gate_major_step(8, 512, 1024)
  exp = jax.export.export(jax.jit(lambda W, a: step_product(W)(a)),
                          platforms=[platform])(W, a)
  assert ("optimization_barrier" in exp.mlir_module()) == gate_major


def test_gate_major_step_product_under_vmap_and_grad(monkeypatch):
  """Per-replica weights (vmap, as the training loop's replicas) with every
  product gate-major: values and gradients equal a @ W's."""
  from sorjax import layer_scan
  monkeypatch.setattr(layer_scan, "STEP_GATE_MAJOR_ELEMS", (1, 1))
  rng = np.random.default_rng(3)
  W = jnp.asarray(rng.standard_normal((3, 5, 7)), jnp.float32)
  a = jnp.asarray(rng.standard_normal((3, 4, 5)), jnp.float32)

  def f(prod):
    return jax.jit(jax.vmap(jax.value_and_grad(
        lambda W, a: jnp.sum(jnp.tanh(prod(W, a))), (0, 1))))

  (v, g) = f(lambda W, a: step_product(W)(a))(W, a)
  (v_ref, g_ref) = f(lambda W, a: a @ W)(W, a)
  np.testing.assert_allclose(v, v_ref, rtol=1e-5)
  for x, y in zip(g, g_ref):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
