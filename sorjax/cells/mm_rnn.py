"""Multi-matrix RNN, mmRNN (Renganathan & Singh sec. 4.3, eq. 6-8).

K shared choice matrices W[k]; a key vector v (a probability vector over the
K matrices, carried from step to step) picks their mixture per example and
step. In row form (`x @ W`, W^proj [K, K+H+D] of the paper is our W_proj.T):

    v_t    = softmax([v_{t-1}; h_{t-1}; x_t] W_proj)      # eq. 6
    W_hh_t = sum_k v_t[k] W[k]                            # eq. 7
    h_t    = tanh(h_{t-1} W_hh_t + x_t W_hx + b)          # eq. 8

v_t is computed first and used in the same step. v_0 = 1/K (sec. 4.3: "equal
weight to all the 4 choice matrices"). The bias b is ours: eq. 8 has none.

W_hh_t is never formed (sec. 5.3's optimisation): h_{t-1} W_hh_t =
sum_k v_t[k] (h_{t-1} W[k]), so one fused matmul of h_{t-1} with
[W[1] | ... | W[K] | W_proj's h rows] ([H, K*H + K]) serves eq. 6 and eq. 8,
and the mixture is a [K]-by-[K, H] contraction per example.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from sorjax.cells import base


class MMRNNCarry(NamedTuple):
  h: jax.Array  # hidden state                    [..., H]
  v: jax.Array  # key vector v^key, sums to 1      [..., K]


class MMRNNInputs(NamedTuple):
  """Input-only terms of one or all steps."""
  hx: jax.Array  # x_t W_hx + b                    [..., H]
  vx: jax.Array  # x_t's part of the key logits    [..., K]


def fused_recurrent(Ws, Ps) -> jax.Array:
  """[W_1[1] | .. | W_1[K_1] | W_2[1] | .. | P_1 | P_2 | ..]: every choice
  matrix W_n [K_n, H, H] side by side, then every key projection's h rows
  P_n [H, K_n]. `sorjax.unroll` builds it once, outside the scan (`split`),
  so its cotangent is split back into the W_n once, not once per step."""
  H = Ws[0].shape[1]
  blocks = [jnp.transpose(W, (1, 0, 2)).reshape(H, -1) for W in Ws]
  return jnp.concatenate(blocks + list(Ps), axis=1)


def mix(v: jax.Array, hW: jax.Array) -> jax.Array:
  """sum_k v[k] (h W[k]) from v [..., K] and hW [..., K*H]: h W_hh(t), eq. 7."""
  K = v.shape[-1]
  hW = hW.reshape(*hW.shape[:-1], K, hW.shape[-1] // K)
  return jnp.einsum("...k,...kh->...h", v, hW)


@dataclasses.dataclass(frozen=True)
class MMRNN:
  """Multi-matrix RNN.

  Attributes:
    hidden_size: H.
    num_matrices: K, the number of choice matrices (the paper settles on 4).
  """
  hidden_size: int
  num_matrices: int = 4

  def __post_init__(self):
    base.check_positive_int("mm_rnn", "hidden_size", self.hidden_size)
    base.check_positive_int("mm_rnn", "num_matrices", self.num_matrices)

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    """U(+-1/sqrt(H)) for W, W_hx; U(+-1/sqrt(K+H+D)) for W_proj (its fan-in,
    as a linear layer on [v; h; x]); zero b."""
    base.check_init(self, key, dtype)
    base.check_positive_int("mm_rnn", "input_size", input_size)
    D, H, K = input_size, self.hidden_size, self.num_matrices
    kW, kx, kp = jax.random.split(key, 3)
    return {"W": base.uniform(kW, (K, H, H), H, dtype),
            "W_hx": base.uniform(kx, (D, H), H, dtype),
            "W_proj": base.uniform(kp, (K + H + D, K), K + H + D, dtype),
            "b": base.zeros((H,), dtype)}

  def initial_carry(self, params, batch_shape=()):
    batch_shape = base.batch_shape(batch_shape)
    dtype = base.param_dtype(params)
    K = self.num_matrices
    return MMRNNCarry(h=jnp.zeros((*batch_shape, self.hidden_size), dtype),
                      v=jnp.full((*batch_shape, K), 1.0 / K, dtype))

  def precompute(self, params, xs):
    base.check_precompute(self, params, xs)
    H, K = self.hidden_size, self.num_matrices
    # One call for both: their weight gradients read x^T once.
    hx, vx = base.input_products(xs, params["W_hx"], params["W_proj"][K + H:])
    return MMRNNInputs(hx=hx + base.lift(params["b"], hx.ndim), vx=vx)

  # Split step (see sorjax.unroll): z = h_{t-1} [W[1] | .. | W[K] | W_proj's
  # h rows], then the rest; q holds W_proj's v rows.
  def split(self, params):
    H, K = self.hidden_size, self.num_matrices
    P = params["W_proj"]
    return fused_recurrent([params["W"]], [P[K:K + H]]), {"P_v": P[:K]}

  def recurrent_input(self, carry):
    return carry.h

  def post(self, q, carry, xp, z):
    KH = self.num_matrices * self.hidden_size
    v = jax.nn.softmax(carry.v @ q["P_v"] + z[..., KH:] + xp.vx)  # eq. 6
    h = jnp.tanh(mix(v, z[..., :KH]) + xp.hx)                     # eq. 7-8
    return MMRNNCarry(h, v), h

  def step(self, params, carry, xp):
    # split's W: [H, K*H + K]: eq. 6 and 8 in one matmul
    return base.split_step(self, params, carry, xp)
