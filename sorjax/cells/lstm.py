"""LSTM baseline (Hochreiter & Schmidhuber 1997), fused gate matmuls.

    [i, f, g, o] = x_t W_x + h_{t-1} W_h + b
    c_t = sigma(f + forget_bias) * c_{t-1} + sigma(i) * tanh(g)
    h_t = sigma(o) * tanh(c_t)

Weights start U(-1/sqrt(H), 1/sqrt(H)); b at zero, or (bias_init=
"uniform", Mahto et al. 3.1.1) from that same range.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from sorjax.cells import base


def lstm_update(gates, c, forget_bias=0.0):
  """The LSTM memory update from pre-activation gates [..., 4H] (i, f, g, o).

  Shared by every cell that ends in a standard LSTM update.
  """
  i, f, g, o = jnp.split(gates, 4, axis=-1)
  c = jax.nn.sigmoid(f + forget_bias) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
  h = jax.nn.sigmoid(o) * jnp.tanh(c)
  return base.LSTMCarry(h, c)


@dataclasses.dataclass(frozen=True)
class LSTM:
  hidden_size: int
  forget_bias: float = 0.0
  bias_init: str = "zeros"

  def __post_init__(self):
    base.check_positive_int("lstm", "hidden_size", self.hidden_size)
    base.check_finite_real("lstm", "forget_bias", self.forget_bias)
    base.check_choice("lstm", "bias_init", self.bias_init, base.BIAS_INITS)

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    base.check_init(self, key, dtype)
    base.check_positive_int("lstm", "input_size", input_size)
    H = self.hidden_size
    kx, kh = jax.random.split(key)
    return {"W_x": base.uniform(kx, (input_size, 4 * H), H, dtype),
            "W_h": base.uniform(kh, (H, 4 * H), H, dtype),
            "b": base.lstm_bias(key, self.bias_init, (4 * H,), H, dtype)}

  def initial_carry(self, params, batch_shape=()):
    batch_shape = base.batch_shape(batch_shape)
    z = jnp.zeros((*batch_shape, self.hidden_size), base.param_dtype(params))
    return base.LSTMCarry(z, z)

  def precompute(self, params, xs):
    base.check_precompute(self, params, xs)
    return base.affine(xs, params["W_x"], params["b"])

  # Split step (see sorjax.unroll): z = h_{t-1} W_h, then the rest.
  def split(self, params):
    return params["W_h"], {}

  def recurrent_input(self, carry):
    return carry.h

  def post(self, q, carry, xp, z):
    new = lstm_update(xp + z, carry.c, self.forget_bias)
    return new, new.h

  def step(self, params, carry, xp):
    return base.split_step(self, params, carry, xp)
