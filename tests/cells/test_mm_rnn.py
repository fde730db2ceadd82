"""mm_rnn against a NumPy loop of Renganathan & Singh eq. 6-8 in the paper's
column form, and a JAX reference that materialises W_hh(t) per example."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from tests.cells.reference import (assert_init_in_dtype,
                                   assert_matches_reference, assert_no_bhh,
                                   normal, np_params, random_params,
                                   unroll_run, value_and_grads)


def make(H=4, K=3, D=2, seed=0):
  cell = sorjax.cells.make("mm_rnn", hidden_size=H, num_matrices=K)
  return cell, random_params(cell, D, seed)


def softmax(z):
  e = np.exp(z - z.max())
  return e / e.sum()


def numpy_mm_rnn(p, xs):
  """Eq. 6-8, one example at a time, column vectors, W_hh(t) built:
  v = softmax(W^proj [v; h; x]); W^hh = sum_k v[k] W[k]; h = tanh(W^hh h +
  W^hx x + b). Returns final h, final v, ys, and every v_t [B, T, K]."""
  B, T, _ = xs.shape
  K, H, _ = p["W"].shape
  Wk = [p["W"][k].T for k in range(K)]   # column form of the choice matrices
  Whx, Wproj = p["W_hx"].T, p["W_proj"].T  # [H, D], [K, K+H+D]
  ys, vs = np.zeros((B, T, H)), np.zeros((B, T, K))
  hs, vfin = [], []
  for b in range(B):
    h, v = np.zeros(H), np.full(K, 1.0 / K)
    for t in range(T):
      x = xs[b, t]
      v = softmax(Wproj @ np.concatenate([v, h, x]))       # eq. 6
      Whh = sum(v[k] * Wk[k] for k in range(K))            # eq. 7
      h = np.tanh(Whh @ h + Whx @ x + p["b"])              # eq. 8
      ys[b, t], vs[b, t] = h, v
    hs.append(h)
    vfin.append(v)
  return np.stack(hs), np.stack(vfin), ys, vs


def test_matches_numpy_loop_of_eq_6_to_8():
  cell, params = make()
  xs = normal(5, (2, 6, 2))
  carry, ys = jax.jit(lambda p, x: sorjax.unroll(cell, p, x))(params, xs)
  h, v, ref, _ = numpy_mm_rnn(np_params(params), np.asarray(xs, np.float64))
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(carry.h, h, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(carry.v, v, rtol=1e-5, atol=1e-6)


def test_key_vector_starts_uniform_and_stays_a_probability_vector():
  cell, params = make(K=5)
  params["W_proj"] = 3.0 * params["W_proj"]  # peaked keys
  carry = cell.initial_carry(params, (2,))
  np.testing.assert_array_equal(carry.v, np.full((2, 5), 0.2, np.float32))
  xs = normal(5, (2, 7, 2), 2.0)
  step = jax.jit(lambda c, x: cell.step(params, c, cell.precompute(params, x)))
  vs = []
  for t in range(7):
    carry, _ = step(carry, xs[:, t])
    vs.append(carry.v)
  vs = np.stack(vs, 1)
  assert (vs >= 0).all()
  np.testing.assert_allclose(vs.sum(-1), 1.0, rtol=1e-6)
  _, _, _, ref = numpy_mm_rnn(np_params(params), np.asarray(xs, np.float64))
  np.testing.assert_allclose(vs, ref, rtol=1e-5, atol=1e-6)
  assert np.abs(vs - 0.2).max() > 0.05  # the keys do move


def test_constant_keys_pick_or_average_the_choice_matrices():
  """Hand-checkable special cases: W_proj = 0 keeps v = 1/K, so the cell is
  an Elman RNN with the mean matrix; a huge logit on one input picks W[j]."""
  H, K = 3, 4
  cell, params = make(H=H, K=K, D=2)
  xs = normal(5, (2, 5, 2))
  p = np_params(params)

  def elman(W, xs):
    h, ys = np.zeros((2, H)), []
    for t in range(xs.shape[1]):
      h = np.tanh(h @ W + xs[:, t] @ p["W_hx"] + p["b"])
      ys.append(h)
    return np.stack(ys, 1)
  run = jax.jit(lambda p, x: sorjax.unroll(cell, p, x)[1])
  params["W_proj"] = jnp.zeros_like(params["W_proj"])
  ys = run(params, xs)
  np.testing.assert_allclose(ys, elman(p["W"].mean(0), np.asarray(xs)),
                             rtol=1e-5, atol=1e-6)
  j = 2
  xs1 = xs.at[..., 0].set(1.0)  # input 0 is a constant 1 ...
  params["W_proj"] = params["W_proj"].at[K + H + 0, j].set(100.0)  # ... -> j
  ys = run(params, xs1)
  np.testing.assert_allclose(ys, elman(p["W"][j], np.asarray(xs1)),
                             rtol=1e-5, atol=1e-6)


def materialised_unroll(p, xs):
  """Eq. 6-8 building W_hh(t) [B, H, H] for every example and step."""
  B = xs.shape[0]
  K, H, _ = p["W"].shape

  def step(carry, x):
    h, v = carry
    v = jax.nn.softmax(jnp.concatenate([v, h, x], -1) @ p["W_proj"], -1)
    Whh = jnp.einsum("bk,kij->bij", v, p["W"])
    h = jnp.tanh(jnp.einsum("bi,bij->bj", h, Whh) + x @ p["W_hx"]
                 + p["b"][None])
    return (h, v), h
  init = (jnp.zeros((B, H)), jnp.full((B, K), 1.0 / K))
  (h, v), ys = jax.lax.scan(step, init, jnp.swapaxes(xs, 0, 1))
  return (h, v), jnp.swapaxes(ys, 0, 1)


def test_equals_materialised_reference_values_and_gradients():
  cell, params = make()
  xs = normal(5, (2, 5, 2))
  w = normal(6, (2, 5, 4))
  assert_matches_reference(cell, params, materialised_unroll, xs, w)


def test_no_per_example_transition_forward_or_backward():
  B, T, H, D, K = 3, 6, 7, 2, 4
  cell, params = make(H=H, K=K, D=D)
  xs = normal(1, (B, T, D))
  w = jnp.ones((B, T, H))
  assert_no_bhh(lambda p, x: value_and_grads(unroll_run(cell), p, x, w),
                (params, xs), B, H)
  with pytest.raises(AssertionError, match="per-example"):  # the check bites
    assert_no_bhh(lambda p, x: value_and_grads(materialised_unroll, p, x, w),
                  (params, xs), B, H)


def test_one_fused_recurrent_matmul_per_step():
  """The forward scan body multiplies h_{t-1} once, by [W[1] | .. | W[K] |
  W_proj's h rows], serving eq. 6 and eq. 8."""
  H, K, D = 7, 4, 2
  cell, params = make(H=H, K=K, D=D)
  jaxpr = jax.make_jaxpr(lambda p, x: sorjax.unroll(cell, p, x))(
      params, jnp.zeros((3, 6, D)))
  eqns = list(jaxpr.jaxpr.eqns)
  for e in jaxpr.jaxpr.eqns:  # unroll's fused_grad scan is in a custom_vjp
    if "call_jaxpr" in e.params:
      eqns += e.params["call_jaxpr"].jaxpr.eqns
  scan = next(e for e in eqns if e.primitive.name == "scan")
  dots = [e for e in scan.params["jaxpr"].jaxpr.eqns
          if e.primitive.name == "dot_general"
          and tuple(e.invars[0].aval.shape) == (3, H)]
  assert [tuple(e.outvars[0].aval.shape) for e in dots] == [(3, K * H + K)]


def test_param_names_shapes_and_carry():
  D = 2
  cell, params = make(H=4, K=3, D=D)
  assert {k: v.shape for k, v in params.items()} == {
      "W": (3, 4, 4), "W_hx": (2, 4), "W_proj": (3 + 4 + 2, 3), "b": (4,)}
  carry = cell.initial_carry(params, (5,))
  assert carry._fields == ("h", "v")
  assert carry.h.shape == (5, 4) and carry.v.shape == (5, 3)
  assert_init_in_dtype(cell, D)
  assert sorjax.cells.make("mm_rnn", hidden_size=2).num_matrices == 4


@pytest.mark.parametrize("kwargs,match", [
    (dict(hidden_size=0), "mm_rnn: hidden_size"),
    (dict(hidden_size=2, num_matrices=0), "mm_rnn: num_matrices"),
    (dict(hidden_size=2, num_matrices=-1), "mm_rnn: num_matrices"),
    (dict(hidden_size=2, num_matrices=2.0), "mm_rnn: num_matrices"),
    (dict(hidden_size=2, num_matrices=True), "mm_rnn: num_matrices"),
])
def test_bad_hyperparameters_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    sorjax.cells.make("mm_rnn", **kwargs)


def test_wrong_input_size_is_named():
  cell, params = make(D=2)
  with pytest.raises(ValueError, match="mm_rnn: .*input size 2.*last axis 3"):
    sorjax.unroll(cell, params, jnp.zeros((2, 5, 3)))
