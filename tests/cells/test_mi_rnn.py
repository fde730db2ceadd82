"""mi_rnn (Wu et al. 2016; Maupome & Meurs eq. 7-8) against column-form
NumPy loops of both forms and a reference that materialises W_hh(x)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from tests.cells.reference import assert_no_bhh, np_params

PHI = {"tanh": np.tanh, "identity": lambda z: z}


def make(general=True, activation="tanh", H=4, D=3, seed=0, perturb=True):
  cell = sorjax.cells.make("mi_rnn", hidden_size=H, general=general,
                           activation=activation)
  params = cell.init(jax.random.key(seed), D)
  if perturb and general:  # move alpha, beta off their init so a swap shows
    keys = jax.random.split(jax.random.key(seed + 100), 3)
    for k, name in zip(keys, ("alpha", "beta1", "beta2")):
      params[name] = params[name] + 0.3 * jax.random.normal(k, (H,))
  return cell, params


def numpy_loop(params, xs, general, act):
  """Eq. 7 / eq. 8 with the paper's column-form U [H, D], W [H, H]."""
  p = np_params(params)
  U, W, b = p["U"].T, p["W"].T, p["b"]
  Bn, Tn, _ = xs.shape
  ys = np.zeros((Bn, Tn, b.shape[0]))
  for n in range(Bn):
    h = np.zeros_like(b)  # eq. 1
    for t in range(Tn):
      Ux, Wh = U @ xs[n, t], W @ h
      if general:  # eq. 8
        pre = (p["alpha"] * Ux * Wh + p["beta1"] * Ux + p["beta2"] * Wh + b)
      else:  # eq. 7
        pre = Ux * Wh + b
      h = PHI[act](pre)
      ys[n, t] = h
  return ys


@pytest.mark.parametrize("activation", ["tanh", "identity"])
@pytest.mark.parametrize("general", [True, False])
def test_matches_eq7_eq8_loop(general, activation):
  cell, params = make(general, activation)
  xs = jax.random.normal(jax.random.key(1), (2, 6, 3))
  carry, ys = sorjax.unroll(cell, params, xs)
  ref = numpy_loop(params, np.asarray(xs, np.float64), general, activation)
  assert np.abs(ref).max() > 0.1
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(carry.h, ref[:, -1], rtol=1e-5, atol=1e-5)


def naive_jax(params, xs, general, act):
  """Forms W_hh(x_t) = diag(alpha * U x_t + beta2) W in row form, [B, H, H]."""
  phi = sorjax.cells.base.activation(act)
  U, W, b = params["U"], params["W"], params["b"]
  h = jnp.zeros((xs.shape[0], W.shape[0]), xs.dtype)
  ys = []
  for t in range(xs.shape[1]):
    Ux = xs[:, t] @ U
    if general:
      s = params["alpha"][None] * Ux + params["beta2"][None]
      c = params["beta1"][None] * Ux + b[None]
    else:
      s, c = Ux, jnp.broadcast_to(b, Ux.shape)
    W_hh = W[None] * s[:, None, :]  # column j of W scaled by s_j
    h = phi(jnp.einsum("bi,bij->bj", h, W_hh) + c)
    ys.append(h)
  return jnp.stack(ys, 1)


@pytest.mark.parametrize("general", [True, False])
def test_gradients_equal_materialising_reference(general):
  cell, params = make(general)
  xs = jax.random.normal(jax.random.key(1), (3, 5, 3))
  w = jax.random.normal(jax.random.key(2), (3, 5, 4))
  loss_cell = lambda p, x: jnp.sum(sorjax.unroll(cell, p, x)[1] * w)
  loss_ref = lambda p, x: jnp.sum(naive_jax(p, x, general, "tanh") * w)
  v1, g1 = jax.jit(jax.value_and_grad(loss_cell, argnums=(0, 1)))(params, xs)
  v2, g2 = jax.jit(jax.value_and_grad(loss_ref, argnums=(0, 1)))(params, xs)
  np.testing.assert_allclose(v1, v2, rtol=1e-5, atol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=1e-5, atol=1e-5), g1, g2)


@pytest.mark.parametrize("general", [True, False])
def test_no_per_example_transition_matrix(general):
  B, H, D, T = 3, 7, 2, 4
  cell = sorjax.cells.make("mi_rnn", hidden_size=H, general=general)
  params = cell.init(jax.random.key(0), D)
  xs = jnp.ones((B, T, D))

  def loss(p, x):
    _, ys = sorjax.unroll(cell, p, x, lengths=jnp.array([4, 2, 3]))
    return jnp.sum(ys ** 2)
  assert_no_bhh(jax.value_and_grad(loss, argnums=(0, 1)), (params, xs), B, H)
  naive = lambda p, x: jnp.sum(naive_jax(p, x, general, "tanh") ** 2)
  with pytest.raises(AssertionError, match="per-example"):
    assert_no_bhh(jax.value_and_grad(naive), (params, xs), B, H)


def test_simple_form_is_general_with_alpha_one_betas_zero():
  simple, ps = make(general=False)
  general = sorjax.cells.make("mi_rnn", hidden_size=4)
  pg = dict(ps, alpha=jnp.ones(4), beta1=jnp.zeros(4), beta2=jnp.zeros(4))
  xs = jax.random.normal(jax.random.key(1), (2, 6, 3))
  _, ys = sorjax.unroll(simple, ps, xs)
  _, yg = sorjax.unroll(general, pg, xs)
  np.testing.assert_allclose(yg, ys, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("activation", ["tanh", "identity"])
def test_general_form_is_general2_under_eq10_to_12(activation):
  """A = diag(alpha), D = diag(beta1) U, E = diag(beta2) W (eq. 10-12), with
  B = U, C = W, f = b and |m| = |h|; transposed for the row convention."""
  cell, p = make(activation=activation)
  g2 = sorjax.cells.make("general2", hidden_size=4, intermediate_size=4,
                         activation=activation)
  pg = {"A": jnp.diag(p["alpha"]), "B": p["U"], "C": p["W"],
        "D": p["U"] * p["beta1"][None], "E": p["W"] * p["beta2"][None],
        "f": p["b"]}
  xs = jax.random.normal(jax.random.key(1), (2, 6, 3))
  _, ym = sorjax.unroll(cell, p, xs)
  _, yg = sorjax.unroll(g2, pg, xs)
  np.testing.assert_allclose(ym, yg, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("general", [True, False])
def test_param_names_shapes_and_init(general):
  _, params = make(general, H=4, D=3, perturb=False)
  expected = {"U": (3, 4), "W": (4, 4), "b": (4,)}
  if general:
    expected.update(alpha=(4,), beta1=(4,), beta2=(4,))
  assert {k: v.shape for k, v in params.items()} == expected
  if general:
    np.testing.assert_array_equal(params["alpha"], 1.0)
    np.testing.assert_array_equal(params["beta1"], 0.5)
    np.testing.assert_array_equal(params["beta2"], 0.5)
  # Eq. 7 with h_0 = 0 would stay at h = 0 for b = 0, leaving U, W no gradient.
  assert np.abs(params["b"]).min() > 0


def test_simple_form_learns_from_init():
  cell, params = make(general=False, perturb=False)
  xs = jax.random.normal(jax.random.key(1), (2, 4, 3))
  g = jax.grad(lambda p: jnp.sum(sorjax.unroll(cell, p, xs)[1] ** 2))(params)
  assert np.abs(g["U"]).max() > 1e-4 and np.abs(g["W"]).max() > 1e-4


@pytest.mark.parametrize("kwargs,match", [
    (dict(hidden_size=0), "mi_rnn: hidden_size"),
    (dict(hidden_size=3, general="yes"), "mi_rnn: general"),
    (dict(hidden_size=3, activation="sigmoid"), "mi_rnn: activation"),
])
def test_bad_hyperparameters_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    sorjax.cells.make("mi_rnn", **kwargs)


def test_wrong_input_size_is_reported():
  cell, params = make(D=3)
  with pytest.raises(ValueError, match="mi_rnn.*input size 3.*got last axis 5"):
    sorjax.unroll(cell, params, jnp.zeros((2, 5, 5)))
  with pytest.raises(ValueError, match="mi_rnn: input_size"):
    cell.init(jax.random.key(0), -2)
