"""Lowering for GPU and TPU on a machine that has neither.

`jax.export` lowers a function for any platform with that platform's own
lowering rules, without its hardware or plugin. It refuses what only the
host can run (a `pure_callback` or `debug.print`: "multi-platform lowering
for python_callback"), and the lowered module names every custom call (a
LAPACK or cuSOLVER kernel, a cuDNN RNN). sorjax's steps are plain StableHLO:
the check below asks for no custom call at all, so one that appears is
named rather than trusted to exist on every accelerator.
"""

import re

import jax
import numpy as np
from jax import export
from jax.sharding import NamedSharding, PartitionSpec as P

ACCELERATORS = ("cuda", "tpu")


def custom_calls(exported) -> set[str]:
  """The custom-call targets in an exported module."""
  return set(re.findall(r"stablehlo\.custom_call @([\w.$-]+)",
                        exported.mlir_module()))


def assert_lowers_for_accelerators(fn, *args):
  """Exports `fn` (jitted here unless it already is) at `args` (arrays or
  `jax.ShapeDtypeStruct`s) for cuda and tpu; returns the export."""
  jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
  exported = export.export(jitted, platforms=ACCELERATORS)(*args)
  assert exported.platforms == ACCELERATORS
  calls = custom_calls(exported)
  assert not calls, f"custom calls in the lowered module: {sorted(calls)}"
  return exported


def train_step_args(task, trainer, sharded: bool = False):
  """(state, batch, temperature) for `trainer._step_fn` as ShapeDtypeStructs:
  the state `init_state` gives, the task's first training batch. sharded:
  with the shardings the loop gives them (the batch through
  `Trainer._shard_batch`, the state `Trainer.state_sharding`, the
  temperature replicated)."""
  state = jax.eval_shape(trainer.init_state)
  batch = next(iter(task.train_batches(0, None)))[0]
  replicated = NamedSharding(trainer.mesh, P()) if sharded else None
  if sharded:
    batch = trainer._shard_batch(batch)

  def spec(a, sharding=replicated):
    dtype = a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype
    return jax.ShapeDtypeStruct(np.shape(a), dtype, sharding=sharding)
  state = jax.tree_util.tree_map(
      lambda a: spec(a, trainer.state_sharding if sharded else None), state)
  batch = {k: spec(a, a.sharding if sharded else None)
           for k, a in batch.items()}
  return state, batch, spec(np.zeros((), np.float32))
