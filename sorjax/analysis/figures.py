"""Figures written at the end of a training run (`config.figures`), drawn by
the same functions `experiments.analyze` uses."""

from __future__ import annotations

import os

import jax


# figure name -> the tasks it is drawn for
FIGURES = {"ldpa": ("dyck_lm", "dyck_closing")}


def check(names, task: str) -> None:
  """A ValueError naming `figures` entries that are unknown or not drawn
  for `task` (checked before training, not after)."""
  if isinstance(names, str):
    raise ValueError(f"figures={names!r} must be a tuple of names, e.g. "
                     f"('ldpa',)")
  for name in names:
    if name not in FIGURES:
      raise ValueError(f"figures: unknown figure {name!r}; known: "
                       f"{', '.join(FIGURES)}")
    if task not in FIGURES[name]:
      raise ValueError(f"figures: {name!r} is drawn for the "
                       f"{' and '.join(FIGURES[name])} tasks, not "
                       f"{task!r}")


def make(name: str, task, state, config, workdir: str) -> str:
  """Writes figure `name` of replica 0 to <workdir>/figures/<name>.png."""
  from sorjax.analysis import dyck
  from sorjax.runs import Run

  os.makedirs(os.path.join(workdir, "figures"), exist_ok=True)
  path = os.path.join(workdir, "figures", f"{name}.png")
  if name == "ldpa":
    if task.name not in ("dyck_lm", "dyck_closing"):
      raise ValueError(f"figure 'ldpa' needs a Dyck task, not {task.name!r}")
    from sorjax.training.asgd import evaluated_params
    params = evaluated_params(config.optim.name, state)
    run = Run(workdir, int(jax.device_get(state.step)[0]), config, task,
              jax.device_get(params), {})
    return dyck.plot_ldpa(dyck.ldpa(run), path)
  raise ValueError(f"unknown figure {name!r}; known: ldpa")
