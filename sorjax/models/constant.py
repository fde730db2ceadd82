"""Arrays held by flax module attributes, hashable by content.

A module whose attributes hash can be a static argument of `jax.jit`; a
NumPy array attribute would make it unhashable. `Constant` freezes a copy and
hashes its bytes once.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import numpy as np


class Constant:
  """A read-only copy of an array, hashed and compared by value."""

  __slots__ = ("array", "_hash")

  def __init__(self, value: Any):
    array = np.array(value, copy=True)
    array.setflags(write=False)
    self.array = array
    digest = hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()
    self._hash = hash((array.shape, array.dtype.str, digest))

  def __hash__(self) -> int:
    return self._hash

  def __eq__(self, other: Any) -> bool:
    return (isinstance(other, Constant) and self._hash == other._hash
            and self.array.dtype == other.array.dtype
            and np.array_equal(self.array, other.array))

  def __array__(self, dtype=None, copy=None):
    return self.array if dtype is None else self.array.astype(dtype)

  @property
  def shape(self) -> tuple[int, ...]:
    return self.array.shape

  def __repr__(self) -> str:
    return f"Constant(shape={self.array.shape}, dtype={self.array.dtype})"


def constant(value: Any) -> Any:
  """`value` as a hashable attribute: None, Python scalars and tracers (a
  value computed under jit, e.g. an annealed temperature) unchanged, other
  arrays as `Constant`."""
  if value is None or isinstance(
      value, (Constant, bool, int, float, str, jax.core.Tracer)):
    return value
  return Constant(value)
