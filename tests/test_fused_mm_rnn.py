"""sorjax.fused_mm_rnn against a NumPy loop of Renganathan & Singh eq. 6-8
(values, final carry, masking by lengths) and against JAX's autodiff of the
plain scan (every gradient, with lengths, reverse, unroll, a given carry,
bfloat16 and vmap); unroll's routing to it; its memory against the generic
fused path; and its argument checks."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax.cells.mm_rnn import MMRNNCarry, MMRNNInputs
from sorjax.fused_mm_rnn import mm_rnn_args, mm_rnn_layer
from tests.cells.reference import normal, np_params, random_params
from tests.cells.test_mm_rnn import numpy_mm_rnn

fm = importlib.import_module("sorjax.fused_mm_rnn")

B, T, D, H, K = 3, 6, 2, 5, 4


def make(H_=H, K_=K, seed=0):
  cell = sorjax.cells.make("mm_rnn", hidden_size=H_, num_matrices=K_)
  return cell, random_params(cell, D, seed)


def layer(cell, params, xs, carry=None, lengths=None, unroll=None):
  """The primitive on a batch-major precompute, as `sorjax.unroll` calls it."""
  B_, T_, _ = xs.shape
  xp = jax.tree_util.tree_map(lambda a: a.reshape(B_, T_, *a.shape[1:]),
                              cell.precompute(params, xs.reshape(B_ * T_, -1)))
  if carry is None:
    carry = cell.initial_carry(params, (B_,))
  return mm_rnn_layer(*mm_rnn_args(cell, params), xp, carry, lengths, unroll)


@pytest.mark.parametrize("unroll", [None, 4])
def test_matches_numpy_loop_per_example_length(unroll):
  """Example b runs lengths[b] steps of eq. 6-8 (the NumPy loop on its
  prefix): its outputs there, zeros after, and the carry of its last step."""
  cell, params = make()
  xs = normal(1, (B, T, D))
  lengths = np.array([6, 2, 0])
  carry, ys = jax.jit(lambda p, x: layer(cell, p, x, lengths=lengths,
                                         unroll=unroll))(params, xs)
  p = np_params(params)
  x64 = np.asarray(xs, np.float64)
  for b, L in enumerate(lengths):
    if L == 0:
      np.testing.assert_array_equal(ys[b], 0)
      np.testing.assert_allclose(carry.h[b], 0, atol=0)
      np.testing.assert_allclose(carry.v[b], 1 / K, rtol=1e-6)
      continue
    h, v, ref, _ = numpy_mm_rnn(p, x64[b:b + 1, :L])
    np.testing.assert_allclose(ys[b, :L], ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ys[b, L:], 0)
    np.testing.assert_allclose(carry.h[b], h[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(carry.v[b], v[0], rtol=1e-5, atol=1e-6)


def loss(cell, G, wh, wv, fused_grad, **kw):
  def f(params, xs, carry):
    c, ys = sorjax.unroll(cell, params, xs, carry, fused_grad=fused_grad, **kw)
    return jnp.sum(ys * G) + jnp.sum(c.h * wh) + jnp.sum(c.v * wv)
  return f


@pytest.mark.parametrize("lengths", [None, (6, 3, 0)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("unroll", [None, 4])
def test_every_gradient_matches_autodiff_of_the_scan(lengths, reverse, unroll):
  """Gradients to every parameter, the inputs and the initial carry equal
  JAX's VJP of the plain scan (fused_grad=False); values too."""
  cell, params = make()
  xs = normal(2, (B, T, D))
  carry = MMRNNCarry(normal(3, (B, H)), jax.nn.softmax(normal(4, (B, K)), -1))
  G, wh, wv = normal(5, (B, T, H)), normal(6, (B, H)), normal(7, (B, K))
  kw = dict(lengths=None if lengths is None else jnp.array(lengths),
            reverse=reverse, unroll=unroll)
  f_new, f_ref = (loss(cell, G, wh, wv, fg, **kw) for fg in (True, False))
  np.testing.assert_allclose(f_new(params, xs, carry),
                             f_ref(params, xs, carry), rtol=1e-5)
  g_new = jax.jit(jax.grad(f_new, (0, 1, 2)))(params, xs, carry)
  g_ref = jax.grad(f_ref, (0, 1, 2))(params, xs, carry)
  for path, a in jax.tree_util.tree_leaves_with_path(g_new):
    b = dict(jax.tree_util.tree_leaves_with_path(g_ref))[path]
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6,
                               err_msg=jax.tree_util.keystr(path))


def test_bfloat16_gradients_close_to_float32():
  """bfloat16 params and inputs: the weight sums accumulate in float32, so
  the gradient stays within bfloat16 rounding of the float32 one."""
  cell, params = make(H_=16)
  xs, G = normal(2, (B, T, D)), normal(5, (B, T, 16))
  grads = {}
  for dt in (jnp.float32, jnp.bfloat16):
    p = jax.tree_util.tree_map(lambda a: a.astype(dt), params)
    f = lambda p: jnp.sum(  # noqa: E731
        sorjax.unroll(cell, p, xs.astype(dt), fused_grad=True)[1]
        .astype(jnp.float32) * G)
    grads[dt] = jax.grad(f)(p)
    assert grads[dt]["W"].dtype == dt
  for k in params:
    a = np.asarray(grads[jnp.bfloat16][k], np.float32)
    b = np.asarray(grads[jnp.float32][k])
    assert np.abs(a - b).max() <= 0.05 * np.abs(b).max() + 1e-3, k


def test_vmap_over_replicas_equals_each_replica():
  cell, _ = make()
  keys = jax.random.split(jax.random.key(9), 2)
  ps = jax.vmap(lambda k: cell.init(k, D))(keys)
  xs, G = normal(2, (B, T, D)), normal(5, (B, T, H))
  f = lambda p: jnp.sum(sorjax.unroll(cell, p, xs, fused_grad=True)[1] * G)  # noqa: E731
  g = jax.vmap(jax.grad(f))(ps)
  for r in range(2):
    one = jax.grad(f)(jax.tree_util.tree_map(lambda a: a[r], ps))
    for k in one:
      np.testing.assert_allclose(g[k][r], one[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("H_,opts,expected", [
    (128, {}, True), (16, dict(fused_grad=True), True),
    (16, {}, False), (128, dict(fused_grad=False), False),
    (128, dict(hoist=False), False), (128, dict(remat=True), False),
    (128, dict(remat="dots"), False)])
def test_unroll_routes_mm_rnn_through_the_layer(H_, opts, expected,
                                                monkeypatch):
  """The fused path (fused_grad=True, or None from H = 128) of a hoisted
  mm_rnn without remat is `mm_rnn_layer`; its result is what unroll
  returns."""
  calls = []
  real = fm.mm_rnn_layer
  monkeypatch.setattr(fm, "mm_rnn_layer",
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  cell, params = make(H_=H_)
  xs = normal(2, (B, T, D))
  _, ys = sorjax.unroll(cell, params, xs, **opts)
  assert bool(calls) == expected
  _, ref = sorjax.unroll(cell, params, xs, fused_grad=False)
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-6)


def test_needs_less_memory_than_the_generic_fused_scan(monkeypatch):
  """No saved z_t stack ([T, B, K*H + K]) and no time-major copies: the
  compiled training step's temporaries are smaller than those of the
  generic fused scan (XLA's own figures, deterministic)."""
  cell, params = make(H_=64)
  xs, G = normal(2, (8, 40, D)), normal(5, (8, 40, 64))

  def temp_bytes():
    def step(p, x):
      _, pull = jax.vjp(lambda p, x: sorjax.unroll(cell, p, x,
                                                   fused_grad=True)[1], p, x)
      return pull(G)
    return jax.jit(step).lower(params, xs).compile().memory_analysis(
        ).temp_size_in_bytes

  ours = temp_bytes()
  monkeypatch.setattr(fm, "mm_rnn_args", lambda cell, params: None)
  generic = temp_bytes()
  # 0.77x here; 0.81-0.84x at the benchmark shapes (BUILD_NOTES).
  assert ours <= 0.9 * generic, (ours, generic)


def test_argument_checks_name_the_argument():
  cell, params = make()
  W, P_h, P_v = mm_rnn_args(cell, params)
  xs = normal(2, (B, T, D))
  xp = jax.tree_util.tree_map(lambda a: a.reshape(B, T, *a.shape[1:]),
                              cell.precompute(params, xs.reshape(B * T, D)))
  c = cell.initial_carry(params, (B,))
  with pytest.raises(ValueError, match=r"W must be \[K, H, H\], got \(4, 5, 6\)"):
    mm_rnn_layer(jnp.zeros((K, H, H + 1)), P_h, P_v, xp, c)
  with pytest.raises(ValueError, match=r"P_h must be \[H, K\] = \[5, 4\]"):
    mm_rnn_layer(W, P_h.T, P_v, xp, c)
  with pytest.raises(ValueError, match=r"xp.hx must be \[B, T, H\] with H = 5"):
    mm_rnn_layer(W, P_h, P_v, MMRNNInputs(xp.hx[..., :4], xp.vx), c)
  with pytest.raises(ValueError, match=r"xp.vx must be \[B, T, K\] = \[3, 6, 4\]"):
    mm_rnn_layer(W, P_h, P_v, MMRNNInputs(xp.hx, xp.vx[:, :5]), c)
  with pytest.raises(ValueError, match=r"carry must be \(h \[B, H\], v \[B, K\]\)"):
    mm_rnn_layer(W, P_h, P_v, xp, MMRNNCarry(c.h[:2], c.v))
  with pytest.raises(ValueError, match=r"lengths must have shape \[B\] = \[3\]"):
    mm_rnn_layer(W, P_h, P_v, xp, c, lengths=jnp.array([1, 2]))
  with pytest.raises(ValueError, match="no time steps"):
    mm_rnn_layer(W, P_h, P_v, MMRNNInputs(xp.hx[:, :0], xp.vx[:, :0]), c)
  with pytest.raises(ValueError, match="unroll must be None or a positive int"):
    mm_rnn_layer(W, P_h, P_v, xp, c, unroll=0)
  assert mm_rnn_args(sorjax.cells.make("rnn", hidden_size=H),
                     {"W_hh": None}) is None
