"""General second-order RNN (Maupome & Meurs eq. 9) and the mRNN (eq. 6).

    h_t = phi(A(B x_t * C h_{t-1}) + D x_t + E h_{t-1} + f)        (eq. 9)

in the paper's column form. Row convention here, x @ W with W [in, out]:

    m_t = (x_t B) * (h_{t-1} C)              intermediate state, |m| = M
    h_t = phi(m_t A + x_t D + h_{t-1} E + f)

Params: A [M, H], B [D, M], C [H, M], D [D, H] (if use_D), E [H, H]
(if use_E), f [H]; each is the transpose of the paper's matrix of the same
name. phi is tanh or the identity; h_0 = 0 (eq. 1).

The per-token transition is W_hh(x_t) = E + A diag(B x_t) C (eq. 13): it is
never formed. x_t B and x_t D are computed for all steps at once in
`precompute` (one matmul with [B | D]); a step is two matmuls: h @ [C | E],
then m @ A.

The mRNN (Sutskever et al. 2011, eq. 6) h_t = phi(Z(V x * W h) + U x + b) is
the case E = 0: Z, V, W, U, b are our A, B, C, D, f.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from sorjax.cells import base


@dataclasses.dataclass(frozen=True)
class General2:
  """Eq. 9; use_D / use_E keep the first-order terms D x_t / E h_{t-1}.

  Hyperparameters: hidden_size, intermediate_size (|m|), use_D, use_E,
  activation ("tanh" or "identity").
  """
  hidden_size: int
  intermediate_size: int
  use_D: bool = True
  use_E: bool = True
  activation: str = "tanh"

  name: ClassVar[str] = "general2"

  def __post_init__(self):
    base.check_positive_int(self.name, "hidden_size", self.hidden_size)
    base.check_positive_int(self.name, "intermediate_size",
                            self.intermediate_size)
    base.check_bool(self.name, "use_D", self.use_D)
    base.check_bool(self.name, "use_E", self.use_E)
    base.check_choice(self.name, "activation", self.activation,
                      ("tanh", "identity"))

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    base.check_init(self, key, dtype)
    base.check_positive_int(self.name, "input_size", input_size)
    H, M = self.hidden_size, self.intermediate_size
    # Six keys whatever the flags, so every variant draws the same A, B, C, ...
    kA, kB, kC, kD, kE, kf = jax.random.split(key, 6)
    params = {"A": base.uniform(kA, (M, H), M, dtype),  # U(+-1/sqrt(fan-in))
              "B": base.uniform(kB, (input_size, M), input_size, dtype),
              "C": base.uniform(kC, (H, M), H, dtype)}
    if self.use_D:
      params["D"] = base.uniform(kD, (input_size, H), input_size, dtype)
    if self.use_E:
      params["E"] = base.uniform(kE, (H, H), H, dtype)
    # f is not zero: with h_0 = 0, f = 0 and no D, h = 0 is a fixed point.
    params["f"] = base.uniform(kf, (H,), H, dtype)
    return params

  def initial_carry(self, params, batch_shape=()):
    batch_shape = base.batch_shape(batch_shape)
    return base.HCarry(jnp.zeros((*batch_shape, self.hidden_size),
                                 base.param_dtype(params)))

  def precompute(self, params, xs):
    """{"BxDx": x_t [B | D]} (one matmul, all t; its halves are sliced in the
    step, so the backward has no pad or concatenation of them), or {"Bx"}
    without D. f is added in the step."""
    base.check_precompute(self, params, xs)
    if not self.use_D:
      return {"Bx": xs @ params["B"]}
    return {"BxDx": xs @ jnp.concatenate([params["B"], params["D"]], axis=1)}

  # Split step (see sorjax.unroll): z = h_{t-1} [C | E]; the second matmul
  # m_t A depends on it, so it stays in `post` (A is in q). `post` is
  # post_second(.., second_input(..) @ A): unroll's fused backward saves m_t
  # and m_t A and forms dA = sum_t m_t^T d(m_t A) as one matmul.
  second_matmul: ClassVar[str] = "A"

  def split(self, params):
    q = {"A": params["A"], "f": params["f"]}
    if not self.use_E:
      return params["C"], q
    return jnp.concatenate([params["C"], params["E"]], axis=1), q

  def recurrent_input(self, carry):
    return carry.h

  def second_input(self, q, carry, xp, hCE):
    # intermediate state m_t = B x_t * C h_{t-1} (eq. 9); hCE[..., :M] is
    # C h_{t-1}, E h_{t-1} follows when use_E
    M = self.intermediate_size
    Bx = xp["BxDx"][..., :M] if self.use_D else xp["Bx"]
    return Bx * hCE[..., :M]

  def post_second(self, q, carry, xp, hCE, mA):
    pre = mA + base.lift(q["f"], mA.ndim)  # m_t A + f
    if self.use_D:
      pre = pre + xp["BxDx"][..., self.intermediate_size:]  # D x_t
    if self.use_E:
      pre = pre + hCE[..., self.intermediate_size:]
    h = base.activation(self.activation)(pre)
    return base.HCarry(h), h

  def post(self, q, carry, xp, hCE):
    return self.post_second(q, carry, xp, hCE,
                            self.second_input(q, carry, xp, hCE) @ q["A"])

  def step(self, params, carry, xp):
    # split's W: C h_{t-1} and E h_{t-1} in one matmul
    return base.split_step(self, params, carry, xp)


@dataclasses.dataclass(frozen=True)
class MRNN(General2):
  """mRNN (Sutskever et al. 2011; Maupome & Meurs eq. 6): eq. 9 with E = 0.

  Hyperparameters: hidden_size, intermediate_size, activation.
  """
  use_D: bool = dataclasses.field(default=True, init=False)
  use_E: bool = dataclasses.field(default=False, init=False)

  name: ClassVar[str] = "mrnn"
