"""benchmarks.placement (where the cores sat) and how the report uses it."""

import os
import shutil

import pytest

from benchmarks import contenders, placement, report
from benchmarks.groups import Group, placement_floor

# the probe needs a C compiler and two usable CPUs (also read by the
# benchmark's smoke run)
CAN_PROBE = (shutil.which(os.environ.get("CC", "cc")) is not None
             and len(os.sched_getaffinity(0)) > 1)
needs_probe = pytest.mark.skipif(
    not CAN_PROBE, reason="needs a C compiler ('cc') and two usable CPUs")


def test_classify_by_the_runs_fastest_reading():
  # APART = 2: within 50 ns of a 25 ns floor is near
  assert placement.classify(26.0, 50.0, 25.0) == "near"
  assert placement.classify(170.0, 51.0, 25.0) == "apart"
  assert placement.classify(26.0, 170.0, 25.0) == "moved"
  assert placement.classify(170.0, 26.0, 25.0) == "moved"
  assert placement.classify(None, 26.0, 25.0) is None
  assert placement.classify(26.0, 26.0, None) is None


@needs_probe
def test_probe_reads_a_plausible_latency():
  p = placement.Prober(hops=200)
  try:
    v = p.probe()
    assert p.error is None
    # a store reaches another core in more than 1 ns and, spinning on one
    # cache line, well within 100 us
    assert 1.0 < v < 1e5
  finally:
    p.close()


@needs_probe
def test_probe_failures_say_why():
  one = placement.Prober(cpus=[0])
  assert one.probe() is None and "one usable CPU" in one.error
  # a CPU this process may not run on: hop.c exits 3 and names it
  cpus = sorted(os.sched_getaffinity(0))
  bad = placement.Prober(cpus=[cpus[0], 1023], hops=10)
  try:
    assert bad.probe() is None
    assert "exit 3" in bad.error and "1023" in bad.error
    assert bad.probe() is None          # stays failed: no retry per round
  finally:
    bad.close()
  with pytest.raises(ValueError, match="hops"):
    placement.Prober(hops=0)


def test_probe_without_compiler_says_why(monkeypatch):
  monkeypatch.setenv("CC", "no-such-compiler-sorjax")
  p = placement.Prober(cpus=[0, 1])
  assert p.probe() is None and "no-such-compiler-sorjax" in p.error
  text = report.placement_text([Group([], [_timed([1.0], [None])])],
                            p.error)
  assert text.endswith("Not probed: no C compiler: "
                       "'no-such-compiler-sorjax' (set $CC) is not on PATH.")


@needs_probe
def test_command_line_watch(capsys):
  assert placement.main(["--seconds", "0.05", "--interval", "0"]) == 0
  out = capsys.readouterr().out
  assert "readings between CPUs" in out and "fastest" in out
  with pytest.raises(SystemExit):
    placement.main(["--seconds", "0"])


def _timed(rates, hops, spec=None, framework="jax", flops_per_token=None):
  """A contender whose timed round r was probed at hops[r] (before and
  after alike, or a (before, after) pair)."""
  c = contenders.Contender("k", spec or {"impl": "matmul", "framework": framework,
                                  "n": 2}, framework, flops_per_token)
  c.rates = list(rates)
  c.cores = [dict(own=1.9, others=0.0, seconds=0.3,
                  hops_ns=list(h) if isinstance(h, tuple) else [h, h])
             for h in hops]
  return c


def test_ratio_and_fraction_at_a_placement():
  # rounds: near, apart, moved, near -- ours is 1.2x the peer near and 0.8x
  # apart; the round that moved counts in neither
  near, apart, moved = 25.0, 170.0, (25.0, 170.0)
  ours = _timed([120, 80, 100, 240], [near, apart, moved, near],
                flops_per_token=10)
  peer = _timed([100, 100, 100, 200], [near, apart, apart, near])
  mm = _timed([2, 2, 2, 2], [near] * 4, flops_per_token=1000)  # 2000 FLOP/s
  g = Group([mm], [ours, peer])
  assert g.ratio(ours, peer) == pytest.approx(1.1)         # every round
  assert g.ratio(ours, peer, ("near", 25.0)) == pytest.approx(1.2)
  assert g.ratio(ours, peer, ("apart", 25.0)) == pytest.approx(0.8)
  assert g.fraction(ours, ("near", 25.0)) == pytest.approx(
      (1200 / 2000 + 2400 / 2000) / 2)
  assert g.fraction(ours, ("apart", 25.0)) == pytest.approx(800 / 2000)
  assert placement_floor([g]) == 25.0
  # a contender never timed apart has no apart rounds to give
  assert g.ratio(mm, ours, ("apart", 25.0)) is None


def _pair(ours_rates, peer_rates, hops):
  ours = contenders.sorjax("lstm", 2, 5, 8)
  peer = contenders.lstm_peer("torch_lstm", 2, 5, 8, "torch")
  return (_timed(ours_rates, hops, ours.spec),
          _timed(peer_rates, hops, peer.spec, "torch"))


def test_targets_give_their_values_near_and_apart():
  a1, t1 = _pair([110, 80], [100, 100], [26.0, 170.0])
  a2, t2 = _pair([120, 90], [100, 100], [25.0, 180.0])
  g1, g2 = Group([], [a1, t1]), Group([], [a2, t2])
  cell = _timed([100, 50], [26.0, 170.0], flops_per_token=10)
  mm = _timed([2, 2], [26.0, 26.0], flops_per_token=1000)  # 2000 FLOP/s
  rep = report.Report()
  rep.target("lstm >= 1.0x torch", True, "0.95x", (a1, t1, 1.0))
  rep.target("cell at 70%", False, "38%",
             frac=(Group([mm], [cell]), cell))
  rep.target("memory", True, "1/20")                   # neither: as given
  text = report.targets_text(rep, [g1, g2])
  # per-round ratios near 1.1, 1.2 and apart 0.8, 0.9, pooled over groups;
  # the verdict stays the median over the groups (0.95x, 1.05x -> 1.00x)
  assert ("| lstm >= 1.0x torch | met | 0.95x; 2 groups of this run timed "
          "both: 0.95x / 1.05x, median 1.00x; cores near 1.15x (2 rounds), "
          "apart 0.85x (2 rounds) |") in text
  assert ("| cell at 70% | NOT met | 38%; cores near 50% (1 round), "
          "apart 25% (1 round) |") in text
  assert "| memory | met | 1/20 |" in text
  # every round near: nothing to split, the table is as before
  b1, u1 = _pair([110, 80], [100, 100], [26.0, 30.0])
  quiet = report.Report()
  quiet.target("lstm >= 1.0x torch", True, "0.95x", (b1, u1, 1.0))
  assert "| lstm >= 1.0x torch | met | 0.95x |" in report.targets_text(
      quiet, [Group([], [b1, u1])])


def test_placement_text_gives_what_apart_costs_each_contender():
  near, apart = 26.0, 170.0
  sensitive = _timed([100, 100, 75, 77], [near, near, apart, apart],
                     contenders.sorjax("lstm", 2, 5, 8).spec)
  steady = _timed([50, 50, 50], [near, apart, (near, apart)])
  only_near = _timed([10, 10], [near, near], flops_per_token=1)
  text = report.placement_text(
      [Group([only_near], [sensitive]), Group([], [steady])], None)
  assert "The fastest reading of the run is 26.0 ns" in text
  assert "Timed rounds: 5 near, 3 apart, 1 moved." in text
  assert "| 1 | sorjax lstm | 2 / 2 | 100 | 76 | 0.76x |" in text
  assert "| 2 | jax matmul 2^3 | 1 / 1 | 50 | 50 | 1.00x |" in text
  assert "| 1 | jax matmul 2^3 |" not in text   # never apart: not listed
  assert "No reading came near" not in text
  # a run whose every reading was apart has no near floor: said so (its
  # rounds were all called near; QA, session 41)
  all_apart = _timed([10, 10], [apart, 1.1 * apart])
  assert ("**No reading came near 60 ns** (cores on one L3 cache): the "
          "whole run may have sat apart") in report.placement_text(
              [Group([], [all_apart])], None)
  # stopped probing mid-run: the reason is given
  assert "probing stopped: hop 0 1: exit 3" in report.placement_text(
      [Group([], [sensitive])], "hop 0 1: exit 3")
