"""unroll's own contract: stacking, aux routing, reversal, input errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax import cells


def test_stack_of_different_cells_equals_chained_unrolls():
  stack = (cells.make("lstm", hidden_size=6), cells.make("rnn", hidden_size=4),
           cells.make("lstm", hidden_size=3, forget_bias=1.0))
  params = sorjax.init_layers(jax.random.key(0), stack, 5)
  assert [p["W_x" if "W_x" in p else "U"].shape[0] for p in params] == [5, 6, 4]
  xs = jax.random.normal(jax.random.key(1), (2, 7, 5))
  lengths = jnp.array([7, 3])
  carries, ys = sorjax.unroll_layers(stack, params, xs, lengths=lengths,
                                     between=lambda l, y: 2.0 * y)
  h = xs
  for l, (c, p) in enumerate(zip(stack, params)):
    carry, h = sorjax.unroll(c, p, h, lengths=lengths)
    np.testing.assert_allclose(carries[l].h, carry.h, rtol=1e-6)
    if l + 1 < len(stack):
      h = 2.0 * h
  np.testing.assert_allclose(ys, h, rtol=1e-6)
  assert ys.shape == (2, 7, 3)
  # one carry per layer: fewer would have dropped the layers past them
  again, _ = sorjax.unroll_layers(stack, params, xs, carries,
                                  lengths=lengths)
  assert len(again) == 3
  with pytest.raises(ValueError, match=r"unroll_layers: 3 cells but 2 "
                     r"carries"):
    sorjax.unroll_layers(stack, params, xs, carries[:2])
  with pytest.raises(ValueError, match="3 cells but 2 param sets"):
    sorjax.unroll_layers(stack, params[:2], xs)


def test_reverse_without_lengths_is_flip_in_flip_out():
  cell = cells.make("rnn", hidden_size=4)
  p = cell.init(jax.random.key(0), 3)
  xs = jax.random.normal(jax.random.key(1), (2, 5, 3))
  c1, y1 = sorjax.unroll(cell, p, xs, reverse=True)
  c2, y2 = sorjax.unroll(cell, p, xs[:, ::-1])
  np.testing.assert_allclose(y1, y2[:, ::-1], rtol=1e-6)
  np.testing.assert_allclose(c1.h, c2.h, rtol=1e-6)


def test_carry_is_passed_through():
  cell = cells.make("lstm", hidden_size=4)
  p = cell.init(jax.random.key(0), 3)
  xs = jax.random.normal(jax.random.key(1), (2, 8, 3))
  _, y_full = sorjax.unroll(cell, p, xs)
  c, y_a = sorjax.unroll(cell, p, xs[:, :5])
  _, y_b = sorjax.unroll(cell, p, xs[:, 5:], carry=c)
  np.testing.assert_allclose(jnp.concatenate([y_a, y_b], 1), y_full,
                             rtol=1e-5, atol=1e-6)


def test_input_errors_name_the_argument():
  cell = cells.make("rnn", hidden_size=4)
  p = cell.init(jax.random.key(0), 3)
  with pytest.raises(ValueError, match=r"xs must be \[B, T, D\]"):
    sorjax.unroll(cell, p, jnp.zeros((5, 3)))
  with pytest.raises(ValueError, match="lengths must have shape"):
    sorjax.unroll(cell, p, jnp.zeros((2, 5, 3)), lengths=jnp.array([1, 2, 3]))
  with pytest.raises(ValueError, match="aux 'temperature'"):
    sorjax.unroll(cell, p, jnp.zeros((2, 5, 3)), temperature=jnp.ones((3,)))


def test_flags_and_dtypes_are_checked():
  cell = cells.make("lstm", hidden_size=4)
  p = cell.init(jax.random.key(0), 3)
  xs = jnp.ones((2, 5, 3))
  for name in ("reverse", "hoist"):
    for bad in ("no", None, 0):  # "no" would have run reversed
      with pytest.raises(ValueError, match=f"unroll: {name} must be True or "
                         f"False, got {bad!r}"):
        sorjax.unroll(cell, p, xs, **{name: bad})
  # Inputs that would promote the params' dtype: the scan's carry types
  # would differ (an error naming neither) or the state silently widen.
  half = cell.init(jax.random.key(0), 3, dtype=jnp.bfloat16)
  with pytest.raises(ValueError, match=r"unroll: lstm: xs are float32 but "
                     r"the params bfloat16.*xs.astype\(jnp.bfloat16\)"):
    sorjax.unroll(cell, half, xs)
  with pytest.raises(ValueError, match="xs are complex64 but the params "
                     "float32"):
    sorjax.unroll(cell, p, xs.astype(jnp.complex64))
  # Under standard promotion, narrower inputs compute in the params'
  # dtype (strict promotion, as in these tests, refuses them); integer ones
  # are refused under both (they were cast silently: token ids 256 and 257
  # are one bfloat16; QA, session 41).
  for promotion in ("strict", "standard"):
    with jax.numpy_dtype_promotion(promotion), pytest.raises(
        ValueError, match=r"xs are int32; cells read floating vectors "
        r"\(embed token ids first"):
      sorjax.unroll(cell, half, xs.astype(jnp.int32))
  with jax.numpy_dtype_promotion("standard"):
    assert sorjax.unroll(cell, p, xs.astype(jnp.bfloat16))[1].dtype == \
        jnp.float32
  # A nested list is an array.
  np.testing.assert_array_equal(sorjax.unroll(cell, p, xs.tolist())[1],
                                sorjax.unroll(cell, p, xs)[1])


def test_stack_routes_aux_and_rejects_unused_aux():
  stack = (cells.make("rnn", hidden_size=4), cells.make("lstm", hidden_size=4))
  params = sorjax.init_layers(jax.random.key(0), stack, 3)
  with pytest.raises(ValueError, match="no layer accepts aux"):
    sorjax.unroll_layers(stack, params, jnp.zeros((2, 5, 3)),
                         temperature=jnp.float32(1.0))
  with pytest.raises(ValueError, match="2 cells but 1 param sets"):
    sorjax.unroll_layers(stack, params[:1], jnp.zeros((2, 5, 3)))
  # errors inside a layer name it; a lone cell or a tree cell is named
  like = (cells.make("lstm", hidden_size=4),) * 2
  ps = sorjax.init_layers(jax.random.key(0), like, 3)
  bad = (None, like[1].initial_carry(ps[1], (2,))._replace(
      h=jnp.zeros((2, 5))))
  with pytest.raises(ValueError, match=r"unroll_layers: layer 1: unroll: "
                     r"lstm: carry.h must have shape \(2, 4\)"):
    sorjax.unroll_layers(like, ps, jnp.zeros((2, 5, 3)), bad)
  for f in (lambda: sorjax.init_layers(jax.random.key(0), like[0], 3),
            lambda: sorjax.unroll_layers(like[0], ps[0],
                                         jnp.zeros((2, 5, 3)))):
    with pytest.raises(ValueError, match=r"cells must be a sequence of "
                       r"cells, one per layer \(e.g. \(cell,\)\); got LSTM"):
      f()
  tree = cells.make("tree_rnn", hidden_size=4)
  with pytest.raises(ValueError, match="tree cells run with"):
    sorjax.unroll_layers((tree,), (tree.init(jax.random.key(0), 4),),
                         jnp.zeros((2, 5, 4)), temperature=1.0)


def test_jit_with_cell_as_static_argument():
  cell = cells.make("lstm", hidden_size=4)
  p = cell.init(jax.random.key(0), 3)
  f = jax.jit(sorjax.unroll, static_argnums=0)
  _, ys = f(cell, p, jnp.ones((2, 5, 3)))
  assert ys.shape == (2, 5, 4)
  assert hash(cell) == hash(cells.make("lstm", hidden_size=4))


def test_bad_lengths_are_named():
  cell = cells.make("rnn", hidden_size=4)
  p = cell.init(jax.random.key(0), 3)
  xs = jnp.zeros((2, 5, 3))
  for bad in (jnp.array([2.0, 3.0]), jnp.array([True, False])):
    with pytest.raises(ValueError, match=f"unroll: lengths must be integers, "
                       f"got {bad.dtype}"):
      sorjax.unroll(cell, p, xs, lengths=bad)
  for bad, named in (([6, 2], r"\[6\]"), ([-1, 9], r"\[-1, 9\]")):
    with pytest.raises(ValueError, match=r"lengths must be in \[0, T\] = "
                       rf"\[0, 5\], got {named}"):
      sorjax.unroll(cell, p, xs, lengths=jnp.array(bad), reverse=True)
  # the whole range is valid, as numpy ints too
  _, ys = sorjax.unroll(cell, p, xs, lengths=np.array([0, 5], np.int64))
  assert ys.shape == (2, 5, 4)
  # traced lengths have no values to check: shape and dtype still are
  step = jax.jit(lambda l: sorjax.unroll(cell, p, xs, lengths=l)[1])
  assert step(jnp.array([5, 1])).shape == (2, 5, 4)
  with pytest.raises(ValueError, match="lengths must be integers"):
    step(jnp.array([5.0, 1.0]))


def test_params_that_init_would_not_make_are_named():
  cell = cells.make("mrnn", hidden_size=4, intermediate_size=3)
  p = cell.init(jax.random.key(0), 2)
  xs = jnp.zeros((2, 5, 2))
  made = r"as MRNN.init makes them for input size 2, the last axis of xs"
  with pytest.raises(ValueError, match=rf"unroll: mrnn: params lack \['A'\] "
                     rf"\({made} \(2, 5, 2\): \['A'\], \['B'\], \['C'\]"):
    sorjax.unroll(cell, {k: v for k, v in p.items() if k != "A"}, xs)
  with pytest.raises(ValueError, match=rf"unroll: mrnn: params\['A'\] must "
                     rf"have shape \(3, 4\) \({made} \(2, 5, 2\)\), got "
                     rf"\(4, 3\)"):
    sorjax.unroll(cell, {**p, "A": p["A"].T}, xs)
  with pytest.raises(ValueError, match=r"params hold \['W'\], which MRNN "
                     r"does not use"):
    sorjax.unroll(cell, {**p, "W": p["A"]}, xs)
  # params of another input size: named as such, not as a shape
  with pytest.raises(ValueError, match=r"unroll: mrnn: inputs must have last "
                     r"axis = the input size 2 the params were initialised "
                     r"for; got last axis 5 \(the last axis of xs "
                     r"\(2, 5, 5\)\)"):
    sorjax.unroll(cell, p, jnp.zeros((2, 5, 5)))
  # any dtype, and under vmap (replicas) each replica's shapes
  half = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), p)
  assert sorjax.unroll(cell, half, xs.astype(jnp.bfloat16))[1].shape == (
      2, 5, 4)
  stacked = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), p)
  assert jax.vmap(lambda q: sorjax.unroll(cell, q, xs)[1])(stacked).shape == (
      2, 2, 5, 4)


def test_a_cell_that_is_not_hashable_is_checked_too():
  base_cell = cells.make("rnn", hidden_size=4)

  class Unhashable(type(base_cell)):
    __hash__ = None

  cell = Unhashable(hidden_size=4)
  p = cell.init(jax.random.key(0), 3)
  with pytest.raises(TypeError):
    hash(cell)
  assert sorjax.unroll(cell, p, jnp.zeros((2, 5, 3)))[1].shape == (2, 5, 4)
  with pytest.raises(ValueError, match=r"unroll: Unhashable: params\['U'\] "
                     r"must have shape \(3, 4\)"):
    sorjax.unroll(cell, {**p, "U": jnp.zeros((3, 5))}, jnp.zeros((2, 5, 3)))


def test_a_carry_unlike_initial_carry_is_named():
  cell = cells.make("lstm", hidden_size=4)
  p = cell.init(jax.random.key(0), 3)
  xs = jnp.zeros((2, 5, 3))
  z = jnp.zeros((2, 4))
  with pytest.raises(ValueError, match=r"unroll: lstm: carry must be a "
                     r"LSTMCarry with entries .h, .c; got a tuple with "
                     r"\[0\], \[1\]"):
    sorjax.unroll(cell, p, xs, carry=(z, z))
  with pytest.raises(ValueError, match=r"unroll: lstm: carry.c must have "
                     r"shape \(2, 4\) for batch shape \(2,\), got \(3, 4\)"):
    sorjax.unroll(cell, p, xs, carry=cell.initial_carry(p, (2,))._replace(
        c=jnp.zeros((3, 4))))
  carry, _ = sorjax.unroll(cell, p, xs)
  assert sorjax.unroll(cell, p, xs, carry=carry)[1].shape == (2, 5, 4)
  # a carry of another dtype: wider would silently compute the state in
  # float32, narrower (or int) failed as the scan's mismatched carry types
  p16 = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), p)
  x16 = xs.astype(jnp.bfloat16)
  with pytest.raises(ValueError, match=r"unroll: lstm: carry.h is float32, "
                     r"but cell.initial_carry makes it bfloat16"):
    sorjax.unroll(cell, p16, x16, carry=carry)
  for dt in (jnp.bfloat16, jnp.int32):
    with pytest.raises(ValueError, match=rf"unroll: lstm: carry.h is "
                       rf"{jnp.dtype(dt).name}, but cell.initial_carry makes "
                       r"it float32"):
      sorjax.unroll(cell, p, xs, carry=jax.tree_util.tree_map(
          lambda a: a.astype(dt), carry))
  carry16, ys16 = sorjax.unroll(cell, p16, x16, carry=jax.tree_util.tree_map(
      lambda a: a.astype(jnp.bfloat16), carry))
  assert ys16.dtype == carry16.c.dtype == jnp.bfloat16
