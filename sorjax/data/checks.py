"""Argument checks of the data modules: `sorjax.checks` with the error
naming "owner: name", the function or class and its argument."""

from __future__ import annotations

from sorjax import checks


def check_int(owner: str, name: str, value, minimum: int = 0) -> int:
  """`value` as an int >= minimum, or a ValueError naming owner and name."""
  return checks.check_int(f"{owner}: {name}", value, minimum)


def check_bool(owner: str, name: str, value) -> bool:
  """`value` if a bool; any other value (a "no" string is truthy) is a
  TypeError naming owner and name."""
  return checks.check_bool(f"{owner}: {name}", value)


def check_scale(owner: str, scale) -> float:
  """The fraction of a split's examples to keep: a number in (0, 1]."""
  return checks.check_number(f"{owner}: scale", scale, "in (0, 1]",
                             lambda v: 0 < v <= 1)
