"""Multiplicative-integration RNN (Wu et al. 2016; Maupome & Meurs eq. 7-8).

    simple  (eq. 7): h_t = phi(U x_t * W h_{t-1} + b)
    general (eq. 8): h_t = phi(alpha * U x_t * W h_{t-1}
                               + beta1 * U x_t + beta2 * W h_{t-1} + b)

Symbols are Maupome & Meurs': U reads the input, W the hidden state, and
beta1 scales the input term U x, beta2 the recurrent term W h (their eq.
11-12: D = diag(beta1) U, E = diag(beta2) W). Wu et al. name the matrices
the other way round (W x, U z) and put beta1 on the recurrent term; only
the names differ. Row convention here: our U [D, H] and W [H, H] are the
transposes of the paper's U and W; alpha, beta1, beta2, b are [H] (the
simple form has no alpha/beta). phi is tanh or the identity; h_0 = 0.

Eq. 8 regrouped so each step does one matmul and two elementwise ops:
    h_t = phi(W h_{t-1} * (alpha * U x_t + beta2) + (beta1 * U x_t + b)),
both brackets input-only, computed for all steps in `precompute`.

Init: U(+-1/sqrt(fan-in)) weights; alpha = 1, beta1 = beta2 = 0.5, a common
MI-RNN choice: the second-order term starts as in eq. 7 and half-strength
first-order terms let the input drive h away from h_0 = 0 from the first
step. b is not zero: in eq. 7 with h_0 = 0 and b = 0, h = 0 is a fixed point
and U, W would get no gradient.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from sorjax.cells import base


@dataclasses.dataclass(frozen=True)
class MIRNN:
  hidden_size: int
  general: bool = True
  activation: str = "tanh"

  def __post_init__(self):
    base.check_positive_int("mi_rnn", "hidden_size", self.hidden_size)
    base.check_bool("mi_rnn", "general", self.general)
    base.check_choice("mi_rnn", "activation", self.activation,
                      ("tanh", "identity"))

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    base.check_init(self, key, dtype)
    base.check_positive_int("mi_rnn", "input_size", input_size)
    H = self.hidden_size
    kU, kW, kb = jax.random.split(key, 3)
    params = {"U": base.uniform(kU, (input_size, H), input_size, dtype),
              "W": base.uniform(kW, (H, H), H, dtype),
              "b": base.uniform(kb, (H,), H, dtype)}
    if self.general:
      params["alpha"] = jnp.ones((H,), dtype)
      params["beta1"] = jnp.full((H,), 0.5, dtype)
      params["beta2"] = jnp.full((H,), 0.5, dtype)
    return params

  def initial_carry(self, params, batch_shape=()):
    batch_shape = base.batch_shape(batch_shape)
    return base.HCarry(jnp.zeros((*batch_shape, self.hidden_size),
                                 base.param_dtype(params)))

  def precompute(self, params, xs):
    base.check_precompute(self, params, xs)
    Ux = xs @ params["U"]  # U x_t, all t
    if not self.general:
      return {"Ux": Ux}
    lift = lambda v: base.lift(params[v], Ux.ndim)
    return {"scale": lift("alpha") * Ux + lift("beta2"),  # multiplies W h
            "shift": lift("beta1") * Ux + lift("b")}

  # Split step (see sorjax.unroll): z = W h_{t-1}, then the rest.
  def split(self, params):
    return params["W"], ({} if self.general else {"b": params["b"]})

  def recurrent_input(self, carry):
    return carry.h

  def post(self, q, carry, xp, Wh):
    if self.general:
      pre = Wh * xp["scale"] + xp["shift"]  # eq. 8, regrouped
    else:
      pre = xp["Ux"] * Wh + base.lift(q["b"], Wh.ndim)  # eq. 7
    h = base.activation(self.activation)(pre)
    return base.HCarry(h), h

  def step(self, params, carry, xp):
    # split's W: W h_{t-1}, the one recurrent matmul
    return base.split_step(self, params, carry, xp)
