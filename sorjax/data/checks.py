"""Argument checks of the data modules: `sorjax.checks` with the error
naming "owner: name", the function or class and its argument."""

from __future__ import annotations

import os

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


def memory_bytes() -> int | None:
  """This machine's physical memory in bytes (None where unknown)."""
  try:
    have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (AttributeError, ValueError, OSError):
    return None
  return have if have > 0 else None      # -1: indeterminate


def check_fits(owner: str, name: str, value: int, bytes_each: int) -> int:
  """Refuses a count whose output would not fit in this machine's memory
  (`bytes_each`: a lower bound per item) before any of it is made, rather
  than after minutes of work or with a bare MemoryError."""
  total, have = value * bytes_each, memory_bytes()
  if have is not None and total > have:
    raise ValueError(f"{owner}: {name}={value} needs at least "
                     f"{total / 2**30:.3g} GiB, more than this machine's "
                     f"{have / 2**30:.3g} GiB of memory; ask for fewer")
  return value
