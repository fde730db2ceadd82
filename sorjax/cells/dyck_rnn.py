"""Dyck-RNN (Renganathan & Singh sec. 4.2): the hidden state is a stack.

In the paper's column form, with fixed shift matrices W_1 (ones on the
subdiagonal: push, moves every element down one unit) and W_2 (ones on the
superdiagonal: pop, moves every element up one unit):

    g_t = sigmoid(x_t W_proj)                  (a scalar per example)  # eq. 3
    W_hh(t) = g_t W_1 + (1 - g_t) W_2                                  # eq. 4
    h_t = W_hh(t) h_{t-1} + g_t x_t W_hx         (no nonlinearity)     # eq. 5

Unit 0 is the top of the stack: a push (g = 1) moves the stack down and
writes x_t W_hx on top; a pop (g = 0) drops the top. The step never forms
W_hh(t) nor multiplies by W_1 / W_2: W_1 h and W_2 h are shifts, O(H) slices
and concatenations. `fixed_arrays()` returns W_1, W_2 for references.
`sorjax.fused_dyck_rnn` runs the same recurrence with a backward of its own
(`sorjax.unroll` picks it from hidden size 128).

Inputs: the paper embeds each bracket in 1-d with fixed, non-trainable
values (`learn_embedding=False`, input size 1, `fixed_embedding(k)` is the
table); sec. 6.2 learns a 2-d embedding with H = 2m instead
(`learn_embedding=True`, any input size; the model owns the embedding).
Params: W_proj [D, 1], W_hx [D, H]; there are no biases in eq. 3-5.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sorjax.cells import base


class DyckInputs(NamedTuple):
  """Input-only terms of one or all steps."""
  g: jax.Array  # g_t = sigmoid(x_t W_proj), the push weight   [..., 1]
  u: jax.Array  # g_t x_t W_hx, what a push writes             [..., H]


def shift_matrices(hidden_size: int) -> tuple[np.ndarray, np.ndarray]:
  """W_1 (subdiagonal, push) and W_2 (superdiagonal, pop), float64 [H, H]."""
  return np.eye(hidden_size, k=-1), np.eye(hidden_size, k=1)


def push(h: jax.Array) -> jax.Array:
  """W_1 h: every element one unit down, 0 on top (unit 0)."""
  return jnp.concatenate([jnp.zeros_like(h[..., :1]), h[..., :-1]], axis=-1)


def pop(h: jax.Array) -> jax.Array:
  """W_2 h: every element one unit up, the top dropped, 0 at the bottom."""
  return jnp.concatenate([h[..., 1:], jnp.zeros_like(h[..., :1])], axis=-1)


@dataclasses.dataclass(frozen=True)
class DyckRNN:
  """Dyck-RNN.

  Attributes:
    hidden_size: H, the stack depth (the paper: H = m for m-bounded Dyck-k;
      H = 2m with a learned 2-d embedding).
    learn_embedding: False for the paper's fixed 1-d bracket embedding
      (input size must be 1); True when the model learns the embedding.
  """
  hidden_size: int
  learn_embedding: bool = False

  def __post_init__(self):
    base.check_positive_int("dyck_rnn", "hidden_size", self.hidden_size)
    base.check_bool("dyck_rnn", "learn_embedding", self.learn_embedding)

  def fixed_arrays(self) -> dict[str, np.ndarray]:
    """The non-trainable shift matrices W1, W2 [H, H] of eq. 4 (float64)."""
    W1, W2 = shift_matrices(self.hidden_size)
    return {"W1": W1, "W2": W2}

  def fixed_embedding(self, num_brackets_k: int) -> np.ndarray:
    """The frozen 1-d bracket embedding [2k + 2, 1] (float64).

    Vocabulary: ids 0..k-1 open brackets, k..2k-1 their closers in the same
    order, then START, END. Values: open j -> j + 1, closer j -> -(j + 1),
    START = END = 0. The sign chooses the operation (with W_proj > 0, an
    open bracket pushes, g ~ 1, and a closer pops, g ~ 0); the magnitude
    j + 1 names the type, which W_hx = [w, 0, ..., 0] writes on top, so the
    top unit holds w (j + 1) for the innermost unclosed bracket j, and 0 when
    the stack is empty. START and END come where the stack is empty (h = 0):
    x = 0 writes nothing and any push/pop mixture of 0 is 0, so they leave h
    unchanged. An affine readout separates the k tops: logits_j =
    c (j + 1) (top / w - (j + 1) / 2) is largest at the nearest j + 1.
    """
    if self.learn_embedding:
      raise ValueError("dyck_rnn: fixed_embedding is the table of "
                       "learn_embedding=False; this cell has "
                       "learn_embedding=True (the model learns it)")
    base.check_positive_int("dyck_rnn", "num_brackets_k", num_brackets_k)
    j = np.arange(1, num_brackets_k + 1, dtype=np.float64)
    return np.concatenate([j, -j, [0.0, 0.0]])[:, None]

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    """W_proj, W_hx ~ U(+-1/sqrt(D)) (linear layers on x)."""
    base.check_init(self, key, dtype)
    base.check_positive_int("dyck_rnn", "input_size", input_size)
    if not self.learn_embedding and input_size != 1:
      raise ValueError(
          f"dyck_rnn: input_size must be 1 with learn_embedding=False (the "
          f"paper's fixed 1-d bracket embedding); got {input_size}")
    kp, kx = jax.random.split(key)
    D, H = input_size, self.hidden_size
    return {"W_proj": base.uniform(kp, (D, 1), D, dtype),
            "W_hx": base.uniform(kx, (D, H), D, dtype)}

  def initial_carry(self, params, batch_shape=()):
    """The empty stack, h_0 = 0."""
    batch_shape = base.batch_shape(batch_shape)
    return base.HCarry(jnp.zeros((*batch_shape, self.hidden_size),
                                 base.param_dtype(params)))

  def precompute(self, params, xs):
    base.check_precompute(self, params, xs)
    g = jax.nn.sigmoid(xs @ params["W_proj"])                        # eq. 3
    # g (x W_hx) as (g x) W_hx, equal to float rounding: g's gradient is
    # then a sum over D, not over H, and leaves the YNNPACK reduce fusion
    # in which XLA:CPU (jax 0.10.2) also formed W_proj's gradient (2.8 ms
    # of a renganathan_dyck:m4 training step; the step 1.31x faster).
    return DyckInputs(g, (g * xs) @ params["W_hx"])

  def step(self, params, carry, xp):
    def step():
      h = carry.h
      h = xp.g * push(h) + (1 - xp.g) * pop(h) + xp.u               # eq. 4-5
      return base.HCarry(h), h
    return base.check_step(self, carry, xp, step)
