"""Naive second-order cells: each step materialises W_hh(x_t) per example.

What one writes straight from the papers' matrix form: build the
per-example transition W_hh(t) [B, H, H'] (Maupome & Meurs eq. 13,
Renganathan & Singh eq. 4 / 7, Lin et al. sec. 3.2's mixture of W_hh^(s))
and multiply h_{t-1} by it. Same parameters and outputs as the sorjax cells,
so the benchmark compares the factored step against this one. Under
`jax.grad` the scan keeps every W_hh(t) for the backward pass: T x B x H x H'
floats, the memory the factored forms avoid.

    ys = naive_unroll("mrnn", cell, params, xs)      # [B, T, H]
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sorjax.cells import base

Array = jax.Array


def _bmv(h: Array, W: Array) -> Array:
  """h_{t-1} W_hh(t) per example: [B, I] x [B, I, J] -> [B, J]."""
  return jnp.einsum("bi,bij->bj", h, W)


def _lstm(gates: Array, c: Array, forget_bias=0.0, act=jnp.tanh):
  i, f, g, o = jnp.split(gates, 4, axis=-1)
  c = jax.nn.sigmoid(f + forget_bias) * c + jax.nn.sigmoid(i) * act(g)
  return jax.nn.sigmoid(o) * jnp.tanh(c), c


def _row(v: Array, ndim: int) -> Array:
  return base.lift(v, ndim)


# ------------------------------------------------------------------ steps
# Each: (cell, params, carry, x_t [B, D], aux_t) -> (carry, h_t).

def _general2(cell, p, h, x, aux):
  Bx = x @ p["B"]                                           # [B, M]
  W = jnp.einsum("bhm,mk->bhk", p["C"][None] * Bx[:, None, :], p["A"])
  if cell.use_E:
    W = W + p["E"][None]            # W_hh(x) = C diag(x B) A + E, eq. 13 (rows)
  pre = _bmv(h, W) + _row(p["f"], 2)
  if cell.use_D:
    pre = pre + x @ p["D"]
  h = base.activation(cell.activation)(pre)
  return h, h


def _mi_rnn(cell, p, h, x, aux):
  Ux = x @ p["U"]
  if cell.general:                                          # eq. 8
    scale = _row(p["alpha"], 2) * Ux + _row(p["beta2"], 2)
    shift = _row(p["beta1"], 2) * Ux + _row(p["b"], 2)
  else:                                                     # eq. 7
    scale, shift = Ux, _row(p["b"], 2)
  W = p["W"][None] * scale[:, None, :]                      # W diag(scale)
  h = base.activation(cell.activation)(_bmv(h, W) + shift)
  return h, h


def _tensor_rnn(cell, p, h, x, aux):
  W = jnp.einsum("bd,dij->bij", x, p["A"])                  # sum_d x_d A[d]
  h = base.activation(cell.activation)(_bmv(h, W) + _row(p["b"], 2))
  return h, h


def _mlstm(cell, p, carry, x, aux):
  h, c = carry
  mx = x @ p["W_mx"]
  W = jnp.einsum("bhm,mg->bhg", p["W_mh"][None] * mx[:, None, :], p["W_m"])
  gates = x @ p["W_x"] + _row(p["b"], 2) + _bmv(h, W)       # [B, 4H]
  act = base.activation(cell.candidate_activation)
  h, c = _lstm(gates, c, act=act)
  return (h, c), h


def _attention_lstm(cell, p, carry, x, aux):
  if cell.mix != "gates":
    raise ValueError("naive attention_lstm: only mix='gates' has a per-token "
                     "W_hh(t) = sum_s alpha_s W_h[s] to materialise")
  h, c = carry
  alpha = jax.nn.softmax(x @ p["V"] / aux["temperature"], axis=-1)
  W_h = jnp.einsum("bs,shg->bhg", alpha, p["W_h"])          # [B, H, 4H]
  gx = jnp.einsum("bs,bsg->bg", alpha,
                  jnp.einsum("bd,sdg->bsg", x, p["W_x"]) + p["b"][None])
  h, c = _lstm(gx + _bmv(h, W_h), c, cell.forget_bias)
  return (h, c), h


def _assignment_lstm(cell, p, carry, x, aux):
  h, c = carry
  a = aux["assignment"]                                     # [B]
  W_h, W_x = p["W_h"][a], p["W_x"][a]                       # [B, H, 4H], [B, D, 4H]
  gates = _bmv(x, W_x) + p["b"][a] + _bmv(h, W_h)
  h, c = _lstm(gates, c, cell.forget_bias)
  return (h, c), h


def _softmax_key(v, h, x, P):
  K, H = v.shape[-1], h.shape[-1]
  return jax.nn.softmax(v @ P[:K] + h @ P[K:K + H] + x @ P[K + H:], axis=-1)


def _mm_rnn(cell, p, carry, x, aux):
  h, v = carry
  v = _softmax_key(v, h, x, p["W_proj"])                    # eq. 6
  W = jnp.einsum("bk,kij->bij", v, p["W"])                  # eq. 7
  h = jnp.tanh(_bmv(h, W) + x @ p["W_hx"] + _row(p["b"], 2))  # eq. 8
  return (h, v), h


def _mm_lstm(cell, p, carry, x, aux):
  h, c, *vs = carry
  pre, new_v = [], []
  for g, v in zip("cifo", vs):
    v = _softmax_key(v, h, x, p[f"W_{g}_proj"])             # eq. 9, 11, 13, 15
    W = jnp.einsum("bk,kij->bij", v, p[f"W_{g}"])           # eq. 10, 12, 14, 16
    pre.append(_bmv(h, W) + x @ p[f"W_{g}_hx"] + _row(p[f"b_{g}"], 2))
    new_v.append(v)
  c_hat = jnp.tanh(pre[0])                                  # eq. 20
  i, f, o = (jax.nn.sigmoid(z) for z in pre[1:])            # eq. 17-19
  c = f * c + i * c_hat                                     # eq. 21
  h = o * jnp.tanh(c)                                       # eq. 22
  return (h, c, *new_v), h


def _dyck_rnn(cell, p, h, x, aux):
  fixed = cell.fixed_arrays()
  W1 = jnp.asarray(fixed["W1"], h.dtype)
  W2 = jnp.asarray(fixed["W2"], h.dtype)
  g = jax.nn.sigmoid(x @ p["W_proj"])[:, :, None]           # eq. 3, [B, 1, 1]
  W = g * W1[None] + (1 - g) * W2[None]                     # eq. 4, column form
  h = jnp.einsum("bij,bj->bi", W, h) + g[:, :, 0] * (x @ p["W_hx"])  # eq. 5
  return h, h


STEPS = {
    "general2": _general2, "mrnn": _general2, "mi_rnn": _mi_rnn,
    "tensor_rnn": _tensor_rnn, "mlstm": _mlstm,
    "attention_lstm": _attention_lstm, "assignment_lstm": _assignment_lstm,
    "mm_rnn": _mm_rnn, "mm_lstm": _mm_lstm, "dyck_rnn": _dyck_rnn,
}


def has_naive(name: str) -> bool:
  return name in STEPS


def _initial(name, cell, params, B):
  carry = cell.initial_carry(params, (B,))
  return tuple(carry) if len(carry) > 1 else carry[0]


def naive_unroll(name: str, cell, params, xs: Array, **aux) -> Array:
  """ys [B, T, H] of cell `name` over xs [B, T, D], materialising W_hh(t).

  aux: `temperature` (attention_lstm, a scalar), `assignment` (int [B, T]).
  """
  if name not in STEPS:
    raise ValueError(f"naive: no materialised form of {name!r} "
                     f"(first-order cells have a constant W_hh)")
  B = xs.shape[0]
  step = STEPS[name]
  per_step = {k: jnp.swapaxes(v, 0, 1) for k, v in aux.items()
              if jnp.ndim(v) >= 2}
  scalar = {k: v for k, v in aux.items() if jnp.ndim(v) < 2}

  def body(carry, inp):
    x, a = inp
    return step(cell, params, carry, x, {**a, **scalar})

  _, ys = jax.lax.scan(body, _initial(name, cell, params, B),
                       (jnp.swapaxes(xs, 0, 1), per_step))
  return jnp.swapaxes(ys, 0, 1)
