"""attention_lstm and assignment_lstm (Lin et al. sec. 3.2) against NumPy
loops of the paper's equations and naive materialising JAX references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax import cells
from tests.cells.reference import assert_no_bhh, np_params, sigmoid

B, T, D, H, S = 2, 4, 7, 3, 5  # all different, for assert_no_bhh
FB = 0.5                        # forget_bias, to check where it enters
RNG = np.random.default_rng(0)
f32 = lambda a: jnp.asarray(a, jnp.float32)


def make(name, key=0, **kw):
  cell = cells.make(name, hidden_size=H, num_cells=S, forget_bias=FB, **kw)
  rng = np.random.default_rng(key)
  params = cell.init(jax.random.key(key), D)
  params["b"] = f32(0.5 * rng.normal(size=(S, 4 * H)))  # nonzero biases
  xs = f32(rng.normal(size=(B, T, D)))
  return cell, params, xs


# ------------------------------------------------------------- NumPy references

def np_lstm_cell(x, h, c, W_x, W_h, b):
  """One LSTM cell on one example, gate order i, f, g, o."""
  z = x @ W_x + h @ W_h + b
  i, f, g, o = np.split(z, 4)
  c = sigmoid(f + FB) * c + sigmoid(i) * np.tanh(g)
  return sigmoid(o) * np.tanh(c), c


def np_softmax(e):
  e = np.exp(e - e.max())
  return e / e.sum()


def np_second_order(p, xs, alphas, mix):
  """Lin et al. eq. (c)-(e) per example and step, given alpha [B, T, S].

  mix="states": S separate LSTM cells, their new h, c mixed (eq. (d)-(e)).
  mix="gates": one LSTM with the explicitly mixed per-example matrices
  W_x(t) = sum_s alpha_s W_x[s], W_h(t) = sum_s alpha_s W_h[s], b(t).
  """
  Bn, Tn, _ = xs.shape
  h, c = np.zeros((Bn, H)), np.zeros((Bn, H))
  ys = np.zeros((Bn, Tn, H))
  for t in range(Tn):
    for b in range(Bn):
      x, a = xs[b, t], alphas[b, t]
      if mix == "states":
        hc = [np_lstm_cell(x, h[b], c[b], p["W_x"][s], p["W_h"][s], p["b"][s])
              for s in range(S)]
        h[b] = sum(a[s] * hc[s][0] for s in range(S))           # eq. (d)
        c[b] = sum(a[s] * hc[s][1] for s in range(S))           # eq. (e)
      else:
        W_x = sum(a[s] * p["W_x"][s] for s in range(S))
        W_h = sum(a[s] * p["W_h"][s] for s in range(S))
        bb = sum(a[s] * p["b"][s] for s in range(S))
        h[b], c[b] = np_lstm_cell(x, h[b], c[b], W_x, W_h, bb)
      ys[b, t] = h[b]
  return (h, c), ys


def np_attention(p, xs, tau):
  """alpha_t = softmax(V x_t / tau), eq. (a)-(b); tau scalar or [B, T]."""
  tau = np.broadcast_to(np.asarray(tau, np.float64), xs.shape[:2])
  return np.array([[np_softmax(p["V"].T @ xs[b, t] / tau[b, t])
                    for t in range(xs.shape[1])] for b in range(xs.shape[0])])


# ------------------------------------------------------------- equations

@pytest.mark.parametrize("mix", ["states", "gates"])
@pytest.mark.parametrize("per_token", [False, True])
def test_attention_lstm_equations(mix, per_token):
  cell, params, xs = make("attention_lstm", mix=mix)
  tau = f32(RNG.uniform(0.3, 2.0, (B, T))) if per_token else 0.7
  carry, ys = sorjax.unroll(cell, params, xs, temperature=tau)
  p, x64 = np_params(params), np.asarray(xs, np.float64)
  (h, c), ref = np_second_order(p, x64, np_attention(p, x64, tau), mix)
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(carry.h, h, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(carry.c, c, rtol=1e-5, atol=1e-6)


def test_states_and_gates_mixing_differ_for_soft_attention():
  """The paper's eq. (d)-(e) is not the weight mixture: a real choice."""
  cell_s, params, xs = make("attention_lstm", mix="states")
  cell_g = cells.make("attention_lstm", hidden_size=H, num_cells=S,
                      forget_bias=FB, mix="gates")
  _, ys_s = sorjax.unroll(cell_s, params, xs)
  _, ys_g = sorjax.unroll(cell_g, params, xs)
  assert np.max(np.abs(ys_s - ys_g)) > 1e-3


def test_temperature_defaults_to_one():
  cell, params, xs = make("attention_lstm")
  _, ys = sorjax.unroll(cell, params, xs)
  _, ys1 = sorjax.unroll(cell, params, xs, temperature=1.0)
  np.testing.assert_array_equal(ys, ys1)
  p, x64 = np_params(params), np.asarray(xs, np.float64)
  _, ref = np_second_order(p, x64, np_attention(p, x64, 1.0), "states")
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-6)


def test_assignment_lstm_equation():
  cell, params, xs = make("assignment_lstm")
  a = jnp.asarray(RNG.integers(0, S, (B, T)))
  carry, ys = sorjax.unroll(cell, params, xs, assignment=a)
  p, x64, a = np_params(params), np.asarray(xs, np.float64), np.asarray(a)
  h, c = np.zeros((B, H)), np.zeros((B, H))
  for t in range(T):  # token (b, t) runs through cell a[b, t] only
    for b in range(B):
      s = a[b, t]
      h[b], c[b] = np_lstm_cell(x64[b, t], h[b], c[b], p["W_x"][s],
                                p["W_h"][s], p["b"][s])
      np.testing.assert_allclose(ys[b, t], h[b], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(carry.c, c, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------- temperature

def test_attention_weights_and_temperature_limits():
  cell, params, xs = make("attention_lstm")
  e = np.asarray(xs, np.float64) @ np.asarray(params["V"], np.float64)
  alpha = cell.attention(params, xs, 1.0)
  assert alpha.shape == (B, T, S)
  np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-6)
  top2 = np.sort(e, -1)[..., -2:]
  assert np.min(top2[..., 1] - top2[..., 0]) > 1e-3  # no near-ties
  cold = cell.attention(params, xs, 1e-5)             # tau -> 0: argmax
  np.testing.assert_allclose(cold, np.eye(S)[e.argmax(-1)], atol=1e-6)
  hot = cell.attention(params, xs, 1e5)               # tau -> inf: uniform
  np.testing.assert_allclose(hot, np.full((B, T, S), 1.0 / S), atol=1e-4)


def test_arbitrarily_low_temperatures_stay_finite():
  """Lin et al. test at an "arbitrarily low" tau. Under jit, e / tau
  overflowed to inf from tau ~ 1e-9 and softmax gave NaN; a subnormal tau
  (1e-40, which passes the > 0 check) is flushed to 0, and a traced
  schedule can reach 0: each is the argmax limit, with finite gradients."""
  cell, params, xs = make("attention_lstm")
  e = np.asarray(xs, np.float64) @ np.asarray(params["V"], np.float64)
  onehot = np.eye(S)[e.argmax(-1)]
  att = jax.jit(cell.attention)
  for tau in (1e-9, 1e-12, 1e-30, 1e-40, 0.0):
    np.testing.assert_array_equal(att(params, xs, jnp.float32(tau)), onehot)
  np.testing.assert_array_equal(cell.attention(params, xs, 1e-40), onehot)
  f = jax.jit(lambda p, t: jnp.sum(
      sorjax.unroll(cell, p, xs, temperature=t)[1] ** 2))
  g = jax.grad(f)(params, jnp.float32(1e-12))
  assert all(np.isfinite(np.asarray(a)).all()
             for a in jax.tree_util.tree_leaves(g))


def test_cold_attention_equals_assignment_to_argmax():
  """At tau -> 0 the attention model is the assignment model with the
  assignment argmax(x V) (sec. 3.2.2: "effectively one-hot")."""
  att, params, xs = make("attention_lstm")
  asg = cells.make("assignment_lstm", hidden_size=H, num_cells=S,
                   forget_bias=FB)
  a = jnp.argmax(xs @ params["V"], -1)
  _, ys_att = sorjax.unroll(att, params, xs, temperature=1e-6)
  _, ys_asg = sorjax.unroll(asg, {k: v for k, v in params.items()
                                  if k != "V"}, xs, assignment=a)
  np.testing.assert_allclose(ys_att, ys_asg, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------- naive JAX refs

def naive_unroll(params, xs, alphas, mix):
  """lax.scan materialising the per-example mixed matrices (gates: W_hh(t)
  as [B, H, 4, H]) or running the S cells separately (states)."""
  W_h = params["W_h"].reshape(S, H, 4, H)

  def body(carry, inp):
    h, c = carry
    x, a = inp
    if mix == "gates":
      W_x_t = jnp.einsum("bs,sdg->bdg", a, params["W_x"])
      W_h_t = jnp.einsum("bs,shkj->bhkj", a, W_h)   # per-example W_hh(t)
      z = (jnp.einsum("bd,bdg->bg", x, W_x_t) +
           jnp.einsum("bh,bhkj->bkj", h, W_h_t).reshape(-1, 4 * H) +
           a @ params["b"])
      i, f, g, o = jnp.split(z, 4, -1)
      c = jax.nn.sigmoid(f + FB) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
      h = jax.nn.sigmoid(o) * jnp.tanh(c)
    else:  # each cell on its own (vmapped over s), then eq. (d)-(e)
      def one_cell(W_x, W_h, b):
        z = x @ W_x + h @ W_h + b[None]
        i, f, g, o = jnp.split(z, 4, -1)
        c_s = jax.nn.sigmoid(f + FB) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        return jax.nn.sigmoid(o) * jnp.tanh(c_s), c_s
      hs, cs = jax.vmap(one_cell)(params["W_x"], params["W_h"], params["b"])
      h = jnp.einsum("bs,sbh->bh", a, hs)
      c = jnp.einsum("bs,sbh->bh", a, cs)
    return (h, c), h

  z = jnp.zeros((xs.shape[0], H), xs.dtype)
  _, ys = jax.lax.scan(body, (z, z), (jnp.swapaxes(xs, 0, 1),
                                      jnp.swapaxes(alphas, 0, 1)))
  return jnp.swapaxes(ys, 0, 1)


W_OUT = f32(RNG.normal(size=(B, T, H)))


def _cases():
  return [("attention_lstm", "states"), ("attention_lstm", "gates"),
          ("assignment_lstm", "gates")]


def _setup(name, mix):
  kw = {"mix": mix} if name == "attention_lstm" else {}
  cell, params, xs = make(name, **kw)
  if name == "attention_lstm":
    aux = {"temperature": jnp.float32(0.7)}
    alphas = lambda p, x: jax.nn.softmax((x @ p["V"]) / 0.7, -1)
  else:
    params.pop("V", None)
    a = jnp.asarray(RNG.integers(0, S, (B, T)))
    aux = {"assignment": a}
    alphas = lambda p, x: jax.nn.one_hot(a, S, dtype=x.dtype)
  return cell, params, xs, aux, alphas


@pytest.mark.parametrize("name,mix", _cases())
def test_matches_naive_materialising_reference_with_gradients(name, mix):
  cell, params, xs, aux, alphas = _setup(name, mix)

  def loss(p, x):
    return jnp.sum(sorjax.unroll(cell, p, x, **aux)[1] * W_OUT)

  def naive_loss(p, x):
    return jnp.sum(naive_unroll(p, x, alphas(p, x), mix) * W_OUT)
  v, g = jax.jit(jax.value_and_grad(loss, (0, 1)))(params, xs)
  vn, gn = jax.jit(jax.value_and_grad(naive_loss, (0, 1)))(params, xs)
  np.testing.assert_allclose(v, vn, rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=1e-5, atol=1e-5), g, gn)


@pytest.mark.parametrize("name,mix", _cases())
def test_no_per_example_transition_matrix(name, mix):
  cell, params, xs, aux, alphas = _setup(name, mix)

  def loss(p, x):
    return jnp.sum(sorjax.unroll(cell, p, x, **aux)[1] * W_OUT)
  assert_no_bhh(jax.value_and_grad(loss, (0, 1)), (params, xs), B, H)
  if mix == "gates":  # the check does catch the materialising reference
    naive = lambda p, x: jnp.sum(naive_unroll(p, x, alphas(p, x), mix))
    with pytest.raises(AssertionError, match="per-example"):
      assert_no_bhh(jax.value_and_grad(naive, (0, 1)), (params, xs), B, H)


# ------------------------------------------------------------- params, errors

def test_param_names_and_shapes():
  att, params, _ = make("attention_lstm")
  shapes = {k: v.shape for k, v in params.items()}
  assert shapes == {"V": (D, S), "W_x": (S, D, 4 * H), "W_h": (S, H, 4 * H),
                    "b": (S, 4 * H)}
  asg = cells.make("assignment_lstm", hidden_size=H, num_cells=S)
  assert set(asg.init(jax.random.key(0), D)) == {"W_x", "W_h", "b"}  # no V
  assert att.initial_carry(params, (B,))._fields == ("h", "c")


@pytest.mark.parametrize("name", ["attention_lstm", "assignment_lstm"])
def test_bad_hyperparameters_are_named(name):
  with pytest.raises(ValueError, match=f"{name}: num_cells"):
    cells.make(name, hidden_size=3, num_cells=0)
  with pytest.raises(ValueError, match=f"{name}: hidden_size"):
    cells.make(name, hidden_size=-1, num_cells=2)
  with pytest.raises(ValueError, match="attention_lstm: mix"):
    cells.make("attention_lstm", hidden_size=3, num_cells=2, mix="weights")


@pytest.mark.parametrize("name, kw", [
    ("lstm", {}), ("attention_lstm", {"num_cells": 2}),
    ("assignment_lstm", {"num_cells": 2})])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "1", True,
                                 (1.0,), np.ones(3)])
def test_forget_bias_must_be_a_finite_real(name, kw, bad):
  """A NaN bias made every state NaN; a string or an array ran on one code
  path and failed on another."""
  with pytest.raises(ValueError, match=f"{name}: forget_bias must be a "
                     "finite number"):
    cells.make(name, hidden_size=3, forget_bias=bad, **kw)
  for good in (1, 1.5, np.float32(-2.0)):
    assert cells.make(name, hidden_size=3, forget_bias=good,
                      **kw).forget_bias == good


def test_bad_temperature_is_named():
  cell, params, xs = make("attention_lstm")
  for bad in (0.0, -1.0, float("inf")):
    with pytest.raises(ValueError, match="temperature must be finite and > 0"):
      sorjax.unroll(cell, params, xs, temperature=bad)
  with pytest.raises(ValueError, match="temperature must be a scalar or one"):
    cell.precompute(params, xs, temperature=jnp.ones((B, T + 1)))
  with pytest.raises(ValueError, match="input size 7"):
    sorjax.unroll(cell, params, jnp.zeros((B, T, D + 1)))


def test_bad_assignment_is_named():
  cell, params, xs = make("assignment_lstm")
  params.pop("V", None)
  with pytest.raises(ValueError, match="aux 'assignment' is required"):
    sorjax.unroll(cell, params, xs)
  with pytest.raises(ValueError, match=r"in \[0, 5\).*got values in \[5, 5\]"):
    sorjax.unroll(cell, params, xs, assignment=jnp.full((B, T), S))
  with pytest.raises(ValueError, match=r"in \[0, 5\).*got values in \[-1, 0\]"):
    sorjax.unroll(cell, params, xs,
                  assignment=jnp.zeros((B, T), jnp.int32).at[0, 1].set(-1))
  with pytest.raises(ValueError, match="int cell indices"):
    sorjax.unroll(cell, params, xs, assignment=jnp.zeros((B, T)))
  with pytest.raises(ValueError, match="one index per token"):
    cell.precompute(params, xs, assignment=jnp.zeros((B, T + 1), jnp.int32))


def test_out_of_range_assignment_under_jit_is_nan_not_silent():
  cell, params, xs = make("assignment_lstm")
  params.pop("V", None)
  a = jnp.zeros((B, T), jnp.int32).at[1, 2].set(S)
  _, ys = jax.jit(lambda a: sorjax.unroll(cell, params, xs, assignment=a))(a)
  assert np.isfinite(ys[0]).all() and np.isfinite(ys[1, :2]).all()
  assert np.isnan(ys[1, 2:]).all()
