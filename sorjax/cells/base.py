"""What every cell shares: the protocol, initialisers, activations, checks.

Row-vector convention throughout: `x @ W` with W shaped [in, out].
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

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
