"""What every cell shares: the protocol, initialisers, activations, input
products, checks.

Row-vector convention throughout: `x @ W` with W shaped [in, out].
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from sorjax.layer_scan import transposed_rows

Array = jax.Array
PyTree = Any


@runtime_checkable
class Cell(Protocol):
  """A recurrent cell: static hyperparameters plus pure methods.

  Implementations are frozen dataclasses (hashable, usable as a static
  argument of `jax.jit`). `precompute` is called on inputs with any leading
  axes ([T, B, D] inside `sorjax.unroll`) and must hold every term that
  depends on the input only; `step` gets one time slice of its output.
  """

  hidden_size: int

  def init(self, key: Array, input_size: int,
           dtype: Any = jnp.float32) -> PyTree: ...

  def initial_carry(self, params: PyTree, batch_shape: tuple[int, ...]
                    ) -> PyTree: ...

  def precompute(self, params: PyTree, xs: Array, **aux: Any) -> PyTree: ...

  def step(self, params: PyTree, carry: PyTree, xp: PyTree
           ) -> tuple[PyTree, Array]: ...


# ---------------------------------------------------------------- checks

def check_positive_int(cell: str, name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{cell}: {name} must be a positive int, got {value!r}")


def check_bool(cell: str, name: str, value: Any) -> None:
  if not isinstance(value, bool):
    raise ValueError(f"{cell}: {name} must be a bool, got {value!r}")


def check_choice(cell: str, name: str, value: Any, choices: tuple) -> None:
  if value not in choices:
    raise ValueError(
        f"{cell}: {name} must be one of {choices}, got {value!r}")


def check_input(cell: str, xs: Array, input_size: int) -> None:
  """Trace-time shape check of the last axis of an input."""
  if xs.ndim < 1 or xs.shape[-1] != input_size:
    raise ValueError(
        f"{cell}: inputs must have last axis = the input size {input_size} "
        f"the params were initialised for; got last axis "
        f"{xs.shape[-1] if xs.ndim else None} (shape {tuple(xs.shape)})")


# ---------------------------------------------------------------- activations

ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "tanh": jnp.tanh,
    "identity": lambda x: x,
    "relu": jax.nn.relu,
    "sigmoid": jax.nn.sigmoid,
}


def activation(name: str) -> Callable[[Array], Array]:
  return ACTIVATIONS[name]


# ---------------------------------------------------------------- initialisers

def uniform(key: Array, shape: tuple[int, ...], fan_in: int,
            dtype: Any = jnp.float32) -> Array:
  """U(-1/sqrt(fan_in), 1/sqrt(fan_in)), the usual RNN initialisation."""
  bound = 1.0 / math.sqrt(max(fan_in, 1))
  return jax.random.uniform(key, shape, dtype, -bound, bound)


def zeros(shape: tuple[int, ...], dtype: Any = jnp.float32) -> Array:
  return jnp.zeros(shape, dtype)


def param_dtype(params: PyTree) -> Any:
  """The dtype of a cell's parameters (of its first leaf)."""
  return jax.tree_util.tree_leaves(params)[0].dtype


# ---------------------------------------------------------------- carries

class HCarry(NamedTuple):
  """Carry of cells whose whole state is the hidden vector."""
  h: Array


class LSTMCarry(NamedTuple):
  """Carry of LSTM-family cells: hidden output h and memory c."""
  h: Array
  c: Array


# ---------------------------------------------------------------- algebra

def lift(v: Array, ndim: int) -> Array:
  """Prepends unit axes so v has rank ndim: explicit broadcasting that the
  strict `jax_numpy_rank_promotion="raise"` mode accepts."""
  return v.reshape((1,) * (ndim - v.ndim) + v.shape)


def affine(x: Array, W: Array, b: Array) -> Array:
  """x @ W + b over any leading axes of x."""
  y = x @ W
  return y + lift(b, y.ndim)


def input_products(xs: Array, *Ws: Array) -> tuple[Array, ...]:
  """(xs @ W_1, .., xs @ W_n) over any leading axes of xs, one matmul each,
  for the hoisted input terms of cells that take several products of x.

  Their gradients to the Ws are sums over xs's rows, sum_r x_r^T dy_r.
  Autodiff of `xs @ W` forms each as a dot that contracts both operands
  along the rows, which XLA:CPU runs slower than from x^T in memory (a
  skinny [6400, 512]^T x [6400, 4]: 4.6 against 0.3 ms). Here the
  tangents read xs's rows transposed once (`layer_scan.transposed_rows`,
  in memory on CPU only), and the weight gradients are products from that
  copy. The copy is a pass over xs, made in the forward pass of a
  differentiated call and kept until the backward (a call that is not
  differentiated makes none), so it pays only where it serves enough:
  mm_rnn's two input terms, 1.02-1.05x its training step; not mlstm's or
  attention_lstm's (BUILD_NOTES, "Input products from transposed rows").
  A custom JVP, so forward mode, reverse mode, vmap and higher orders all
  go through it."""
  return _input_products(xs, Ws)


@jax.custom_jvp
def _input_products(xs, Ws):
  return tuple(xs @ W for W in Ws)


def _input_products_jvp(primals, tangents):
  xs, Ws = primals
  dxs, dWs = tangents
  ys = _input_products(xs, Ws)
  xT = None  # x^T [D, R], only when some W has a tangent
  dys = []
  for y, W, dW in zip(ys, Ws, dWs):
    parts = [] if type(dxs) is SymbolicZero else [dxs @ W]
    if type(dW) is not SymbolicZero:
      xT = transposed_rows(xs) if xT is None else xT
      parts.append((xT.T @ dW).reshape(y.shape))       # sum_r x_r^T dy_r
    dys.append(sum(parts[1:], parts[0]) if parts else jnp.zeros_like(y))
  return ys, tuple(dys)


_input_products.defjvp(_input_products_jvp, symbolic_zeros=True)
