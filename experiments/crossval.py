"""k-fold cross-validation of one LM config: every fold, then their mean.

    python -m experiments.crossval \\
        --config=experiments/configs/maupome_ablation.py:none,tanh \\
        --workdir=runs/mm_none [--folds=0,1] [--config.x=...]

The config must set data.folds = k (Maupome & Meurs: 5; their configs do).
Fold f trains as `experiments.main` would with --config.data.fold=f, in
WORKDIR/fold_<f> (rerunning resumes an unfinished fold; a finished one
trains no further, unless train.num_epochs / max_steps grew: then it trains
on). Each fold's result is its test metrics at the epoch of its best
validation (the run's selection), averaged over its replicas; the summary,
WORKDIR/crossval.json, holds every fold's numbers and their mean and sample
sd over the folds ("the average performance on the 20% test set across the
folds", Maupome & Meurs 4). `--folds` runs some folds only; the summary then
covers the folds finished so far, each checked to have been trained with
the given config (how it logged and checkpointed aside): folds of other
runs are refused, not averaged, and before any fold trains (the error says
what to delete or rerun). The other flags are experiments.main's (--host_malloc,
--cpu_devices, --small_loops, --jax_*).
"""

from __future__ import annotations

import json
import os
import sys

import jax
from absl import app, flags, logging

from experiments import train
from experiments.results import (ResultsError, fold_stats, per_replica,
                                 replica_means)
from sorjax.checks import WriteError, output_dir_problem, write_text
from sorjax.training.checkpoint import complete_steps
from sorjax.training.interrupt import Interrupted
from sorjax.training.tasks.common import ConfigError
from sorjax.training.workdir_lock import WorkdirInUse

FLAGS = flags.FLAGS
DONE = "crossval_fold.json"   # written in a fold's directory when it ends
PARTIAL = "crossval_partial.json"  # an interrupted invocation's seconds
NOT_METRICS = ("step", "epoch", "best_epoch", "epochs_run")


class CrossvalError(ValueError):
  """A config, flag or folder cross-validation cannot run with (names it)."""


def fold_numbers(config, chosen) -> list[int]:
  """The folds to run: `chosen` (strings from --folds) or all 0..k-1."""
  data = config.get("data") or {}
  k = data.get("folds")
  if k is None:
    raise CrossvalError(
        "the config's data.folds is None (or absent: task "
        f"{config.get('task')!r}); cross-validation needs k folds, e.g. "
        "--config.data.folds=5 on an lm config")
  if chosen is None:
    return list(range(int(k)))
  out = []
  for f in chosen:
    try:
      n = int(f)
    except ValueError:
      n = -1
    if not 0 <= n < int(k) or n in out:
      raise CrossvalError(f"--folds={','.join(chosen)}: {f!r} is not a new "
                          f"fold of 0..{int(k) - 1} (data.folds={k})")
    out.append(n)
  return out


def run_fold(config, fold: int, workdir: str) -> dict:
  """Trains fold `fold` of `config` in WORKDIR/fold_<fold>: a new run, or
  the run there resumed (a finished one with the same config trains no
  further; one with other values is refused by the loop, naming them);
  returns its record (directory, training time over every invocation:
  an interrupted one leaves its seconds in WORKDIR/fold_<fold>/PARTIAL,
  and one that trains a finished fold on adds to its recorded time)."""
  wd = os.path.join(workdir, f"fold_{fold}")
  cfg = _fold_config(config, fold)
  logging.info("crossval: fold %d of %d in %s", fold, cfg.data.folds, wd)
  before = sum(train.recorded_wall_s(os.path.join(wd, name))
               for name in (DONE, PARTIAL))
  step0 = _latest_step(wd)
  # WorkdirInUse: another process trains this fold now
  with train.time_kept(os.path.join(wd, PARTIAL), before,
                       unless=WorkdirInUse) as wall_s:
    train.train_and_evaluate(cfg, wd)
  # a finished fold that trained no further keeps its time
  trained = (_latest_step(wd) != step0
             or not os.path.exists(os.path.join(wd, DONE)))
  record = {"fold": fold, "workdir": wd,
            "wall_s": round(wall_s() if trained else before, 1)}
  write_text(os.path.join(wd, DONE), json.dumps(record, indent=1))
  if os.path.exists(os.path.join(wd, PARTIAL)):
    os.remove(os.path.join(wd, PARTIAL))
  return record


def _latest_step(wd: str) -> int | None:
  """The newest complete checkpoint step in `wd` (None without one)."""
  return max(complete_steps(os.path.join(wd, "checkpoints")), default=None)


def _fold_config(config, fold: int):
  cfg = config.copy_and_resolve_references()
  cfg.data.fold = fold
  return cfg


# train.* fields a resumed run may change that still change its result:
# a finished fold may train on to a longer budget (the schedules count
# optim.total_steps, so it ends as a fresh run of that budget would), never
# back to a shorter one.
RESULT_TRAIN_FIELDS = ("num_epochs", "max_steps")


def _longer(field: str, was, now) -> bool:
  """Whether train.`field` = now lets a run train at least as long as was
  (max_steps None: no limit)."""
  if field == "max_steps":
    return now is None or (was is not None and now >= was)
  return now >= was


def _saved_config(wd: str) -> dict:
  from sorjax.runs import read_config_json
  try:
    return read_config_json(os.path.join(wd, "config.json"))
  except ValueError as e:
    raise CrossvalError(f"{e}: the fold in {wd} cannot be checked against "
                        f"the config; delete {wd} to train it again, or use "
                        "another --workdir") from None


def _check_same_config(cfg, wd: str, resumed: bool = False) -> None:
  """CrossvalError unless the fold in `wd` was trained with `cfg` (its
  config.json; logging and checkpointing fields aside): the summary would
  average folds of different runs. A fold about to be resumed (`resumed`)
  may have trained for fewer epochs or steps than `cfg` asks; it trains on.
  Each error says what would remedy it."""
  from sorjax.training.loop import config_changes
  from sorjax.training.tasks import added_fields
  saved = _saved_config(wd)
  changes = config_changes(saved, cfg.to_dict(), added_fields(cfg.get("task")))
  if changes:
    raise CrossvalError(
        f"{wd} was trained with another config: {'; '.join(changes[:8])} "
        f"(saved -> given); delete {wd} to train that fold again with these "
        "values, or use another --workdir")
  shorter, longer = [], []
  for k in RESULT_TRAIN_FIELDS:
    was, now = (saved.get("train") or {}).get(k), cfg.train.get(k)
    if was != now:
      (longer if _longer(k, was, now) else shorter).append(
          f"train.{k}: {was!r} -> {now!r}")
  if shorter:
    raise CrossvalError(
        f"{wd} trained for longer than the config asks: "
        f"{'; '.join(shorter)} (saved -> given); a fold cannot be shortened "
        f"(delete {wd} to train it again with these values, or use another "
        "--workdir)")
  if longer and not resumed:
    raise CrossvalError(
        f"{wd} finished with {'; '.join(longer)} (saved -> given); train it "
        f"on with --folds={_fold_of(wd)}, or use another --workdir")


def _fold_of(wd: str) -> str:
  return os.path.basename(os.path.normpath(wd)).removeprefix("fold_")


def check_folds(config, workdir: str, folds: list[int]) -> None:
  """Before any training: every finished fold (its summary would average
  it) was trained with `config`, and every started fold about to be
  resumed can go on under it (the folds in `folds` may train for more
  epochs or steps). Refusing after training some folds would waste them."""
  for f in range(int(config.data.folds)):
    wd = os.path.join(workdir, f"fold_{f}")
    finished = os.path.exists(os.path.join(wd, DONE))
    started = os.path.exists(os.path.join(wd, "config.json"))
    if finished or (f in folds and started):
      _check_same_config(_fold_config(config, f), wd, resumed=f in folds)


def summarise_folds(workdir: str, config) -> dict:
  """Per finished fold (each checked to have been trained with `config`):
  its replicas' test metrics (at each one's best validation epoch) and
  their mean; over the folds, the mean and sample sd of those means."""
  folds, k = {}, int(config.data.folds)
  for f in range(k):
    wd = os.path.join(workdir, f"fold_{f}")
    if not os.path.exists(os.path.join(wd, DONE)):
      continue
    _check_same_config(_fold_config(config, f), wd)
    try:
      rows = per_replica(wd)
    except (ValueError, OSError) as e:
      raise CrossvalError(f"{e}: the finished fold in {wd} cannot be "
                          f"summarised; delete {wd} to train it again"
                          ) from None
    folds[f] = {"per_replica": rows, "mean": replica_means(rows, [
        n for n in rows[0] if n not in NOT_METRICS
        and isinstance(rows[0][n], (int, float))])}
  if not folds:
    raise CrossvalError(f"{workdir}: no finished fold (fold_*/{DONE})")
  means = [v["mean"] for v in folds.values()]
  return {"folds": k, "finished": sorted(folds),
          "per_fold": {str(f): v for f, v in folds.items()},
          "test": fold_stats(means, means[0])}


def crossval(config, workdir: str, chosen=None) -> dict:
  """Runs the chosen folds, then writes and returns the summary."""
  problem = output_dir_problem(workdir)
  if problem is not None:
    raise CrossvalError(f"--workdir={workdir}: {problem}")
  folds = fold_numbers(config, chosen)
  train.validate(config)
  check_folds(config, workdir, folds)
  runs = [run_fold(config, f, workdir) for f in folds]
  summary = {"config": json.loads(config.to_json()), "runs": runs,
             **summarise_folds(workdir, config)}
  # whole or not at all: a failed rewrite keeps the earlier summary
  write_text(os.path.join(workdir, "crossval.json"),
             json.dumps(summary, indent=1))
  return summary


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if any(a == "--config.data.fold" or a.startswith("--config.data.fold=")
         for a in sys.argv):
    raise app.UsageError("--config.data.fold: crossval trains every fold "
                         "itself; choose some with --folds")
  train.prepare_or_exit(FLAGS.host_malloc, FLAGS.small_loops,
                        FLAGS.cpu_devices)
  workdir = os.path.expanduser(FLAGS.workdir)
  try:
    s = crossval(FLAGS.config, workdir, FLAGS.folds)
  except (CrossvalError, ResultsError, ConfigError, WriteError) as e:
    logging.error("crossval error: %s", e)
    sys.exit(f"crossval error: {e}")
  except Interrupted as e:
    e.exit()
  done = s["finished"]
  print(f"{workdir}: {len(done)} of {s['folds']} folds finished {done}")
  for name, v in s["test"].items():
    print(f"  test {name}: {v['mean']:.4f} +- {v['std']:.4f} "
          f"(folds: {', '.join(f'{x:.4f}' for x in v['values'])})")


def cli():
  """The command: experiments.main's flags (--config with its overrides,
  --workdir, --host_malloc, ...) and --folds. The flags are defined here,
  not on import, so tests can import this module beside
  experiments.reproduce, which defines flags of the same names."""
  from experiments import main as main_lib
  flags.DEFINE_list("folds", None, "Which folds to train (default: all of "
                    "data.folds), e.g. 0,1.")
  jax.config.config_with_absl()  # every JAX option as a --jax_* flag
  app.run(main, flags_parser=main_lib.parse_flags)


if __name__ == "__main__":
  cli()
