"""The cell zoo: pure-function recurrent cells, created by name.

    cell = sorjax.cells.make("mrnn", hidden_size=256, intermediate_size=512)
    params = cell.init(key, input_size)
    carry = cell.initial_carry(params, batch_shape)
    xp = cell.precompute(params, xs, **aux)     # input-only terms, all steps at once
    carry, y = cell.step(params, carry, xp_t)  # the recurrent part of one step

`make` imports a cell's module when the cell is first made. (`import
sorjax` imports some of them anyway: the fused layers that `sorjax.unroll`
dispatches to use their cells' helpers.)
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from sorjax.cells.base import Cell

# name -> (module under sorjax.cells, class name). One module per family.
_REGISTRY: dict[str, tuple[str, str]] = {
    "rnn": ("rnn", "RNN"),
    "lstm": ("lstm", "LSTM"),
    "gru": ("gru", "GRU"),
    "tensor_rnn": ("tensor_rnn", "TensorRNN"),
    "general2": ("general2", "General2"),
    "mrnn": ("general2", "MRNN"),
    "mi_rnn": ("mi_rnn", "MIRNN"),
    "mlstm": ("mlstm", "MLSTM"),
    "attention_lstm": ("attention_lstm", "AttentionLSTM"),
    "assignment_lstm": ("attention_lstm", "AssignmentLSTM"),
    "mm_rnn": ("mm_rnn", "MMRNN"),
    "mm_lstm": ("mm_lstm", "MMLSTM"),
    "dyck_rnn": ("dyck_rnn", "DyckRNN"),
    "mts_lstm": ("mts_lstm", "MTSLSTM"),
    "tree_rnn": ("tree", "TreeRNN"),
    "tree_lstm": ("tree", "TreeLSTM"),
}

# Cells that compose two children over a tree (sorjax.trees), not steps over time.
TREE_CELLS = ("tree_rnn", "tree_lstm")


def names() -> list[str]:
  """All registered cell names, sorted."""
  return sorted(_REGISTRY)


def sequence_names() -> list[str]:
  """Names of the cells that run over time with `sorjax.unroll`."""
  return [n for n in names() if n not in TREE_CELLS]


def cell_class(name: str) -> type:
  """The class registered under `name`."""
  if name not in _REGISTRY:
    raise ValueError(
        f"unknown cell {name!r}; known cells: {', '.join(names())}")
  module, cls = _REGISTRY[name]
  return getattr(importlib.import_module(f"sorjax.cells.{module}"), cls)


def name_of(cell: Cell) -> str:
  """The name `cell`'s class is registered under (its class name if none)."""
  cls = type(cell)
  for name, (module, cls_name) in _REGISTRY.items():
    if (cls.__name__, cls.__module__) == (cls_name, f"sorjax.cells.{module}"):
      return name
  return cls.__name__


def make(name: str, **hyperparameters: Any) -> Cell:
  """Creates the cell registered under `name` with the given
  hyperparameters; a TypeError naming the cell and listing its
  hyperparameters for one it does not have."""
  cls = cell_class(name)
  fields = sorted(f.name for f in dataclasses.fields(cls) if f.init)
  unknown = [k for k in hyperparameters if k not in fields]
  if unknown:
    raise TypeError(f"cell {name!r} has no hyperparameter {unknown[0]!r} "
                    f"(it has {fields})")
  try:
    return cls(**hyperparameters)
  except TypeError as e:  # unknown / missing keyword: say which cell
    raise TypeError(f"cell {name!r}: {e}") from None


__all__ = ["Cell", "TREE_CELLS", "cell_class", "make", "name_of", "names",
           "sequence_names"]
