"""The language model's decoder gradient: `lm.Decoder` against `nn.Dense`.

    python -m benchmarks.decoder [--rounds 5] [--shapes "64,70,600,33278;..."]

`lm.Decoder` has `nn.Dense`'s parameters and forms its gradients as one
product over the rows, [dW; db] = [h^T; 1^T] dy from h^T in memory
(`base.affine_products`; BUILD_NOTES, "The decoder's gradients as
products"). Both are timed here in one process, in rounds of rotating
order (`small_model.rounds`), on the same parameters: the gradient, to
the decoder's parameters and its input, of the mean softmax cross-entropy
of h W + b for a fixed h [B, T, H] and random targets, at each B,T,H,V of
`--shapes` (default: Lin et al.'s WikiText-2 LM, Renganathan & Singh's
PTB words, a character model), in two forms: the gradient alone, and
vmapped over one replica as the training loop runs it (there XLA:CPU
compiled a separate 1^T dy to a transposed copy of the cotangent). Same
framework on both sides, so one process. Prints a table: ms a call
(medians) and the paired speed-up (median of the rounds' ratios).
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import flags

SHAPES = ((64, 70, 600, 33278), (20, 35, 200, 10000), (128, 100, 128, 50))


FORMS = ("grad", "vmap(grad), 1 replica")


def cases(B: int, T: int, H: int, V: int, vmapped: bool = False):
  """Both decoders' compiled gradients (`small_model.Case`s, wall clock),
  nn.Dense first; `vmapped`: over a leading replica axis of 1 for the
  params and h, as the training loop's step."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import optax
  from benchmarks.small_model import Case
  from sorjax.models.lm import Decoder

  kh, ky, kp = jax.random.split(jax.random.key(0), 3)
  h = jax.random.normal(kh, (B, T, H), jnp.float32)
  y = jax.random.randint(ky, (B, T), 0, V)
  out = []
  for name, module in (("nn.Dense", nn.Dense(V)), ("lm.Decoder", Decoder(V))):
    def loss(p, h, module=module):
      logits = module.apply(p, h)
      return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
          logits, y))
    grad, args = jax.grad(loss, (0, 1)), (module.init(kp, h), h)
    if vmapped:
      grad = jax.vmap(grad)
      args = jax.tree_util.tree_map(lambda a: a[None], args)
    out.append(Case(name, grad, args, clock=time.perf_counter))
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--rounds", type=flags.at_least(1), default=5)
  ap.add_argument("--shapes", default=";".join(
      ",".join(map(str, s)) for s in SHAPES),
                  help="B,T,H,V;B,T,H,V;... (default: %(default)s)")
  args = ap.parse_args(argv)
  shapes = flags.shape_list(ap, "--shapes", args.shapes, "B,T,H,V")
  from benchmarks.small_model import ratio, rounds, table
  rows = []
  for shape in shapes:
    for form in FORMS:
      ts = rounds(cases(*shape, vmapped=form != FORMS[0]), args.rounds, 0)
      ms = {n: statistics.median(t) * 1e3 for n, t in ts.items()}
      rows.append([", ".join(map(str, shape)), form, f"{ms['nn.Dense']:.4g}",
                   f"{ms['lm.Decoder']:.4g}",
                   f"{ratio(ts, 'nn.Dense', 'lm.Decoder'):.2f}x"])
  print(table(["B, T, H, V", "form", "nn.Dense ms", "lm.Decoder ms",
               "speed-up"], rows))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
