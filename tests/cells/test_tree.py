"""tree_rnn and tree_lstm against NumPy float64 transcriptions of
Le & Zuidema (2016) sec. 2, in the paper's column form (W x)."""

import jax
import jax.numpy as jnp
import jax.test_util as jtu
import numpy as np
import pytest

import sorjax
from sorjax.cells import base
from tests.cells.reference import assert_no_bhh, np_params, sigmoid


def key(seed):
  """PRNG keys of the "rbg" implementation: on CPU their random ops compile
  several times faster than threefry's, which dominates these tests."""
  return jax.random.key(seed, impl="rbg")


H = 5
ACT = {"tanh": np.tanh, "identity": lambda z: z,
       "relu": lambda z: np.maximum(z, 0)}


def _randomise(params, prng):
  """Non-zero biases, so every term of the equations is exercised."""
  keys = jax.random.split(prng, len(params))
  return {k: (0.5 * jax.random.normal(kk, v.shape, v.dtype) if k.startswith("b")
              else v) for (k, v), kk in zip(sorted(params.items()), keys)}


def _children(prng, lead, lstm, dtype=jnp.float32):
  k = jax.random.split(prng, 4)
  x, y = (jax.random.normal(k[i], (*lead, H), dtype) for i in range(2))
  if not lstm:
    return base.HCarry(x), base.HCarry(y)
  c_x, c_y = (jax.random.normal(k[i], (*lead, H), dtype) for i in range(2, 4))
  return base.LSTMCarry(x, c_x), base.LSTMCarry(y, c_y)


def _paper_lstm(p, x, y, c_x, c_y, g=np.tanh):
  """Sec. 2, one node, column vectors: the paper's W_* are our blocks
  transposed (we store [in, out])."""
  W_if = p["W_if"]
  blk = lambda r, c: W_if[r * H:(r + 1) * H, c * H:(c + 1) * H].T
  W_i1, W_i2, W_ci1, W_ci2 = (blk(r, 0) for r in range(4))
  W_f1, W_f2, W_cf1, W_cf2 = (blk(r, 1) for r in range(4))
  b_i, b_f = p["b_if"][:H], p["b_if"][H:]
  W_c1, W_c2 = p["W_c"][0].T, p["W_c"][1].T
  W_o1, W_o2 = p["W_o"][0].T, p["W_o"][1].T
  W_co = p["W_co"].T
  i_1 = sigmoid(W_i1 @ x + W_i2 @ y + W_ci1 @ c_x + W_ci2 @ c_y + b_i)
  i_2 = sigmoid(W_i1 @ y + W_i2 @ x + W_ci1 @ c_y + W_ci2 @ c_x + b_i)
  f_1 = sigmoid(W_f1 @ x + W_f2 @ y + W_cf1 @ c_x + W_cf2 @ c_y + b_f)
  f_2 = sigmoid(W_f1 @ y + W_f2 @ x + W_cf1 @ c_y + W_cf2 @ c_x + b_f)
  c_p = f_1 * c_x + f_2 * c_y + g((W_c1 @ x) * i_1 + (W_c2 @ y) * i_2
                                  + p["b_c"])
  o = sigmoid(W_o1 @ x + W_o2 @ y + W_co @ c_p + p["b_o"])
  return o * g(c_p), c_p


@pytest.mark.parametrize("act", ["tanh", "identity", "relu"])
def test_tree_rnn_equation(act):
  cell = sorjax.cells.make("tree_rnn", hidden_size=H, activation=act)
  params = _randomise(cell.init(key(0), H), key(1))
  left, right = _children(key(2), (2, 3), lstm=False)
  p = jax.jit(cell.compose)(params, left, right)
  assert p.h.shape == (2, 3, H)
  q = np_params(params)
  W_1, W_2 = q["W"][:H].T, q["W"][H:].T
  for a in range(2):
    for b in range(3):
      x = np.asarray(left.h[a, b], np.float64)
      y = np.asarray(right.h[a, b], np.float64)
      ref = ACT[act](W_1 @ x + W_2 @ y + q["b"])   # p = f(W_1 x + W_2 y + b)
      np.testing.assert_allclose(p.h[a, b], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act", ["tanh", "identity"])
def test_tree_lstm_equation(act):
  cell = sorjax.cells.make("tree_lstm", hidden_size=H, activation=act)
  params = _randomise(cell.init(key(0), H), key(1))
  left, right = _children(key(2), (4,), lstm=True)
  out = jax.jit(cell.compose)(params, left, right)
  assert out._fields == ("h", "c") and out.h.shape == out.c.shape == (4, H)
  q = np_params(params)
  for b in range(4):
    args = [np.asarray(v[b], np.float64) for v in (*left, *right)]
    x, c_x, y, c_y = args
    h_ref, c_ref = _paper_lstm(q, x, y, c_x, c_y, g=ACT[act])
    np.testing.assert_allclose(out.h[b], h_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.c[b], c_ref, rtol=1e-5, atol=1e-6)


def test_tree_lstm_ties_the_two_child_gates():
  """i_2, f_2 are i_1, f_1 with the children swapped: with W_c1 = W_c2 and
  W_o1 = W_o2 the composition is symmetric, F(x, y) = F(y, x)."""
  cell = sorjax.cells.make("tree_lstm", hidden_size=H)
  params = _randomise(cell.init(key(0), H), key(1))
  params["W_c"] = jnp.stack([params["W_c"][0]] * 2)
  params["W_o"] = jnp.stack([params["W_o"][0]] * 2)
  left, right = _children(key(2), (3,), lstm=True)
  compose = jax.jit(cell.compose)
  a = compose(params, left, right)
  b = compose(params, right, left)
  np.testing.assert_allclose(a.h, b.h, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(a.c, b.c, rtol=1e-6, atol=1e-6)
  # ... and not symmetric in general.
  params["W_c"] = params["W_c"].at[1].mul(-1.0)
  a = compose(params, left, right)
  b = compose(params, right, left)
  assert np.max(np.abs(a.c - b.c)) > 1e-3


def test_leaves_are_the_word_vectors():
  x = jax.random.normal(key(0), (2, 3, H))
  rnn = sorjax.cells.make("tree_rnn", hidden_size=H)
  np.testing.assert_array_equal(rnn.leaf(rnn.init(key(1), H), x).h,
                                x)
  lstm = sorjax.cells.make("tree_lstm", hidden_size=H)
  leaf = lstm.leaf(lstm.init(key(1), H), x)
  np.testing.assert_array_equal(leaf.h, x)
  np.testing.assert_array_equal(leaf.c, np.zeros((2, 3, H)))


def test_param_names_and_shapes():
  lstm = sorjax.cells.make("tree_lstm", hidden_size=H).init(
      key(0), H)
  assert {k: v.shape for k, v in lstm.items()} == {
      "W_if": (4 * H, 2 * H), "b_if": (2 * H,), "W_c": (2, H, H),
      "b_c": (H,), "W_o": (2, H, H), "W_co": (H, H), "b_o": (H,)}
  rnn = sorjax.cells.make("tree_rnn", hidden_size=H).init(key(0), H)
  assert {k: v.shape for k, v in rnn.items()} == {"W": (2 * H, H), "b": (H,)}
  assert set(sorjax.cells.TREE_CELLS) == {"tree_rnn", "tree_lstm"}


@pytest.mark.parametrize("name", ["tree_rnn", "tree_lstm"])
def test_bad_hyperparameters_and_inputs_are_reported(name):
  with pytest.raises(ValueError, match=f"{name}: hidden_size"):
    sorjax.cells.make(name, hidden_size=0)
  with pytest.raises(ValueError, match=f"{name}: activation"):
    sorjax.cells.make(name, hidden_size=H, activation="softsign")
  with pytest.raises(TypeError, match=f"cell '{name}'"):
    sorjax.cells.make(name, hidden_size=H, intermediate_size=3)
  cell = sorjax.cells.make(name, hidden_size=H)
  with pytest.raises(ValueError, match=f"{name}: input_size must equal "
                     f"hidden_size={H}.*got input_size=7"):
    cell.init(key(0), 7)
  params = cell.init(key(0), H)
  with pytest.raises(ValueError, match=r"word vectors of size hidden_size=5.*"
                     r"\(2, 7\)"):
    cell.leaf(params, jnp.zeros((2, 7)))


@pytest.mark.parametrize("name", ["tree_rnn", "tree_lstm"])
def test_gradients_match_finite_differences(name):
  with jax.enable_x64(True):
    cell = sorjax.cells.make(name, hidden_size=3)
    params = _randomise(cell.init(key(0), 3, jnp.float64),
                        key(1))
    k = jax.random.split(key(2), 4)
    kids = [jax.random.normal(kk, (2, 3), jnp.float64) for kk in k]
    carry = base.HCarry if name == "tree_rnn" else base.LSTMCarry

    def loss(params, kids):
      if name == "tree_rnn":
        left, right = carry(kids[0]), carry(kids[1])
      else:
        left, right = carry(kids[0], kids[2]), carry(kids[1], kids[3])
      out = cell.compose(params, left, right)
      return sum(jnp.sum(jnp.sin(v)) for v in out)

    jtu.check_grads(jax.jit(loss), (params, kids), order=1, modes=["rev"],
                    atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", ["tree_rnn", "tree_lstm"])
def test_no_per_example_hh_matrix(name):
  B = 3
  cell = sorjax.cells.make(name, hidden_size=H)
  params = cell.init(key(0), H)
  left, right = _children(key(1), (B,), lstm=name == "tree_lstm")

  def loss(params, left, right):
    return sum(jnp.sum(v) for v in cell.compose(params, left, right))

  assert_no_bhh(jax.value_and_grad(loss, argnums=(0, 1, 2)),
                (params, left, right), B, H)


@pytest.mark.parametrize("name", ["tree_rnn", "tree_lstm"])
def test_bf16_and_jit_with_the_cell_static(name):
  cell = sorjax.cells.make(name, hidden_size=H)
  params = cell.init(key(0), H, jnp.bfloat16)
  left, right = _children(key(1), (2,), lstm=name == "tree_lstm",
                          dtype=jnp.bfloat16)
  out = jax.jit(type(cell).compose, static_argnums=0)(cell, params, left,
                                                      right)
  ref = jax.jit(cell.compose)(jax.tree_util.tree_map(
      lambda a: a.astype(jnp.float32), params),
      *jax.tree_util.tree_map(lambda a: a.astype(jnp.float32), (left, right)))
  for a, r in zip(out, ref):
    assert a.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(a, np.float32), r, atol=5e-2)
