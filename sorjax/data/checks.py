"""Argument checks shared by the data modules; errors name the argument."""

from __future__ import annotations

import numpy as np


def check_bool(owner: str, name: str, value) -> bool:
  """`value` if a bool; any other value (a "no" string is truthy) is a
  TypeError naming owner and name."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{owner}: {name} must be a bool, got {value!r}")
  return bool(value)
