"""mts_lstm (Mahto et al. sec. 2.3): eq. 5 biases, their fixedness, the
timescale specs, and the cell against a NumPy LSTM loop."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.special

import sorjax
from sorjax import cells
from sorjax.cells import mts_lstm
from tests.cells.reference import assert_no_bhh, np_params, sigmoid

B, T, D, H = 2, 7, 3, 5  # T - 1 != H too (assert_no_bhh)
TS = (0.5, 1.0, 2.0, 3.0, 100.0)
# eq. 5, b_f = -log(e^{1/T} - 1), worked out to 18 digits with `decimal`.
B_F = (-1.85458654213114094, -0.541324854612918109, 0.432752129567188572,
       0.927320271521323214, 4.60016601932489692)
RNG = np.random.default_rng(0)
f32 = lambda a: jnp.asarray(a, jnp.float32)


def make(timescales=TS, key=0):
  cell = cells.make("mts_lstm", hidden_size=H, timescales=timescales)
  params = cell.init(jax.random.key(key), D)
  params["b_go"] = f32(RNG.normal(size=2 * H))
  return cell, params, f32(RNG.normal(size=(B, T, D)))


# ------------------------------------------------------------- eq. 5

def test_fixed_biases_are_eq5_on_hand_computed_values():
  cell, params, _ = make()
  fixed = cell.fixed_arrays()
  np.testing.assert_allclose(fixed["b_f"], B_F, rtol=1e-14)
  np.testing.assert_allclose(fixed["b_i"], -np.array(B_F), rtol=1e-14)
  assert not {"b_i", "b_f", "b", "b_if"} & set(params)
  assert {k: v.shape for k, v in params.items()} == {
      "W_x": (D, 4 * H), "W_h": (H, 4 * H), "b_go": (2 * H,)}


@pytest.mark.parametrize("T_", [1e-2, 0.3, 1.0, 7.0, 1e3, 1e6])
def test_forget_gate_is_exp_minus_one_over_T(T_):
  b_f = mts_lstm.forget_bias(T_)
  assert np.isfinite(b_f)
  np.testing.assert_allclose(sigmoid(b_f), np.exp(-1.0 / T_), rtol=1e-12)
  np.testing.assert_allclose(mts_lstm.timescale(b_f), T_, rtol=1e-9)  # eq. 2


def test_memory_decays_as_exp_minus_t_over_T():
  """Zero weights and b_g = 0, from c_0 = 1: c_t = e^{-t/T} per unit (eq. 1),
  and i_t = 1 - f_t (sec. 2.3)."""
  cell, params, _ = make()
  params = {"W_x": jnp.zeros((D, 4 * H)), "W_h": jnp.zeros((H, 4 * H)),
            "b_go": jnp.concatenate([jnp.zeros(H), jnp.full((H,), 2.0)])}
  lengths = jnp.arange(1, 9)
  xs = f32(RNG.normal(size=(8, 8, D))) * 0.0
  carry0 = sorjax.cells.base.LSTMCarry(jnp.zeros((8, H)), jnp.ones((8, H)))
  carry, _ = sorjax.unroll(cell, params, xs, carry=carry0, lengths=lengths)
  expected = np.exp(-np.arange(1, 9)[:, None] / np.array(TS)[None, :])
  np.testing.assert_allclose(carry.c, expected, rtol=1e-5, atol=1e-7)
  z = np.asarray(cell.precompute(params, jnp.zeros((D,))), np.float64)
  np.testing.assert_allclose(sigmoid(z[:H]) + sigmoid(z[H:2 * H]), 1.0,
                             rtol=1e-6)


# ------------------------------------------------------------- equations

def np_lstm(p, xs, b):
  h, c = np.zeros((xs.shape[0], H)), np.zeros((xs.shape[0], H))
  ys = []
  for t in range(xs.shape[1]):
    z = xs[:, t] @ p["W_x"] + h @ p["W_h"] + b
    i, f, g, o = (z[:, k * H:(k + 1) * H] for k in range(4))
    c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    h = sigmoid(o) * np.tanh(c)
    ys.append(h)
  return (h, c), np.stack(ys, 1)


def test_cell_equals_numpy_lstm_with_eq5_biases():
  cell, params, xs = make()
  carry, ys = sorjax.unroll(cell, params, xs)
  p = np_params(params)
  b = np.concatenate([-np.array(B_F), B_F, p["b_go"]])  # b_i, b_f, b_g, b_o
  (h, c), ref = np_lstm(p, np.asarray(xs, np.float64), b)
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(carry.c, c, rtol=1e-5, atol=1e-6)


def test_matches_plain_jax_lstm_with_gradients_and_no_bhh():
  cell, params, xs = make()
  w = f32(RNG.normal(size=(B, T, H)))
  b_if = f32(np.concatenate([-np.array(B_F), B_F]))

  def loss(p, x):
    return jnp.sum(sorjax.unroll(cell, p, x)[1] * w)

  def naive(p, x):  # a textbook LSTM scan with the full bias written out
    b = jnp.concatenate([b_if, p["b_go"]])

    def body(hc, x_t):
      h, c = hc
      i, f, g, o = jnp.split(x_t @ p["W_x"] + h @ p["W_h"] + b[None], 4, -1)
      c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
      h = jax.nn.sigmoid(o) * jnp.tanh(c)
      return (h, c), h
    z = jnp.zeros((B, H))
    _, ys = jax.lax.scan(body, (z, z), jnp.swapaxes(x, 0, 1))
    return jnp.sum(jnp.swapaxes(ys, 0, 1) * w)
  v, g = jax.jit(jax.value_and_grad(loss, (0, 1)))(params, xs)
  vn, gn = jax.jit(jax.value_and_grad(naive, (0, 1)))(params, xs)
  np.testing.assert_allclose(v, vn, rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=1e-5, atol=1e-5), g, gn)
  assert_no_bhh(jax.value_and_grad(loss, (0, 1)), (params, xs), B, H)


# ------------------------------------------------------------- fixedness

def _train(cell, params, xs, steps=5):
  target = f32(RNG.normal(size=(B, T, H)))

  def loss(p):
    return jnp.mean((sorjax.unroll(cell, p, xs)[1] - target) ** 2)
  opt = optax.sgd(0.5, momentum=0.9)  # adam trips strict dtype promotion

  @jax.jit
  def update(p, s):
    g = jax.grad(loss)(p)
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s
  state = opt.init(params)
  for _ in range(steps):
    params, state = update(params, state)
  return params


def test_training_leaves_fixed_biases_and_their_effect_unchanged():
  cell, params, xs = make()
  before = {k: v.copy() for k, v in cell.fixed_arrays().items()}
  trained = _train(cell, params, xs)
  assert not np.allclose(trained["W_x"], params["W_x"])  # it did train
  assert set(trained) == set(params)
  after = cell.fixed_arrays()
  for k in before:
    np.testing.assert_array_equal(after[k], before[k])
  # Effect: at x = 0 the i and f pre-activations are exactly -b_f, b_f.
  z = np.asarray(cell.precompute(trained, jnp.zeros((D,))), np.float64)
  np.testing.assert_allclose(z[H:2 * H], B_F, rtol=1e-6)
  np.testing.assert_allclose(z[:H], -np.array(B_F), rtol=1e-6)


def test_learned_spec_initialises_trainable_biases_from_eq5():
  cell, params, xs = make(("learned", TS))
  assert cell.learned and cell.fixed_arrays() == {}
  np.testing.assert_allclose(params["b_if"],
                             np.concatenate([-np.array(B_F), B_F]), rtol=1e-6)
  trained = _train(cell, params, xs)
  assert not np.allclose(trained["b_if"], params["b_if"])  # they move


# ------------------------------------------------------------- specs

def test_inverse_gamma_quantiles_match_scipy():
  alpha, n = 0.56, 7
  q = np.arange(1, n + 1) / (n + 1)
  # InvGamma(alpha, 1) = 1 / Gamma(alpha, 1): its q-quantile is
  # 1 / (the upper-tail q-quantile of Gamma), Q^{-1}(alpha, q).
  expected = 1.0 / scipy.special.gammainccinv(alpha, q)
  np.testing.assert_allclose(mts_lstm.inverse_gamma_timescales(n, alpha),
                             expected, rtol=1e-10)
  cell = cells.make("mts_lstm", hidden_size=n,
                    timescales=("inverse_gamma", alpha))
  np.testing.assert_allclose(cell.unit_timescales(), expected, rtol=1e-10)
  np.testing.assert_allclose(cell.fixed_arrays()["b_f"],
                             -np.log(np.exp(1.0 / expected) - 1), rtol=1e-10)


def test_constant_and_group_specs():
  c = cells.make("mts_lstm", hidden_size=4, timescales=("constant", 3))
  np.testing.assert_array_equal(c.unit_timescales(), [3.0] * 4)
  # Mahto et al.'s layer 1 (half T = 3, half T = 4) plus an InvGamma group.
  g = cells.make("mts_lstm", hidden_size=7, timescales=[
      "groups", [("constant", 3.0, 2), ("constant", 4, 2),
                 ("inverse_gamma", 1.5, 3)]])
  ig = 1.0 / scipy.special.gammainccinv(1.5, np.arange(1, 4) / 4)
  np.testing.assert_allclose(g.unit_timescales(),
                             np.concatenate([[3, 3, 4, 4], ig]), rtol=1e-10)
  assert hash(g) == hash(cells.make("mts_lstm", hidden_size=7, timescales=(
      "groups", (("constant", 3.0, 2.0), ("constant", 4.0, 2.0),
                 ("inverse_gamma", 1.5, 3.0)))))


def test_array_timescales_are_hashable_and_jit_static():
  cell = cells.make("mts_lstm", hidden_size=H, timescales=np.array(TS))
  assert cell == cells.make("mts_lstm", hidden_size=H, timescales=list(TS))
  params = cell.init(jax.random.key(0), D)
  f = jax.jit(lambda c, p, x: sorjax.unroll(c, p, x)[1], static_argnums=0)
  assert f(cell, params, jnp.zeros((B, T, D))).shape == (B, T, H)


@pytest.mark.parametrize("bad,match", [
    ((1.0, 2.0, 0.0, 4.0, 5.0), r"\[2\] must be a finite number > 0"),
    ((1.0, -2.0, 3.0, 4.0, 5.0), r"\[1\] must be a finite number > 0"),
    ((1.0, 2.0, 3.0, np.inf, 5.0), r"\[3\] must be a finite number"),
    ((1.0, 2.0, np.nan, 4.0, 5.0), r"\[2\] must be a finite number"),
    ((1.0, 2.0, 3.0), "one timescale per unit: 3 values for hidden_size=5"),
    (("constant", 0.0), "constant T must be a finite number > 0"),
    (("inverse_gamma", -1.0), "inverse_gamma alpha must be a finite number > 0"),
    (("inverse_gamma", 0.001), "0 or inf in float64; use a larger alpha"),
    (("gamma", 1.0), "kind must be one of"),
    (("groups", (("constant", 3.0, 2), ("constant", 4.0, 2))),
     r"group sizes \[2.0, 2.0\] must be positive ints summing to "
     "hidden_size=5"),
    (("groups", (("constant", 3.0),)), r"\('groups', \(\(kind, value, n\)"),
    (("learned",), r"\('learned', spec\) takes one inner spec"),
    ((), "must not be empty"),
    ("constant", "must be a sequence or a spec tuple"),
    (({"T": 3},), "must be numbers or a spec tuple"),
])
def test_invalid_timescales_are_named(bad, match):
  with pytest.raises(ValueError, match="mts_lstm: timescales.*" + match):
    cells.make("mts_lstm", hidden_size=5, timescales=bad)


def test_other_errors_are_named():
  with pytest.raises(ValueError, match="mts_lstm: hidden_size"):
    cells.make("mts_lstm", hidden_size=0, timescales=())
  cell, params, _ = make()
  with pytest.raises(ValueError, match="input size 3.*got last axis 4"):
    sorjax.unroll(cell, params, jnp.zeros((B, T, 4)))
