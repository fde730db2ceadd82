"""Where the cores sat: core-to-core latency of the usable CPUs (hop.c).

    python -m benchmarks.placement [--seconds 60] [--interval 0.5]

On a VM the host moves the vCPUs between its cores. Session 23 found this
machine's two vCPUs sometimes on one L3 cache (~26 ns for a store on one
to reach the other) and sometimes on two (~170 ns), for seconds at a time,
and sorjax's LSTM step at B=32 T=100 H=256 1.31x slower while they sat
apart (its threads hand each step's products and wake-ups to each other),
torch.nn.LSTM 1.07x slower, and neither the 1024^3 matmul nor the FMA
peak slower. That was the "slow state" of sessions 22's runs.

`benchmarks.run` probes between timed rounds and its report splits the
rounds by placement (`classify`); this command prints the readings over
time. The probe is C, compiled on the spot as benchmarks.peak's is; it
pins two threads, so run it when nothing else is being timed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks import flags, peak

SOURCE = Path(__file__).with_name("hop.c")

# A reading above APART times the fastest of the run: the cores sat apart
# (this machine: ~170 against ~26 ns; the probe's spread is +-15%).
APART = 2.0
# The slowest reading of cores on one L3 cache seen here (~26 ns, +-15%,
# with room): a run whose fastest reading is above it never sat near, and
# `is_apart` against that floor would call its rounds near.
SHARED_L3_NS = 60.0


class Prober:
  """Runs hop.c between the first usable CPU and up to three others; a
  reading is the slowest pair's median one-way hop, in ns. Without a C
  compiler or a second CPU, `probe()` returns None and `error` says why."""

  def __init__(self, cpus=None, hops: int = 2000, timeout_s: float = 10.0):
    cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if hops < 1:
      raise ValueError(f"Prober: hops must be >= 1, got {hops}")
    self.pairs = [(cpus[0], c) for c in cpus[1:4]]
    self.hops, self.timeout_s = hops, timeout_s
    self.error: str | None = None
    self._dir = None
    if not self.pairs:
      self.error = f"one usable CPU ({cpus}): no pair of cores to probe"
      return
    self._dir = tempfile.TemporaryDirectory(prefix="sorjax-hop-")
    try:
      self.exe = peak.compile_probe(SOURCE, Path(self._dir.name))
    except peak.PeakUnavailable as e:
      self.error = str(e)
      self.close()

  def probe(self) -> float | None:
    """One reading, or None (after a failure every reading is None)."""
    if self.error is not None:
      return None
    worst = 0.0
    for a, b in self.pairs:
      cmd = [str(self.exe), str(a), str(b), str(self.hops)]
      try:
        r = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=self.timeout_s)
      except subprocess.TimeoutExpired:
        self.error = f"hop {a} {b}: no answer in {self.timeout_s} s"
        return None
      if r.returncode:
        self.error = (f"hop {a} {b}: exit {r.returncode}: "
                      f"{r.stderr.strip()[:300]}")
        return None
      worst = max(worst, float(r.stdout.split()[0]))
    return worst

  def close(self):
    if self._dir is not None:
      self._dir.cleanup()
      self._dir = None


def is_apart(reading: float, floor: float) -> bool:
  """Whether one reading says the cores sat apart: above APART x floor,
  the run's fastest reading."""
  return reading > APART * floor


def classify(before: float | None, after: float | None,
             floor: float | None) -> str | None:
  """A timed round's placement from the readings on either side of it:
  "near" (neither `is_apart`), "apart" (both), "moved" (one of each), None
  (not probed)."""
  if before is None or after is None or not floor:
    return None
  apart = [is_apart(v, floor) for v in (before, after)]
  return "apart" if all(apart) else "moved" if any(apart) else "near"


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--seconds", default=60.0,
                  type=flags.number("> 0", lambda v: v > 0),
                  help="how long to watch (default 60)")
  ap.add_argument("--interval", default=0.5,
                  type=flags.number(">= 0", lambda v: v >= 0),
                  help="seconds between readings (default 0.5)")
  args = ap.parse_args(argv)
  prober = Prober()
  try:
    readings, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
      v = prober.probe()
      if v is None:
        print(f"not measured: {prober.error}")
        return 1
      readings.append(v)
      print(f"{time.perf_counter() - t0:7.1f} s  {v:6.1f} ns", flush=True)
      time.sleep(args.interval)
  finally:
    prober.close()
  floor = min(readings)
  apart = [is_apart(v, floor) for v in readings]
  moves = sum(a != b for a, b in zip(apart, apart[1:]))
  print(f"{len(readings)} readings between CPUs {prober.pairs}: fastest "
        f"{floor:.1f} ns, median {statistics.median(readings):.1f} ns; "
        f"{sum(apart)} above {APART:g}x the fastest; {moves} changes")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
