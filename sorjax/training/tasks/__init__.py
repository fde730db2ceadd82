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


def make_task(config):
  """Builds config.task; every config error surfaces here, before any
  compilation, as a ConfigError naming the field."""
  if config.task not in _TASKS:
    raise ConfigError(f"config.task: unknown task {config.task!r}; known: "
                      f"{', '.join(names())}")
  module, cls = _TASKS[config.task]
  return getattr(importlib.import_module(f"sorjax.training.tasks.{module}"),
                 cls)(config)
