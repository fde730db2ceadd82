"""Paired statistics of a group: contenders timed in the same rounds.

A `Group` holds a group's contenders and its roofline matmuls. A ratio
between two contenders is the median of their per-round ratios, and a
fraction of the roofline the median over rounds of a contender's FLOP/s
over that round's faster matmul, so that load drifting during a group
cancels; either can be taken over only the rounds run at one placement of
the cores (`round_place` against the run's `placement_floor`, by
`benchmarks.placement`). `pooled` and `pooled_rounds` gather a pair's
ratios over every group of a run that timed both; `others_busy` says
whether the other workers used the CPU during a timed round.
"""

from __future__ import annotations

import os
import statistics
from typing import Iterable

from benchmarks import placement
from benchmarks.contenders import Contender


def _paired(a: list, b: list, keep=None) -> list[float]:
  """Per-round ratios a / b; keep: the round indices to use (all if None)."""
  return [x / y for r, (x, y) in enumerate(zip(a, b))
          if x is not None and y and (keep is None or r in keep)]


def round_place(c: Contender, r: int, floor: float | None) -> str | None:
  """The placement of c's timed round r (`placement.classify`)."""
  x = c.cores[r] if r < len(c.cores) else None
  if x is None or "hops_ns" not in x:
    return None
  return placement.classify(*x["hops_ns"], floor)


def rounds_at(place, *cs: Contender) -> set | None:
  """The rounds every one of cs ran at placement place = (kind, floor);
  None (every round) when place is None."""
  if place is None:
    return None
  kind, floor = place
  n = min(len(c.rates) for c in cs)
  return {r for r in range(n)
          if all(round_place(c, r, floor) == kind for c in cs)}


class Group:
  """Measured contenders of one group and the paired statistics."""

  def __init__(self, rooflines: list[Contender], contenders: list[Contender]):
    self.rooflines, self.contenders = rooflines, contenders
    rounds = max([len(c.rates) for c in rooflines] or [0])
    self.roof = []  # FLOP/s of each round: the faster matmul
    for r in range(rounds):
      v = [c.rates[r] * c.flops_per_token for c in rooflines
           if len(c.rates) > r and c.rates[r] is not None]
      self.roof.append(max(v) if v else None)

  def roof_gflops(self) -> dict[str, float | None]:
    out = {"roofline": median_of(self.roof)}
    for c in self.rooflines:
      out[c.spec["framework"]] = (None if c.rate is None
                                  else c.rate * c.flops_per_token)
    return {k: None if v is None else v / 1e9 for k, v in out.items()}

  def ratio(self, a: Contender, b: Contender, place=None) -> float | None:
    """The median per-round ratio; place = (kind, floor): only the rounds
    both ran at that placement."""
    return median_of(_paired(a.rates, b.rates, rounds_at(place, a, b)))

  def fraction(self, c: Contender, place=None) -> float | None:
    """The median per-round fraction of the roofline; place as in ratio
    (the matmuls' placement is not asked: they ran as fast apart)."""
    if not c.flops_per_token or not self.roof:
      return None
    keep = rounds_at(place, c)
    return median_of([x * c.flops_per_token / y
                 for r, (x, y) in enumerate(zip(c.rates, self.roof))
                 if x is not None and y and (keep is None or r in keep)])

  def as_json(self) -> dict:
    return {"roofline_gflops": self.roof_gflops(),
            "contenders": [dict(label=c.label, spec=c.spec, rates=c.rates,
                                cores=c.cores, info=c.info, error=c.error,
                                flops_per_token=c.flops_per_token,
                                fraction=self.fraction(c))
                           for c in self.contenders]}


def median_of(v: Iterable) -> float | None:
  v = [x for x in v if x is not None]
  return statistics.median(v) if v else None


def pooled(groups: Iterable["Group"], ours: Contender, peer: Contender
           ) -> list[float]:
  """The paired ratio ours / peer in every group that timed both (the same
  specs), in the order the groups ran. torch.nn.LSTM's rate moved 1.4x
  between three groups of one run (session 13), so one group's ratio can
  read a target met that the others read missed."""
  out = []
  for g in groups:
    a, b = _pair_in(g, ours, peer)
    r = None if a is None or b is None else g.ratio(a, b)
    if r is not None:
      out.append(r)
  return out


def _pair_in(g: "Group", ours: Contender, peer: Contender):
  """g's contenders of ours' and peer's specs (None where g has none):
  each section builds its own Contender objects."""
  return tuple(next((c for c in g.contenders if c.spec == x.spec), None)
               for x in (ours, peer))


# Cores the other workers may use during a timed round before the report
# names it (their threads should sleep while another framework is timed),
# if that is more than /proc's resolution can blur (two clock ticks).
OTHERS_BUSY = 0.1
BUSY_MIN_S = 2 / os.sysconf("SC_CLK_TCK")


def others_busy(cores: dict) -> bool:
  """Whether a round's `Contender.cores` entry shows the other workers
  busy."""
  return (cores["others"] > OTHERS_BUSY
          and cores["others"] * cores["seconds"] >= BUSY_MIN_S)


def placement_floor(groups: Iterable["Group"]) -> float | None:
  """The run's fastest core-to-core reading: the cores' nearest
  placement, against which `placement.classify` judges each round."""
  v = [h for g in groups for c in g.rooflines + g.contenders
       for x in c.cores if x is not None for h in x.get("hops_ns", ())
       if h is not None]
  return min(v) if v else None


def pooled_rounds(groups: Iterable["Group"], ours: Contender,
                  peer: Contender, place) -> list[float]:
  """The per-round ratios ours / peer at placement place = (kind, floor),
  over every group that timed both."""
  out = []
  for g in groups:
    a, b = _pair_in(g, ours, peer)
    if a is not None and b is not None:
      out += _paired(a.rates, b.rates, rounds_at(place, a, b))
  return out
