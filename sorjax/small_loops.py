"""Small scans compiled whole on XLA:CPU (an opt-in, process-wide setting).

XLA:CPU runs a compiled program as a sequence of thunks: one generated
kernel, copy or library call (a YNN dot) each. A training step of the
LSTM at the Dyck experiments' size (B=10, H=12) runs ~28 of them per time
step (11 forward, 17 backward), each on arrays of a few hundred floats,
so the step costs what their dispatch costs: ~3.8 us for forward and
backward, against ~4.7 us for torch.nn.LSTM's.

XLA has a pass that compiles a while loop whose iteration accesses few
bytes into one function instead (`xla_cpu_small_while_loop_byte_threshold`
in `--xla_backend_extra_options`, by default far below our loops). It
leaves alone loops that hold a YNN dot fusion, so YNN's dot fusions must
be off too (`--xla_cpu_experimental_ynn_fusion_type=`); the loops' dots
are then XLA's own generated code, which is fast for tiny matrices and
slow beyond them. `compile_whole()` sets both.

Measured (session 15; `jax.vjp` of `sorjax.unroll`, B=10 T=200, two
threads, speed against the default settings in processes of their own):

    lstm H=12 1.6x    H=18 0.66x   H=24 0.28x   H=48 0.12x
    mrnn H=12 2.8x    H=24 1.16x   gru H=12 1.3x   dyck_rnn H=12 1.13x
    dyck_rnn at B=512 T=100 (Renganathan & Singh's batch) H=4 / 8 / 16:
    2.2x / 2.3x / 1.6x; with 3 vmapped replicas and Adam, H=8: 1.2x
    attention_lstm H=12 0.66x     lstm H=12 at B=32 / 128: 1.39x / 1.19x
    one Adam step of lstm H=12: 1.3-1.6x; of 3 / 20 vmapped replicas: 0.86x /
    0.74x (their batched dots leave YNN for slower code); mrnn with 3
    replicas 1.17x
    lstm at B=32 T=100 H=128 / 256: 0.91x / 0.67x (YNN off; the loops are
    above the byte limit and stay as they were)

So it pays for single models at the smallest sizes only, and costs up to
8x beyond them. (Whole training runs of the Dyck configs at CPU scale
gained little: their time goes to compiling each new bucket length.) It is
opt-in, `--small_loops` in the experiment launchers
(`benchmarks.run` times it as a variant of the Dyck section). The same
settings for a process started from a shell:

    XLA_FLAGS="--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=1048576 --xla_cpu_experimental_ynn_fusion_type="

The flags reach XLA only if they are set before it compiles anything
(it reads XLA_FLAGS once). They are XLA:CPU settings: GPU and TPU
programs are compiled as before.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from sorjax import checks
from sorjax.xla_flags import prepend as _prepend_flags

# A loop iteration of the LSTM at B=10 H=12 accesses < 128 KB (cost
# analysis); at B=32 H=128 > 1 MB.
MAX_BYTES = 1 << 20
THRESHOLD_KEY = "xla_cpu_small_while_loop_byte_threshold"
_EXTRA = "--xla_backend_extra_options"
_YNN = "--xla_cpu_experimental_ynn_fusion_type"
# What XLA writes on a loop it compiled whole (a call's frontend attribute).
_MARK = "xla_cpu_small_call"


def xla_flags(max_bytes: int = MAX_BYTES) -> str:
  """The XLA_FLAGS words that `compile_whole(max_bytes)` adds."""
  checks.check_int("small_loops.xla_flags: max_bytes", max_bytes, 1)
  if max_bytes >= 1 << 63:              # XLA reads it as an int64
    raise ValueError(f"small_loops.xla_flags: max_bytes must be < 2**63, "
                     f"got {max_bytes}")
  return f"{_EXTRA}={THRESHOLD_KEY}={max_bytes} {_YNN}="


def compile_whole(max_bytes: int = MAX_BYTES) -> None:
  """Puts `xla_flags(max_bytes)` at the front of this process's XLA_FLAGS
  (XLA ignores what follows a word that is not a flag, such as TF's
  `intra_op_parallelism_threads=1`): loops whose iteration accesses fewer
  than `max_bytes` bytes are compiled whole (module doc for where that
  pays).

  Raises:
    RuntimeError: JAX's backend has started (XLA has read its flags).
    ValueError: XLA_FLAGS already sets either flag (it would be given
      twice; set both there instead), or a bad `max_bytes`.
  """
  _prepend_flags("small_loops.compile_whole()", xla_flags(max_bytes),
                 (_EXTRA, _YNN))


def compile_whole_checked(where: str, max_bytes: int = MAX_BYTES) -> None:
  """`compile_whole(max_bytes)`, then `compiled_whole()` to check that XLA
  took the flags: what the launchers and benchmarks run for their
  small-loops option, named `where` in the error.

  Raises:
    RuntimeError: as `compile_whole`, or XLA still compiled the probe loop
      as before.
    ValueError: as `compile_whole`.
  """
  compile_whole(max_bytes)
  check_compiled_whole(where)


def check_compiled_whole(where: str) -> None:
  """A RuntimeError naming `where` unless `compiled_whole()`: for a caller
  that sets other XLA flags between `compile_whole` and starting JAX."""
  if not compiled_whole():
    raise RuntimeError(
        f"{where}: XLA compiled a small loop as before (XLA_FLAGS="
        f"{os.environ.get('XLA_FLAGS', '')!r})")


def compiled_whole() -> bool:
  """Whether XLA:CPU compiles a small scan (with a dot) whole in this
  process: compiles one and looks for the call XLA makes of such a loop.
  Starts JAX's backend. (Its iteration accesses a few KB: XLA's own limit
  is lower.)"""
  w = jnp.full((16, 16), 0.5)

  def run(h, xs):
    def step(h, x):
      h = jnp.tanh(h @ w + x)
      return h, h
    return jax.lax.scan(step, h, xs)[1]

  h, xs = jnp.zeros((8, 16)), jnp.ones((8, 8, 16))
  cpu = jax.devices("cpu")[0]
  args = [jax.device_put(a, cpu) for a in (h, xs)]
  return _MARK in jax.jit(run).lower(*args).compile().as_text()
