"""tanh as an odd rational function, for XLA:CPU's thread assignment.

XLA:CPU lowers an HLO `tanh` to a rational polynomial anyway, but its cost
model (ParallelTaskAssignment) counts the op as one "transcendental" with
no flops. An LSTM step's activation map then looks I/O-bound (~5 flops
against 12 bytes an element), stays under the 512 KB an I/O-bound fusion
needs before XLA splits it over threads, and runs on one thread while the
other sleeps; the next per-step product then waits ~30 us for it to wake
(BUILD_NOTES, "Why the LSTM trails torch.nn.LSTM at H = 256"). Written out
as multiplies, adds and a divide, the same work counts as ~20 flops an
element: the fusion is compute-bound in XLA's eyes and is split over both
threads from ~1,500 elements up (B=32 H=256: 1.19x for the LSTM layer's
forward + backward), and at the Dyck shape (B=10 H=12), where nothing is
split, the plain arithmetic is also faster than XLA's tanh kernel (1.18x).
Where a split map is too small to pay, `sorjax.fused_lstm.tanh_for` keeps
`jnp.tanh`.

    tanh(x) ~ x P(x^2) / Q(x^2),  |x| <= 9 (clamped; 1 - tanh(9) < 3e-8)

P and Q have degree 4 in x^2; the coefficients are a weighted least-squares
fit of the relative error (Lawson iterations towards minimax) made for
sorjax: `python -m benchmarks.tanh_fit` refits and prints them with the
errors. In float32 on [-12, 12] the maximum error is 3.3e-7 (XLA:CPU's own
tanh: 2.6e-7), mostly rounding in the two Horner sums.

Only float32 on CPU takes the rational form: other dtypes keep `jnp.tanh`
(float64 needs more terms, 16-bit floats would round the sums), and
`jax.lax.platform_dependent` gives GPU and TPU their own tanh, chosen when
the computation is lowered for them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Coefficients of P and Q in powers of y = x^2 (benchmarks/tanh_fit.py).
P = (0.9999999795350929, 0.13381038447013227, 0.003495602900441005,
     2.06093084287322e-05, 1.3354943539933828e-08)
Q = (1.0, 0.4671435406551214, 0.02587703952289931, 0.00032856582400688677,
     7.776680317241047e-07)
CLAMP = 9.0


def _horner(coeffs, y):
  acc = coeffs[-1] * y
  for c in coeffs[-2:0:-1]:
    acc = (acc + c) * y
  return acc + coeffs[0]


def rational(x: jax.Array) -> jax.Array:
  """x P(x^2) / Q(x^2) on x clamped to [-9, 9], itself clamped to [-1, 1]
  (rounding can overshoot 1 by an ulp near the clamp)."""
  x = jnp.clip(x, -CLAMP, CLAMP)
  y = x * x
  return jnp.clip(x * _horner(P, y) / _horner(Q, y), -1.0, 1.0)


@jax.custom_jvp
def tanh(x: jax.Array) -> jax.Array:
  """tanh(x): the rational form for float32 on CPU, `jnp.tanh` otherwise
  (module doc). Its derivative is 1 - tanh(x)^2, as `jnp.tanh`'s."""
  if x.dtype != jnp.float32:
    return jnp.tanh(x)
  return jax.lax.platform_dependent(x, cpu=rational, default=jnp.tanh)


@tanh.defjvp
def _tanh_jvp(primals, tangents):
  (x,), (dx,) = primals, tangents
  t = tanh(x)
  return t, dx * (1 - t * t)
