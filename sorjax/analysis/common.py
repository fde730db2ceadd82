"""What every analysis of a restored run shares: errors that name the run,
run-type checks, split names, checkpoints per step, JSON and figure files,
and a progress line for the long ones.

Every analysis takes a `sorjax.runs.Run` (from `sorjax.restore(workdir)`)
and returns a JSON-able dict; its `plot_*` functions draw that dict. Figures
use matplotlib's object API (`matplotlib.figure.Figure`), so nothing touches
pyplot's global state or needs a display.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Callable, Iterable, TextIO

import jax
import numpy as np
from matplotlib.figure import Figure

from sorjax import cells as cells_lib
from sorjax import checks

FORGET_GATE_CELLS = ("lstm", "mts_lstm")
# progress(done, total) of a long pass (e.g. a `Progress`)
OnProgress = Callable[[int, int], None]
MULTI_CELL_LSTMS = ("attention_lstm", "assignment_lstm")


class AnalysisError(ValueError):
  """An analysis that cannot run on this run (task, cells, split, input)."""


def fail(analysis: str, run, message: str) -> AnalysisError:
  """An AnalysisError naming the analysis and the run's work directory."""
  where = getattr(run, "workdir", None)
  return AnalysisError(f"{analysis}: {message}" +
                       (f" (run {where})" if where else ""))


# ---------------------------------------------------------------- run types

def cell_name(cell) -> str:
  """The registry name of a cell instance ("lstm", "mts_lstm", ...)."""
  for name in cells_lib.names():
    if type(cell) is cells_lib.cell_class(name):
      return name
  return type(cell).__name__


def layer_cells(run) -> tuple:
  """The run's per-layer sequence cells (a tree run has none)."""
  return tuple(getattr(run.task.model, "cells", ()) or ())


def require_task(analysis: str, run, tasks: Iterable[str]) -> None:
  tasks = tuple(tasks)
  if run.task.name not in tasks:
    raise fail(analysis, run, f"needs a {' or '.join(map(repr, tasks))} run; "
               f"this run's task is {run.task.name!r}")


def require_layers(analysis: str, run, names: Iterable[str], what: str
                   ) -> list[int]:
  """Indices of the layers whose cell is one of `names`; an error naming
  the run's cells when there are none."""
  names = tuple(names)
  found = [l for l, c in enumerate(layer_cells(run)) if cell_name(c) in names]
  if not found:
    have = [cell_name(c) for c in layer_cells(run)] or [
        getattr(run.config.model, "cell", "?")]
    raise fail(analysis, run, f"needs a layer of {' or '.join(names)} for "
               f"its {what}; this model's cells are {have}")
  return found


def splits(run) -> tuple[str, ...]:
  """The split names of the run's task, in the task's order."""
  task = run.task
  for attr in ("split_ids", "splits", "split_trees"):
    if hasattr(task, attr):
      return tuple(getattr(task, attr))
  return tuple(task.eval_splits())


def check_split(analysis: str, run, split: str | None,
                default: str = "test") -> str:
  """`split` (or `default`) if the task has it, else an error listing the
  task's splits."""
  names = splits(run)
  split = default if split is None else split
  if split not in names:
    raise fail(analysis, run, f"unknown split {split!r}; this "
               f"{run.task.name!r} run has {list(names)}")
  return split


def temperature(run, value: float | None = None) -> float:
  """The softmax temperature of the analyses: `value`, else the run's
  evaluation temperature (Lin et al. test at a very low tau); an error
  unless finite and > 0."""
  from sorjax.runs import check_temperature
  return check_temperature("the run's evaluation temperature" if value is
                           None else "--temperature",
                           run.eval_temperature() if value is None else value)


# ---------------------------------------------------------------- checkpoints

def checkpoint_steps(workdir: str) -> list[int]:
  """Steps of the resumable checkpoints kept in `workdir/checkpoints`."""
  path = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(path):
    return []
  return sorted(int(d) for d in os.listdir(path) if d.isdigit())


class CheckpointReader:
  """Reads the params of any kept checkpoint of a restored run (one
  abstract target, many steps), and the run's initial params."""

  def __init__(self, run):
    from sorjax.training.loop import Trainer
    self.run = run
    self._trainer = Trainer(run.task, run.config, run.workdir)
    self._target = jax.eval_shape(self._trainer.init_state)

  def _replica(self, params):
    return jax.tree_util.tree_map(lambda a: a[self.run.replica], params)

  def params(self, step: int) -> tuple[Any, dict]:
    """(params of the run's replica, meta) at checkpoint `step`."""
    from sorjax.training.checkpoint import Checkpointer
    ckpt = Checkpointer(self.run.workdir, read_only=True)
    try:
      _, state, meta = ckpt.restore(self._target, step)
    finally:
      ckpt.close()
    return self._replica(state.params), meta

  def initial_params(self):
    """The params before the first step (the run's seed and init)."""
    return self._replica(self._trainer.init_state().params)


# ---------------------------------------------------------------- outputs

def default_out(run) -> str:
  """RUN/analysis for the best checkpoint of replica 0, else a folder in
  it named for the checkpoint and replica (`latest`, `step_300`,
  `replica_1` for the best one's, `latest-replica_1`), so analyses of
  other checkpoints or seeds do not replace each other's files."""
  parts = []
  checkpoint = getattr(run, "checkpoint", "best")
  if checkpoint != "best":
    parts.append(checkpoint or f"step_{run.step}")
  if getattr(run, "replica", 0):
    parts.append(f"replica_{run.replica}")
  return os.path.join(run.workdir, "analysis", *(["-".join(parts)]
                                                  if parts else []))


def output_dir(run, out: str | None = None) -> str:
  """`out`, or `default_out(run)`; created. Never inside the run's
  checkpoint folders, which training rotates away."""
  path = os.path.expanduser(out) if out else default_out(run)
  problem = checks.output_dir_problem(path)
  if problem is not None:
    raise AnalysisError(f"--out {path}: {problem}")
  real = os.path.realpath(path)
  for kept in ("checkpoints", "best"):
    inside = os.path.realpath(os.path.join(run.workdir, kept))
    if real == inside or real.startswith(inside + os.sep):
      raise AnalysisError(f"--out {path} is inside the run's {kept}/ "
                          "folder, whose steps training deletes as it "
                          "rotates them: give a folder outside it")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise AnalysisError(f"--out {path}: cannot create the directory "
                        f"({e.strerror})") from None
  return path


def jsonable(obj):
  """NumPy and non-finite floats -> plain JSON values (inf/nan -> None)."""
  if isinstance(obj, dict):
    return {str(k): jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [jsonable(v) for v in obj]
  if isinstance(obj, np.ndarray):
    return jsonable(obj.tolist())
  if isinstance(obj, (np.bool_, bool)):
    return bool(obj)
  if isinstance(obj, (np.integer, int)):
    return int(obj)
  if isinstance(obj, (np.floating, float)):
    v = float(obj)
    return v if math.isfinite(v) else None
  return obj


def write_json(path: str, obj) -> str:
  """Writes `obj` as indented JSON (whole or not at all: a failed write
  keeps an earlier file and names this one); returns the path."""
  return checks.write_text(path, json.dumps(jsonable(obj), indent=2,
                                            allow_nan=False) + "\n")


def figure(ncols: int = 1, nrows: int = 1, size=(6.0, 3.5)):
  """(Figure, axes) without pyplot."""
  fig = Figure(figsize=size)
  axes = fig.subplots(nrows, ncols, squeeze=False)
  return fig, axes


def save(fig: Figure, path: str, dpi: int = 120) -> str:
  """Writes `fig` to `path` (its format from the extension), whole or not
  at all: a failed write keeps an earlier figure and names this one."""
  fig.tight_layout()
  fmt = os.path.splitext(path)[1][1:] or None
  return checks.write_whole(path, lambda tmp: fig.savefig(tmp, dpi=dpi,
                                                          format=fmt))


class Progress:
  """`progress(done, total)` callback that prints "what: done of total
  unit (pct), elapsed, ~left" to `stream` (stderr) at most every `every`
  seconds, and once when done == total; the estimate assumes a constant
  rate since construction. Long analyses (BLiMP's 67k pairs: ~20 min)
  take one, so a user sees that they are moving."""

  def __init__(self, what: str, unit: str = "",
               stream: TextIO | None = None, every: float = 30.0,
               clock: Callable[[], float] = time.monotonic):
    self.what, self.unit, self.every, self.clock = what, unit, every, clock
    self.stream = stream
    self.start = self.last = clock()

  def __call__(self, done: int, total: int) -> None:
    now = self.clock()
    if done < total and now - self.last < self.every:
      return
    self.last = now
    spent = now - self.start
    unit = f" {self.unit}" if self.unit else ""
    line = (f"{self.what}: {done:,} of {total:,}{unit} "
            f"({100 * done / max(total, 1):.0f}%), {_duration(spent)}")
    if 0 < done < total:
      line += f", ~{_duration(spent * (total - done) / done)} left"
    print(line, file=self.stream or sys.stderr, flush=True)


def progress_part(progress: OnProgress | None, i: int, n: int
                  ) -> OnProgress | None:
  """The callback of part `i` of a job of `n` equal parts that `progress`
  reports as a whole (e.g. one of several runs scoring the same pairs)."""
  if progress is None:
    return None
  return lambda done, total: progress(i * total + done, n * total)


def _duration(seconds: float) -> str:
  return (f"{seconds:.0f} s" if seconds < 90 else
          f"{seconds / 60:.1f} min" if seconds < 5400 else
          f"{seconds / 3600:.1f} h")
