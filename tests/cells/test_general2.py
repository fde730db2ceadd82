"""general2 (Maupome & Meurs eq. 9) and mrnn (eq. 6) against references
written in the paper's column form, materialising W_hh(x) (eq. 13)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax.cells import general2
from tests.cells.reference import assert_no_bhh, np_params

PHI = {"tanh": np.tanh, "identity": lambda z: z}
FLAGS = list(itertools.product([True, False], repeat=2))  # (use_D, use_E)


def make(use_D=True, use_E=True, activation="tanh", H=4, M=3, D=2, seed=0):
  cell = sorjax.cells.make("general2", hidden_size=H, intermediate_size=M,
                           use_D=use_D, use_E=use_E, activation=activation)
  return cell, cell.init(jax.random.key(seed), D)


def paper_matrices(p):
  """Our row-convention params as the paper's column-form A..E, f."""
  return {k: (v.T if v.ndim == 2 else v) for k, v in np_params(p).items()}


def numpy_eq13(p, xs, act):
  """Eq. 9 via its per-token transition W_hh(x) = E + A diag(B x) C (eq.
  13): h_t = phi(W_hh(x_t) h_{t-1} + D x_t + f), one column vector at a time."""
  P = paper_matrices(p)
  Bn, Tn, _ = xs.shape
  H = P["f"].shape[0]
  ys = np.zeros((Bn, Tn, H))
  for b in range(Bn):
    h = np.zeros(H)  # eq. 1
    for t in range(Tn):
      x = xs[b, t]
      W_hh = P["A"] @ np.diag(P["B"] @ x) @ P["C"]
      if "E" in P:
        W_hh = W_hh + P["E"]
      pre = W_hh @ h + P["f"]
      if "D" in P:
        pre = pre + P["D"] @ x
      h = PHI[act](pre)
      ys[b, t] = h
  return ys


@pytest.mark.parametrize("activation", ["tanh", "identity"])
@pytest.mark.parametrize("use_D,use_E", FLAGS)
def test_matches_materialised_eq13_loop(use_D, use_E, activation):
  cell, params = make(use_D, use_E, activation)
  xs = jax.random.normal(jax.random.key(1), (2, 6, 2))
  carry, ys = sorjax.unroll(cell, params, xs)
  ref = numpy_eq13(params, np.asarray(xs, np.float64), activation)
  assert np.abs(ref).max() > 0.1  # the state moves
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(carry.h, ref[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["tanh", "identity"])
def test_mrnn_matches_eq6_loop(activation):
  """h_t = phi(Z(V x_t * W h_{t-1}) + U x_t + b) with Z, V, W, U, b = A, B,
  C, D, f in column form."""
  cell = sorjax.cells.make("mrnn", hidden_size=4, intermediate_size=6,
                           activation=activation)
  params = cell.init(jax.random.key(0), 3)
  assert set(params) == {"A", "B", "C", "D", "f"}
  xs = jax.random.normal(jax.random.key(1), (2, 5, 3))
  _, ys = sorjax.unroll(cell, params, xs)
  P = paper_matrices(params)
  Z, V, W, U, b = P["A"], P["B"], P["C"], P["D"], P["f"]
  x64 = np.asarray(xs, np.float64)
  ref = np.zeros((2, 5, 4))
  for i in range(2):
    h = np.zeros(4)
    for t in range(5):
      x = x64[i, t]
      h = PHI[activation](Z @ ((V @ x) * (W @ h)) + U @ x + b)
      ref[i, t] = h
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-5)


def naive_jax(params, xs, act):
  """A materialising JAX reference: builds W_hh(x_t) [B, H, H] every step."""
  phi = sorjax.cells.base.activation(act)
  A, B, C, f = params["A"], params["B"], params["C"], params["f"]
  h = jnp.zeros((xs.shape[0], A.shape[1]), xs.dtype)
  ys = []
  for t in range(xs.shape[1]):
    x = xs[:, t]
    W_hh = jnp.einsum("im,bm,mj->bij", C, x @ B, A)  # row form of A diag(Bx) C
    if "E" in params:
      W_hh = W_hh + params["E"][None]
    pre = jnp.einsum("bi,bij->bj", h, W_hh) + f[None]
    if "D" in params:
      pre = pre + x @ params["D"]
    h = phi(pre)
    ys.append(h)
  return jnp.stack(ys, 1)


@pytest.mark.parametrize("use_D,use_E", FLAGS)
def test_gradients_equal_materialising_reference(use_D, use_E):
  cell, params = make(use_D, use_E, H=4, M=3, D=2)
  xs = jax.random.normal(jax.random.key(1), (3, 5, 2))
  w = jax.random.normal(jax.random.key(2), (3, 5, 4))
  loss_cell = lambda p, x: jnp.sum(sorjax.unroll(cell, p, x)[1] * w)
  loss_ref = lambda p, x: jnp.sum(naive_jax(p, x, "tanh") * w)
  v1, g1 = jax.jit(jax.value_and_grad(loss_cell, argnums=(0, 1)))(params, xs)
  v2, g2 = jax.jit(jax.value_and_grad(loss_ref, argnums=(0, 1)))(params, xs)
  np.testing.assert_allclose(v1, v2, rtol=1e-5, atol=1e-5)
  assert jax.tree_util.tree_structure(g1) == jax.tree_util.tree_structure(g2)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=1e-5, atol=1e-5), g1, g2)


B_, H_, D_, M_, T_ = 3, 7, 2, 5, 4


def bhh_loss_and_args(name, **kw):
  cell = sorjax.cells.make(name, hidden_size=H_, intermediate_size=M_, **kw)
  params = cell.init(jax.random.key(0), D_)
  xs = jnp.ones((B_, T_, D_))
  return cell, params, xs


@pytest.mark.parametrize("name,kw", [("general2", dict(use_D=d, use_E=e))
                                     for d, e in FLAGS] + [("mrnn", {})])
@pytest.mark.parametrize("remat", [False, True])
def test_no_per_example_transition_matrix(name, kw, remat):
  cell, params, xs = bhh_loss_and_args(name, **kw)

  def loss(p, x):
    _, ys = sorjax.unroll(cell, p, x, lengths=jnp.array([4, 2, 3]),
                          remat=remat)
    return jnp.sum(ys ** 2)
  assert_no_bhh(jax.value_and_grad(loss, argnums=(0, 1)), (params, xs), B_, H_)


def test_no_bhh_check_catches_the_materialising_reference():
  _, params, xs = bhh_loss_and_args("general2")
  loss = lambda p, x: jnp.sum(naive_jax(p, x, "tanh") ** 2)
  with pytest.raises(AssertionError, match="per-example"):
    assert_no_bhh(jax.value_and_grad(loss), (params, xs), B_, H_)


@pytest.mark.parametrize("activation", ["tanh", "identity"])
def test_step_jacobian_is_eq13(activation):
  """dh_t/dh_{t-1} = diag(phi'_t)(E + A diag(B x_t) C) (eq. 13)."""
  cell, params = make(activation=activation, H=4, M=3, D=2)
  x = jnp.array([0.3, -1.2])
  h = jnp.array([0.1, -0.4, 0.7, 0.2])
  xp = cell.precompute(params, x)
  J = jax.jacobian(lambda h: cell.step(params, sorjax.cells.base.HCarry(h),
                                       xp)[1])(h)
  P = paper_matrices(params)
  x64, h64 = np.asarray(x, np.float64), np.asarray(h, np.float64)
  W_hh = P["E"] + P["A"] @ np.diag(P["B"] @ x64) @ P["C"]
  pre = W_hh @ h64 + P["D"] @ x64 + P["f"]
  dphi = 1 - np.tanh(pre) ** 2 if activation == "tanh" else np.ones(4)
  np.testing.assert_allclose(J, np.diag(dphi) @ W_hh, rtol=1e-5, atol=1e-6)


def test_general2_without_E_is_mrnn():
  """'The mRNN can be seen as the special case where E is null.'"""
  g = sorjax.cells.make("general2", hidden_size=5, intermediate_size=3,
                        use_E=False)
  m = sorjax.cells.make("mrnn", hidden_size=5, intermediate_size=3)
  assert isinstance(m, general2.General2)
  pg, pm = g.init(jax.random.key(3), 2), m.init(jax.random.key(3), 2)
  assert set(pg) == set(pm)
  for k in pg:
    np.testing.assert_array_equal(pg[k], pm[k])
  # ... and with E present but zero, the full eq. 9 gives the same outputs.
  full = sorjax.cells.make("general2", hidden_size=5, intermediate_size=3)
  pf = dict(pm, E=jnp.zeros((5, 5)))
  xs = jax.random.normal(jax.random.key(4), (2, 6, 2))
  _, ym = sorjax.unroll(m, pm, xs)
  _, yg = sorjax.unroll(g, pm, xs)
  _, yf = sorjax.unroll(full, pf, xs)
  np.testing.assert_array_equal(ym, yg)
  np.testing.assert_allclose(yf, ym, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("use_D,use_E", FLAGS)
def test_param_names_and_shapes(use_D, use_E):
  _, params = make(use_D, use_E, H=4, M=3, D=2)
  expected = {"A": (3, 4), "B": (2, 3), "C": (4, 3), "f": (4,)}
  if use_D:
    expected["D"] = (2, 4)
  if use_E:
    expected["E"] = (4, 4)
  assert {k: v.shape for k, v in params.items()} == expected


def test_pure_second_order_cell_is_not_stuck_at_zero():
  """With h_0 = 0 and no D x term, a zero f would keep h = 0 forever and
  give A, B, C no gradient; the init draws f away from zero."""
  cell, params = make(use_D=False, use_E=False)
  assert np.abs(params["f"]).min() > 0
  xs = jax.random.normal(jax.random.key(1), (2, 4, 2))
  grads = jax.grad(lambda p: jnp.sum(sorjax.unroll(cell, p, xs)[1] ** 2))(
      params)
  for k in "ABC":
    assert np.abs(grads[k]).max() > 1e-4, k


@pytest.mark.parametrize("kwargs,match", [
    (dict(hidden_size=0, intermediate_size=3), "general2: hidden_size"),
    (dict(hidden_size=3, intermediate_size=2.0),
     "general2: intermediate_size"),
    (dict(hidden_size=3, intermediate_size=2, use_D=1), "general2: use_D"),
    (dict(hidden_size=3, intermediate_size=2, use_E="no"), "general2: use_E"),
    (dict(hidden_size=3, intermediate_size=2, activation="relu"),
     "general2: activation"),
])
def test_bad_hyperparameters_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    sorjax.cells.make("general2", **kwargs)


def test_mrnn_hyperparameters():
  with pytest.raises(ValueError, match="mrnn: intermediate_size"):
    sorjax.cells.make("mrnn", hidden_size=3, intermediate_size=0)
  with pytest.raises(TypeError, match="cell 'mrnn'.*use_E"):
    sorjax.cells.make("mrnn", hidden_size=3, intermediate_size=2, use_E=True)
  m = sorjax.cells.make("mrnn", hidden_size=3, intermediate_size=2)
  assert (m.use_D, m.use_E) == (True, False)
  assert hash(m) == hash(sorjax.cells.make("mrnn", hidden_size=3,
                                           intermediate_size=2))


def test_wrong_input_size_is_reported():
  cell, params = make(D=2)
  with pytest.raises(ValueError,
                     match="general2.*input size 2.*got last axis 3"):
    sorjax.unroll(cell, params, jnp.zeros((2, 5, 3)))
  with pytest.raises(ValueError, match="general2: input_size"):
    cell.init(jax.random.key(0), 0)
