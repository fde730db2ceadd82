"""argparse types of the benchmarks' value flags: a bad value is the
parser's usage error naming its flag (exit 2), found before any work.

This module imports neither jax nor torch (benchmarks.run's process must
not), so it cannot use sorjax.checks.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable


def at_least(minimum: int):
  """An argparse type: an int >= minimum."""
  def parse(text: str) -> int:
    try:
      v = int(text)
    except ValueError:
      v = None
    if v is None or v < minimum:
      raise argparse.ArgumentTypeError(
          f"want an int >= {minimum}, got {text!r}")
    return v
  return parse


def number(rule: str, ok: Callable[[float], bool]):
  """An argparse type: a finite float for which ok holds; rule says what
  ok checks, e.g. "> 0" or "in [0, 600] (the worker's timeout)"."""
  def parse(text: str) -> float:
    try:
      v = float(text)
    except ValueError:
      v = math.nan
    if not (math.isfinite(v) and ok(v)):
      raise argparse.ArgumentTypeError(
          f"want a finite number {rule}, got {text!r}")
    return v
  return parse
