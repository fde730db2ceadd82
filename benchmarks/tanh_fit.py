"""Fits the coefficients of `sorjax.rational_tanh` and prints their errors.

    python -m benchmarks.tanh_fit [--m 4] [--n 4]

tanh(x) ~ x P(x^2) / Q(x^2) on [0, CLAMP] (odd, so that covers [-CLAMP,
CLAMP]), P of degree m and Q of degree n in y = x^2, Q(0) = 1. The fit is
linear least squares on x P(y) - tanh(x) Q(y) ~ 0 at Chebyshev points,
with weights 1 / (tanh(x) Q_prev(y)) (so the residual is the relative
error of the previous iterate; Sanathanan-Koerner), multiplied from the
tenth iteration on by |relative error|^(1/2) (Lawson's update towards the
minimax fit). Float64 throughout; `float32_errors` then evaluates the
coefficients as the library does, in float32.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks import flags
from sorjax.rational_tanh import CLAMP

ITERATIONS = 60
LAWSON_FROM = 10


def chebyshev_points(n: int = 4000, hi: float = CLAMP) -> np.ndarray:
  k = np.arange(n)
  x = hi * (1 - np.cos(np.pi * (k + 0.5) / n)) / 2
  return x[x > 1e-4]  # tanh(x) / x = 1 - x^2 / 3: nothing to fit below


def _poly(coeffs: np.ndarray, y: np.ndarray) -> np.ndarray:
  return np.polyval(coeffs[::-1], y)


def fit(m: int = 4, n: int = 4) -> tuple[np.ndarray, np.ndarray, float]:
  """(P, Q, max relative error in float64), coefficients lowest power
  first, Q[0] = 1."""
  x = chebyshev_points()
  t, y = np.tanh(x), x * x
  A = np.concatenate([x[:, None] * y[:, None] ** np.arange(m + 1),
                      -t[:, None] * y[:, None] ** np.arange(1, n + 1)], 1)
  w, q_prev = np.ones_like(x), np.ones_like(x)
  for it in range(ITERATIONS):
    ww = w / (t * q_prev)
    sol = np.linalg.lstsq(A * ww[:, None], t * ww, rcond=None)[0]
    p, q = sol[:m + 1], np.concatenate([[1.0], sol[m + 1:]])
    q_prev = _poly(q, y)
    err = (x * _poly(p, y) / q_prev - t) / t
    if it >= LAWSON_FROM:
      w = w * np.sqrt(np.abs(err))
      w /= w.max()
  return p, q, float(np.abs(err).max())


def float32_errors(p, q, lo: float = -12.0, hi: float = 12.0,
                   num: int = 2_000_001) -> tuple[float, float]:
  """(max absolute, max relative) error of the float32 evaluation (clamp,
  Horner, divide, clamp to [-1, 1]) against float64 tanh on a grid."""
  x = np.linspace(lo, hi, num).astype(np.float32)
  xc = np.clip(x, np.float32(-CLAMP), np.float32(CLAMP))
  y = xc * xc
  P = np.zeros_like(y)
  for c in np.asarray(p, np.float32)[::-1]:
    P = P * y + c
  Q = np.zeros_like(y)
  for c in np.asarray(q, np.float32)[::-1]:
    Q = Q * y + c
  r = np.clip(xc * P / Q, -1, 1).astype(np.float64)
  ref = np.tanh(x.astype(np.float64))
  e = np.abs(r - ref)
  return float(e.max()), float((e / np.maximum(np.abs(ref), 1e-30)).max())


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--m", type=flags.at_least(0), default=4,
                  help="degree of P in x^2")
  ap.add_argument("--n", type=flags.at_least(0), default=4,
                  help="degree of Q in x^2")
  a = ap.parse_args(argv)
  p, q, rel64 = fit(a.m, a.n)
  fmt = lambda v: "(" + ", ".join(f"{c:.16e}" for c in v) + ")"  # noqa: E731
  print(f"P = {fmt(p)}\nQ = {fmt(q)}")
  print(f"max relative error, float64 on [0, {CLAMP}]: {rel64:.2e}")
  ab, rel = float32_errors(p, q)
  print(f"float32 on [-12, 12]: max absolute {ab:.2e}, max relative "
        f"{rel:.2e}")


if __name__ == "__main__":
  main()
