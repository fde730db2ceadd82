"""Unrolls every sequence cell of the zoo on random data and prints a table.

    python -m sorjax.demo [--hidden 64] [--batch 16] [--steps 50]

Columns: trainable parameters, output shape, and forward+backward tokens/s of
a jitted `sorjax.unroll` (a smoke run, not a benchmark: see benchmarks/).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import sorjax
from sorjax import cells


def demo_cell(name: str, H: int):
  """A cell of hidden size H with sensible demo hyperparameters, plus aux."""
  extra = {
      "general2": dict(intermediate_size=H),
      "mrnn": dict(intermediate_size=H),
      "mlstm": dict(intermediate_size=H),
      "attention_lstm": dict(num_cells=2),
      "assignment_lstm": dict(num_cells=2),
      "mts_lstm": dict(timescales=tuple(float(t) for t in
                                        np.geomspace(1.0, 100.0, H))),
  }.get(name, {})
  return cells.make(name, hidden_size=H, **extra)


def demo_aux(name: str, B: int, T: int):
  if name == "attention_lstm":
    return {"temperature": jnp.float32(1.0)}
  if name == "assignment_lstm":
    return {"assignment": jnp.arange(B * T).reshape(B, T) % 2}
  return {}


def _positive(text: str) -> int:
  """argparse's type for a size: argparse names the flag on a bad one."""
  try:
    v = int(text)
  except ValueError:
    v = 0
  if v < 1:
    raise argparse.ArgumentTypeError(
        f"must be a positive integer, got {text!r}")
  return v


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--hidden", type=_positive, default=64)
  parser.add_argument("--batch", type=_positive, default=16)
  parser.add_argument("--steps", type=_positive, default=50)
  parser.add_argument("--input", type=_positive, default=32)
  args = parser.parse_args(argv)
  B, T, D, H = args.batch, args.steps, args.input, args.hidden

  print(f"sorjax {sorjax.__version__} on {jax.devices()[0].platform}: "
        f"B={B} T={T} D={D} H={H}")
  print(f"{'cell':<17}{'params':>10}  {'output':<14}{'tokens/s':>12}")
  for name in cells.sequence_names():
    cell = demo_cell(name, H)
    d = 1 if name == "dyck_rnn" else D   # its fixed 1-d bracket embedding
    params = cell.init(jax.random.key(0), d)
    xs = jax.random.normal(jax.random.key(1), (B, T, d))
    aux = demo_aux(name, B, T)

    @jax.jit
    def loss_and_grad(p, x):
      def loss(p):
        _, ys = sorjax.unroll(cell, p, x, **aux)
        return jnp.mean(ys ** 2), ys
      return jax.value_and_grad(loss, has_aux=True)(p)

    (_, ys), g = loss_and_grad(params, xs)
    jax.block_until_ready(g)
    reps, t0 = 3, time.perf_counter()
    for _ in range(reps):
      jax.block_until_ready(loss_and_grad(params, xs))
    rate = reps * B * T / (time.perf_counter() - t0)
    n = sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(params))
    print(f"{name:<17}{n:>10,}  {str(tuple(ys.shape)):<14}{rate:>12,.0f}")


if __name__ == "__main__":
  main()
