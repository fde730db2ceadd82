"""Helpers for the naive per-family references (NumPy, float64, for-loops)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np


def sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def np_params(params):
  """Cell params as float64 NumPy arrays (nested dicts/tuples kept)."""
  if isinstance(params, dict):
    return {k: np_params(v) for k, v in params.items()}
  if isinstance(params, (tuple, list)):
    return type(params)(np_params(v) for v in params)
  return np.asarray(params, np.float64)


def run_numpy(step, h0, xs):
  """Loops a NumPy step(state, x_t) -> (state, y_t) over xs [B, T, D]."""
  state, ys = h0, []
  for t in range(xs.shape[1]):
    state, y = step(state, xs[:, t])
    ys.append(y)
  return state, np.stack(ys, 1)


def iter_eqns(jaxpr):
  """Every equation of a jaxpr, sub-jaxprs (scan bodies, remat, pjit,
  custom_vjp calls) included."""
  from jax.extend import core as jcore
  for eqn in jaxpr.eqns:
    yield eqn
    for p in eqn.params.values():
      for sub in (p if isinstance(p, (tuple, list)) else (p,)):
        if isinstance(sub, jcore.ClosedJaxpr):
          yield from iter_eqns(sub.jaxpr)
        elif isinstance(sub, jcore.Jaxpr):
          yield from iter_eqns(sub)


def intermediate_shapes(fn, *args):
  """Shapes of every value a traced computation creates, sub-jaxprs
  (scan bodies, remat, pjit) included."""
  import jax
  return [tuple(v.aval.shape)
          for eqn in iter_eqns(jax.make_jaxpr(fn)(*args).jaxpr)
          for v in eqn.outvars if hasattr(v.aval, "shape")]


def assert_no_bhh(fn, args, B, H):
  """Fails if fn (forward or backward) builds an array holding a [B, H, H]
  block, i.e. a per-example hidden-to-hidden matrix. Pick B != H and keep
  every other size (D, M, K, T) different from both."""
  bad = [s for s in intermediate_shapes(fn, *args)
         if B in s and list(s).count(H) >= 2]
  assert not bad, f"per-example [B={B}, H={H}, H] arrays built: {bad}"


def random_params(cell, D, seed):
  """Uniform(+-1/sqrt(H)) values, biases included, in the shapes `cell.init`
  declares (read with eval_shape: no per-shape RNG compiles in the tests)."""
  shapes = jax.eval_shape(functools.partial(cell.init, input_size=D),
                          jax.random.key(0))
  rng = np.random.default_rng(seed)
  s = 1.0 / np.sqrt(cell.hidden_size)
  return {k: jnp.asarray(rng.uniform(-s, s, v.shape), v.dtype)
          for k, v in shapes.items()}


def normal(seed, shape, scale=1.0):
  return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(
      shape), jnp.float32)


def unroll_run(cell):
  """`sorjax.unroll` of `cell` as run(params, xs) -> (final carry as a
  tuple, ys), the form of the materialised references."""
  import sorjax

  def run(p, x):
    carry, ys = sorjax.unroll(cell, p, x)
    return tuple(carry), ys
  return run


def value_and_grads(run, params, xs, w):
  """L = sum(ys * w) + sum over the final carry's arrays of sum(sin(c)),
  and its gradients in (params, xs); run(params, xs) -> (carry, ys)."""
  def loss(p, x):
    carry, ys = run(p, x)
    return jnp.sum(ys * w) + sum(jnp.sum(jnp.sin(c)) for c in carry)
  return jax.value_and_grad(loss, argnums=(0, 1))(params, xs)


def assert_matches_reference(cell, params, reference, xs, w, tol=1e-5):
  """sorjax.unroll of `cell` equals `reference` (a materialised loop of
  the paper's equations, run(params, xs) -> (carry, ys)) in
  `value_and_grads`: the loss and every gradient."""
  l1, g1 = jax.jit(lambda p, x: value_and_grads(unroll_run(cell), p, x, w))(
      params, xs)
  l2, g2 = jax.jit(lambda p, x: value_and_grads(reference, p, x, w))(
      params, xs)
  np.testing.assert_allclose(l1, l2, rtol=tol, atol=tol)
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=tol, atol=tol),
      g1, g2)


def assert_init_in_dtype(cell, D, dtype=jnp.bfloat16):
  """`cell.init(..., dtype=dtype)` gives every parameter, and
  `cell.initial_carry` of those parameters every carry array, in dtype."""
  p = jax.eval_shape(functools.partial(cell.init, input_size=D, dtype=dtype),
                     jax.random.key(0))
  assert {v.dtype for v in p.values()} == {jnp.dtype(dtype)}
  assert {a.dtype for a in cell.initial_carry(p, (2,))} == {jnp.dtype(dtype)}
