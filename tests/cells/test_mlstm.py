"""mlstm against a NumPy loop of Krause et al.'s equations (column form) and a
JAX reference that materialises each example's transition matrix."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from tests.cells.reference import (assert_init_in_dtype,
                                   assert_matches_reference, assert_no_bhh,
                                   normal, np_params, random_params, sigmoid)

ACT = {"identity": lambda z: z, "tanh": np.tanh}


def make(act="identity", H=4, M=5, D=3, seed=0):
  cell = sorjax.cells.make("mlstm", hidden_size=H, intermediate_size=M,
                           candidate_activation=act)
  return cell, random_params(cell, D, seed)


def numpy_mlstm(p, xs, act):
  """Krause et al., one example at a time, column vectors W v:
  m = (W_mx x) * (W_mh h); hat-h = W_hx x + W_hm m; i, f, o = sigmoid(W_*x x +
  W_*m m); c = f c + i act(hat-h); h = tanh(c) o."""
  B, T, _ = xs.shape
  H = p["W_mh"].shape[0]
  Wmx, Wmh = p["W_mx"].T, p["W_mh"].T                  # [M, D], [M, H]
  col = lambda W, k: W[:, k * H:(k + 1) * H].T         # gate k's [H, in]
  Wix, Wfx, Whx, Wox = (col(p["W_x"], k) for k in range(4))
  Wim, Wfm, Whm, Wom = (col(p["W_m"], k) for k in range(4))
  bi, bf, bh, bo = (p["b"][k * H:(k + 1) * H] for k in range(4))
  ys, hs, cs = np.zeros((B, T, H)), [], []
  for b in range(B):
    h, c = np.zeros(H), np.zeros(H)
    for t in range(T):
      x = xs[b, t]
      m = (Wmx @ x) * (Wmh @ h)
      h_hat = Whx @ x + Whm @ m + bh
      i = sigmoid(Wix @ x + Wim @ m + bi)
      f = sigmoid(Wfx @ x + Wfm @ m + bf)
      o = sigmoid(Wox @ x + Wom @ m + bo)
      c = f * c + i * ACT[act](h_hat)
      h = np.tanh(c) * o
      ys[b, t] = h
    hs.append(h)
    cs.append(c)
  return np.stack(hs), np.stack(cs), ys


@pytest.mark.parametrize("act", ["identity", "tanh"])
def test_matches_numpy_loop_of_the_equations(act):
  cell, params = make(act)
  xs = normal(5, (2, 6, 3))
  carry, ys = sorjax.unroll(cell, params, xs)
  h, c, ref = numpy_mlstm(np_params(params), np.asarray(xs, np.float64), act)
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(carry.h, h, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(carry.c, c, rtol=1e-5, atol=1e-6)


def test_candidate_activation_matters_and_defaults_to_identity():
  assert sorjax.cells.make("mlstm", hidden_size=2,
                           intermediate_size=2).candidate_activation == \
      "identity"
  xs = normal(5, (2, 4, 3), 3.0)
  (c1, p), (c2, _) = make("identity"), make("tanh")
  _, y1 = sorjax.unroll(c1, p, xs)
  _, y2 = sorjax.unroll(c2, p, xs)
  assert float(jnp.max(jnp.abs(y1 - y2))) > 1e-3


def materialised_unroll(p, xs, act):
  """Builds each example's transition T_t = W_mh diag(x_t W_mx) W_m [B,H,4H]
  and applies it to h_{t-1} (what the factored step must equal)."""
  B, _, _ = xs.shape
  H = p["W_mh"].shape[0]
  act = {"identity": lambda z: z, "tanh": jnp.tanh}[act]

  def step(carry, x):
    h, c = carry
    Tt = jnp.einsum("im,bm,mj->bij", p["W_mh"], x @ p["W_mx"], p["W_m"])
    z = jnp.einsum("bi,bij->bj", h, Tt) + x @ p["W_x"] + p["b"][None]
    i, f, g, o = jnp.split(z, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * act(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h
  zero = jnp.zeros((B, H))
  (h, c), ys = jax.lax.scan(step, (zero, zero), jnp.swapaxes(xs, 0, 1))
  return (h, c), jnp.swapaxes(ys, 0, 1)


@pytest.mark.parametrize("act", ["identity", "tanh"])
def test_equals_materialised_reference_values_and_gradients(act):
  cell, params = make(act)
  xs = normal(5, (2, 5, 3))
  w = normal(6, (2, 5, 4))

  assert_matches_reference(cell, params,
                           lambda p, x: materialised_unroll(p, x, act), xs, w)


def test_no_per_example_transition_forward_or_backward():
  B, T, H, D, M = 3, 6, 7, 2, 5
  cell, params = make(H=H, M=M, D=D)
  xs = normal(1, (B, T, D))

  def loss(p, x):
    return jnp.sum(sorjax.unroll(cell, p, x)[1] ** 2)
  assert_no_bhh(jax.value_and_grad(loss, argnums=(0, 1)), (params, xs), B, H)


def test_param_names_shapes_and_carry():
  D = 3
  cell, params = make(H=4, M=5, D=D)
  assert {k: v.shape for k, v in params.items()} == {
      "W_mx": (3, 5), "W_mh": (4, 5), "W_x": (3, 16), "W_m": (5, 16),
      "b": (16,)}
  carry = cell.initial_carry(params, (2,))
  assert carry._fields == ("h", "c")
  assert carry.h.shape == carry.c.shape == (2, 4)
  assert_init_in_dtype(cell, D)


def test_docstring_says_it_is_not_xlstm():
  doc = sorjax.cells.cell_class("mlstm").__doc__
  assert "Krause" in doc and "not xLSTM" in doc


@pytest.mark.parametrize("kwargs,match", [
    (dict(hidden_size=0, intermediate_size=2), "mlstm: hidden_size"),
    (dict(hidden_size=2, intermediate_size=0), "mlstm: intermediate_size"),
    (dict(hidden_size=2, intermediate_size=2.5), "mlstm: intermediate_size"),
    (dict(hidden_size=2, intermediate_size=2, candidate_activation="relu"),
     "mlstm: candidate_activation"),
])
def test_bad_hyperparameters_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    sorjax.cells.make("mlstm", **kwargs)


def test_wrong_input_size_is_named():
  cell, params = make(D=3)
  with pytest.raises(ValueError, match="mlstm: .*input size 3.*last axis 4"):
    sorjax.unroll(cell, params, jnp.zeros((2, 5, 4)))
