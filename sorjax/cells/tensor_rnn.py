"""Second-order tensor RNN (Goudreau et al. 1994; Maupome & Meurs eq. 5).

    h_t^(j) = phi(h_{t-1}^T A^(j) x_t + b^(j))                     (eq. 5)
            = phi(sum_{d,i} x_t[d] h_{t-1}[i] A[d, i, j] + b[j])

Params: A [D, H, H] (the paper's A^(j)[i, d] is our A[d, i, j]), b [H].
phi is tanh or the identity. h_0 = 0 (eq. 1).

The per-token transition W_hh(x)[i, j] = sum_d x[d] A[d, i, j] is the model
itself, so this cell is exempt from the no-[B, H, H] rule; it still never
forms W_hh(x). The step contracts h first, with every [H, H] block of A at
once: one matmul of h_{t-1} with A laid out as [H, D*H] (`split`;
`sorjax.unroll` transposes A once, outside the loop), D*B*H*H multiply-adds,
then sums the D blocks weighted by x_t (D*B*H). `sorjax.fused_tensor_rnn`
runs the same step with a backward of its own. Forming x . A first costs
the same D*B*H*H plus B*H*H for the matvec, and holds a [B, H, H] array per
step ([T, B, H, H] if hoisted).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from sorjax.cells import base


@dataclasses.dataclass(frozen=True)
class TensorRNN:
  hidden_size: int
  activation: str = "tanh"

  # Hoisted (the default), sorjax.unroll runs `sorjax.fused_tensor_rnn`'s
  # layer at every size. Unhoisted, its generic batched-dW path stacks dz_t
  # [T, B, D*H] (and saves z_t): per core at D = 32, 1.06-1.4x autodiff's
  # speed for 4.8x its memory (1.6x when xs need gradients too), so that
  # one is opt-in (fused_grad=True).
  fused_grad_default: ClassVar[bool] = False

  def __post_init__(self):
    base.check_positive_int("tensor_rnn", "hidden_size", self.hidden_size)
    base.check_choice("tensor_rnn", "activation", self.activation,
                      ("tanh", "identity"))

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    base.check_init(self, key, dtype)
    base.check_positive_int("tensor_rnn", "input_size", input_size)
    H = self.hidden_size
    kA, kb = jax.random.split(key)
    # Fan-in of the bilinear sum of eq. 5 is D*H. b is not zero: with h_0 = 0
    # and b = 0, h = 0 is a fixed point and A would get no gradient.
    return {"A": base.uniform(kA, (input_size, H, H), input_size * H, dtype),
            "b": base.uniform(kb, (H,), H, dtype)}

  def initial_carry(self, params, batch_shape=()):
    batch_shape = base.batch_shape(batch_shape)
    return base.HCarry(jnp.zeros((*batch_shape, self.hidden_size),
                                 base.param_dtype(params)))

  def precompute(self, params, xs):
    base.check_precompute(self, params, xs)
    return xs  # x_t enters only through the product with h_{t-1}

  # Split step (see sorjax.unroll): z = h_{t-1} A as [H, D*H], then the rest.
  def split(self, params):
    A = params["A"]
    D, H, _ = A.shape
    return jnp.transpose(A, (1, 0, 2)).reshape(H, D * H), {"b": params["b"]}

  def recurrent_input(self, carry):
    return carry.h

  def post(self, q, carry, x, hA):
    D = x.shape[-1]  # h^T A[d]: [.., D, H] (sizes given: B may be 0)
    hA = hA.reshape(*hA.shape[:-1], D, hA.shape[-1] // D)
    pre = jnp.einsum("...d,...dj->...j", x, hA)  # weighted by x_t[d] (eq. 5)
    h = base.activation(self.activation)(pre + base.lift(q["b"], pre.ndim))
    return base.HCarry(h), h

  def step(self, params, carry, x):
    return base.split_step(self, params, carry, x)
