"""sorjax.cells.base.input_products: the products and every derivative
against NumPy sums over the rows and against autodiff of plain products,
and the compiled form of its weight gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sorjax.cells.base import input_products

SHAPES = [(4, 3), (6,), (1, 6), (2, 1, 3), ()]


def _args(lead, dtype=jnp.float32, seed=0):
  rng = np.random.default_rng(seed)
  xs = jnp.asarray(rng.normal(size=lead + (5,)), dtype)
  Ws = tuple(jnp.asarray(rng.normal(size=(5, n)), dtype) for n in (7, 2))
  return xs, Ws


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("lead", SHAPES)
def test_products_and_gradients_are_sums_over_the_rows(lead, dtype):
  """y_i = x W_i, and for L = sum_i <c_i, y_i>: dL/dW_i = sum_r x_r^T c_i,r,
  dL/dx = sum_i c_i W_i^T, by NumPy loops over the rows (float64)."""
  xs, Ws = _args(lead, dtype)
  rng = np.random.default_rng(1)
  cs = [jnp.asarray(rng.normal(size=lead + (W.shape[1],)), dtype) for W in Ws]
  x64 = np.asarray(xs, np.float64).reshape(-1, 5)
  c64 = [np.asarray(c, np.float64).reshape(-1, c.shape[-1]) for c in cs]
  W64 = [np.asarray(W, np.float64) for W in Ws]
  want_dW = [np.zeros(W.shape) for W in W64]
  want_dx = np.zeros_like(x64)
  for r in range(x64.shape[0]):
    for i, (W, c) in enumerate(zip(W64, c64)):
      want_dW[i] += np.outer(x64[r], c[r])
      want_dx[r] += W @ c[r]

  def loss(xs, Ws):
    ys = input_products(xs, *Ws)
    return sum(jnp.sum(y.astype(jnp.float32) * c.astype(jnp.float32))
               for y, c in zip(ys, cs))

  tol = 1e-5 if dtype == jnp.float32 else 5e-2
  ys = jax.jit(lambda xs, Ws: input_products(xs, *Ws))(xs, Ws)
  for y, W in zip(ys, W64):
    n = W.shape[1]
    assert y.shape == lead + (n,) and y.dtype == dtype
    np.testing.assert_allclose(np.asarray(y, np.float64).reshape(-1, n),
                               x64 @ W, rtol=tol, atol=tol)
  dx, dWs = jax.jit(jax.grad(loss, argnums=(0, 1)))(xs, Ws)
  assert dx.dtype == dtype and all(d.dtype == dtype for d in dWs)
  np.testing.assert_allclose(np.asarray(dx, np.float64).reshape(-1, 5),
                             want_dx, rtol=tol, atol=tol)
  for got, want in zip(dWs, want_dW):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol,
                               atol=tol)


def test_every_transform_agrees_with_plain_products():
  """Forward mode, reverse mode to either argument alone, vmap of the
  gradient and second derivatives: what autodiff of `xs @ W` gives."""
  xs, Ws = _args((4, 3))

  def f(plain):
    def loss(xs, Ws):
      ys = (tuple(xs @ W for W in Ws) if plain
            else input_products(xs, *Ws))
      return sum(jnp.sum(jnp.sin(y)) for y in ys)
    return loss

  new, old = f(False), f(True)
  close = lambda a, b: jax.tree_util.tree_map(  # noqa: E731
      lambda u, v: np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-5),
      a, b)
  tangents = (jnp.cos(xs), tuple(jnp.cos(W) for W in Ws))
  close(jax.jvp(new, (xs, Ws), tangents), jax.jvp(old, (xs, Ws), tangents))
  for argnums in (0, 1):
    close(jax.grad(new, argnums)(xs, Ws), jax.grad(old, argnums)(xs, Ws))
  batch = jnp.stack([xs, 2 * xs])
  close(jax.vmap(jax.grad(new, 1), (0, None))(batch, Ws),
        jax.vmap(jax.grad(old, 1), (0, None))(batch, Ws))
  close(jax.hessian(new, 1)(xs, Ws), jax.hessian(old, 1)(xs, Ws))
  close(jax.jacfwd(jax.grad(new))(xs, Ws), jax.jacfwd(jax.grad(old))(xs, Ws))


def _dots(f, *args):
  hlo = jax.jit(f).lower(*args).compile().as_text()
  return [line for line in hlo.splitlines() if " dot(" in line]


def test_weight_gradients_read_x_transposed_in_memory():
  """On CPU, no dot of the compiled weight gradients contracts its left
  operand along its rows (autodiff of `xs @ W` gives that form, which
  XLA:CPU runs slower), and a call that is not differentiated forms no
  transposed copy of x."""
  if jax.default_backend() != "cpu":
    pytest.skip("x^T is made in memory on CPU only")
  xs, Ws = _args((6, 5))

  def grads(plain):
    def loss(Ws):
      ys = (tuple(xs @ W for W in Ws) if plain
            else input_products(xs, *Ws))
      return sum(jnp.sum(jnp.sin(y)) for y in ys)
    return jax.grad(loss)

  rows_contracted = lambda dots: [  # noqa: E731
      d for d in dots if "lhs_contracting_dims={0}" in d]
  assert len(rows_contracted(_dots(grads(True), Ws))) == 2  # the contrast
  got = _dots(grads(False), Ws)
  assert len(got) == 4 and not rows_contracted(got), got
  xT = "f32[5,30]"  # x^T: D = 5 by R = 6 * 5 rows
  assert xT in jax.jit(grads(False)).lower(Ws).compile().as_text()
  hlo = jax.jit(lambda xs, Ws: input_products(xs, *Ws)).lower(
      xs, Ws).compile().as_text()
  assert xT not in hlo
