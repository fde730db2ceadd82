"""Compile time under the test suite's XLA settings against XLA's defaults.

    python -m benchmarks.compile_time [--repeats 3]

Each setting runs in its own process (XLA reads XLA_FLAGS and jax its
optimisation level once, at start), alternating A B A B ... `--repeats`
times, with no compilation cache. A process compiles the value and
gradients of a fused mm_lstm layer (B, T, D, H = 3, 6, 2, 5; lengths,
reverse) by the fused backward and by autodiff's scan, and runs 30 eager
ops of new shapes (each compiles a program). The report gives the median
of each time and its ratio to the first setting's (the defaults').
tests/conftest.py uses the last setting; BUILD_NOTES.md ("Build and test")
gives the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SETTINGS = {
    "defaults": {"JAX_DISABLE_MOST_OPTIMIZATIONS": "0", "XLA_FLAGS": ""},
    "LLVM level 0": {"JAX_DISABLE_MOST_OPTIMIZATIONS": "1", "XLA_FLAGS": ""},
    "level 0 + loop emitters": {
        "JAX_DISABLE_MOST_OPTIMIZATIONS": "1",
        "XLA_FLAGS": "--xla_cpu_use_fusion_emitters=false"},
}

_PROBE = """
import json, time
import jax, jax.numpy as jnp, numpy as np
import sorjax
B, T, D, H = 3, 6, 2, 5
cell = sorjax.cells.make("mm_lstm", hidden_size=H, num_matrices=(3, 1, 2, 4))
rng = np.random.default_rng(0)
shapes = jax.eval_shape(lambda k: cell.init(k, D), jax.random.key(0))
params = {k: jnp.asarray(rng.uniform(-0.5, 0.5, v.shape), v.dtype)
          for k, v in shapes.items()}
xs = jnp.asarray(rng.standard_normal((B, T, D)), jnp.float32)
G = jnp.asarray(rng.standard_normal((B, T, H)), jnp.float32)
lengths = jnp.array([6, 3, 0])
out = {}
for fused in (True, False):
  def loss(p, x):
    _, ys = sorjax.unroll(cell, p, x, lengths=lengths, reverse=True,
                          fused_grad=fused)
    return jnp.sum(ys * G)
  lowered = jax.jit(jax.value_and_grad(loss, (0, 1))).trace(
      params, xs).lower()
  t = time.perf_counter()
  lowered.compile()
  out["fused gradient" if fused else "autodiff gradient"] = (
      time.perf_counter() - t)
jnp.ones(3).block_until_ready()
t = time.perf_counter()
for i in range(30):
  (jnp.ones((8, 8 + i)) * 2).block_until_ready()
out["eager op"] = (time.perf_counter() - t) / 60
print(json.dumps(out))
"""


def _measure(env_extra: dict) -> dict:
  env = {k: v for k, v in os.environ.items()
         if k not in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR")}
  env.update(env_extra)
  env["JAX_PLATFORMS"] = "cpu"
  res = subprocess.run([sys.executable, "-c", _PROBE], env=env,
                       capture_output=True, text=True, timeout=600)
  if res.returncode:
    raise RuntimeError(f"compile-time probe failed ({env_extra}):\n"
                       f"{res.stderr[-2000:]}")
  return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args(argv)
  if args.repeats < 1:
    ap.error(f"--repeats must be >= 1, got {args.repeats}")
  runs = {name: [] for name in SETTINGS}
  for _ in range(args.repeats):
    for name, env in SETTINGS.items():
      runs[name].append(_measure(env))
  medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
             for name, rs in runs.items()}
  base = next(iter(medians.values()))  # the first setting's: the defaults
  keys = list(base)
  print("| setting | " + " | ".join(keys) + " |")
  print("|---|" + "---|" * len(keys))
  for name, m in medians.items():
    cells = [f"{m[k] * 1e3:.0f} ms ({base[k] / m[k]:.1f}x)" for k in keys]
    print(f"| {name} | " + " | ".join(cells) + " |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
