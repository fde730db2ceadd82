"""tensor_rnn (Goudreau et al. 1994; Maupome & Meurs eq. 5) against the
triple sum of eq. 5 and a reference that forms W_hh(x) = x . A."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from tests.cells.reference import assert_no_bhh, np_params

PHI = {"tanh": np.tanh, "identity": lambda z: z}


def make(activation="tanh", H=4, D=3, seed=0):
  cell = sorjax.cells.make("tensor_rnn", hidden_size=H, activation=activation)
  return cell, cell.init(jax.random.key(seed), D)


@pytest.mark.parametrize("activation", ["tanh", "identity"])
def test_matches_eq5_triple_sum(activation):
  cell, params = make(activation)
  xs = jax.random.normal(jax.random.key(1), (2, 5, 3))
  carry, ys = sorjax.unroll(cell, params, xs)
  p = np_params(params)
  A, b = p["A"], p["b"]
  x64 = np.asarray(xs, np.float64)
  Dn, H = A.shape[0], A.shape[2]
  ref = np.zeros((2, 5, H))
  for n in range(2):
    h = np.zeros(H)  # eq. 1
    for t in range(5):
      new = np.zeros(H)
      for j in range(H):  # phi(h^T A^(j) x + b^(j)), A^(j)[i,d] = A[d,i,j]
        s = sum(h[i] * A[d, i, j] * x64[n, t, d]
                for i in range(H) for d in range(Dn))
        new[j] = PHI[activation](s + b[j])
      h = new
      ref[n, t] = h
  assert np.abs(ref).max() > 0.1
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(carry.h, ref[:, -1], rtol=1e-5, atol=1e-5)


def naive_jax(params, xs, act):
  """Forms W_hh(x_t) = sum_d x_t[d] A[d] ([B, H, H]) every step."""
  phi = sorjax.cells.base.activation(act)
  A, b = params["A"], params["b"]
  h = jnp.zeros((xs.shape[0], A.shape[2]), xs.dtype)
  ys = []
  for t in range(xs.shape[1]):
    W_hh = jnp.einsum("bd,dij->bij", xs[:, t], A)
    h = phi(jnp.einsum("bi,bij->bj", h, W_hh) + b[None])
    ys.append(h)
  return jnp.stack(ys, 1)


@pytest.mark.parametrize("activation", ["tanh", "identity"])
def test_gradients_equal_materialising_reference(activation):
  cell, params = make(activation)
  xs = jax.random.normal(jax.random.key(1), (3, 5, 3))
  w = jax.random.normal(jax.random.key(2), (3, 5, 4))
  loss_cell = lambda p, x: jnp.sum(sorjax.unroll(cell, p, x)[1] * w)
  loss_ref = lambda p, x: jnp.sum(naive_jax(p, x, activation) * w)
  v1, g1 = jax.jit(jax.value_and_grad(loss_cell, argnums=(0, 1)))(params, xs)
  v2, g2 = jax.jit(jax.value_and_grad(loss_ref, argnums=(0, 1)))(params, xs)
  np.testing.assert_allclose(v1, v2, rtol=1e-5, atol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=1e-5, atol=1e-5), g1, g2)


def test_contracts_h_first_without_forming_the_transition():
  """Exempt from the no-[B,H,H] rule, but the chosen order (h @ A, then x)
  never needs it, forward or backward; forming x . A first would."""
  B, H, D, T = 3, 7, 2, 4
  cell = sorjax.cells.make("tensor_rnn", hidden_size=H)
  params = cell.init(jax.random.key(0), D)
  xs = jnp.ones((B, T, D))
  loss = lambda p, x: jnp.sum(sorjax.unroll(cell, p, x)[1] ** 2)
  assert_no_bhh(jax.value_and_grad(loss, argnums=(0, 1)), (params, xs), B, H)
  naive = lambda p, x: jnp.sum(naive_jax(p, x, "tanh") ** 2)
  with pytest.raises(AssertionError, match="per-example"):
    assert_no_bhh(jax.value_and_grad(naive), (params, xs), B, H)


def test_rank_r_tensor_of_general2_without_first_order_terms():
  """'One can synthesize a rank r 3-way tensor by adding r rank 1 tensors':
  eq. 9 without D, E is eq. 5 with A[d,i,j] = sum_m B[d,m] C[i,m] A2[m,j]."""
  g = sorjax.cells.make("general2", hidden_size=4, intermediate_size=2,
                        use_D=False, use_E=False)
  pg = g.init(jax.random.key(5), 3)
  cell = sorjax.cells.make("tensor_rnn", hidden_size=4)
  pt = {"A": jnp.einsum("dm,im,mj->dij", pg["B"], pg["C"], pg["A"]),
        "b": pg["f"]}
  xs = jax.random.normal(jax.random.key(6), (2, 6, 3))
  _, yg = sorjax.unroll(g, pg, xs)
  _, yt = sorjax.unroll(cell, pt, xs)
  np.testing.assert_allclose(yt, yg, rtol=1e-5, atol=1e-6)


def test_param_names_shapes_and_live_init():
  cell, params = make(H=4, D=3)
  assert {k: v.shape for k, v in params.items()} == {"A": (3, 4, 4),
                                                      "b": (4,)}
  # h_0 = 0: with b = 0 the state would stay 0 and A would get no gradient.
  assert np.abs(params["b"]).min() > 0
  xs = jax.random.normal(jax.random.key(1), (2, 4, 3))
  g = jax.grad(lambda p: jnp.sum(sorjax.unroll(cell, p, xs)[1] ** 2))(params)
  assert np.abs(g["A"]).max() > 1e-4


@pytest.mark.parametrize("kwargs,match", [
    (dict(hidden_size=-1), "tensor_rnn: hidden_size"),
    (dict(hidden_size=True), "tensor_rnn: hidden_size"),
    (dict(hidden_size=3, activation="relu"), "tensor_rnn: activation"),
])
def test_bad_hyperparameters_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    sorjax.cells.make("tensor_rnn", **kwargs)


def test_wrong_input_size_is_reported():
  cell, params = make(D=3)
  with pytest.raises(ValueError,
                     match="tensor_rnn.*input size 3.*got last axis 2"):
    sorjax.unroll(cell, params, jnp.zeros((2, 5, 2)))
  with pytest.raises(ValueError, match="tensor_rnn: input_size"):
    cell.init(jax.random.key(0), 0)
