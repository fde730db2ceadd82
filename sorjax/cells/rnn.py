"""Elman RNN, the first-order baseline of every paper.

    h_t = phi(x_t U + h_{t-1} W + b)

(Maupome & Meurs eq. 3; Renganathan & Singh eq. 1 in column form.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from sorjax.cells import base


@dataclasses.dataclass(frozen=True)
class RNN:
  hidden_size: int
  activation: str = "tanh"

  def __post_init__(self):
    base.check_positive_int("rnn", "hidden_size", self.hidden_size)
    base.check_choice("rnn", "activation", self.activation,
                      ("tanh", "identity", "relu"))

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    base.check_init(self, key, dtype)
    base.check_positive_int("rnn", "input_size", input_size)
    H = self.hidden_size
    kU, kW = jax.random.split(key)
    return {"U": base.uniform(kU, (input_size, H), H, dtype),
            "W": base.uniform(kW, (H, H), H, dtype),
            "b": base.zeros((H,), dtype)}

  def initial_carry(self, params, batch_shape=()):
    batch_shape = base.batch_shape(batch_shape)
    return base.HCarry(jnp.zeros((*batch_shape, self.hidden_size),
                                 base.param_dtype(params)))

  def precompute(self, params, xs):
    base.check_precompute(self, params, xs)
    return base.affine(xs, params["U"], params["b"])  # x_t U + b, all t

  # Split step (see sorjax.unroll): z = h_{t-1} W, then the rest.
  def split(self, params):
    return params["W"], {}

  def recurrent_input(self, carry):
    return carry.h

  def post(self, q, carry, xp, z):
    h = base.activation(self.activation)(xp + z)  # phi(x_t U + b + h_{t-1} W)
    return base.HCarry(h), h

  def step(self, params, carry, xp):
    return base.split_step(self, params, carry, xp)
