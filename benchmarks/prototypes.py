"""Prototype fast paths, measured by the benchmark next to the current cells.

Not part of sorjax: each is a proposal for `sorjax/unroll.py` or a cell
module, kept here so `python -m benchmarks.run` measures it side by side
with what sorjax does now (contender `impl="prototype"`).

`linear_recurrence` -- batched weight gradients. `jax.grad` of a
`lax.scan` whose step computes `h_{t-1} @ W` accumulates dW += h_{t-1}^T dz_t
inside the backward loop: T small matmuls ([H, B] x [B, N], inner size B)
plus a read-modify-write of the whole [H, N] accumulator every step. Here
the backward loop only carries dh; the cotangents dz_t are stacked and
dW = sum_t h_{t-1}^T dz_t is ONE [H, T*B] x [T*B, N] matmul after the loop
(what cuDNN and torch.nn.LSTM's CPU kernel do). The step is split as

    z_t = h_{t-1} @ W                    (the recurrent matmul, W fused)
    carry_t, y_t = post(q, carry_{t-1}, xp_t, z_t)   (the rest, cheap)

and `post`'s own parameters q get ordinary per-step gradients.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from sorjax.cells.lstm import lstm_update
from sorjax.cells.mm_rnn import MMRNNCarry, fused_recurrent, mix


def linear_recurrence(post: Callable, W, q, xp, carry0):
  """Scans `post` over time-major xp with z_t = carry.h @ W; returns
  (final carry, ys [T, ...]). Differentiable in W, q, xp and carry0."""
  return _linear_recurrence(post, W, q, xp, carry0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _linear_recurrence(post, W, q, xp, carry0):
  def body(carry, x):
    return post(q, carry, x, carry.h @ W)
  return jax.lax.scan(body, carry0, xp)


def _fwd(post, W, q, xp, carry0):
  def body(carry, x):
    z = carry.h @ W
    new, y = post(q, carry, x, z)
    return new, (y, carry, z)          # keep carry_{t-1} and z_t
  final, (ys, carries, zs) = jax.lax.scan(body, carry0, xp)
  return (final, ys), (W, q, xp, carries, zs)


def _bwd(post, res, cot):
  W, q, xp, carries, zs = res
  d_final, dys = cot
  Wt = W.T

  def body(acc, inp):
    d_carry, dq = acc
    x, carry, z, dy = inp
    _, pull = jax.vjp(lambda q_, c_, x_, z_: post(q_, c_, x_, z_), q, carry,
                      x, z)
    dq_t, d_prev, dx, dz = pull((d_carry, dy))
    d_prev = d_prev._replace(h=d_prev.h + dz @ Wt)   # through z = h @ W
    dq = jax.tree_util.tree_map(jnp.add, dq, dq_t)
    return (d_prev, dq), (dx, dz)

  dq0 = jax.tree_util.tree_map(jnp.zeros_like, q)
  (d_carry0, dq), (dxp, dzs) = jax.lax.scan(
      body, (d_final, dq0), (xp, carries, zs, dys), reverse=True)
  # dW = sum_t h_{t-1}^T dz_t: one large matmul over all T*B rows.
  dW = jnp.einsum("tbh,tbn->hn", carries.h, dzs)
  return dW, dq, dxp, d_carry0


_linear_recurrence.defvjp(_fwd, _bwd)


# ------------------------------------------------------------------ adapters
# Each: (cell, params, xs [B, T, D], **aux) -> ys [B, T, H], as sorjax.unroll.

def _lstm_post(forget_bias):
  def post(q, carry, xp, z):
    new = lstm_update(xp + z, carry.c, forget_bias)
    return new, new.h
  return post


def lstm_unroll(cell, params, xs, **aux):
  xp = jnp.swapaxes(cell.precompute(params, xs), 0, 1)
  carry0 = cell.initial_carry(params, (xs.shape[0],))
  _, ys = linear_recurrence(_lstm_post(cell.forget_bias), params["W_h"], {},
                            xp, carry0)
  return jnp.swapaxes(ys, 0, 1)


def _mm_rnn_post(K, H):
  def post(q, carry, xp, z):
    v = jax.nn.softmax(carry.v @ q["P_v"] + z[..., K * H:] + xp.vx, axis=-1)
    h = jnp.tanh(mix(v, z[..., :K * H]) + xp.hx)
    return MMRNNCarry(h, v), h
  return post


def mm_rnn_unroll(cell, params, xs, **aux):
  H, K = cell.hidden_size, cell.num_matrices
  P = params["W_proj"]
  xp = jax.tree_util.tree_map(lambda a: jnp.swapaxes(a, 0, 1),
                              cell.precompute(params, xs))
  W = fused_recurrent([params["W"]], [P[K:K + H]])
  carry0 = cell.initial_carry(params, (xs.shape[0],))
  _, ys = linear_recurrence(_mm_rnn_post(K, H), W, {"P_v": P[:K]}, xp,
                            carry0)
  return jnp.swapaxes(ys, 0, 1)


UNROLLS = {"lstm": lstm_unroll, "mm_rnn": mm_rnn_unroll}


def prototype_unroll(name: str) -> Callable[..., Any]:
  """The batched-dW unroll of cell `name` (lstm, mm_rnn)."""
  if name not in UNROLLS:
    raise ValueError(f"prototypes: no batched-dW prototype for {name!r}; "
                     f"have {sorted(UNROLLS)}")
  return UNROLLS[name]


def policy_unroll(cell, params, xs, policy: str = "dots", **aux):
  """sorjax.unroll's hoisted scan with the step under `jax.checkpoint` and a
  saving policy: "dots" keeps only matmul outputs (the gates' pre-
  activations) for the backward pass and recomputes the elementwise rest,
  instead of autodiff's default of every intermediate (often twice)."""
  policies = {"dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
              "nothing": jax.checkpoint_policies.nothing_saveable}
  xp = jax.tree_util.tree_map(lambda a: jnp.swapaxes(a, 0, 1),
                              cell.precompute(params, xs, **aux))
  step = jax.checkpoint(lambda c, x: cell.step(params, c, x),
                        policy=policies[policy], prevent_cse=False)
  _, ys = jax.lax.scan(step, cell.initial_carry(params, (xs.shape[0],)), xp)
  return jnp.swapaxes(ys, 0, 1)
