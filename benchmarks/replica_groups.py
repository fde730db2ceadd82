"""How many replicas to vmap at a time: the training loop's whole step of
paper configs, timed at several `replica_batch_size` values (the
measurements behind `sorjax.training.loop.replica_batch_for`).

    python -m benchmarks.replica_groups [--replicas 20] [--groups 1,2,4,10,20]
        [--rounds 3] [--min-seconds 1] [--cpu-devices N]
        [CONFIG:STRING ...]   (default: the Dyck configs below)

Each config's task and `Trainer` are built as `experiments.main` builds
them (num_replicas = --replicas, no files written but a scratch work
directory); the step is timed on the training batch with the longest
sequences among the first 60, in rotating rounds of at least
--min-seconds each (`benchmarks.small_model.rounds`; wall clock,
medians).
"rule" marks the group size the loop picks by default.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import itertools
import os
import shutil
import statistics
import tempfile
import time

from benchmarks import flags

CONFIGS = ("lin_dyck:lstm,m4", "lin_dyck:lstm,m8", "lin_dyck:attention,m8",
           "mahto_dyck:baseline", "renganathan_dyck:m8")


def longest_batch(task, n: int = 60):
  """The batch with the most time steps among the first n of epoch 0 (the
  first one for batches without `inputs`)."""
  batches = [b for b, _ in itertools.islice(task.train_batches(0, None), n)]
  if "inputs" not in batches[0]:
    return batches[0]
  return max(batches, key=lambda b: b["inputs"].shape[1])


class GroupStep:
  """The Trainer's step at one group size, timed by wall clock with its
  state fed back (a case of `benchmarks.small_model.rounds`)."""

  def __init__(self, trainer, k: int, state, batch, temperature):
    import jax
    self.label, self.temperature, self.batch = k, temperature, batch
    trainer.replica_batch = k
    self.fn = trainer._build_step()
    self.state = jax.tree_util.tree_map(lambda a: a.copy(), state)
    self.time(1)                                      # compile

  def time(self, n: int) -> float:
    import jax
    t0 = time.perf_counter()
    for _ in range(n):
      self.state = jax.block_until_ready(
          self.fn(self.state, self.batch, self.temperature)[0])
    return time.perf_counter() - t0


def config(spec: str):
  """The config of `spec`, module[:string] of experiments/configs."""
  name, _, string = spec.partition(":")
  module = importlib.import_module(f"experiments.configs.{name}")
  if not hasattr(module, "get_config"):   # e.g. common, _options
    from sorjax.training.tasks.common import ConfigError
    raise ConfigError(f"experiments/configs/{name}.py is no config (it has "
                      "no get_config)")
  return module.get_config(string) if string else module.get_config()


def time_config(spec: str, replicas: int, groups, rounds: int,
                min_s: float) -> str:
  """One line: the step's median time at each group size (the trainer's
  scratch work directory removed after)."""
  from sorjax.training.loop import Trainer
  from sorjax.training.tasks import make_task
  cfg = config(spec)
  cfg.num_replicas = replicas
  cfg.train.tensorboard = False
  task = make_task(cfg)
  scratch = tempfile.mkdtemp(prefix="sorjax-groups-")
  try:
    trainer = Trainer(task, cfg, scratch)
    return _time_trainer(spec, trainer, task, replicas, groups, rounds,
                         min_s)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


def _time_trainer(spec, trainer, task, replicas, groups, rounds, min_s):
  import numpy as np
  from benchmarks.small_model import rounds as timed_rounds
  rule = trainer.replica_batch
  state = trainer._place_state(trainer.init_state())
  batch = longest_batch(task)
  placed = trainer._shard_batch(batch)                # once for every k
  steps = [GroupStep(trainer, k, state, placed, np.float32(1.0))
           for k in groups]
  times = timed_rounds(steps, rounds, min_s)
  shape = "x".join(str(d) for d in np.shape(next(iter(batch.values()))))
  cells = ", ".join(f"k={k}{' (rule)' if k == min(rule, replicas) else ''}"
                    f" {1e3 * statistics.median(times[k]):.1f} ms"
                    for k in groups)
  return f"| {spec} | {shape} | {rule} | {cells} |"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("configs", nargs="*", default=list(CONFIGS),
                  help="experiment configs as module[:string] of "
                  "experiments/configs (default: " + " ".join(CONFIGS) + ")")
  ap.add_argument("--replicas", type=flags.at_least(1), default=20)
  ap.add_argument("--groups", default="1,2,4,10,20",
                  help="replicas vmapped at a time, each in 1..--replicas")
  ap.add_argument("--rounds", type=flags.at_least(1), default=3)
  ap.add_argument("--min-seconds", default=1.0,
                  type=flags.number(">= 0", lambda v: v >= 0))
  ap.add_argument("--cpu-devices", type=flags.at_least(1), default=None,
                  help="force this many CPU devices (the replicas sharded "
                  "over them when they divide evenly)")
  args = ap.parse_args(argv)
  try:
    groups = [int(v) for v in args.groups.split(",")]
  except ValueError:
    groups = []
  if not groups or min(groups) < 1 or max(groups) > args.replicas:
    ap.error(f"--groups: want ints in 1..--replicas ({args.replicas}) "
             f"joined by ',', got {args.groups!r}")
  for spec in args.configs:   # every config found before any compiles
    name = spec.partition(":")[0]
    if not (name.isidentifier() and importlib.util.find_spec(
        f"experiments.configs.{name}")):  # "a.b" would import a
      ap.error(f"config {spec!r}: no module experiments/configs/{name}.py")
  if args.cpu_devices is not None:
    from experiments.train import force_cpu_devices
    try:
      force_cpu_devices(args.cpu_devices)
    except (ValueError, RuntimeError) as e:
      ap.error(f"--cpu-devices: {e}")
  from sorjax.training.tasks.common import ConfigError
  for spec in args.configs:   # a bad string too, not after the others' runs
    try:
      config(spec)
    except ConfigError as e:
      ap.error(f"config {spec!r}: {e}")
  import jax
  print(f"# Replicas vmapped in groups: {time.strftime('%Y-%m-%d %H:%M')} "
        f"UTC, {args.replicas} replicas, {jax.device_count()} device(s), "
        f"load {os.getloadavg()[0]:.2f}, jax {jax.__version__}\n")
  print("| config | batch | rule | step time by replicas vmapped at a time "
        "(k) |\n|---|---|---|---|", flush=True)
  for spec in args.configs:
    print(time_config(spec, args.replicas, groups, args.rounds,
                      args.min_seconds), flush=True)


if __name__ == "__main__":
  main()
