"""sorjax.linen.CellAdapter inside nn.RNN / nn.Bidirectional equals
sorjax.unroll with the same params (flax-example style), for every cell."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax import cells
from sorjax.linen import CellAdapter
from tests.cells.configs import SMALL

B, T = 3, 5
LENGTHS = np.array([5, 2, 4])


def setup(name):
  """Cell, inputs, adapter aux (fixed over time) and the same aux for
  unroll ([B, T] when the adapter's is per sequence)."""
  try:
    cell_cls = cells.cell_class(name)
  except ModuleNotFoundError as e:  # a cell another helper has not landed
    pytest.skip(f"cell {name!r} not importable: {e}")
  del cell_cls
  kwargs, D, aux_fn = SMALL[name]
  cell = cells.make(name, **kwargs)
  k1, k2 = jax.random.split(jax.random.key(7))
  xs = jax.random.normal(k1, (B, T, D))
  aux = aux_fn(k2, B, T)
  adapter_aux, unroll_aux = {}, {}
  for k, v in aux.items():
    v = jnp.asarray(v)
    if v.ndim == 0:
      adapter_aux[k] = unroll_aux[k] = v
    else:  # per-token: hold the first token's value for the whole sequence
      adapter_aux[k] = v[:, 0]
      unroll_aux[k] = jnp.broadcast_to(v[:, :1], v.shape)
  return cell, xs, adapter_aux, unroll_aux


def close(a, b):
  jax.tree_util.tree_map(
      lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6), a, b)


def valid(ys, lengths):
  """ys with padded steps zeroed (nn.RNN leaves them arbitrary)."""
  mask = np.arange(ys.shape[1])[None, :] < lengths[:, None]
  return np.where(mask[..., None], np.asarray(ys), 0.0)


@pytest.mark.parametrize("name", cells.sequence_names())
def test_nn_rnn_equals_unroll(name):
  cell, xs, adapter_aux, unroll_aux = setup(name)
  rnn = nn.RNN(CellAdapter(cell, aux=adapter_aux), return_carry=True)
  # nn.RNN's params are the cell's: same names and shapes as cell.init.
  shapes = jax.eval_shape(rnn.init, jax.random.key(0), xs)
  params = cell.init(jax.random.key(1), xs.shape[-1])
  assert jax.tree_util.tree_map(jnp.shape, shapes["params"]["cell"]) == \
      jax.tree_util.tree_map(jnp.shape, params)
  variables = {"params": {"cell": params}}

  @jax.jit  # one compilation for every variant
  def run(xs, lengths):
    out = {}
    for reverse in (False, True):
      out["rnn", reverse, False] = rnn.apply(
          variables, xs, reverse=reverse, keep_order=True)
      out["rnn", reverse, True] = rnn.apply(
          variables, xs, seq_lengths=lengths, reverse=reverse,
          keep_order=True)
      out["unroll", reverse, False] = sorjax.unroll(
          cell, params, xs, reverse=reverse, **unroll_aux)
      out["unroll", reverse, True] = sorjax.unroll(
          cell, params, xs, lengths=lengths, reverse=reverse, **unroll_aux)
    return out

  out = run(xs, jnp.asarray(LENGTHS))
  for reverse in (False, True):
    carry, ys = out["rnn", reverse, False]  # whole sequences
    ref_carry, ref_ys = out["unroll", reverse, False]
    close(ys, ref_ys)
    close(carry, ref_carry)
    carry, ys = out["rnn", reverse, True]  # padded: valid steps, last carry
    ref_carry, ref_ys = out["unroll", reverse, True]
    close(valid(ys, LENGTHS), ref_ys)
    close(carry, ref_carry)


def test_bidirectional_equals_two_unrolls():
  cell, xs, adapter_aux, unroll_aux = setup("attention_lstm")
  bi = nn.Bidirectional(nn.RNN(CellAdapter(cell, aux=adapter_aux)),
                        nn.RNN(CellAdapter(cell, aux=adapter_aux)))
  variables = jax.jit(bi.init)(jax.random.key(0), xs)
  pf = variables["params"]["forward_rnn"]["cell"]
  pb = variables["params"]["backward_rnn"]["cell"]

  @jax.jit
  def run(xs, lengths):
    ys = bi.apply(variables, xs, seq_lengths=lengths)
    _, fwd = sorjax.unroll(cell, pf, xs, lengths=lengths, **unroll_aux)
    _, bwd = sorjax.unroll(cell, pb, xs, lengths=lengths, reverse=True,
                           **unroll_aux)
    return ys, jnp.concatenate([fwd, bwd], -1)

  ys, ref = run(xs, jnp.asarray(LENGTHS))
  assert ys.shape == (B, T, 2 * cell.hidden_size)
  close(valid(ys, LENGTHS), ref)
  # The two directions have their own parameters.
  assert not np.allclose(jax.tree_util.tree_leaves(pf)[0],
                         jax.tree_util.tree_leaves(pb)[0])


def test_manual_loop_over_adapter_equals_nn_rnn():
  """The adapter as a standalone cell: one call per step, as flax's tests."""
  cell = cells.make("mrnn", hidden_size=4, intermediate_size=6)
  xs = jax.random.normal(jax.random.key(1), (2, 4, 3))
  adapter = CellAdapter(cell)
  carry = adapter.initialize_carry(jax.random.key(0), xs[:, 0].shape)
  variables = jax.jit(adapter.init)(jax.random.key(2), carry, xs[:, 0])
  step = jax.jit(adapter.apply)
  ys = []
  for t in range(xs.shape[1]):
    carry, y = step(variables, carry, xs[:, t])
    ys.append(y)
  rnn_ys = jax.jit(nn.RNN(adapter).apply)(
      {"params": {"cell": variables["params"]}}, xs)
  close(jnp.stack(ys, 1), rnn_ys)


def test_initialize_carry_matches_the_cell_and_dtype():
  cell = cells.make("lstm", hidden_size=4)
  adapter = CellAdapter(cell, param_dtype=jnp.bfloat16)
  carry = adapter.initialize_carry(jax.random.key(0), (2, 7, 3))
  assert carry._fields == ("h", "c")
  assert carry.h.shape == (2, 7, 4) and carry.h.dtype == jnp.bfloat16
  assert not np.any(np.asarray(carry.c, np.float32))
  assert adapter.num_feature_axes == 1


def test_scalar_aux_is_used():
  cell, xs, _, _ = setup("attention_lstm")
  variables = {"params": {"cell": cell.init(jax.random.key(0), xs.shape[-1])}}

  @jax.jit
  def run(xs):
    return [nn.RNN(CellAdapter(cell, aux={"temperature": tau})).apply(
        variables, xs) for tau in (0.3, 3.0)]

  cold, hot = run(xs)
  assert not np.allclose(cold, hot)


def test_adapter_hashes_and_takes_a_traced_temperature():
  cell, xs, _, _ = setup("attention_lstm")
  assert hash(CellAdapter(cell, aux={"temperature": 0.5})) == hash(
      CellAdapter(cell, aux={"temperature": 0.5}))
  per_seq = CellAdapter(cell, aux={"temperature": np.full(B, 0.5)})
  assert hash(per_seq) == hash(
      CellAdapter(cell, aux={"temperature": np.full(B, 0.5)}))
  params = cell.init(jax.random.key(0), xs.shape[-1])

  @jax.jit  # an annealed temperature is a traced value inside a train step
  def run(tau):
    return nn.RNN(CellAdapter(cell, aux={"temperature": tau})).apply(
        {"params": {"cell": params}}, xs)

  _, ref = sorjax.unroll(cell, params, xs, temperature=jnp.float32(0.4))
  close(run(jnp.float32(0.4)), ref)


def test_per_token_aux_is_rejected_with_its_name():
  cell, xs, _, _ = setup("assignment_lstm")
  bad = {"assignment": jnp.zeros((B, T), jnp.int32)}
  with pytest.raises(ValueError, match="aux 'assignment'.*per-token"):
    nn.RNN(CellAdapter(cell, aux=bad)).init(jax.random.key(0), xs)


def test_inputs_of_a_wider_dtype_than_the_params_are_named():
  cell = cells.make("lstm", hidden_size=4)
  rnn = nn.RNN(CellAdapter(cell, param_dtype=jnp.bfloat16))
  with pytest.raises(ValueError, match=r"CellAdapter\(LSTM\): xs are "
                     "float32 but the params bfloat16"):
    rnn.init(jax.random.key(0), jnp.ones((2, 5, 3)))
  v = rnn.init(jax.random.key(0), jnp.ones((2, 5, 3), jnp.bfloat16))
  assert rnn.apply(v, jnp.ones((2, 5, 3), jnp.bfloat16)).dtype == jnp.bfloat16


def test_a_carry_unlike_the_cells_is_named():
  """nn.RNN's initial_carry is checked as unroll's is (it was blamed on
  xp, the step's input terms)."""
  cell = cells.make("lstm", hidden_size=6)
  rnn = nn.RNN(CellAdapter(cell))
  xs = jnp.ones((3, 5, 2))
  v = rnn.init(jax.random.key(0), xs)
  good = cell.initial_carry(v["params"]["cell"], (3,))
  bad = good._replace(h=jnp.zeros((3, 7)))
  with pytest.raises(ValueError, match=r"CellAdapter\(LSTM\): carry.h must "
                     r"have shape \(3, 6\) for batch shape \(3,\), got "
                     r"\(3, 7\)"):
    rnn.apply(v, xs, initial_carry=bad)
  with pytest.raises(ValueError, match=r"CellAdapter\(LSTM\): carry.h is "
                     "bfloat16"):
    rnn.apply(v, xs, initial_carry=jax.tree_util.tree_map(
        lambda a: a.astype(jnp.bfloat16), good))
  assert rnn.apply(v, xs, initial_carry=good).shape == (3, 5, 6)


def test_aux_with_two_batch_axes():
  """Inputs [B1, B2, T, D]: an aux of one step's batch shape [B1, B2] goes
  through (as a per-sequence temperature for unroll on the flattened
  batch); one of [B1] only is refused."""
  cell = cells.make("attention_lstm", hidden_size=4, num_cells=2)
  xs = jax.random.normal(jax.random.key(3), (2, 3, T, 5))
  tau = jnp.array([[0.5, 1.0, 2.0], [4.0, 0.25, 1.5]])
  rnn = nn.RNN(CellAdapter(cell, aux={"temperature": tau}))
  variables = rnn.init(jax.random.key(0), xs)
  ys = rnn.apply(variables, xs)
  params = variables["params"]["cell"]
  _, want = sorjax.unroll(cell, params, xs.reshape(6, T, 5),
                          temperature=jnp.broadcast_to(
                              tau.reshape(6, 1), (6, T)))
  close(ys.reshape(6, T, -1), want)
  with pytest.raises(ValueError, match=r"batch shape \(2, 3\)"):
    nn.RNN(CellAdapter(cell, aux={"temperature": tau[:, 0]})).init(
        jax.random.key(0), xs)
