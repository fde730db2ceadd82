"""The protocol grid: every sequence cell x every property of `unroll`.

References are independent of the scan: a Python loop of `step`, a loop over
examples, a truncated sequence, finite differences.

Slices of inputs and outputs are taken in NumPy (`cut`): each eager jnp
slice of a new shape or index compiles a program of its own, which was
much of these tiny tests' time.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import sorjax
from sorjax import cells
from tests.cells.configs import SMALL
from tests.cells.reference import random_params

B, T = 3, 6


def test_registry_lists_every_cell():
  expected = {"rnn", "lstm", "gru", "tensor_rnn", "general2", "mrnn",
              "mi_rnn", "mlstm", "attention_lstm", "assignment_lstm",
              "mm_rnn", "mm_lstm", "dyck_rnn", "mts_lstm", "tree_rnn",
              "tree_lstm"}
  assert set(cells.names()) == expected
  assert set(SMALL) == set(cells.sequence_names())


def test_unknown_cell_and_bad_hyperparameter_are_named():
  with pytest.raises(ValueError, match="unknown cell 'mrn'"):
    cells.make("mrn", hidden_size=3)
  with pytest.raises(TypeError, match=re.escape(
      "cell 'rnn' has no hyperparameter 'bogus' (it has ['activation', "
      "'hidden_size'])")):
    cells.make("rnn", hidden_size=3, bogus=1)
  with pytest.raises(ValueError, match="hidden_size"):
    cells.make("rnn", hidden_size=0)


def setup(name, dtype=jnp.float32, seed=0):
  kwargs, D, aux_fn = SMALL[name]
  cell = cells.make(name, **kwargs)
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  params = cell.init(k1, D, dtype)
  xs = jax.random.normal(k2, (B, T, D), dtype)
  aux = aux_fn(k3, B, T)
  return cell, params, xs, aux


def cut(a, index):
  """a[index], sliced in NumPy (no compile), as a jax array."""
  return jnp.asarray(np.asarray(a)[index])


def cut_aux(aux, index):
  """Per-token ([B, T]) aux sliced like xs[index]; scalars as they are."""
  return {k: (cut(v, index) if jnp.ndim(v) >= 2 else v)
          for k, v in aux.items()}


def aux_at(aux, b=None, t=None):
  """Slices per-token aux like xs[b, t]."""
  index = (slice(None) if b is None else b,
           slice(None) if t is None else t)
  return cut_aux(aux, index)


def precompute_shapes(cell, params, xs, aux):
  """The shapes and dtypes of cell.precompute(params, xs, **aux)."""
  return jax.eval_shape(lambda p, x, a: cell.precompute(p, x, **a), params,
                        xs, aux)


def loop_reference(cell, params, xs, aux, carry=None):
  """A plain Python loop of precompute+step over time (each jitted: one
  program apiece, not one per op)."""
  Bn, Tn, _ = xs.shape
  carry = cell.initial_carry(params, (Bn,)) if carry is None else carry
  ys = []
  pre = jax.jit(lambda p, x, a: cell.precompute(p, x, **a))
  step = jax.jit(cell.step)
  for t in range(Tn):
    xp = pre(params, cut(xs, np.s_[:, t]), aux_at(aux, t=t))
    carry, y = step(params, carry, xp)
    ys.append(np.asarray(y))
  return carry, np.stack(ys, 1)


def assert_tree_close(a, b, **tol):
  jax.tree_util.tree_map(
      lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y),
                                              **tol), a, b)


SEQ = sorted(SMALL)


@pytest.mark.parametrize("name", SEQ)
def test_scan_equals_python_loop(name):
  cell, params, xs, aux = setup(name)
  c1, y1 = jax.jit(lambda p, x: sorjax.unroll(cell, p, x, **aux))(params, xs)
  c2, y2 = loop_reference(cell, params, xs, aux)
  assert y1.shape == (B, T, cell.hidden_size)
  assert_tree_close(c1, c2, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", SEQ)
def test_step_refuses_the_input_terms_of_a_whole_sequence(name):
  """A whole sequence's xp, [B, T, ..] with T = B, broadcasts against the
  carry under JAX's default rank promotion into a [B, B, H] state: step
  names the mistake instead. The step checks shapes as it is traced: run
  on shapes alone (jax.eval_shape), nothing compiles."""
  cell, params, xs, aux = setup(name)
  carry = cell.initial_carry(params, (B,))
  must = (rf"{name}.step: xp must be one step's input terms "
          rf"\(cell.precompute\(params, xs\[:, t\]\)\), for the carry's "
          rf"batch shape \({B},\): the carry \(.h \({B}, ")
  for t in (B, T):  # T = B broadcasts silently; T != B fails, unnamed
    xp = precompute_shapes(cell, params, cut(xs, np.s_[:, :t]),
                           cut_aux(aux, np.s_[:, :t]))
    with jax.numpy_rank_promotion("allow"), pytest.raises(
        ValueError, match=must + (r".*\) became \(" if t == B else
                                  r".*\) do not combine \(")):
      jax.eval_shape(cell.step, params, carry, xp)
  new, y = jax.eval_shape(cell.step, params, carry, precompute_shapes(
      cell, params, cut(xs, np.s_[:, 0]), aux_at(aux, t=0)))
  assert y.shape == (B, cell.hidden_size)
  shapes = lambda c: jax.tree_util.tree_map(jnp.shape, c)  # noqa: E731
  assert shapes(new) == shapes(carry)


@pytest.mark.parametrize("name", SEQ)
def test_step_names_params_of_another_hidden_size(name):
  """One step's xp with params made for hidden_size + 2 (the step failed
  blaming xp); an int batch shape is (B,)."""
  cell, params, xs, aux = setup(name)
  kwargs, D, _ = SMALL[name]
  more = {"hidden_size": cell.hidden_size + 2}
  if name == "mts_lstm":  # one timescale per unit
    more["timescales"] = kwargs["timescales"] + (32.0, 64.0)
  big = cells.make(name, **{**kwargs, **more})
  wrong = random_params(big, D, 1)  # init's shapes; no RNG compiles
  carry = cell.initial_carry(params, B)
  assert jax.tree_util.tree_map(jnp.shape, carry) == jax.tree_util.tree_map(
      jnp.shape, cell.initial_carry(params, (B,)))
  with pytest.raises(ValueError, match="batch_shape must be a tuple of ints"):
    cell.initial_carry(params, (B, "2"))
  xp = precompute_shapes(big, wrong, cut(xs, np.s_[:, 0]),
                         aux_at(aux, t=0))
  if name == "dyck_rnn":  # its step reads no params: xp is what is wrong
    match = r"dyck_rnn.step: xp must be one step's input terms"
  else:
    match = (rf"{name}.step: params \(.*\) do not have the shapes "
             rf"{type(cell).__name__}.init makes for hidden_size "
             rf"{cell.hidden_size} at any input size")
  with jax.numpy_rank_promotion("allow"), pytest.raises(ValueError,
                                                        match=match):
    jax.eval_shape(cell.step, wrong, carry, xp)  # checked as it is traced


@pytest.mark.parametrize("name", SEQ)
@pytest.mark.parametrize("hoist,remat,unroll_n", [(False, False, 1),
                                                  (True, True, 3)])
def test_hoist_remat_unroll_do_not_change_results(name, hoist, remat,
                                                  unroll_n):
  cell, params, xs, aux = setup(name)
  ref = sorjax.unroll(cell, params, xs, **aux)
  out = sorjax.unroll(cell, params, xs, hoist=hoist, remat=remat,
                      unroll=unroll_n, **aux)
  assert_tree_close(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", SEQ)
def test_batched_equals_per_example(name):
  cell, params, xs, aux = setup(name)
  ys = np.asarray(sorjax.unroll(cell, params, xs, **aux)[1])
  for b in range(B):
    _, yb = sorjax.unroll(cell, params, cut(xs, np.s_[b:b + 1]),
                          **cut_aux(aux, np.s_[b:b + 1]))
    np.testing.assert_allclose(ys[b:b + 1], yb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", SEQ)
@pytest.mark.parametrize("reverse", [False, True])
def test_lengths_mask_equals_truncation(name, reverse):
  cell, params, xs, aux = setup(name)
  lengths = jnp.array([T, 2, 4])
  carry, ys = jax.tree_util.tree_map(np.asarray, sorjax.unroll(
      cell, params, xs, lengths=lengths, reverse=reverse, **aux))
  for b in range(B):
    L = int(lengths[b])
    index = np.s_[b:b + 1, :L]
    cb, yb = sorjax.unroll(cell, params, cut(xs, index), reverse=reverse,
                           **cut_aux(aux, index))
    np.testing.assert_allclose(ys[b, :L], yb[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ys[b, L:], 0.0)
    assert_tree_close(jax.tree_util.tree_map(lambda a: a[b], carry),
                      jax.tree_util.tree_map(lambda a: np.asarray(a)[0], cb),
                      rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", SEQ)
def test_vmap_over_unbatched_examples(name):
  cell, params, xs, aux = setup(name)
  _, ys = sorjax.unroll(cell, params, xs, **aux)
  per_token = {k: v for k, v in aux.items() if jnp.ndim(v) >= 2}
  scalars = {k: v for k, v in aux.items() if jnp.ndim(v) < 2}

  def one(x, a):  # one example [T, D]; per-token aux [T]
    _, y = sorjax.unroll(cell, params, x[None],
                         **{k: v[None] for k, v in a.items()}, **scalars)
    return y[0]
  yv = jax.jit(jax.vmap(one))(xs, per_token)
  np.testing.assert_allclose(ys, yv, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", SEQ)
def test_gradients_match_finite_differences(name):
  """The gradient to the params and inputs along a random direction v
  equals the loss's central difference (jax.test_util.check_grads's check,
  its step and tolerance) in float64. One compiled program gives the
  gradient and the two shifted losses: evaluated eagerly, every op of the
  forward and backward compiled on its own (most of the test's time)."""
  cell, params, xs, aux = setup(name)
  # float64 NumPy copies of the float32 draws: no float64 RNG programs.
  args = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64),
                                (params, xs))
  rng = np.random.default_rng(9)
  w = rng.standard_normal((B, T, cell.hidden_size))
  v = jax.tree_util.tree_map(lambda a: rng.standard_normal(a.shape), args)
  eps = 1e-4  # jax.test_util.check_grads's

  def loss(p, x):
    carry, ys = sorjax.unroll(cell, p, x, lengths=lengths, **aux)
    return jnp.sum(ys * w) + sum(jnp.sum(l) for l in
                                 jax.tree_util.tree_leaves(carry))

  @jax.jit
  def probe(args, v):
    grads = jax.grad(loss, (0, 1))(*args)
    shifted = [loss(*jax.tree_util.tree_map(lambda a, d: a + s * d, args, v))
               for s in (eps, -eps)]
    return grads, shifted

  with jax.enable_x64(True):
    lengths = jnp.array([T, 3, 5])
    grads, (up, down) = probe(args, v)
  # in NumPy: float64 jax arrays, outside enable_x64, compute in float32
  up, down = np.asarray(up), np.asarray(down)
  assert up.dtype == np.float64
  along = sum(np.vdot(g, d) for g, d in zip(jax.tree_util.tree_leaves(grads),
                                            jax.tree_util.tree_leaves(v)))
  np.testing.assert_allclose(along, (up - down) / (2 * eps), atol=1e-5,
                             rtol=1e-5)


@pytest.mark.parametrize("name", SEQ)
def test_bfloat16_forward_runs(name):
  cell, params, xs, aux = setup(name)
  _, y32 = sorjax.unroll(cell, params, xs, **aux)
  to16 = lambda a: a.astype(jnp.bfloat16)
  carry, ys = jax.jit(lambda p, x: sorjax.unroll(cell, p, x, **aux))(
      jax.tree_util.tree_map(to16, params), to16(xs))
  assert ys.dtype == jnp.bfloat16
  assert all(l.dtype == jnp.bfloat16 for l in jax.tree_util.tree_leaves(carry))
  assert np.isfinite(np.asarray(ys, np.float32)).all()
  np.testing.assert_allclose(np.asarray(ys, np.float32), y32, atol=0.1)


@pytest.mark.parametrize("name", SEQ)
def test_one_optax_step_changes_every_trainable_array(name):
  cell, params, xs, aux = setup(name)

  def loss(p):
    _, ys = sorjax.unroll(cell, p, xs, **aux)
    return jnp.sum(ys ** 2)
  opt = optax.sgd(0.1)
  grads = jax.jit(jax.grad(loss))(params)
  updates, _ = opt.update(grads, opt.init(params), params)
  new = optax.apply_updates(params, updates)
  changed = jax.tree_util.tree_map(lambda a, b: bool(jnp.any(a != b)),
                                   params, new)
  unchanged = [jax.tree_util.keystr(k) for k, v in
               jax.tree_util.tree_leaves_with_path(changed) if not v]
  assert not unchanged, f"{name}: no gradient reaches {unchanged}"


@pytest.mark.parametrize("name", SEQ)
@pytest.mark.parametrize("fused_grad", [False, True])
@pytest.mark.parametrize("b, t", [(0, T), (0, 0), (B, 0)])
def test_empty_batch_or_sequence_gives_empty_outputs(name, fused_grad, b, t):
  """B = 0 divided by zero in two cells' reshapes (tensor_rnn's post,
  the attention layer's gates) instead of giving empty outputs."""
  cell, params, xs, aux = setup(name)
  xs = xs[:b, :t]
  aux = {k: v[:b, :t] if jnp.ndim(v) == 2 else v for k, v in aux.items()}

  def loss(p, x):
    carry, ys = sorjax.unroll(cell, p, x, fused_grad=fused_grad, **aux)
    return jnp.sum(ys), (carry, ys)
  # The errors were raised while tracing: shapes suffice, nothing compiles.
  grads, (carry, ys) = jax.eval_shape(jax.grad(loss, has_aux=True), params,
                                      xs)
  assert ys.shape == (b, t, cell.hidden_size)
  assert all(l.shape[0] == b for l in jax.tree_util.tree_leaves(carry))
  assert jax.tree_util.tree_map(jnp.shape, grads) == \
      jax.tree_util.tree_map(jnp.shape, params)
