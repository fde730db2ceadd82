"""mm_lstm against a NumPy loop of Renganathan & Singh eq. 9-22 in the
paper's column form, and a JAX reference that materialises every gate's
W_hh(t) per example."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from tests.cells.reference import (assert_init_in_dtype,
                                   assert_matches_reference, assert_no_bhh,
                                   normal, np_params, random_params, sigmoid,
                                   unroll_run, value_and_grads)

GATES = ("c", "i", "f", "o")


def make(H=4, D=2, num_matrices=(4, 4, 2, 2), seed=0):
  cell = sorjax.cells.make("mm_lstm", hidden_size=H,
                           num_matrices=num_matrices)
  return cell, random_params(cell, D, seed)


def softmax(z):
  e = np.exp(z - z.max())
  return e / e.sum()


def numpy_mm_lstm(p, xs):
  """Eq. 9-22, one example at a time, column vectors, W_g^hh(t) built.
  Returns final (h, c, {g: v_g}), ys, and every key {g: [B, T, K_g]}."""
  B, T, _ = xs.shape
  H = p["W_c"].shape[1]
  K = {g: p[f"W_{g}"].shape[0] for g in GATES}
  Wk = {g: [p[f"W_{g}"][k].T for k in range(K[g])] for g in GATES}
  Whx = {g: p[f"W_{g}_hx"].T for g in GATES}
  Wproj = {g: p[f"W_{g}_proj"].T for g in GATES}
  ys = np.zeros((B, T, H))
  keys = {g: np.zeros((B, T, K[g])) for g in GATES}
  final = []
  for b in range(B):
    h, c = np.zeros(H), np.zeros(H)
    v = {g: np.full(K[g], 1.0 / K[g]) for g in GATES}
    for t in range(T):
      x = xs[b, t]
      pre = {}
      for g in GATES:
        v[g] = softmax(Wproj[g] @ np.concatenate([v[g], h, x]))  # eq. 9-15
        Whh = sum(v[g][k] * Wk[g][k] for k in range(K[g]))      # eq. 10-16
        pre[g] = Whh @ h + Whx[g] @ x + p[f"b_{g}"]
        keys[g][b, t] = v[g]
      i, f, o = sigmoid(pre["i"]), sigmoid(pre["f"]), sigmoid(pre["o"])
      c_hat = np.tanh(pre["c"])                                  # eq. 17-20
      c = f * c + i * c_hat                                      # eq. 21
      h = o * np.tanh(c)                                         # eq. 22
      ys[b, t] = h
    final.append((h, c, dict(v)))
  return final, ys, keys


@pytest.mark.parametrize("num_matrices", [(4, 4, 2, 2), (1, 3, 2, 5)])
def test_matches_numpy_loop_of_eq_9_to_22(num_matrices):
  cell, params = make(num_matrices=num_matrices)
  xs = normal(5, (2, 5, 2))
  carry, ys = jax.device_get(
      jax.jit(lambda p, x: sorjax.unroll(cell, p, x))(params, xs))
  final, ref, _ = numpy_mm_lstm(np_params(params), np.asarray(xs, np.float64))
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-6)
  for b, (h, c, v) in enumerate(final):
    np.testing.assert_allclose(carry.h[b], h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(carry.c[b], c, rtol=1e-5, atol=1e-6)
    for g in GATES:
      np.testing.assert_allclose(getattr(carry, f"v_{g}")[b], v[g],
                                 rtol=1e-5, atol=1e-6)


def test_key_vectors_start_uniform_and_stay_probability_vectors():
  cell, params = make(num_matrices=(4, 3, 2, 5))
  for g in GATES:
    params[f"W_{g}_proj"] = 3.0 * params[f"W_{g}_proj"]  # peaked keys
  carry = cell.initial_carry(params, (2,))
  for g, K in zip(GATES, (4, 3, 2, 5)):
    np.testing.assert_array_equal(getattr(carry, f"v_{g}"),
                                  np.full((2, K), 1.0 / K, np.float32))
  xs = normal(5, (2, 6, 2), 2.0)
  step = jax.jit(lambda c, x: cell.step(params, c, cell.precompute(params, x)))
  traj = []
  for t in range(6):
    carry, _ = step(carry, xs[:, t])
    traj.append(carry)
  _, _, ref = numpy_mm_lstm(np_params(params), np.asarray(xs, np.float64))
  for g in GATES:
    vs = np.stack([getattr(c, f"v_{g}") for c in traj], 1)
    assert (vs >= 0).all()
    np.testing.assert_allclose(vs.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(vs, ref[g], rtol=1e-5, atol=1e-6)
    assert np.abs(vs - vs[:, :1]).max() > 0.01  # the keys do move


def materialised_unroll(p, xs):
  """Eq. 9-22 building every gate's W_g_hh(t) [B, H, H] per example."""
  B = xs.shape[0]
  H = p["W_c"].shape[1]

  def step(carry, x):
    h, c, *vs = carry
    new_v, pre = [], {}
    for g, v in zip(GATES, vs):
      v = jax.nn.softmax(jnp.concatenate([v, h, x], -1) @ p[f"W_{g}_proj"], -1)
      Whh = jnp.einsum("bk,kij->bij", v, p[f"W_{g}"])
      pre[g] = (jnp.einsum("bi,bij->bj", h, Whh) + x @ p[f"W_{g}_hx"]
                + p[f"b_{g}"][None])
      new_v.append(v)
    i, f, o = (jax.nn.sigmoid(pre[g]) for g in "ifo")
    c = f * c + i * jnp.tanh(pre["c"])
    h = o * jnp.tanh(c)
    return (h, c, *new_v), h
  z = jnp.zeros((B, H))
  init = (z, z) + tuple(jnp.full((B, p[f"W_{g}"].shape[0]),
                                 1.0 / p[f"W_{g}"].shape[0]) for g in GATES)
  carry, ys = jax.lax.scan(step, init, jnp.swapaxes(xs, 0, 1))
  return carry, jnp.swapaxes(ys, 0, 1)


def test_equals_materialised_reference_values_and_gradients():
  cell, params = make()
  xs = normal(5, (2, 5, 2))
  w = normal(6, (2, 5, 4))
  assert_matches_reference(cell, params, materialised_unroll, xs, w)


def test_no_per_example_transition_forward_or_backward():
  B, T, H, D = 3, 6, 7, 2
  cell, params = make(H=H, D=D)
  xs = normal(1, (B, T, D))
  w = jnp.ones((B, T, H))
  assert_no_bhh(lambda p, x: value_and_grads(unroll_run(cell), p, x, w),
                (params, xs), B, H)
  with pytest.raises(AssertionError, match="per-example"):  # the check bites
    assert_no_bhh(lambda p, x: value_and_grads(materialised_unroll, p, x, w),
                  (params, xs), B, H)


def test_one_fused_recurrent_matmul_per_step():
  """The scan body of the forward pass holds exactly one matmul with h that
  produces every gate's sum_g K_g*H + sum_g K_g columns."""
  H, D = 7, 2
  cell, params = make(H=H, D=D)
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
  assert [tuple(e.outvars[0].aval.shape) for e in dots] == [(3, 12 * H + 12)]


def test_defaults_param_names_and_shapes():
  D = 2
  cell, params = make(H=4, D=D)
  # eq. 10, 12, 14, 16: c and i mix 4 matrices, f and o 2 ("T" in eq. 16 is 2)
  assert cell.num_matrices == (4, 4, 2, 2)
  expected = {}
  for g, K in zip(GATES, (4, 4, 2, 2)):
    expected |= {f"W_{g}": (K, 4, 4), f"W_{g}_hx": (2, 4),
                 f"W_{g}_proj": (K + 4 + 2, K), f"b_{g}": (4,)}
  assert {k: v.shape for k, v in params.items()} == expected
  carry = cell.initial_carry(params, (3,))
  assert carry._fields == ("h", "c", "v_c", "v_i", "v_f", "v_o")
  assert [a.shape for a in carry] == [(3, 4), (3, 4), (3, 4), (3, 4), (3, 2),
                                      (3, 2)]
  assert_init_in_dtype(cell, D)


def test_dict_and_tuple_give_the_same_hashable_cell():
  a = sorjax.cells.make("mm_lstm", hidden_size=3,
                        num_matrices={"o": 5, "f": 2, "i": 3, "c": 1})
  b = sorjax.cells.make("mm_lstm", hidden_size=3, num_matrices=[1, 3, 2, 5])
  assert a.num_matrices == (1, 3, 2, 5) and a == b and hash(a) == hash(b)


@pytest.mark.parametrize("num_matrices,match", [
    ({"c": 4, "i": 4, "f": 2}, r"missing \['o'\]"),
    ({"c": 4, "i": 4, "f": 2, "o": 2, "g": 1}, r"unknown \['g'\]"),
    ((4, 4, 2), "4 counts .* got 3"),
    (4, "dict over the gates"),
    ((4, 0, 2, 2), r"num_matrices\['i'\] must be an int >= 1"),
    ({"c": 4, "i": 4, "f": -2, "o": 2}, r"num_matrices\['f'\]"),
    ((4, 4, 2, 2.0), r"num_matrices\['o'\]"),
])
def test_bad_num_matrices_are_named(num_matrices, match):
  with pytest.raises(ValueError, match="mm_lstm: .*" + match):
    sorjax.cells.make("mm_lstm", hidden_size=2, num_matrices=num_matrices)


def test_bad_hidden_size_and_input_size_are_named():
  with pytest.raises(ValueError, match="mm_lstm: hidden_size"):
    sorjax.cells.make("mm_lstm", hidden_size=0)
  cell, params = make(D=2)
  with pytest.raises(ValueError, match="mm_lstm: .*input size 2.*last axis 3"):
    sorjax.unroll(cell, params, jnp.zeros((2, 5, 3)))
