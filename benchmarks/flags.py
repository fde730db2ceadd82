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


def shape_list(ap, flag: str, text: str, names: str = "B,T,H"
               ) -> list[tuple[int, ...]]:
  """--flag's shapes: tuples of positive ints named `names`, joined by
  ';' ("B,T,H;B,T,H"), or the parser's error naming the flag."""
  n = len(names.split(","))
  try:
    shapes = [tuple(int(v) for v in s.split(",")) for s in text.split(";")]
  except ValueError:
    shapes = [()]
  if not all(len(s) == n and min(s) > 0 for s in shapes):
    kind = {3: "triples", 4: "quadruples"}.get(n, "tuples")
    ap.error(f"{flag}: want {names} {kind} of positive ints joined by ';', "
             f"got {text!r}")
  return shapes


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
