"""The protocol grid: every sequence cell x every property of `unroll`.

References are independent of the scan: a Python loop of `step`, a loop over
examples, a truncated sequence, finite differences.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import test_util as jtu
import pytest

import sorjax
from sorjax import cells
from tests.cells.configs import SMALL

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


def aux_at(aux, b=None, t=None):
  """Slices per-token aux like xs[b, t]."""
  out = {}
  for k, v in aux.items():
    v = jnp.asarray(v)
    if v.ndim >= 2:
      v = v if b is None else v[b]
      if t is not None:
        v = v[..., t] if b is not None else v[:, t]
    out[k] = v
  return out


def loop_reference(cell, params, xs, aux, carry=None):
  """A plain Python loop of precompute+step over time."""
  Bn, Tn, _ = xs.shape
  carry = cell.initial_carry(params, (Bn,)) if carry is None else carry
  ys = []
  for t in range(Tn):
    xp = cell.precompute(params, xs[:, t], **aux_at(aux, t=t))
    carry, y = cell.step(params, carry, xp)
    ys.append(y)
  return carry, jnp.stack(ys, 1)


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
  names the mistake instead."""
  cell, params, xs, aux = setup(name)
  carry = cell.initial_carry(params, (B,))
  must = (rf"{name}.step: xp must be one step's input terms "
          rf"\(cell.precompute\(params, xs\[:, t\]\)\), for the carry's "
          rf"batch shape \({B},\): the carry \(.h \({B}, ")
  for t in (B, T):  # T = B broadcasts silently; T != B fails, unnamed
    seq = {k: (v[:, :t] if jnp.ndim(v) >= 2 else v) for k, v in aux.items()}
    xp = cell.precompute(params, xs[:, :t], **seq)
    with jax.numpy_rank_promotion("allow"), pytest.raises(
        ValueError, match=must + (r".*\) became \(" if t == B else
                                  r".*\) do not combine \(")):
      cell.step(params, carry, xp)
  new, y = cell.step(params, carry,
                     cell.precompute(params, xs[:, 0], **aux_at(aux, t=0)))
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
  wrong = big.init(jax.random.key(1), D)
  carry = cell.initial_carry(params, B)
  assert jax.tree_util.tree_map(jnp.shape, carry) == jax.tree_util.tree_map(
      jnp.shape, cell.initial_carry(params, (B,)))
  with pytest.raises(ValueError, match="batch_shape must be a tuple of ints"):
    cell.initial_carry(params, (B, "2"))
  xp = big.precompute(wrong, xs[:, 0], **aux_at(aux, t=0))
  if name == "dyck_rnn":  # its step reads no params: xp is what is wrong
    match = r"dyck_rnn.step: xp must be one step's input terms"
  else:
    match = (rf"{name}.step: params \(.*\) do not have the shapes "
             rf"{type(cell).__name__}.init makes for hidden_size "
             rf"{cell.hidden_size} at any input size")
  with jax.numpy_rank_promotion("allow"), pytest.raises(ValueError,
                                                        match=match):
    cell.step(wrong, carry, xp)


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
  _, ys = sorjax.unroll(cell, params, xs, **aux)
  for b in range(B):
    _, yb = sorjax.unroll(cell, params, xs[b:b + 1], **aux_at_batch(aux, b))
    np.testing.assert_allclose(ys[b:b + 1], yb, rtol=1e-5, atol=1e-6)


def aux_at_batch(aux, b):
  return {k: (v[b:b + 1] if jnp.ndim(v) >= 2 else v) for k, v in aux.items()}


@pytest.mark.parametrize("name", SEQ)
@pytest.mark.parametrize("reverse", [False, True])
def test_lengths_mask_equals_truncation(name, reverse):
  cell, params, xs, aux = setup(name)
  lengths = jnp.array([T, 2, 4])
  carry, ys = sorjax.unroll(cell, params, xs, lengths=lengths,
                            reverse=reverse, **aux)
  for b in range(B):
    L = int(lengths[b])
    sub = {k: (v[b:b + 1, :L] if jnp.ndim(v) >= 2 else v)
           for k, v in aux.items()}
    cb, yb = sorjax.unroll(cell, params, xs[b:b + 1, :L], reverse=reverse,
                           **sub)
    np.testing.assert_allclose(ys[b, :L], yb[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ys[b, L:], 0.0)
    assert_tree_close(jax.tree_util.tree_map(lambda a: a[b], carry),
                      jax.tree_util.tree_map(lambda a: a[0], cb),
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
  yv = jax.vmap(one)(xs, per_token)
  np.testing.assert_allclose(ys, yv, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", SEQ)
def test_gradients_match_finite_differences(name):
  with jax.enable_x64(True):
    cell, params, xs, aux = setup(name, dtype=jnp.float64)
    lengths = jnp.array([T, 3, 5])
    w = jax.random.normal(jax.random.key(9), (B, T, cell.hidden_size),
                          jnp.float64)

    def loss(p, x):
      carry, ys = sorjax.unroll(cell, p, x, lengths=lengths, **aux)
      return jnp.sum(ys * w) + sum(jnp.sum(l) for l in
                                   jax.tree_util.tree_leaves(carry))
    jtu.check_grads(loss, (params, xs), order=1, modes=["rev"],
                              atol=1e-5, rtol=1e-5)


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
  grads = jax.grad(loss)(params)
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
