"""Helpers for the naive per-family references (NumPy, float64, for-loops)."""

import numpy as np


def sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def np_params(params):
  """Cell params as float64 NumPy arrays (nested dicts/tuples kept)."""
  if isinstance(params, dict):
    return {k: np_params(v) for k, v in params.items()}
  if isinstance(params, (tuple, list)):
    return type(params)(np_params(v) for v in params)
  return np.asarray(params, np.float64)


def run_numpy(step, h0, xs):
  """Loops a NumPy step(state, x_t) -> (state, y_t) over xs [B, T, D]."""
  state, ys = h0, []
  for t in range(xs.shape[1]):
    state, y = step(state, xs[:, t])
    ys.append(y)
  return state, np.stack(ys, 1)
