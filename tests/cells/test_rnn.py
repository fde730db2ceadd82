"""rnn and lstm against NumPy loops of their textbook equations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from tests.cells.reference import np_params, run_numpy, sigmoid

ACT = {"tanh": np.tanh, "identity": lambda z: z, "relu": lambda z: np.maximum(z, 0)}


@pytest.mark.parametrize("act", ["tanh", "identity", "relu"])
def test_rnn_equation(act):
  cell = sorjax.cells.make("rnn", hidden_size=4, activation=act)
  params = cell.init(jax.random.key(1), 3)
  params["b"] = jnp.linspace(-1, 1, 4)
  xs = jax.random.normal(jax.random.key(2), (2, 7, 3))
  _, ys = sorjax.unroll(cell, params, xs)
  p = np_params(params)

  def step(h, x):  # h_t = phi(x_t U + h_{t-1} W + b)
    h = ACT[act](x @ p["U"] + h @ p["W"] + p["b"])
    return h, h
  _, ref = run_numpy(step, np.zeros((2, 4)), np.asarray(xs, np.float64))
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-6)


def test_lstm_equation_and_gate_order():
  H = 4
  cell = sorjax.cells.make("lstm", hidden_size=H, forget_bias=1.0)
  params = cell.init(jax.random.key(1), 3)
  params["b"] = jax.random.normal(jax.random.key(3), (4 * H,))
  xs = jax.random.normal(jax.random.key(2), (2, 7, 3))
  carry, ys = sorjax.unroll(cell, params, xs)
  p = np_params(params)

  def step(state, x):
    h, c = state
    z = x @ p["W_x"] + h @ p["W_h"] + p["b"]
    i, f, g, o = (z[:, k * H:(k + 1) * H] for k in range(4))
    c = sigmoid(f + 1.0) * c + sigmoid(i) * np.tanh(g)
    h = sigmoid(o) * np.tanh(c)
    return (h, c), h
  (h, c), ref = run_numpy(step, (np.zeros((2, H)), np.zeros((2, H))),
                          np.asarray(xs, np.float64))
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(carry.c, c, rtol=1e-5, atol=1e-6)
  assert carry._fields == ("h", "c")


def test_param_names_and_shapes():
  lstm = sorjax.cells.make("lstm", hidden_size=4).init(jax.random.key(0), 3)
  assert {k: v.shape for k, v in lstm.items()} == {
      "W_x": (3, 16), "W_h": (4, 16), "b": (16,)}
  rnn = sorjax.cells.make("rnn", hidden_size=4).init(jax.random.key(0), 3)
  assert {k: v.shape for k, v in rnn.items()} == {
      "U": (3, 4), "W": (4, 4), "b": (4,)}


def test_wrong_input_size_is_reported():
  cell = sorjax.cells.make("lstm", hidden_size=4)
  params = cell.init(jax.random.key(0), 3)
  with pytest.raises(ValueError, match="input size 3.*got last axis 7"):
    sorjax.unroll(cell, params, jnp.zeros((2, 5, 7)))
