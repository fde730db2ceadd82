"""Checks shared by the tests of the cell-specific layer primitives
(`sorjax.fused_mm_rnn`, `sorjax.fused_attention_lstm`): each runs a cell
through `sorjax.unroll` on its fused path."""

import jax
import jax.numpy as jnp
import numpy as np

import sorjax


def assert_bfloat16_grads_close(cell, params, xs, G):
  """bfloat16 params and inputs: the weight sums accumulate in float32, so
  every gradient stays within bfloat16 rounding of the float32 one (and
  keeps the params' dtype)."""
  grads = {}
  for dt in (jnp.float32, jnp.bfloat16):
    p = jax.tree_util.tree_map(lambda a: a.astype(dt), params)
    f = lambda p: jnp.sum(  # noqa: E731
        sorjax.unroll(cell, p, xs.astype(dt), fused_grad=True)[1]
        .astype(jnp.float32) * G)
    grads[dt] = jax.grad(f)(p)
    assert all(a.dtype == dt for a in jax.tree_util.tree_leaves(grads[dt]))
  for k in params:
    a = np.asarray(grads[jnp.bfloat16][k], np.float32)
    b = np.asarray(grads[jnp.float32][k])
    assert np.abs(a - b).max() <= 0.05 * np.abs(b).max() + 1e-3, k


def assert_vmap_equals_each_replica(cell, input_size, xs, G):
  """Gradients of two vmapped replicas equal each replica's own."""
  ps = jax.vmap(lambda k: cell.init(k, input_size))(
      jax.random.split(jax.random.key(9), 2))
  f = lambda p: jnp.sum(sorjax.unroll(cell, p, xs, fused_grad=True)[1] * G)  # noqa: E731
  g = jax.vmap(jax.grad(f))(ps)
  for r in range(2):
    one = jax.grad(f)(jax.tree_util.tree_map(lambda a: a[r], ps))
    for k in one:
      np.testing.assert_allclose(g[k][r], one[k], rtol=1e-5, atol=1e-6)


def train_step_temp_bytes(cell, params, xs, G):
  """XLA's temporary bytes of the compiled forward + backward (to params
  and xs) of `sorjax.unroll(..., fused_grad=True)`."""
  def step(p, x):
    _, pull = jax.vjp(lambda p, x: sorjax.unroll(cell, p, x,
                                                 fused_grad=True)[1], p, x)
    return pull(G)
  return jax.jit(step).lower(params, xs).compile().memory_analysis(
      ).temp_size_in_bytes
