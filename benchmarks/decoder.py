"""The language model's decoder gradient: `lm.Decoder` against `nn.Dense`.

    python -m benchmarks.decoder [--rounds 5] [--shapes "64,70,600,33278;..."]

`lm.Decoder` has `nn.Dense`'s parameters and forms its gradients as
products over the rows (dW from h^T in memory, db as 1^T dy; BUILD_NOTES,
"The decoder's gradients as products"). Both are timed here in one
process, alternating, on the same parameters: the gradient, to the
decoder's parameters and its input, of the mean softmax cross-entropy of
h W + b for a fixed h [B, T, H] and random targets, at each B,T,H,V of
`--shapes` (default: Lin et al.'s WikiText-2 LM, Renganathan & Singh's
PTB words, a character model). Same framework on both sides, so one
process. Prints a table: ms a call (medians) and the paired speed-up
(median of the rounds' ratios).
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import flags

SHAPES = ((64, 70, 600, 33278), (20, 35, 200, 10000), (128, 100, 128, 50))


def grads(B: int, T: int, H: int, V: int):
  """{name: (compiled gradient, its arguments)} for both decoders."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import optax
  from sorjax.models.lm import Decoder

  kh, ky, kp = jax.random.split(jax.random.key(0), 3)
  h = jax.random.normal(kh, (B, T, H), jnp.float32)
  y = jax.random.randint(ky, (B, T), 0, V)
  out = {}
  for name, module in (("nn.Dense", nn.Dense(V)), ("lm.Decoder", Decoder(V))):
    params = module.init(kp, h)

    def loss(p, h, module=module):
      logits = module.apply(p, h)
      return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
          logits, y))
    out[name] = (jax.jit(jax.grad(loss, (0, 1))).lower(params, h).compile(),
                 (params, h))
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--rounds", type=flags.at_least(1), default=5)
  ap.add_argument("--shapes", default=";".join(
      ",".join(map(str, s)) for s in SHAPES),
                  help="B,T,H,V;B,T,H,V;... (default: %(default)s)")
  args = ap.parse_args(argv)
  shapes = flags.shape_list(ap, "--shapes", args.shapes, "B,T,H,V")
  import jax
  print("| B, T, H, V | nn.Dense ms | lm.Decoder ms | speed-up |")
  print("|---|---|---|---|")
  for shape in shapes:
    cases = grads(*shape)
    for f, a in cases.values():
      jax.block_until_ready(f(*a))  # warm up
    times = {n: [] for n in cases}
    for _ in range(args.rounds):
      for n, (f, a) in cases.items():
        t = time.perf_counter()
        jax.block_until_ready(f(*a))
        times[n].append(time.perf_counter() - t)
    ratios = [d / o for d, o in zip(times["nn.Dense"], times["lm.Decoder"])]
    ms = {n: statistics.median(ts) * 1e3 for n, ts in times.items()}
    print(f"| {', '.join(map(str, shape))} | {ms['nn.Dense']:.4g} | "
          f"{ms['lm.Decoder']:.4g} | {statistics.median(ratios):.2f}x |",
          flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
