"""R replicas of an LSTM layer in vectorised lanes: a measured alternative
to vmap for the Dyck experiments' many tiny models (issue 7's "20
replicas in <= 3x one model"), kept in benchmarks/ as the evidence behind
BUILD_NOTES' verdict; sorjax does not use it.

vmap of `fused_lstm.lstm_layer` over R replicas runs R batched
[B, H] x [H, 4H] products per step and elementwise fusions whose minor
dimension is 4H = 48, which XLA:CPU compiles to scalar code
(benchmarks/small_model.md). Here every array has the replicas and the
batch in its minor dimension, L = R * B lanes (lane r * B + b):

    state h, c [H, L]; z_t [4H, L] = sum_k Wh[:, k, :] h_{t-1}[k]
                                   + sum_d Wx[:, d, :] x_t[d] + b

with W_h, W_x and b repeated over each replica's B lanes before the loop
(Wh [4H, H, L]), so a product is H unrolled multiply-adds over [4H, L],
vectorised along L; the gate map, c_t and h_t are the `fused_lstm`
equations on [4H, L] and [H, L]. The backward is written by hand; its
dz_t passes an optimization barrier, without which XLA fused dz's map
into the backward product and recomputed it per use (in a forward with
that fault a step took 29.9 us against 5.7).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sorjax import rational_tanh
from sorjax.fused_lstm import activation_consts
from sorjax.layer_scan import previous_steps, scan_overwrite, scan_prefetch


def _consts(H: int):
  """(s, delta) per gate row, [4H, 1]: A = s tanh(s z) + delta is
  [sigma(i), sigma(f), tanh(g), sigma(o)] (`fused_lstm.activation_consts`
  in its gate-major layout, forget bias 0, whose gamma is then 0)."""
  s, _, delta = activation_consts(H, 0.0, jnp.float32, tr=True)
  return s, delta


def _rows(W, v):
  """sum_k W[:, k, :] * v[k]: [n, k, L] by [k, L] -> [n, L]."""
  z = W[:, 0] * v[0][None]
  for k in range(1, v.shape[0]):
    z = z + W[:, k] * v[k][None]
  return z


def _cols(W, d):
  """sum_n W[n] * d[n]: [n, k, L] by [n, L] -> [k, L]."""
  g = W[0] * d[0][None]
  for n in range(1, d.shape[0]):
    g = g + W[n] * d[n][None]
  return g


def _forward(Wh, Wx, bl, xl, h0, c0):
  s, delta = _consts(h0.shape[0])
  tanh = rational_tanh.tanh

  def body(carry, x):
    h, c = carry
    A = s * tanh(s * (_rows(Wh, h) + _rows(Wx, x) + bl)) + delta
    si, sf, tg, so = jnp.split(A, 4, axis=0)
    c_new = sf * c + si * tg
    h_new = so * tanh(c_new)
    return (h_new, c_new), (h_new, c, A)

  _, (ys, cs, As) = scan_prefetch(body, (h0, c0), xl)
  return ys, As, cs


@jax.custom_vjp
def _layer(Wh, Wx, bl, xl, h0, c0):
  return _forward(Wh, Wx, bl, xl, h0, c0)[0]


def _layer_fwd(Wh, Wx, bl, xl, h0, c0):
  ys, As, cs = _forward(Wh, Wx, bl, xl, h0, c0)
  return ys, (Wh, Wx, xl, h0, ys, As, cs)


def _layer_bwd(res, dys):
  Wh, Wx, xl, h0, ys, As, cs = res
  s, delta = _consts(h0.shape[0])
  tanh = rational_tanh.tanh

  def body(carry, A, inp):  # A_t, overwritten with dz_t
    dh, dc = carry
    c0, dy = inp
    si, sf, tg, so = jnp.split(A, 4, axis=0)
    tc = tanh(sf * c0 + si * tg)
    dh_t = dh + dy
    dct = dc + dh_t * so * (1 - tc * tc)
    dA = jnp.concatenate([dct * tg, dct * c0, dct * si, dh_t * tc], axis=0)
    u = (A - delta) / s
    dz = jax.lax.optimization_barrier(dA * (s * s) * (1 - u * u))
    return (_cols(Wh, dz), dct * sf), _cols(Wx, dz), dz

  zero = jnp.zeros_like(h0)
  (dh0, dc0), dxl, dzs = scan_overwrite(body, (zero, zero), As, (cs, dys),
                                        reverse=True)
  hprev = previous_steps(h0, ys, 0)
  dWh = jnp.einsum("tkl,tnl->nkl", hprev, dzs)  # per lane, summed by the
  dWx = jnp.einsum("tkl,tnl->nkl", xl, dzs)     # repeat's transpose
  return dWh, dWx, jnp.sum(dzs, 0), dxl, dh0, dc0


_layer.defvjp(_layer_fwd, _layer_bwd)


def lstm_replicas(W_h, W_x, b, xs):
  """R LSTM layers from zero state, as `jax.vmap` of `fused_lstm.lstm_layer`
  (forget_bias 0, no padding) computes them.

  Args: W_h [R, H, 4H], W_x [R, D, 4H], b [R, 4H] (gate order i, f, g, o);
  xs [R, B, T, D]. Returns ys [R, B, T, H].
  """
  R, B, T, D = xs.shape
  H = W_h.shape[1]
  if W_h.shape != (R, H, 4 * H) or W_x.shape != (R, D, 4 * H) or \
      b.shape != (R, 4 * H):
    raise ValueError(f"lstm_replicas: want W_h [R, H, 4H], W_x [R, D, 4H], "
                     f"b [R, 4H] with R, D = {R}, {D} from xs {xs.shape}; got "
                     f"W_h {W_h.shape}, W_x {W_x.shape}, b {b.shape}")
  L = R * B

  def lanes(W):  # [R, k, n] -> [n, k, R * B], each replica over its B lanes
    n, k = W.shape[2], W.shape[1]
    return jnp.broadcast_to(jnp.transpose(W, (2, 1, 0))[..., None],
                            (n, k, R, B)).reshape(n, k, L)

  bl = jnp.broadcast_to(b.T[:, :, None], (4 * H, R, B)).reshape(4 * H, L)
  xl = jnp.transpose(xs, (2, 3, 0, 1)).reshape(T, D, L)
  zero = jnp.zeros((H, L), xs.dtype)
  ys = _layer(lanes(W_h), lanes(W_x), bl, xl, zero, zero)     # [T, H, L]
  return jnp.transpose(ys.reshape(T, H, R, B), (2, 3, 0, 1))
