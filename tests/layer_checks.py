"""Checks shared by the tests of the cell-specific layer primitives
(`sorjax.fused_mm_rnn`, `sorjax.fused_attention_lstm`, `sorjax.fused_mlstm`,
`sorjax.fused_gru`, `sorjax.fused_rnn`, `sorjax.fused_tensor_rnn`): each
runs a cell through `sorjax.unroll` on its fused path."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from tests.cells.reference import random_params, run_numpy


def assert_bfloat16_grads_close(cell, params, xs, G):
  """bfloat16 params and inputs: the weight sums accumulate in float32, so
  every gradient stays within bfloat16 rounding of the float32 one (and
  keeps the params' dtype). The casts are made in the compiled programs
  (eagerly, each shape's cast compiled a program of its own)."""
  grads = {}
  for dt in (jnp.float32, jnp.bfloat16):
    def grad(params, xs, dt=dt):
      f = lambda p: jnp.sum(  # noqa: E731
          sorjax.unroll(cell, p, xs.astype(dt), fused_grad=True)[1]
          .astype(jnp.float32) * G)
      return jax.grad(f)(jax.tree_util.tree_map(lambda a: a.astype(dt),
                                                params))
    grads[dt] = jax.jit(grad)(params, xs)
    assert all(a.dtype == dt for a in jax.tree_util.tree_leaves(grads[dt]))
  for k in params:
    a = np.asarray(grads[jnp.bfloat16][k], np.float32)
    b = np.asarray(grads[jnp.float32][k])
    assert np.abs(a - b).max() <= 0.05 * np.abs(b).max() + 1e-3, k


def assert_vmap_equals_each_replica(cell, input_size, xs, G):
  """Gradients of two vmapped replicas equal each replica's own. The
  replicas' params are `random_params` of two seeds (biases off zero;
  nothing compiles, where an eager vmap of `cell.init` compiled every
  random draw's shape), sliced in NumPy."""
  replicas = [random_params(cell, input_size, seed) for seed in (9, 10)]
  ps = jax.tree_util.tree_map(lambda *a: jnp.asarray(np.stack(a)), *replicas)
  f = lambda p: jnp.sum(sorjax.unroll(cell, p, xs, fused_grad=True)[1] * G)  # noqa: E731
  # compiled, as a training loop runs them (eager took 1.5x as long here)
  g = jax.tree_util.tree_map(np.asarray, jax.jit(jax.vmap(jax.grad(f)))(ps))
  grad = jax.jit(jax.grad(f))
  for r in range(2):
    one = grad(replicas[r])
    for k in one:
      np.testing.assert_allclose(g[k][r], one[k], rtol=1e-5, atol=1e-6)


def train_step_temp_bytes(cell, params, xs, G, fused_grad=True):
  """XLA's temporary bytes of the compiled forward + backward (to params
  and xs) of `sorjax.unroll(..., fused_grad=fused_grad)`."""
  def step(p, x):
    _, pull = jax.vjp(lambda p, x: sorjax.unroll(
        cell, p, x, fused_grad=fused_grad)[1], p, x)
    return pull(G)
  return jax.jit(step).lower(params, xs).compile().memory_analysis(
      ).temp_size_in_bytes


def assert_bias_in_map_equals_bias_in_gx(loss, b, gx):
  """loss(b, gx) -> (a scalar, ys) runs a layer given b (added inside its
  map) over gx, or with b None over gx holding it. Over gx - b with b
  given it computes what it computes over gx (values, and gx's gradient),
  and b's gradient is the sum of gx's over all steps."""
  (_, ys_map), (db, dgx0) = jax.value_and_grad(loss, (0, 1), has_aux=True)(
      b, gx - b[None, None])
  (_, ys_gx), dgx = jax.value_and_grad(lambda gx: loss(None, gx),
                                       has_aux=True)(gx)
  np.testing.assert_allclose(ys_map, ys_gx, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(dgx0, dgx, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(db, jnp.sum(dgx, axis=(0, 1)), rtol=1e-5,
                             atol=1e-6)


def adds_to_hoisted_product(cell, params, xs, rows, width):
  """The elementwise adds of [rows, width] elements (the hoisted product's
  size, a bias added to it) among the top-level fusions of the compiled
  training step of `sorjax.unroll(..., fused_grad=True)` (XLA:CPU's
  optimized HLO)."""
  def step(p, x):
    return jax.grad(lambda p: jnp.sum(sorjax.unroll(
        cell, p, x, fused_grad=True)[1]))(p)
  hlo = jax.jit(step).lower(params, xs).compile().as_text()
  entry = hlo[hlo.index("\nENTRY"):]
  found = []
  for line in entry.splitlines():
    m = re.search(r"= \w+\[([\d,]*)\]\S* fusion\(.*kind=kLoop.*"
                  r'op_name="[^"]*/add"', line)
    if m and math.prod(map(int, m.group(1).split(","))) == rows * width:
      found.append(line.strip())
  return found


def option_cases(unroll, lengths):
  """(unroll, reverse, lengths) for `assert_every_gradient_matches_autodiff`:
  each option alone, and all three together. Every pair of the options'
  values occurs (an orthogonal array of strength 2) in half the eight
  combinations."""
  return [(None, False, lengths), (None, True, None), (unroll, False, None),
          (unroll, True, lengths)]


def assert_every_gradient_matches_autodiff(cell, params, xs, carry, G, **kw):
  """Through `sorjax.unroll`'s fused path (kw: lengths, reverse, unroll):
  the gradients to every parameter, the inputs and the initial carry, of
  a loss on the outputs and the final carry, equal JAX's VJP of the plain
  scan (fused_grad=False); the values too."""
  ws = [jnp.asarray(np.random.default_rng(20 + n).standard_normal(a.shape),
                    a.dtype) for n, a in enumerate(carry)]

  def loss(fused_grad):
    def f(params, xs, carry):
      c, ys = sorjax.unroll(cell, params, xs, carry, fused_grad=fused_grad,
                            **kw)
      return jnp.sum(ys * G) + sum(jnp.sum(a * w) for a, w in zip(c, ws))
    return f

  # Each loss and its gradients in one compiled program: eagerly, the
  # forward compiled again on its own and autodiff's backward ran op by op
  # (one mm_lstm case: 37.6 -> 29.6 s, measured on a loaded machine).
  (v_new, g_new), (v_ref, g_ref) = (
      jax.jit(jax.value_and_grad(loss(f), (0, 1, 2)))(params, xs, carry)
      for f in (True, False))
  np.testing.assert_allclose(v_new, v_ref, rtol=1e-5)
  g_ref = dict(jax.tree_util.tree_leaves_with_path(g_ref))
  for path, a in jax.tree_util.tree_leaves_with_path(g_new):
    np.testing.assert_allclose(a, g_ref[path], rtol=2e-5, atol=2e-6,
                               err_msg=jax.tree_util.keystr(path))


# (hidden size, unroll options, whether the cell's own layer runs): the
# fused path (fused_grad=True, or None from H = 128), hoisted, without remat.
ROUTES = [
    (128, {}, True), (16, dict(fused_grad=True), True),
    (16, {}, False), (128, dict(fused_grad=False), False),
    (128, dict(hoist=False), False), (128, dict(remat=True), False),
    (128, dict(remat="dots"), False)]


def assert_unroll_routes_through(module, cell, params, xs, opts, expected,
                                 monkeypatch, **aux):
  """`sorjax.unroll(cell, params, xs, **opts, **aux)` runs
  `module.run_layer` exactly when `expected`, and returns what the plain
  scan does."""
  calls = []
  real = module.run_layer
  monkeypatch.setattr(module, "run_layer",
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  _, ys = sorjax.unroll(cell, params, xs, **opts, **aux)
  assert bool(calls) == expected
  _, ref = sorjax.unroll(cell, params, xs, fused_grad=False, **aux)
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-6)


def temp_bytes_vs_generic(module, cell, params, xs, G, monkeypatch):
  """(the training step's temporary bytes on `module`'s layer, the same
  on the generic fused scan, with `module.layer_args` switched off)."""
  ours = train_step_temp_bytes(cell, params, xs, G)
  monkeypatch.setattr(module, "layer_args", lambda cell, params: None)
  return ours, train_step_temp_bytes(cell, params, xs, G)


def assert_each_example_runs_its_length(ys, carry, state0, lengths,
                                        numpy_step, xs):
  """A layer's outputs ys [B, T, H] and final carry, run over xs [B, T, D]
  from the initial state state0 (the carry's arrays, each [B, .]) with
  `lengths`: example b's outputs are those of the NumPy loop
  `numpy_step(state, x_t)` (state: one array, or a tuple for two or more)
  over its first lengths[b] steps, zeros after, and its carry is the
  loop's last state (state0 itself when lengths[b] = 0)."""
  x64 = np.asarray(xs, np.float64)
  for b, L in enumerate(lengths):
    np.testing.assert_array_equal(ys[b, L:], 0)
    if L == 0:  # no step
      for got, s0 in zip(carry, state0):
        np.testing.assert_array_equal(got[b], s0[b])
      continue
    start = tuple(np.asarray(s0[b:b + 1], np.float64) for s0 in state0)
    final, ref = run_numpy(numpy_step, start[0] if len(start) == 1 else start,
                           x64[b:b + 1, :L])
    assert np.abs(ref).max() > 0.05  # not a trivially small run
    np.testing.assert_allclose(ys[b, :L], ref[0], rtol=1e-5, atol=1e-6)
    final = (final,) if len(start) == 1 else final
    for got, want in zip(carry, final):
      np.testing.assert_allclose(got[b], want[0], rtol=1e-5, atol=1e-6)


def assert_rejects_lengths_steps_unroll(run, run_without_steps, B):
  """The argument errors every layer shares: `run(**kw)` calls the layer
  with valid arguments plus kw, `run_without_steps()` with T = 0 inputs."""
  with pytest.raises(ValueError,
                     match=rf"lengths must have shape \[B\] = \[{B}\]"):
    run(lengths=jnp.arange(1, B))
  with pytest.raises(ValueError, match="no time steps"):
    run_without_steps()
  with pytest.raises(ValueError, match="unroll must be None or an int "
                     ">= 1"):
    run(unroll=0)
