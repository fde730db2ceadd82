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
