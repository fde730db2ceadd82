"""The text of a benchmark report: formats, tables, targets and accounts.

`f_rate`, `f_x`, `f_pct` and `f_mb` format a table's cells, `table` makes
a markdown table and `roof_line` a group's roofline sentence. `Report`
collects the sections' parts and targets. `targets_text` judges the
targets (a ratio over every group of the run that timed its pair, and over
the rounds run with the cores near and apart); `cpu_text` gives the rounds
in which the other workers were busy, `placement_text` where the cores sat,
and `unreported_text` the groups an interrupted section had not tabled.
`errors` lists the contenders that failed; `note` writes a progress line
to stderr.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from typing import Iterable

from benchmarks import placement
from benchmarks.contenders import Contender
from benchmarks.groups import (OTHERS_BUSY, Group, median_of, others_busy,
                               placement_floor, pooled, pooled_rounds,
                               round_place, rounds_at)


def f_rate(c: Contender) -> str:
  if c.error and c.rate is None:
    return "skipped" if c.error.startswith("skipped") else "error"
  r = c.rate
  if r is None:
    return "-"
  return f"{r / 1e3:,.1f}k" if r >= 1e4 else f"{r:,.0f}"


def f_x(v: float | None) -> str:
  return "-" if v is None else f"{v:.2f}x"


def f_pct(v: float | None) -> str:
  return "-" if v is None else f"{100 * v:.0f}%"


def f_mb(v: float | None) -> str:
  if v is None:
    return "-"
  if v < 1:
    return f"{v * 1024:.0f} kB"
  return f"{v / 1024:.1f} GB" if v >= 1024 else f"{v:.1f} MB"


def table(header: list[str], rows: list[list[str]]) -> str:
  out = ["| " + " | ".join(header) + " |",
         "|" + "|".join("---" for _ in header) + "|"]
  out += ["| " + " | ".join(r) + " |" for r in rows]
  return "\n".join(out)


def roof_line(g: Group) -> str:
  r = g.roof_gflops()
  parts = [f"{k} {v:.0f}" for k, v in r.items()
           if k != "roofline" and v is not None]
  if r["roofline"] is None:
    return "roofline: not measured"
  return (f"Roofline {r['roofline']:.0f} GFLOP/s: per round the faster "
          f"f32 matmul, median over rounds ({', '.join(parts)} GFLOP/s).")


def note(s: str):
  print(s, file=sys.stderr, flush=True)


def errors(cs: Iterable[Contender]) -> list[str]:
  """One line per distinct failure (a contender timed in two groups, such
  as sorjax's cell beside its naive form, may fail twice the same way)."""
  return list(dict.fromkeys(f"- {c.label}: {c.error}" for c in cs
                            if c.error and not c.error.startswith("skipped")))


@dataclasses.dataclass
class Report:
  parts: list = dataclasses.field(default_factory=list)
  # (text, ok, value, pool, frac): pool = (ours, peer, x) for "ours >= x
  # times peer", judged at the end over every group that timed both
  # (`pooled`); frac = (group, contender) for a fraction of the roofline
  targets: list = dataclasses.field(default_factory=list)

  def add(self, text: str):
    self.parts.append(text)
    print(text + "\n", flush=True)

  def target(self, text: str, ok: bool | None, value: str, pool=None,
             frac=None):
    self.targets.append((text, ok, value, pool, frac))


def unreported_text(groups: list["Group"], n0: int, section: str) -> str:
  """The groups from number n0 + 1 on, which an interrupted section timed
  but had not tabled yet: each contender's tokens/s and peak memory."""
  rows = [[str(i), c.label, f_rate(c), f_mb(c.peak_mb)]
          for i, g in enumerate(groups[n0:], n0 + 1) for c in g.contenders]
  return (f"### Groups of section {section} finished before the interrupt"
          f"\n\nNot yet in the section's tables (groups numbered as they "
          f"ran; their raw measurements are in the JSON, if asked for).\n\n"
          + table(["group", "contender", "tokens/s", "peak memory"], rows))


def cpu_text(groups: Iterable["Group"]) -> str:
  """The report's account of CPU use in the timed rounds: how many rounds
  the other workers' processes were busy in (> OTHERS_BUSY cores, CPU time
  over the round's wall time), and which contenders those rounds timed."""
  rows, total, n_busy = [], 0, 0
  for i, g in enumerate(groups, 1):
    for c in g.rooflines + g.contenders:
      seen = [x for x in c.cores if x is not None]
      busy = [x for x in seen if others_busy(x)]
      total, n_busy = total + len(seen), n_busy + len(busy)
      if busy:
        rows.append([str(i), c.label, f"{len(busy)} of {len(seen)}",
                     f"{max(x['others'] for x in busy):.2f}",
                     f"{median_of(x['own'] for x in seen):.2f}"])
  head = (f"## CPU use in the timed rounds\n\nEach timed round's CPU time "
          f"over its wall time, for the timed worker's process and for the "
          f"other workers' (which should sleep meanwhile; groups are "
          f"numbered in the order they ran). {n_busy} of {total} timed "
          f"rounds had the other workers use more than {OTHERS_BUSY} cores")
  if not rows:
    return head + "."
  return head + ":\n\n" + table(
      ["group", "contender", "rounds", "others' cores (max)",
       "own cores (median)"], rows)


def _by_place(groups, floor, pool, frac) -> str:
  """A target's value over the rounds run with the cores near and apart."""
  parts = []
  for kind, name in (("near", "cores near"), ("apart", "apart")):
    place = (kind, floor)
    if pool is not None:
      rs = pooled_rounds(groups, *pool[:2], place)
      v, n = (f_x(median_of(rs)) if rs else "-"), len(rs)
    else:
      g, c = frac
      n = len(rounds_at(place, c))
      v = f_pct(g.fraction(c, place)) if n else "-"
    parts.append(f"{name} {v} ({n} round{'' if n == 1 else 's'})")
  return "; " + ", ".join(parts)


def targets_text(rep: Report, groups: Iterable["Group"] = ()) -> str:
  """The targets table. A ratio target whose pair was timed in more than
  one group is judged by the median over those groups, which it lists.
  When some rounds of the run ran with the cores apart (section "Where the
  cores sat"), each ratio and fraction target also gives its value over
  the rounds run near and apart; the verdict stays the one over all."""
  if not rep.targets:
    return ""
  groups = list(groups)
  floor = placement_floor(groups)
  split = floor is not None and any(
      round_place(c, r, floor) == "apart" for g in groups
      for c in g.contenders for r in range(len(c.cores)))
  rows = []
  for t, ok, v, pool, frac in rep.targets:
    rs = [] if pool is None else pooled(groups, *pool[:2])
    if len(rs) > 1:
      med = statistics.median(rs)
      ok = med >= pool[2]
      v += (f"; {len(rs)} groups of this run timed both: "
            f"{' / '.join(map(f_x, rs))}, median {f_x(med)}")
    if split and (pool is not None or frac is not None):
      v += _by_place(groups, floor, pool, frac)
    rows.append([t, "met" if ok else "NOT met" if ok is not None else "n/a",
                 v])
  return "## Targets\n\n" + table(["target", "status", "measured"], rows)


def placement_text(groups: Iterable["Group"], error: str | None) -> str:
  """The report's account of where the cores sat in the timed rounds, and
  what the rounds apart cost every contender timed both near and apart."""
  head = "## Where the cores sat\n\n"
  groups = list(groups)
  floor = placement_floor(groups)
  if floor is None:
    return head + f"Not probed: {error or 'no timed round'}."
  kinds = {"near": 0, "apart": 0, "moved": 0}
  rows = []
  for i, g in enumerate(groups, 1):
    for c in g.rooflines + g.contenders:
      at = {}
      for r, x in enumerate(c.rates):
        kind = round_place(c, r, floor)
        if kind is not None:
          kinds[kind] += 1
          if x is not None:
            at.setdefault(kind, []).append(x)
      if "near" in at and "apart" in at:
        near, apart = median_of(at["near"]), median_of(at["apart"])
        rows.append([str(i), c.label,
                     f"{len(at['near'])} / {len(at['apart'])}",
                     f"{near:,.0f}", f"{apart:,.0f}", f_x(apart / near)])
  text = head + (
      f"The core-to-core latency (`benchmarks/placement.py`: a store on one "
      f"core seen by another, the slowest of the probed pairs) was read "
      f"before and after every timing. The fastest reading of the run is "
      f"{floor:.1f} ns; a timed round ran with the cores *near* when both "
      f"its readings were within {placement.APART:g}x of it, *apart* when "
      f"both were above, and *moved* otherwise. On a VM the host moves the "
      f"vCPUs: session 23's (AMD EPYC family 25 model 17) sat on one L3 "
      f"cache (~26 ns) or on two (~170 ns). Timed rounds: "
      f"{kinds['near']} near, {kinds['apart']} apart, {kinds['moved']} "
      f"moved"
      + ("" if error is None else f"; probing stopped: {error}")
      + ("" if floor <= placement.SHARED_L3_NS else
         f". **No reading came near {placement.SHARED_L3_NS:g} ns** (cores "
         f"on one L3 cache): the whole run may have sat apart, and *near* "
         f"means here only as near as this run got"))
  if not rows:
    return text + "."
  return text + (". Contenders timed both near and apart (median "
                 "tokens/s; groups numbered as they ran):\n\n") + table(
      ["group", "contender", "rounds near / apart", "tokens/s near",
       "tokens/s apart", "apart vs near"], rows)
