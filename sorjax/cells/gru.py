"""GRU baseline (Cho et al. 2014), reset gate after the recurrent matmul.

    r_t = sigma(x_t W_xr + h_{t-1} W_hr + b_r)
    z_t = sigma(x_t W_xz + h_{t-1} W_hz + b_z)
    n_t = tanh(x_t W_xn + b_n + r_t * (h_{t-1} W_hn + b_hn))
    h_t = (1 - z_t) * n_t + z_t * h_{t-1}

Reset-gate placement: the cuDNN / PyTorch / `flax.linen.GRUCell` form,
r * (h W_hn + b_hn), not Cho et al.'s (r * h) W_hn. It lets the three
recurrent matmuls fuse into one, h @ W_h with W_h = [W_hr | W_hz | W_hn];
Cho's form needs a second matmul that waits for r. The update gate z keeps
the old state as in Cho et al. (h_t = z h_{t-1} + (1 - z) h~_t).

Params (row convention, gate order r, z, n along the 3H axis):
    W_x  [D, 3H]   input weights [W_xr | W_xz | W_xn]
    W_h  [H, 3H]   recurrent weights [W_hr | W_hz | W_hn]
    b    [3H]      [b_r | b_z | b_n]; b_r, b_z merge the input and recurrent
                   biases, b_n is the input-side bias of n
    b_hn [H]       recurrent bias of n, kept apart because r multiplies it
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from sorjax.cells import base


@dataclasses.dataclass(frozen=True)
class GRU:
  hidden_size: int

  def __post_init__(self):
    base.check_positive_int("gru", "hidden_size", self.hidden_size)

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    base.check_init(self, key, dtype)
    base.check_positive_int("gru", "input_size", input_size)
    H = self.hidden_size
    kx, kh = jax.random.split(key)
    # U(+-1/sqrt(H)) weights and zero biases, as rnn and lstm.
    return {"W_x": base.uniform(kx, (input_size, 3 * H), H, dtype),
            "W_h": base.uniform(kh, (H, 3 * H), H, dtype),
            "b": base.zeros((3 * H,), dtype),
            "b_hn": base.zeros((H,), dtype)}

  def initial_carry(self, params, batch_shape=()):
    batch_shape = base.batch_shape(batch_shape)
    return base.HCarry(jnp.zeros((*batch_shape, self.hidden_size),
                                 base.param_dtype(params)))

  def precompute(self, params, xs):
    base.check_precompute(self, params, xs)
    return base.affine(xs, params["W_x"], params["b"])  # x_t W_x + b, all t

  # Split step (see sorjax.unroll): h_{t-1} W_h, then the rest.
  def split(self, params):
    return params["W_h"], {"b_hn": params["b_hn"]}

  def recurrent_input(self, carry):
    return carry.h

  def post(self, q, carry, xp, hW):
    """The step after hW = h_{t-1} W_h (named hW here: z is the gate)."""
    h = carry.h
    xr, xz, xn = jnp.split(xp, 3, axis=-1)
    hr, hz, hn = jnp.split(hW, 3, axis=-1)
    r = jax.nn.sigmoid(xr + hr)
    z = jax.nn.sigmoid(xz + hz)
    n = jnp.tanh(xn + r * (hn + base.lift(q["b_hn"], hn.ndim)))
    h = (1 - z) * n + z * h
    return base.HCarry(h), h

  def step(self, params, carry, xp):
    # split's W: the one recurrent matmul: r, z, n together
    return base.split_step(self, params, carry, xp)
