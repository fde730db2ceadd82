"""Multiplicative LSTM (Krause, Lu, Murray & Renals 2016, arXiv:1609.07959).

This is Krause et al.'s *multiplicative* LSTM, the mRNN/LSTM hybrid that
Renganathan & Singh use as a baseline (sec. 4.1; Lin et al. sec. 2 discuss
it). It is NOT
the matrix-memory "mLSTM" of xLSTM (Beck et al. 2024), which keeps a matrix
cell state C_t updated by outer products.

An intermediate state m_t gives every input its own recurrent transition,
and every gate reads m_t instead of h_{t-1} (Krause et al. sec. "multiplicative
LSTM"; the paper is not in shared/papers, so equations are cited by symbol).
In row form:

    m_t          = (x_t W_mx) * (h_{t-1} W_mh)            # [M]
    [i, f, g, o] = x_t W_x + m_t W_m + b                 # [4H], fused gates
    c_t          = sigma(f) * c_{t-1} + sigma(i) * act(g)
    h_t          = sigma(o) * tanh(c_t)

Krause writes the candidate hat-h_t = W_hx x_t + W_hm m_t without a
nonlinearity, so `candidate_activation="identity"` is the default; "tanh"
gives the usual LSTM candidate (as in many re-implementations). The bias b
is ours (Krause omits biases from the equations).

The effective per-example transition h -> gates is W_mh diag(x_t W_mx) W_m;
it is never formed: the step is two matmuls around a Hadamard product.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from sorjax.cells import base


class MLSTMInputs(NamedTuple):
  """Input-only terms of one or all steps."""
  mx: jax.Array  # x_t W_mx                [..., M]
  gx: jax.Array  # x_t W_x + b             [..., 4H]


@dataclasses.dataclass(frozen=True)
class MLSTM:
  """Krause et al.'s multiplicative LSTM (not xLSTM's matrix-memory mLSTM).

  Attributes:
    hidden_size: H.
    intermediate_size: M, the size of the multiplicative state m_t.
    candidate_activation: "identity" (Krause's linear hat-h_t) or "tanh".
  """
  hidden_size: int
  intermediate_size: int
  candidate_activation: str = "identity"

  def __post_init__(self):
    base.check_positive_int("mlstm", "hidden_size", self.hidden_size)
    base.check_positive_int("mlstm", "intermediate_size",
                            self.intermediate_size)
    base.check_choice("mlstm", "candidate_activation",
                      self.candidate_activation, ("identity", "tanh"))

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    """U(+-1/sqrt(H)) weights (the lstm cell's convention), zero bias."""
    base.check_init(self, key, dtype)
    base.check_positive_int("mlstm", "input_size", input_size)
    D, H, M = input_size, self.hidden_size, self.intermediate_size
    k = jax.random.split(key, 4)
    return {"W_mx": base.uniform(k[0], (D, M), H, dtype),
            "W_mh": base.uniform(k[1], (H, M), H, dtype),
            "W_x": base.uniform(k[2], (D, 4 * H), H, dtype),
            "W_m": base.uniform(k[3], (M, 4 * H), H, dtype),
            "b": base.zeros((4 * H,), dtype)}

  def initial_carry(self, params, batch_shape=()):
    batch_shape = base.batch_shape(batch_shape)
    z = jnp.zeros((*batch_shape, self.hidden_size), base.param_dtype(params))
    return base.LSTMCarry(z, z)

  def precompute(self, params, xs):
    base.check_precompute(self, params, xs)
    return MLSTMInputs(mx=xs @ params["W_mx"],
                       gx=base.affine(xs, params["W_x"], params["b"]))

  # Split step (see sorjax.unroll): z = h_{t-1} W_mh; the second matmul
  # m_t W_m depends on it, so it stays in `post` (W_m is in q).
  def split(self, params):
    return params["W_mh"], {"W_m": params["W_m"]}

  def recurrent_input(self, carry):
    return carry.h

  # post = post_second(.., second_input(..) @ W_m): unroll's fused backward
  # saves m_t and m_t W_m and forms dW_m as one matmul after its loop.
  second_matmul: ClassVar[str] = "W_m"

  def second_input(self, q, carry, xp, hW_mh):
    return xp.mx * hW_mh  # m_t = (x_t W_mx) * (h_{t-1} W_mh)

  def post_second(self, q, carry, xp, hW_mh, mW_m):
    i, f, g, o = jnp.split(xp.gx + mW_m, 4, axis=-1)
    act = base.activation(self.candidate_activation)
    c = jax.nn.sigmoid(f) * carry.c + jax.nn.sigmoid(i) * act(g)  # hat-h_t = g
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return base.LSTMCarry(h, c), h

  def post(self, q, carry, xp, hW_mh):
    return self.post_second(q, carry, xp, hW_mh,
                            self.second_input(q, carry, xp, hW_mh) @ q["W_m"])

  def step(self, params, carry, xp):
    return base.split_step(self, params, carry, xp)
