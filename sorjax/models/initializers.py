"""Initialisers the models share that flax does not have: a symmetric
uniform (`flax.linen.initializers.uniform(s)` draws from [0, s))."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def uniform_symmetric(scale: float):
  """Initialiser drawing from U(-scale, scale)."""
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -scale, scale)
  return init
