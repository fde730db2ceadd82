"""Second-order tensor RNN (Goudreau et al. 1994; Maupome & Meurs eq. 5).

    h_t^(j) = phi(h_{t-1}^T A^(j) x_t + b^(j))                     (eq. 5)
            = phi(sum_{d,i} x_t[d] h_{t-1}[i] A[d, i, j] + b[j])

Params: A [D, H, H] (the paper's A^(j)[i, d] is our A[d, i, j]), b [H].
phi is tanh or the identity. h_0 = 0 (eq. 1).

The per-token transition W_hh(x)[i, j] = sum_d x[d] A[d, i, j] is the model
itself, so this cell is exempt from the no-[B, H, H] rule; it still never
forms W_hh(x). The step contracts h first, one [H, H] block of A per input
component d (a batched matmul over d: D*B*H*H multiply-adds, reading A in
its stored layout, so no per-step transpose of A), then sums the D results
weighted by x_t (D*B*H). Forming x . A first costs the same D*B*H*H plus
B*H*H for the matvec, and holds a [B, H, H] array per step ([T, B, H, H] if
hoisted).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from sorjax.cells import base


@dataclasses.dataclass(frozen=True)
class TensorRNN:
  hidden_size: int
  activation: str = "tanh"

  def __post_init__(self):
    base.check_positive_int("tensor_rnn", "hidden_size", self.hidden_size)
    base.check_choice("tensor_rnn", "activation", self.activation,
                      ("tanh", "identity"))

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    base.check_positive_int("tensor_rnn", "input_size", input_size)
    H = self.hidden_size
    kA, kb = jax.random.split(key)
    # Fan-in of the bilinear sum of eq. 5 is D*H. b is not zero: with h_0 = 0
    # and b = 0, h = 0 is a fixed point and A would get no gradient.
    return {"A": base.uniform(kA, (input_size, H, H), input_size * H, dtype),
            "b": base.uniform(kb, (H,), H, dtype)}

  def initial_carry(self, params, batch_shape=()):
    return base.HCarry(jnp.zeros((*batch_shape, self.hidden_size),
                                 base.param_dtype(params)))

  def precompute(self, params, xs):
    base.check_input("tensor_rnn", xs, params["A"].shape[0])
    return xs  # x_t enters only through the product with h_{t-1}

  def step(self, params, carry, x):
    A, b, h = params["A"], params["b"], carry.h
    hb = jnp.broadcast_to(h, (A.shape[0], *h.shape))  # one copy of h per d
    hA = jnp.einsum("d...i,dij->d...j", hb, A)  # h^T A[d]: [D, .., H]
    xd = jnp.moveaxis(x, -1, 0)[..., None]  # x_t[d] as [D, .., 1]
    pre = jnp.sum(hA * xd, axis=0)  # ... weighted by x_t[d] (eq. 5)
    h = base.activation(self.activation)(pre + base.lift(b, pre.ndim))
    return base.HCarry(h), h
