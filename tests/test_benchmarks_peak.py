"""benchmarks.peak (the cores' FMA peak) and the roofline terms of targets."""

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import peak, run, sections

CC = os.environ.get("CC", "cc")  # the compiler benchmarks.peak uses
HAS_CC = shutil.which(CC) is not None


@pytest.mark.skipif(not HAS_CC, reason=f"no C compiler ({CC!r}) on PATH")
def test_fma_peak_is_its_flops_over_its_time(tmp_path):
  exe = peak.build(Path(tmp_path))
  p = peak.fma_peak([1], seconds=0.02, repeats=1, exe=exe)
  # No machine retires 2000 GFLOP/s on one core. (No floor: on a loaded
  # machine a 0.02 s run measured 4 GFLOP/s of an idle core's ~117.)
  assert 0.0 < p[1] < 2000.0
  # The rate is its FLOPs over its time: 2 FLOP an FMA, 12 chains of one
  # register's floats a round, per thread.
  lanes = _register_floats()
  for threads, iters in ((1, 2_000_000), (2, 1_000_000)):  # >= ~5 ms
    gflops, secs = peak._run(exe, threads, iters)
    assert gflops * 1e9 * secs == pytest.approx(
        2 * 12 * lanes * iters * threads, rel=2e-3)


def _register_floats() -> int:
  """Floats in the widest vector register that $CC -march=native targets,
  from the compiler's own predefined macros."""
  macros = subprocess.run(
      [CC, "-march=native", "-dM", "-E", "-x", "c", "/dev/null"],
      capture_output=True, text=True, check=True).stdout.split()
  return 16 if "__AVX512F__" in macros else 8 if "__AVX__" in macros else 4


@pytest.mark.skipif(not HAS_CC or platform.machine() not in ("x86_64",
                                                              "AMD64"),
                    reason="needs a C compiler targeting x86-64 (reads its "
                    "assembly)")
def test_fma_peak_keeps_its_accumulators_in_registers(tmp_path):
  """An FMA that reads an operand from the stack measures the stack, not
  the FMA units: 64-byte vectors on an AVX2-only Zen 3 spilled all 12
  accumulators and read 12 GFLOP/s on two cores whose matmul ran at 125."""
  asm = tmp_path / "fma_peak.s"
  subprocess.run([CC, "-O2", "-march=native", "-ffp-contract=fast", "-S",
                  str(peak.SOURCE), "-o", str(asm)], check=True)
  fmas = re.findall(r"^\s*vfmadd\w*ps\s+(.*)$", asm.read_text(), re.M)
  assert len(fmas) >= 12, "the 12 chains' FMAs were not emitted as FMAs"
  assert not [f for f in fmas if "(%rsp)" in f or "(%rbp)" in f], fmas


def test_fma_peak_without_compiler_says_why(monkeypatch):
  monkeypatch.setenv("CC", "no-such-compiler-sorjax")
  with pytest.raises(peak.PeakUnavailable, match="no-such-compiler-sorjax"):
    peak.fma_peak([1])
  assert "not measured" in peak.describe(2)
  assert "no-such-compiler-sorjax" in peak.describe(2)


def test_fma_peak_rejects_bad_arguments():
  with pytest.raises(ValueError, match="thread counts"):
    peak.fma_peak([0])
  with pytest.raises(ValueError, match="seconds"):
    peak.fma_peak([1], seconds=0)


@pytest.mark.skipif(not HAS_CC, reason=f"no C compiler ({CC!r}) on PATH")
def test_probe_rejects_bad_command_line(tmp_path):
  exe = peak.build(Path(tmp_path))
  with pytest.raises(peak.PeakUnavailable, match="exit 2"):
    peak._run(exe, 0, 10)


class _Group:  # what _needs reads of a groups.Group
  def __init__(self, fractions):
    self.fractions = fractions

  def fraction(self, c):
    return self.fractions[c]


def test_needs_is_the_target_times_the_peer_fraction():
  # flax at 82% of the roofline: 1.3x flax needs 1.3 * 82 = 106.6% -> 107%.
  g = _Group({"ours": 1.0, "flax": 0.82, "loop": None})
  assert sections._needs(g, "ours", "flax", 1.3) == \
      "; needs 107% of the roofline, is at 100%"
  assert sections._needs(g, "ours", "loop", 2.0) == ""   # peer not measured


def test_lstm_targets_state_the_roofline_needed(tmp_path, monkeypatch):
  monkeypatch.setenv("TMPDIR", str(tmp_path))    # the workers' log
  out = tmp_path / "r.md"
  assert run.main(["--smoke", "--no-torch", "--sections", "lstm",
                   "--out", str(out)]) == 0
  text = out.read_text()
  assert "FMA peak" in text
  flax_rows = [l for l in text.splitlines()
               if l.startswith("| lstm >= 1.3x flax")]
  assert flax_rows and all("of the roofline, is at" in l for l in flax_rows)
