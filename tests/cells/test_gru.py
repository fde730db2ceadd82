"""gru against a NumPy loop of its equations and against flax.linen.GRUCell
(same reset-gate placement, independently written)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from tests.cells.reference import np_params, run_numpy, sigmoid

H, D = 4, 3


def make(seed=0):
  cell = sorjax.cells.make("gru", hidden_size=H)
  params = cell.init(jax.random.key(seed), D)
  kb, kn = jax.random.split(jax.random.key(seed + 1))
  params["b"] = jax.random.normal(kb, (3 * H,))  # biases off zero so their
  params["b_hn"] = jax.random.normal(kn, (H,))   # placement is tested
  return cell, params


def numpy_step(p, reset_after=True):
  def step(h, x):
    gx = x @ p["W_x"] + p["b"]
    xr, xz, xn = gx[:, :H], gx[:, H:2 * H], gx[:, 2 * H:]
    W_hr, W_hz, W_hn = (p["W_h"][:, k * H:(k + 1) * H] for k in range(3))
    r = sigmoid(xr + h @ W_hr)
    z = sigmoid(xz + h @ W_hz)
    if reset_after:  # cuDNN / flax: r * (h W_hn + b_hn)
      n = np.tanh(xn + r * (h @ W_hn + p["b_hn"]))
    else:  # Cho et al. 2014: (r * h) W_hn
      n = np.tanh(xn + (r * h) @ W_hn + p["b_hn"])
    h = (1 - z) * n + z * h
    return h, h
  return step


def test_matches_numpy_loop_with_reset_after_matmul():
  cell, params = make()
  xs = jax.random.normal(jax.random.key(2), (2, 7, D))
  carry, ys = sorjax.unroll(cell, params, xs)
  p, x64 = np_params(params), np.asarray(xs, np.float64)
  h, ref = run_numpy(numpy_step(p), np.zeros((2, H)), x64)
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(carry.h, h, rtol=1e-5, atol=1e-6)
  # The test tells the two placements apart.
  _, cho = run_numpy(numpy_step(p, reset_after=False), np.zeros((2, H)), x64)
  assert np.abs(cho - ref).max() > 1e-3


def to_flax(p):
  """Our fused params as flax.linen.GRUCell's per-gate Dense params."""
  col = lambda a, k: a[..., k * H:(k + 1) * H]
  return {"params": {
      "ir": {"kernel": col(p["W_x"], 0), "bias": col(p["b"], 0)},
      "iz": {"kernel": col(p["W_x"], 1), "bias": col(p["b"], 1)},
      "in": {"kernel": col(p["W_x"], 2), "bias": col(p["b"], 2)},
      "hr": {"kernel": col(p["W_h"], 0)},
      "hz": {"kernel": col(p["W_h"], 1)},
      "hn": {"kernel": col(p["W_h"], 2), "bias": p["b_hn"]}}}


def test_equals_flax_gru_cell_values_and_gradients():
  cell, params = make()
  xs = jax.random.normal(jax.random.key(2), (2, 5, D))
  w = jax.random.normal(jax.random.key(3), (2, 5, H))
  ref_cell = nn.GRUCell(features=H)
  flax_shapes = jax.tree_util.tree_map(
      jnp.shape, ref_cell.init(jax.random.key(0), jnp.zeros((2, H)),
                               jnp.zeros((2, D))))
  assert flax_shapes == jax.tree_util.tree_map(jnp.shape, to_flax(params))

  def loss_ours(p, x):
    return jnp.sum(sorjax.unroll(cell, p, x)[1] * w)

  def loss_flax(p, x):
    h, ys = jnp.zeros((2, H)), []
    for t in range(x.shape[1]):
      h, y = ref_cell.apply(to_flax(p), h, x[:, t])
      ys.append(y)
    return jnp.sum(jnp.stack(ys, 1) * w)
  v1, g1 = jax.jit(jax.value_and_grad(loss_ours, argnums=(0, 1)))(params, xs)
  v2, g2 = jax.jit(jax.value_and_grad(loss_flax, argnums=(0, 1)))(params, xs)
  np.testing.assert_allclose(v1, v2, rtol=1e-5, atol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=1e-5, atol=1e-5), g1, g2)


def test_param_names_and_shapes():
  params = sorjax.cells.make("gru", hidden_size=4).init(jax.random.key(0), 3)
  assert {k: v.shape for k, v in params.items()} == {
      "W_x": (3, 12), "W_h": (4, 12), "b": (12,), "b_hn": (4,)}


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_hidden_size_is_named(bad):
  with pytest.raises(ValueError, match="gru: hidden_size"):
    sorjax.cells.make("gru", hidden_size=bad)


def test_wrong_input_size_is_reported():
  cell, params = make()
  with pytest.raises(ValueError, match="gru.*input size 3.*got last axis 2"):
    sorjax.unroll(cell, params, jnp.zeros((2, 5, 2)))
  with pytest.raises(ValueError, match="gru: input_size"):
    cell.init(jax.random.key(0), 0)
  with pytest.raises(TypeError, match="cell 'gru'"):
    sorjax.cells.make("gru", hidden_size=3, activation="tanh")
