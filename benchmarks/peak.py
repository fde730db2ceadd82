"""The cores' f32 FMA peak (benchmarks/fma_peak.c), next to the roofline.

    python -m benchmarks.peak [--threads N]

The roofline of the reports is the fastest f32 matmul measured (2048^3, in
XLA and in torch). This probe gives the arithmetic ceiling above it: how
many FLOP/s the cores' FMA units retire when nothing waits on memory. The
gap between the two is what a better matmul kernel than XLA's or torch's
could still win; a target that needs more than the roofline asks for
exactly such a kernel.

The probe is C, compiled on the spot with $CC (default `cc`) and
`-O2 -march=native`; without a compiler it is reported as not measured.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("fma_peak.c")


class PeakUnavailable(RuntimeError):
  """No C compiler, or a C probe (this one, benchmarks.placement's) failed
  to build or run."""


def compile_probe(source: Path, workdir: Path) -> Path:
  """Compiles one of the benchmarks' C probes into workdir with $CC
  (default `cc`) and -O2 -march=native; returns the executable."""
  cc = os.environ.get("CC", "cc")
  if shutil.which(cc) is None:
    raise PeakUnavailable(f"no C compiler: {cc!r} (set $CC) is not on PATH")
  exe = workdir / source.stem
  cmd = [cc, "-O2", "-march=native", "-ffp-contract=fast", "-pthread",
         str(source), "-o", str(exe)]
  r = subprocess.run(cmd, capture_output=True, text=True)
  if r.returncode:
    raise PeakUnavailable(f"{' '.join(cmd)} failed: {r.stderr.strip()[:300]}")
  return exe


def build(workdir: Path) -> Path:
  """Compiles fma_peak.c into workdir; returns the executable."""
  return compile_probe(SOURCE, workdir)


def _run(exe: Path, threads: int, iters: int) -> tuple[float, float]:
  r = subprocess.run([str(exe), str(threads), str(iters)],
                     capture_output=True, text=True)
  if r.returncode:
    raise PeakUnavailable(f"{exe.name} {threads} {iters}: exit "
                          f"{r.returncode}: {r.stderr.strip()[:300]}")
  try:
    gflops, secs = map(float, r.stdout.split())
  except ValueError:
    raise PeakUnavailable(f"{exe.name}: unexpected output {r.stdout!r}")
  return gflops, secs


def fma_peak(threads_list, seconds: float = 0.25, repeats: int = 3,
             exe: Path | None = None) -> dict[int, float]:
  """GFLOP/s per thread count: the best of `repeats` runs of about
  `seconds` each (iterations calibrated by a short first run)."""
  if seconds <= 0 or repeats < 1:
    raise ValueError(f"fma_peak: seconds must be > 0 (got {seconds}) and "
                     f"repeats >= 1 (got {repeats})")
  bad = [t for t in threads_list if int(t) < 1]
  if bad:
    raise ValueError(f"fma_peak: thread counts must be >= 1, got {bad}")
  with tempfile.TemporaryDirectory(prefix="sorjax-peak-") as d:
    exe = exe or build(Path(d))
    out = {}
    for t in threads_list:
      iters = 1 << 16
      _, secs = _run(exe, t, iters)
      while secs < 0.02:  # calibrate: about `seconds` a run
        iters *= 8
        _, secs = _run(exe, t, iters)
      iters = max(1, int(iters * seconds / secs))
      out[int(t)] = max(_run(exe, t, iters)[0] for _ in range(repeats))
    return out


def describe(threads: int) -> str:
  """One line for a report header; says why when not measured."""
  ts = sorted({1, max(1, threads)})
  try:
    p = fma_peak(ts)
  except PeakUnavailable as e:
    return f"FMA peak: not measured ({e})"
  parts = [f"{p[t]:.0f} GFLOP/s on {t} thread{'s' if t > 1 else ''}"
           for t in ts]
  return ("FMA peak of the cores (benchmarks/fma_peak.c): "
          + ", ".join(parts))


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                  help="thread count besides 1 (default: the usable cores)")
  args = ap.parse_args(argv)
  if args.threads < 1:
    ap.error(f"--threads must be >= 1, got {args.threads}")
  print(describe(args.threads))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
