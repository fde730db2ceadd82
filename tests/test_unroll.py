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


def test_stack_routes_aux_and_rejects_unused_aux():
  stack = (cells.make("rnn", hidden_size=4), cells.make("lstm", hidden_size=4))
  params = sorjax.init_layers(jax.random.key(0), stack, 3)
  with pytest.raises(ValueError, match="no layer accepts aux"):
    sorjax.unroll_layers(stack, params, jnp.zeros((2, 5, 3)),
                         temperature=jnp.float32(1.0))
  with pytest.raises(ValueError, match="2 cells but 1 param sets"):
    sorjax.unroll_layers(stack, params[:1], jnp.zeros((2, 5, 3)))


def test_jit_with_cell_as_static_argument():
  cell = cells.make("lstm", hidden_size=4)
  p = cell.init(jax.random.key(0), 3)
  f = jax.jit(sorjax.unroll, static_argnums=0)
  _, ys = f(cell, p, jnp.ones((2, 5, 3)))
  assert ys.shape == (2, 5, 4)
  assert hash(cell) == hash(cells.make("lstm", hidden_size=4))
