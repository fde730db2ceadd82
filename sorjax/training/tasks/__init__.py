"""Tasks by name: config.task -> a Task (see sorjax.training.task)."""

from __future__ import annotations

import importlib

from sorjax.training.tasks.common import ConfigError

_TASKS = {
    "dyck_lm": ("dyck", "DyckLM"),
    "dyck_closing": ("dyck", "DyckClosing"),
    "dyck_pcfg": ("dyck", "DyckPCFGTask"),
    "lm": ("lm", "LanguageModelTask"),
    "trees": ("trees", "TreeTask"),
}


def names() -> list[str]:
  return sorted(_TASKS)


def added_fields(task: str | None) -> dict:
  """The config fields a task gained after runs were saved, by dotted path,
  with the value that does what those runs did (`config_changes` reads a
  saved config.json's missing fields so); {} for an unknown task."""
  if task not in _TASKS:
    return {}
  module, cls = _TASKS[task]
  fields = getattr(getattr(importlib.import_module(
      f"sorjax.training.tasks.{module}"), cls), "ADDED_FIELDS", {})
  return {f"data.{k}": v for k, v in fields.items()}


def as_trained(saved: dict) -> tuple[dict, dict[str, str]]:
  """A saved config (a run's config.json, or a checkpoint's copy) as the
  version that trained the run read it, where a field written then means
  something else now (the task's `as_trained`), and {dotted path: why}
  for each field read otherwise than written; (saved, {}) when none is."""
  if saved.get("task") not in _TASKS:
    return saved, {}
  from sorjax.training.tasks.common import unread_as_trained
  saved, why = unread_as_trained(saved)
  module, cls = _TASKS[saved["task"]]
  read = getattr(getattr(importlib.import_module(
      f"sorjax.training.tasks.{module}"), cls), "as_trained", None)
  if read is not None:
    saved, more = read(saved)
    why = {**why, **more}
  return saved, why


def make_task(config):
  """Builds config.task; every config error surfaces here, before any
  compilation, as a ConfigError naming the field."""
  if config.task not in _TASKS:
    raise ConfigError(f"config.task: unknown task {config.task!r}; known: "
                      f"{', '.join(names())}")
  module, cls = _TASKS[config.task]
  return getattr(importlib.import_module(f"sorjax.training.tasks.{module}"),
                 cls)(config)
