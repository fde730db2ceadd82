"""sorjax.fused_lstm against a NumPy loop of the LSTM equations (float64):
values, final carry, masking, gradients (finite differences and a plain
JAX loop), vmap over replicas and jit; every check in both layouts (batch-major
and gate-major). The scans it runs on: tests/test_layer_scan.py."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sorjax import cells
from sorjax.cells.base import LSTMCarry
from sorjax.fused_lstm import lstm_layer, lstm_scan
from tests.cells.reference import iter_eqns

B, T, H = 3, 4, 4


def sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def numpy_lstm(W, xp, h, c, lengths=None, forget_bias=0.0):
  """The module docstring's equations, one example and one step at a time."""
  T_, B_, _ = xp.shape
  ys = np.zeros((T_, B_, W.shape[0]))
  h, c = h.copy(), c.copy()
  for b in range(B_):
    for t in range(T_ if lengths is None else lengths[b]):
      z = xp[t, b] + h[b] @ W
      i, f, g, o = np.split(z, 4)
      c[b] = sigmoid(f + forget_bias) * c[b] + sigmoid(i) * np.tanh(g)
      h[b] = sigmoid(o) * np.tanh(c[b])
      ys[t, b] = h[b]
  return h, c, ys


def jax_loop_loss(W, xp, h, c, G, lengths, forget_bias):
  """<ys, G> + sum(final h) + 2 sum(final c) by a plain Python loop in JAX."""
  ys = []
  for t in range(xp.shape[0]):
    z = xp[t] + h @ W
    i, f, g, o = jnp.split(z, 4, axis=-1)
    c_new = jax.nn.sigmoid(f + forget_bias) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h_new = jax.nn.sigmoid(o) * jnp.tanh(c_new)
    m = (t < lengths)[:, None] if lengths is not None else None
    if m is not None:
      h_new, c_new = jnp.where(m, h_new, h), jnp.where(m, c_new, c)
      ys.append(jnp.where(m, h_new, 0.0))
    else:
      ys.append(h_new)
    h, c = h_new, c_new
  return jnp.sum(jnp.stack(ys) * G) + jnp.sum(h) + 2.0 * jnp.sum(c)


LAYOUTS = ["batch_major", "gate_major"]


def fused_loss(W, xp, h, c, G, lengths, forget_bias, layout=None):
  final, ys = lstm_scan(W, xp, LSTMCarry(h, c), lengths, forget_bias,
                        layout=layout)
  return jnp.sum(ys * G) + jnp.sum(final.h) + 2.0 * jnp.sum(final.c)


@pytest.fixture
def data():
  with jax.enable_x64(True):
    r = np.random.default_rng(0)
    W = r.normal(size=(H, 4 * H)) / 2
    xp = r.normal(size=(T, B, 4 * H))
    h0, c0 = r.normal(size=(B, H)), r.normal(size=(B, H))
    G = r.normal(size=(T, B, H))
    yield W, xp, h0, c0, G


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("lengths", [None, (4, 2, 0)])
@pytest.mark.parametrize("forget_bias", [0.0, 1.0])
def test_values_match_numpy_loop(data, lengths, forget_bias, layout):
  W, xp, h0, c0, _ = data
  with jax.enable_x64(True):
    L = None if lengths is None else jnp.asarray(lengths, jnp.int32)
    final, ys = lstm_scan(jnp.asarray(W), jnp.asarray(xp),
                          LSTMCarry(jnp.asarray(h0), jnp.asarray(c0)), L,
                          forget_bias, layout=layout)
    h, c, ys_ref = numpy_lstm(W, xp, h0, c0, lengths, forget_bias)
    np.testing.assert_allclose(ys, ys_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(final.h, h, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(final.c, c, rtol=1e-12, atol=1e-12)
    if lengths is not None:  # length 0: the carry is untouched
      np.testing.assert_array_equal(final.h[2], h0[2])
      np.testing.assert_array_equal(ys[:, 2], 0.0)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("lengths", [None, (4, 2, 0)])
def test_gradients_match_plain_loop(data, lengths, layout):
  W, xp, h0, c0, G = data
  with jax.enable_x64(True):
    L = None if lengths is None else jnp.asarray(lengths, jnp.int32)
    args = tuple(map(jnp.asarray, (W, xp, h0, c0)))
    got = jax.grad(fused_loss, argnums=(0, 1, 2, 3))(*args, G, L, 0.5,
                                                      layout)
    ref = jax.grad(jax_loop_loss, argnums=(0, 1, 2, 3))(*args, G, L, 0.5)
    for g, r in zip(got, ref):
      np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradient_matches_finite_differences(data, layout):
  W, xp, h0, c0, G = data
  lengths = (4, 3, 1)

  def np_loss(W_, xp_):
    h, c, ys = numpy_lstm(W_, xp_, h0, c0, lengths, 0.5)
    return np.sum(ys * G) + np.sum(h) + 2.0 * np.sum(c)

  with jax.enable_x64(True):
    gW, gx = jax.grad(fused_loss, argnums=(0, 1))(
        jnp.asarray(W), jnp.asarray(xp), jnp.asarray(h0), jnp.asarray(c0), G,
        jnp.asarray(lengths, jnp.int32), 0.5, layout)
  r = np.random.default_rng(1)
  for _ in range(3):
    dW, dx = r.normal(size=W.shape), r.normal(size=xp.shape)
    eps = 1e-6
    fd = (np_loss(W + eps * dW, xp + eps * dx)
          - np_loss(W - eps * dW, xp - eps * dx)) / (2 * eps)
    np.testing.assert_allclose(np.sum(gW * dW) + np.sum(gx * dx), fd,
                               rtol=1e-7)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_vmap_over_replicas_and_jit(data, layout):
  W, xp, h0, c0, G = data
  R = 3
  with jax.enable_x64(True):
    r = np.random.default_rng(2)
    Ws = jnp.asarray(W[None] + 0.1 * r.normal(size=(R,) + W.shape))
    xps = jnp.asarray(xp[None] + 0.1 * r.normal(size=(R,) + xp.shape))
    L = jnp.asarray((3, 4, 1), jnp.int32)
    grad = jax.grad(fused_loss, argnums=(0, 1))

    @jax.jit
    def batched(Ws, xps):
      return jax.vmap(lambda w, x: grad(w, x, h0, c0, G, L, 0.0, layout))(
          Ws, xps)

    gW, gx = batched(Ws, xps)
    for k in range(R):
      rW, rx = jax.grad(jax_loop_loss, argnums=(0, 1))(
          Ws[k], xps[k], jnp.asarray(h0), jnp.asarray(c0), G, L, 0.0)
      np.testing.assert_allclose(gW[k], rW, rtol=1e-10, atol=1e-12)
      np.testing.assert_allclose(gx[k], rx, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_float32_in_float32_out(layout):
  W = jnp.zeros((H, 4 * H), jnp.float32)
  xp = jnp.ones((T, B, 4 * H), jnp.float32)
  z = jnp.zeros((B, H), jnp.float32)
  final, ys = lstm_scan(W, xp, LSTMCarry(z, z), layout=layout)
  assert ys.dtype == final.h.dtype == final.c.dtype == jnp.float32
  assert ys.shape == (T, B, H)


@pytest.mark.parametrize("bad, message", [
    (dict(xp=np.zeros((T, B, 4 * H + 1))), r"xp must be \[T, B, 4H\]"),
    (dict(xp=np.zeros((B, 4 * H))), "time-major"),
    (dict(h=np.zeros((B + 1, H))), "carry.h"),
    (dict(lengths=np.zeros((B + 1,), np.int32)), "lengths"),
    (dict(xp=np.zeros((0, B, 4 * H))), "no time steps"),
    (dict(layout="row_major"), "layout must be"),
])
def test_bad_inputs_are_named(bad, message):
  args = dict(xp=np.zeros((T, B, 4 * H)), h=np.zeros((B, H)),
              lengths=None, layout=None)
  args.update(bad)
  z = jnp.zeros((B, H))
  with pytest.raises(ValueError, match=message):
    lstm_scan(jnp.zeros((H, 4 * H)), jnp.asarray(args["xp"], jnp.float32),
              LSTMCarry(jnp.asarray(args["h"], jnp.float32), z),
              args["lengths"], layout=args["layout"])


@pytest.mark.parametrize("layout", ["batch_major", "gate_major"])
def test_layer_unrolled_equals_unroll_one(layout):
  """Values and every gradient with unroll 3 over T = 7 (two chunks and a
  step alone), with a mask, equal those of unroll 1."""
  Tn, Bn, Dn, Hn = 7, 3, 2, 4
  k = jax.random.split(jax.random.key(5), 6)
  args = (jax.random.normal(k[0], (Hn, 4 * Hn)) * 0.4,
          jax.random.normal(k[1], (Dn, 4 * Hn)) * 0.4,
          jax.random.normal(k[2], (4 * Hn,)) * 0.1,
          jax.random.normal(k[3], (Tn, Bn, Dn)))
  carry = LSTMCarry(jax.random.normal(k[4], (Bn, Hn)),
                    jax.random.normal(k[5], (Bn, Hn)))
  lengths = jnp.array([7, 4, 1])

  def loss(unroll, *a):
    (h, c), ys = lstm_layer(*a, carry, lengths, forget_bias=1.0,
                            unroll=unroll, layout=layout)
    return jnp.sum(ys * jnp.cos(ys)) + jnp.sum(h * c), ys

  (l1, y1), g1 = jax.value_and_grad(lambda *a: loss(1, *a), (0, 1, 2, 3),
                                    has_aux=True)(*args)
  (l3, y3), g3 = jax.value_and_grad(lambda *a: loss(3, *a), (0, 1, 2, 3),
                                    has_aux=True)(*args)
  np.testing.assert_allclose(y3, y1, rtol=1e-6, atol=1e-7)
  # a sum near 0: the loops' fusions (unrolled or not) round differently
  np.testing.assert_allclose(l3, l1, rtol=1e-6, atol=1e-6)
  for a, b in zip(g3, g1):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _while_body_copies(hlo: str, shape: str) -> list[str]:
  """The `copy` instructions of result `shape` (e.g. "f32[20,3,16]") inside
  the while-loop bodies of an optimized HLO module's text."""
  bodies = set(re.findall(r"body=(%[\w.-]+)", hlo))
  found, current = [], None
  for line in hlo.splitlines():
    head = re.match(r"(%[\w.-]+) \(", line)
    if head:
      current = head.group(1)
    elif line.startswith("}"):
      current = None
    elif current in bodies and f"= {shape}" in line and " copy(" in line:
      found.append(line.strip())
  return found


@pytest.mark.parametrize("unroll", [1, 4])
def test_unrolled_layer_loops_copy_no_buffer(unroll):
  """The [T, B, 4H] buffers stay in place in both loops at any unroll: an
  unrolled lax.scan let XLA copy the whole buffer on every iteration
  (2x slower at B=10 H=12)."""
  Tn, Bn, Hn = 20, 3, 4
  k = jax.random.split(jax.random.key(0), 4)
  W_h = jax.random.normal(k[0], (Hn, 4 * Hn)) * 0.3
  W_x = jax.random.normal(k[1], (Hn, 4 * Hn)) * 0.3
  b = jnp.zeros((4 * Hn,))
  xs = jax.random.normal(k[2], (Tn, Bn, Hn))
  z = jnp.zeros((Bn, Hn))

  def loss(W_h, W_x, xs):
    _, ys = lstm_layer(W_h, W_x, b, xs, LSTMCarry(z, z), unroll=unroll,
                       layout="batch_major")
    return jnp.sum(ys ** 2)

  hlo = jax.jit(jax.grad(loss, (0, 1, 2))).lower(W_h, W_x, xs).compile(
      ).as_text()
  assert "body=" in hlo
  assert _while_body_copies(hlo, f"f32[{Tn},{Bn},{4 * Hn}]") == []


def test_gate_major_layer_moves_no_gate_sized_array():
  """Gate-major keeps its [4H, T, B] buffers time-inside: x W_x and the
  weight sums see [., T*B] rows directly, so no transpose of a [T, B, 4H]
  (or [T, 4H, B]) array appears in the forward or the backward."""
  Tn, Bn, D, Hn = 5, 3, 2, 4
  k = jax.random.split(jax.random.key(0), 4)
  W_h = jax.random.normal(k[0], (Hn, 4 * Hn))
  W_x = jax.random.normal(k[1], (D, 4 * Hn))
  b = jnp.zeros(4 * Hn)
  xs = jax.random.normal(k[2], (Tn, Bn, D))
  z = jnp.zeros((Bn, Hn))

  def loss(W_h, W_x, b, xs):
    _, ys = lstm_layer(W_h, W_x, b, xs, LSTMCarry(z, z), layout="gate_major")
    return jnp.sum(ys)

  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 3)))(W_h, W_x, b,
                                                                xs)
  moved = [eqn.invars[0].aval.size for eqn in iter_eqns(jaxpr.jaxpr)
           if eqn.primitive.name == "transpose"]
  assert moved, "expected the small [T, B, D] / [T, H, B] transposes"
  assert max(moved) < Tn * Bn * 4 * Hn, moved


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name, hp", [
    ("lstm", dict(forget_bias=1.0)),
    ("mts_lstm", dict(timescales=("inverse_gamma", 1.5))),
])
def test_lstm_layer_of_lstm_args_is_a_scan_of_the_cells_step(name, hp,
                                                             layout):
  """Values, and gradients w.r.t. every parameter and the inputs (dW_x,
  db, dx formed inside lstm_layer's VJP), against the cell's own step."""
  from sorjax import cells
  from sorjax.fused_lstm import lstm_args, lstm_layer
  cell = cells.make(name, hidden_size=H, **hp)
  with jax.enable_x64(True):
    params = cell.init(jax.random.key(0), 3, jnp.float64)
    params = {k: v + 0.1 for k, v in params.items()}  # no zero bias
    xs = jax.random.normal(jax.random.key(1), (T, B, 3), jnp.float64)
    L = jnp.asarray((4, 3, 1), jnp.int32)
    carry0 = cell.initial_carry(params, (B,))

    def loop(params, xs):  # the cell's own step, one time step at a time
      carry, ys = carry0, []
      for t in range(T):
        new, y = cell.step(params, carry, cell.precompute(params, xs[t]))
        m = (t < L)[:, None]
        carry = LSTMCarry(jnp.where(m, new.h, carry.h),
                          jnp.where(m, new.c, carry.c))
        ys.append(jnp.where(m, y, 0.0))
      return jnp.sum(jnp.stack(ys) ** 2) + jnp.sum(carry.c)

    def fused(params, xs):
      a = lstm_args(cell, params)
      final, ys = lstm_layer(a.W_h, a.W_x, a.b, xs, carry0, L,
                             a.forget_bias, layout=layout, name=a.name)
      return jnp.sum(ys ** 2) + jnp.sum(final.c)

    np.testing.assert_allclose(fused(params, xs), loop(params, xs),
                               rtol=1e-12)
    got = jax.grad(fused, argnums=(0, 1))(params, xs)
    ref = jax.grad(loop, argnums=(0, 1))(params, xs)
    for k in ref[0]:
      np.testing.assert_allclose(got[0][k], ref[0][k], rtol=1e-9,
                                 atol=1e-12, err_msg=k)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match=f"{name}: .*input size 3.*axis 2"):
      a = lstm_args(cell, params)
      lstm_layer(a.W_h, a.W_x, a.b, xs[..., :2], carry0, name=a.name)


def test_lstm_args_refuses_other_cells():
  from sorjax import cells
  from sorjax.fused_lstm import lstm_args
  cell = cells.make("gru", hidden_size=H)
  assert lstm_args(cell, cell.init(jax.random.key(0), 3)) is None


def _spy_layer(monkeypatch):
  """Records (unroll, gate-major) of every call of fused_lstm's layer."""
  from sorjax import fused_lstm
  seen, layer = [], fused_lstm._layer

  def spy(fb, unroll, tr, *args):
    seen.append((unroll, tr))
    return layer(fb, unroll, tr, *args)

  monkeypatch.setattr(fused_lstm, "_layer", spy)
  return seen


@pytest.mark.parametrize("hidden, tr", [(4, False), (8, True)])
def test_default_layout_is_gate_major_from_the_threshold(monkeypatch, hidden,
                                                         tr):
  from sorjax import fused_lstm
  monkeypatch.setattr(fused_lstm, "GATE_MAJOR_FROM", 8)
  seen = _spy_layer(monkeypatch)
  z = jnp.zeros((B, hidden))
  lstm_scan(jnp.zeros((hidden, 4 * hidden)), jnp.ones((T, B, 4 * hidden)),
            LSTMCarry(z, z))
  assert [t for _, t in seen] == [tr]


@pytest.mark.parametrize("hidden, layout, unroll, want", [
    (4, None, None, 2), (8, None, None, 1), (4, "gate_major", None, 1),
    (4, None, 3, 3), (8, None, 1, 1)])
def test_unroll_none_is_two_for_small_batch_major_layers(
    monkeypatch, hidden, layout, unroll, want):
  """unroll=None: 2 for batch-major layers up to AUTO_UNROLL_MAX_H, 1
  otherwise; an explicit factor is used as given. The same through
  sorjax.unroll, whose other paths take None as 1."""
  import sorjax
  from sorjax import fused_lstm
  monkeypatch.setattr(fused_lstm, "AUTO_UNROLL_MAX_H", 4)
  seen = _spy_layer(monkeypatch)
  z = jnp.zeros((B, hidden))
  lstm_scan(jnp.zeros((hidden, 4 * hidden)), jnp.ones((T, B, 4 * hidden)),
            LSTMCarry(z, z), unroll=unroll, layout=layout)
  if layout is None:
    cell = cells.make("lstm", hidden_size=hidden)
    sorjax.unroll(cell, cell.init(jax.random.key(0), 3), jnp.ones((B, T, 3)),
                  unroll=unroll)
  assert [u for u, _ in seen] == [want] * (2 if layout is None else 1)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_unroll_must_be_none_or_a_positive_int(bad):
  import sorjax
  z = jnp.zeros((B, 4))
  with pytest.raises(ValueError, match="unroll must be None or an int >= 1, "
                     "got"):
    lstm_scan(jnp.zeros((4, 16)), jnp.ones((T, B, 16)), LSTMCarry(z, z),
              unroll=bad)
  cell = cells.make("gru", hidden_size=4)
  with pytest.raises(ValueError, match="unroll: unroll must be None or an "
                     "int >= 1"):
    sorjax.unroll(cell, cell.init(jax.random.key(0), 3), jnp.ones((B, T, 3)),
                  unroll=bad)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bfloat16_weight_gradients_are_summed_in_float32(layout):
  """dW_h, dW_x, db sum T*B rows: in bfloat16 they stay within bfloat16
  rounding of the float32 gradients (per-row bfloat16 accumulation over
  T*B = 768 rows would not)."""
  from sorjax.fused_lstm import lstm_layer
  T_, B_, D_, H_ = 64, 12, 8, 8
  r = np.random.default_rng(3)
  W_h, W_x = r.normal(size=(H_, 4 * H_)) / 3, r.normal(size=(D_, 4 * H_)) / 3
  b, xs = r.normal(size=(4 * H_,)) / 3, r.normal(size=(T_, B_, D_))

  def grads(dtype):
    z = jnp.zeros((B_, H_), dtype)

    def loss(W_h, W_x, b):
      _, ys = lstm_layer(W_h, W_x, b, jnp.asarray(xs, dtype),
                         LSTMCarry(z, z), layout=layout)
      return jnp.sum(ys.astype(jnp.float32))
    args = [jnp.asarray(a, dtype) for a in (W_h, W_x, b)]
    return jax.grad(loss, argnums=(0, 1, 2))(*args)

  for g16, g32 in zip(grads(jnp.bfloat16), grads(jnp.float32)):
    assert g16.dtype == jnp.bfloat16
    scale = float(jnp.max(jnp.abs(g32)))
    np.testing.assert_allclose(np.asarray(g16, np.float32), g32,
                               atol=0.05 * scale)


@pytest.mark.parametrize("Bn,Hn", [(2, 256), (10, 12), (32, 64)])
def test_float32_tanh_choice_against_numpy(Bn, Hn):
  """In float32 the maps use the rational tanh at (2, 256) and (10, 12)
  and jnp.tanh at (32, 64) (`tanh_for`); either way values and gradients
  match the float64 NumPy loop and the float64 plain JAX loop."""
  Tn = 3
  r = np.random.default_rng(7)
  W = r.normal(size=(Hn, 4 * Hn)) / np.sqrt(Hn)
  xp = r.normal(size=(Tn, Bn, 4 * Hn))
  h0, c0 = r.normal(size=(Bn, Hn)), r.normal(size=(Bn, Hn))
  G = r.normal(size=(Tn, Bn, Hn))
  f32 = lambda *a: [jnp.asarray(v, jnp.float32) for v in a]  # noqa: E731
  (h, c), ys = lstm_scan(*f32(W, xp), LSTMCarry(*f32(h0, c0)),
                         forget_bias=1.0)
  h_, c_, ys_ = numpy_lstm(W, xp, h0, c0, forget_bias=1.0)
  for a, b in ((h, h_), (c, c_), (ys, ys_)):
    np.testing.assert_allclose(a, b, atol=3e-6)
  g = jax.grad(fused_loss, (0, 1, 2, 3))(*f32(W, xp, h0, c0, G), None, 1.0)
  with jax.enable_x64(True):
    g_ = jax.grad(jax_loop_loss, (0, 1, 2, 3))(W, xp, h0, c0, G, None, 1.0)
  for a, b in zip(g, g_):
    np.testing.assert_allclose(a, b, atol=2e-5 * max(1.0, np.abs(b).max()))
