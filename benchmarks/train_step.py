"""Shipped configs' training steps, as the training loop runs them, timed
in this checkout of sorjax against others.

    python -m benchmarks.train_step SPEC [SPEC ...] [--against DIR ...]
        [--rounds 3] [--steps 5] [--seconds 2] [--batches 60]

SPEC names a config of experiments/configs with its string, as
`--config` takes it without the path: `renganathan_dyck:m4`,
`lin_wikitext2:lstm`, `demo`. The step is the loop's jitted
`Trainer` step (loss, gradient, optimizer, one replica, the training
loop's replica vmap) on the longest of the config's first `--batches`
training batches (the most time steps); each timing is the median wall time of at least
`--steps` calls, and of as many as fill `--seconds`, after two untimed
ones.

Each (checkout, SPEC) timing runs in a fresh process, in rounds that
alternate the checkouts (this one first). `--against DIR` adds another
checkout, e.g. the commit before a change: `git worktree add /tmp/base
HEAD~1`. The worker is this file, run with DIR's sorjax first on the
path, so it reads only what every checkout since session 30 has (the
Trainer's step, state placement and batch sharding). Prints, per SPEC,
each checkout's median ms a step, tokens/s (the batch's valid
positions: its lengths' sum where it has lengths) and its speed-up over
each --against checkout (median of the rounds' ratios). Every SPEC's
config must exist in every checkout before anything is timed. Real
corpora are found as the builders find them (`$SORJAX_DATA_DIR`,
`../shared/data` of this checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def worker(root: str, spec: str, steps: int, seconds: float, batches: int,
           workdir: str) -> dict:
  """One process's timing of SPEC with the sorjax of checkout `root`
  (the Trainer's files go to `workdir`, which the parent removes). The
  config and batch come from this checkout's `replica_groups` helpers
  (imported before root goes first on the path), sorjax and the configs
  from root's."""
  sys.path.insert(0, str(HERE))
  from benchmarks.replica_groups import config as config_of, longest_batch
  sys.path.insert(0, root)
  import time

  import jax
  import numpy as np

  import sorjax
  from sorjax.training.loop import Trainer
  from sorjax.training.tasks import make_task

  config = config_of(spec)
  config.num_replicas = 1
  config.train.tensorboard = False
  task = make_task(config)
  trainer = Trainer(task, config, workdir)
  state = trainer._place_state(trainer.init_state())
  batch = longest_batch(task, batches)
  placed = trainer._shard_batch(batch)
  tau = np.float32(trainer.temperature(0, 0))
  for _ in range(2):
    state, metrics = trainer._step_fn(state, placed, tau)
  jax.block_until_ready((state, metrics))
  times = []
  while len(times) < steps or sum(times) < seconds:
    t0 = time.perf_counter()
    state, metrics = trainer._step_fn(state, placed, tau)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - t0)
  # tokens: the batch's valid positions, as loop.batch_tokens counts them
  # (written out here: older checkouts have no batch_tokens)
  tokens = (np.sum(batch["lengths"]) if "lengths" in batch
            else np.size(next(iter(batch.values()))))
  return {"sorjax": sorjax.__file__, "ms": statistics.median(times) * 1e3,
          "tokens": int(tokens)}


def timed(root: str, spec: str, steps: int, seconds: float,
          batches: int) -> dict:
  """`worker` in a fresh process; raises with its stderr if it fails."""
  env = dict(os.environ, PYTHONPATH=root)
  if "SORJAX_DATA_DIR" not in env and (HERE.parent / "shared/data").is_dir():
    env["SORJAX_DATA_DIR"] = str(HERE.parent / "shared" / "data")
  with tempfile.TemporaryDirectory(prefix="train_step-") as workdir:
    args = [sys.executable, __file__, "--worker", root, spec, str(steps),
            str(seconds), str(batches), workdir]
    proc = subprocess.run(args, cwd=root, env=env, capture_output=True,
                          text=True)
  if proc.returncode:
    raise RuntimeError(f"{spec} with the sorjax of {root} failed "
                       f"(exit {proc.returncode}):\n{proc.stderr[-3000:]}")
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  if Path(out["sorjax"]).parents[1] != Path(root):
    raise RuntimeError(f"the worker for {root} imported sorjax from "
                       f"{out['sorjax']}")
  return out


def main(argv=None) -> int:
  if argv is None and sys.argv[1:2] == ["--worker"]:
    root, spec, steps, seconds, batches, workdir = sys.argv[2:8]
    print(json.dumps(worker(root, spec, int(steps), float(seconds),
                            int(batches), workdir)))
    return 0
  from benchmarks import flags
  from benchmarks.small_model import table
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("specs", nargs="+", metavar="SPEC")
  ap.add_argument("--against", action="append", default=[], metavar="DIR",
                  help="another sorjax checkout to time (repeatable)")
  ap.add_argument("--rounds", type=flags.at_least(1), default=3)
  ap.add_argument("--steps", type=flags.at_least(1), default=5)
  ap.add_argument("--seconds", type=flags.number(">= 0", lambda v: v >= 0),
                  default=2.0, help="time calls until this many seconds")
  ap.add_argument("--batches", type=flags.at_least(1), default=60)
  args = ap.parse_args(argv)
  roots = [str(HERE)]
  for d in args.against:
    path = Path(d).resolve()
    if not (path / "sorjax" / "__init__.py").is_file():
      ap.error(f"--against {d!r}: not a sorjax checkout (no "
               "sorjax/__init__.py)")
    if str(path) in roots:
      ap.error(f"--against {d!r}: that checkout is already timed")
    roots.append(str(path))
  for spec in args.specs:  # in every checkout, before anything is timed
    name = spec.partition(":")[0]
    for root in roots:
      config = Path(root) / "experiments" / "configs" / f"{name}.py"
      if not (name.isidentifier() and config.is_file()
              and "def get_config(" in config.read_text()):
        ap.error(f"SPEC {spec!r}: no experiments/configs/{name}.py with a "
                 f"get_config() in {root}")
  rows = []
  for spec in args.specs:
    ms, tokens = {r: [] for r in roots}, {}
    for _ in range(args.rounds):
      for root in roots:
        try:
          out = timed(root, spec, args.steps, args.seconds, args.batches)
        except RuntimeError as e:
          print(f"benchmarks.train_step: {e}", file=sys.stderr)
          return 1
        except KeyboardInterrupt:
          print("benchmarks.train_step: interrupted; nothing printed",
                file=sys.stderr)
          return 130
        ms[root].append(out["ms"])
        tokens[root] = out["tokens"]
    for root in roots:
      speedups = [
          "-" if other == root else
          f"{statistics.median(o / t for o, t in zip(ms[other], ms[root])):.2f}x"
          for other in roots[1:]]
      median = statistics.median(ms[root])
      rows.append([spec, root, f"{median:.4g}",
                   f"{min(ms[root]):.4g}-{max(ms[root]):.4g}",
                   f"{tokens[root] / median * 1e3:,.0f}", *speedups])
  print(table(["SPEC", "checkout", "ms a step", "range", "tokens/s",
               *(f"speed-up over {r}" for r in roots[1:])], rows))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
