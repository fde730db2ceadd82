"""Benchmark driver: paired, interleaved throughput and memory of every cell.

    python -m benchmarks.run                 # full grid (an hour or more here)
    python -m benchmarks.run --quick         # the targets (minutes when idle)
    python -m benchmarks.run --sections lstm,dyck --rounds 7
    # per-core and steady on a busy machine: one thread each, CPU time
    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
      python -m benchmarks.run --quick --sections gemm,lstm,dyck --clock cpu \
      --torch-threads 1

This process imports neither jax nor torch. Each framework runs in its own
worker process (`benchmarks.jax_worker`, `benchmarks.torch_worker`; importing
jax after torch had set up its threads slowed torch.nn.LSTM ~24x in one
process). A *group* is a set of contenders measured together: each is
compiled and warmed up, then timed in R rounds, the order rotating every
round (A B C, B C A, ...), each timing long enough (`--min-round-seconds`).
Throughput is the median over rounds; a ratio between two contenders is the
median of their per-round ratios, so load that drifts during a group
cancels. Groups that report "% roofline" also time a 2048^3 f32 matmul in
XLA and in torch: the roofline of a round is the faster of the two, and
"% roofline" is a cell's matmul FLOP/s (benchmarks.flops) over it, paired
by round. Naive forms are timed in groups of their own (their rounds fault
in gigabytes, which slowed the matmul timed next to them). The header also
gives the cores' FMA peak (benchmarks.peak): the arithmetic ceiling above
the roofline. Targets relative to a peer say what they need in roofline
terms (the target ratio times the peer's fraction): above 100% a target
asks for a faster matmul than any measured here. Every timing is
bracketed by a core-to-core latency probe (benchmarks.placement): on a VM
the host moves the vCPUs, and with two of them on different L3 caches
XLA's steps ran up to 1.6x slower; the report gives each target over
the rounds run near and apart, and what apart cost each contender.

A training step is forward + backward through time to every parameter,
given a fixed random cotangent of the outputs (no loss head). Peak memory:
XLA's `memory_analysis()` of the compiled step for JAX contenders; the rise
of the resident high-water mark for torch (see torch_worker). Both include
parameters, inputs and gradients.

This module is the command line: its flags, the run and the report's
header and writing. The parts it runs: `benchmarks.profiles` (the runs'
sizes), `benchmarks.workers` (the framework processes),
`benchmarks.contenders` (what is timed), `benchmarks.bench` (timing a
group), `benchmarks.groups` (paired statistics), `benchmarks.report` (the
report's text) and `benchmarks.sections` (what each section times).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import signal
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import flags, peak, specs
from benchmarks.bench import Bench
from benchmarks.profiles import ALL_CELLS, PROFILES
from benchmarks.report import (Report, cpu_text, errors, note,
                               placement_text, targets_text, unreported_text)
from benchmarks.sections import RUNNERS
from benchmarks.workers import ROOT, host_malloc_env

SECTIONS = tuple(RUNNERS)    # in the order a full run takes them


def loadavg() -> str:
  try:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])
  except OSError:
    return "n/a"


def _versions(torch_ok: bool) -> str:
  out = []
  for mod in ("jax", "flax", "torch"):
    if mod == "torch" and not torch_ok:
      out.append("torch (not installed)" if importlib.util.find_spec("torch")
                 is None else "torch (not used: --no-torch)")
      continue
    try:
      from importlib.metadata import version
      out.append(f"{mod} {version(mod)}")
    except Exception:
      out.append(f"{mod} ?")
  return ", ".join(out)


def _cpu() -> str:
  """The first CPU's model name with its family and model numbers (a
  VM's "AMD EPYC" names every generation alike)."""
  try:
    text = Path("/proc/cpuinfo").read_text()
  except OSError:
    return platform.processor() or "unknown CPU"
  return cpu_from_cpuinfo(text) or platform.processor() or "unknown CPU"


def cpu_from_cpuinfo(text: str) -> str:
  """"<model name> (family F model M)" from /proc/cpuinfo's first block;
  "" when it names no model."""
  fields = {}
  for line in text.split("\n\n", 1)[0].splitlines():
    key, sep, value = line.partition(":")
    if sep:
      fields.setdefault(key.strip(), value.strip())
  name = fields.get("model name", "")
  ids = [f"{label} {fields[key]}" for key, label in
         (("cpu family", "family"), ("model", "model")) if key in fields]
  return f"{name} ({' '.join(ids)})" if name and ids else name


def parse_args(argv=None):
  ap = argparse.ArgumentParser(
      prog="python -m benchmarks.run",
      description="Paired, interleaved benchmarks of sorjax vs torch and flax.")
  mode = ap.add_mutually_exclusive_group()
  mode.add_argument("--quick", action="store_true",
                    help="the targets only, ~13 min on 2 idle cores")
  mode.add_argument("--smoke", action="store_true",
                    help="tiny sizes, seconds (the test suite's run)")
  ap.add_argument("--sections", default=",".join(SECTIONS),
                  help=f"comma-separated subset of {','.join(SECTIONS)}")
  ap.add_argument("--cells", default=None,
                  help="comma-separated cells for the 'cells' and 'fused' "
                       "sections (fused runs those with a split step); "
                       "refused if a requested section runs none of them or "
                       "one of them would run in no requested section")
  ap.add_argument("--rounds", type=flags.at_least(1), default=None)
  ap.add_argument("--warmup-rounds", type=flags.at_least(0), default=None,
                  help="untimed rounds before them (default 1)")
  ap.add_argument("--min-round-seconds", default=None,
                  type=flags.number(">= 0", lambda v: v >= 0),
                  help="least seconds per timing (0: one step); below the "
                       "profile's worker timeout")
  ap.add_argument("--mem-budget-gb", default=4.0,
                  type=flags.number("> 0", lambda v: v > 0),
                  help="largest naive step to execute (default 4 GB)")
  ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                  help="wall time (default) or the worker's CPU time (all "
                       "threads; steadier on a loaded machine, but counts "
                       "spinning threads as work)")
  ap.add_argument("--torch-threads", type=flags.at_least(0), default=0,
                  help="torch intra-op threads (default: the cores)")
  ap.add_argument("--no-torch", action="store_true",
                  help="measure JAX contenders only")
  ap.add_argument("--no-torch-memory", dest="torch_memory",
                  action="store_false",
                  help="skip the fresh-process torch memory measurements")
  ap.add_argument("--host-malloc", choices=("default", "reuse", "hugepages"),
                  default="default",
                  help="glibc settings of sorjax.host_memory for every worker "
                       "(torch, flax and sorjax alike), for steps whose "
                       "temporaries exceed 32 MB and page-fault them in on "
                       "every call. reuse: keep freed host buffers; "
                       "hugepages: map them with transparent huge pages; "
                       "default: glibc as is")
  ap.add_argument("--out", default=None,
                  help="markdown report (default a new file "
                       "benchmarks/reports/<UTC time>-<profile>.md, so the "
                       "curated benchmarks/RESULTS.md is never overwritten: "
                       "it is refused here; '-' for none)")
  ap.add_argument("--json", default=None,
                  help="raw measurements as JSON (default none; '-' for "
                       "none too)")
  ap.add_argument("--overwrite", action="store_true",
                  help="replace an existing --out / --json file (refused "
                       "otherwise: an earlier run's report)")
  args = ap.parse_args(argv)
  if args.no_torch and args.torch_threads:
    ap.error(f"--torch-threads {args.torch_threads}: no torch worker runs "
             "with --no-torch")
  # every check before anything is made: folders are made when written
  sections = list(dict.fromkeys(  # each once, in the order given
      s.strip() for s in args.sections.split(",") if s.strip()))
  bad = [s for s in sections if s not in SECTIONS]
  if bad or not sections:
    ap.error(f"--sections: {f'unknown {bad}' if bad else 'none given'}; "
             f"choose from {','.join(SECTIONS)}")
  args.section_list = sections
  timeout = PROFILES["smoke" if args.smoke else "quick" if args.quick
                     else "full"].timeout_s
  if args.min_round_seconds is not None and args.min_round_seconds >= timeout:
    ap.error(f"--min-round-seconds: {args.min_round_seconds:g} s is not "
             f"below the workers' {timeout:g} s reply timeout")
  if args.cells is not None:
    args.cells = list(dict.fromkeys(
        c.strip() for c in args.cells.split(",") if c.strip()))
    unknown = [c for c in args.cells if c not in ALL_CELLS]
    if unknown or not args.cells:
      ap.error(f"--cells: {f'unknown {unknown}' if unknown else 'none given'}"
               f"; choose from {','.join(ALL_CELLS)}")
    problem = _cells_unused(args.cells, sections)
    if problem:
      ap.error(f"--cells: {problem}")
  args.json = None if args.json == "-" else args.json
  paths = {}
  for flag, path in (("--out", args.out), ("--json", args.json)):
    if path not in (None, "-"):
      # Path() reads "" as "." and drops a trailing "/" ("new/" would be
      # written as the file new)
      problem = ("names a folder; give a file in it" if path.endswith("/")
                 else _unwritable(Path(path)) if path
                 else "empty; give a file, or '-' for none")
      if problem:  # found now, not after the first group's minutes
        ap.error(f"{flag} {path or repr(path)}: {problem}")
      if Path(path).is_file() and not args.overwrite:
        ap.error(f"{flag} {path}: exists (an earlier run's?); give a new "
                 "file, or --overwrite to replace it")
      paths[flag] = Path(path).resolve()
  if len(paths) == 2 and paths["--out"] == paths["--json"]:
    ap.error(f"--json {args.json}: the same file as --out {args.out}; "
             f"give them different files")
  return args


# The sections that take --cells, and which of the cells each runs.
CELL_SECTIONS = {"cells": ALL_CELLS, "fused": specs.SPLIT}


def _cells_unused(cells: list, sections: list) -> str | None:
  """Why --cells `cells` would be ignored by `sections`, in whole or in
  part, or None."""
  takers = [s for s in sections if s in CELL_SECTIONS]
  if not takers:
    return (f"only the sections {' and '.join(CELL_SECTIONS)} take cells, "
            f"and --sections {','.join(sections)} has neither")
  takes = ("; fused takes the cells with a split step: "
           f"{','.join(specs.SPLIT)}")
  for s in takers:
    if not any(c in CELL_SECTIONS[s] for c in cells):
      return f"section {s} runs none of {','.join(cells)}{takes}"
  unused = [c for c in cells
            if not any(c in CELL_SECTIONS[s] for s in takers)]
  if unused:
    return (f"no section of --sections {','.join(sections)} runs "
            f"{','.join(unused)}{takes}")
  return None


def _unwritable(path: Path) -> str | None:
  """Why a report could not be written at `path`, or None. Makes nothing:
  a file or folder made to try is removed."""
  try:
    if path.resolve() == (ROOT / "benchmarks" / "RESULTS.md").resolve():
      return ("the curated results are never overwritten; write elsewhere "
              "and merge by hand")
    if path.is_dir():
      return "is a directory"
    top = path.parent  # the nearest folder that exists
    while not top.exists():
      top = top.parent
    if not top.is_dir():
      return f"its folder cannot be made ({top} is a file)"
    if top == path.parent:
      if path.exists():  # writable, not truncated (nor a FIFO waited on)
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
      else:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        path.unlink()
    else:
      made = path.parent.relative_to(top).parts
      longest = os.pathconf(top, "PC_NAME_MAX")
      if any(len(os.fsencode(p)) > longest for p in made + (path.name,)):
        return f"a name in it is longer than {longest} bytes"
      os.rmdir(tempfile.mkdtemp(dir=top))
  except OSError as e:
    return f"cannot be written ({e.strerror or e})"
  return None


class Stopped(KeyboardInterrupt):
  """SIGTERM or SIGHUP (a scheduler, `timeout`, a closed terminal), handled
  as Ctrl-C is: what finished is written, and the report says so."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


# What stops a run: each signal's name in the report and its exit status.
STOP_SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM",
                signal.SIGHUP: "SIGHUP"}


def _stop(signum, frame):
  raise Stopped(signum)


def _how(e: KeyboardInterrupt) -> tuple[str, int]:
  """(what stopped the run, its exit status 128 + signal)."""
  signum = getattr(e, "signum", signal.SIGINT)
  return STOP_SIGNALS[signum], 128 + int(signum)


def main(argv=None) -> int:
  args = parse_args(argv)
  before = {}
  if threading.current_thread() is threading.main_thread():
    before = {s: signal.signal(s, _stop) for s in (signal.SIGTERM,
                                                   signal.SIGHUP)}
  try:
    return run_args(args, argv)
  except KeyboardInterrupt as e:  # before the first section: nothing kept
    how, code = _how(e)
    note(f"interrupted ({how}) before the first section; nothing written")
    return code
  finally:
    for s, handler in before.items():
      signal.signal(s, handler)


def run_args(args, argv=None) -> int:
  """The run of parsed `args`: 0, 1 if a contender failed or a report could
  not be written, 128 + the signal if interrupted (130 for Ctrl-C; what
  finished is written, nothing if nothing did)."""
  name = "smoke" if args.smoke else "quick" if args.quick else "full"
  profile = PROFILES[name]
  over = {}
  if args.rounds is not None:
    over["rounds"] = args.rounds
  if args.warmup_rounds is not None:
    over["warmup_rounds"] = args.warmup_rounds
  if args.min_round_seconds is not None:
    over["min_round_s"] = args.min_round_seconds
  if args.cells:
    over["cells"] = tuple(args.cells)
  profile = dataclasses.replace(profile, **over)
  torch_ok = (not args.no_torch
              and importlib.util.find_spec("torch") is not None)
  stamp = datetime.datetime.now(datetime.timezone.utc)
  out = (ROOT / "benchmarks" / "reports" / f"{stamp:%Y%m%d-%H%M%S}-{name}.md"
         if args.out is None else None if args.out == "-" else Path(args.out))
  problem = args.out is None and _unwritable(out)
  if problem:  # --out's default, checked as parse_args checks a given one
    raise SystemExit(f"--out (default {out}): {problem}")
  log = Path(os.environ.get("TMPDIR", "/tmp")) / f"sorjax-bench-{os.getpid()}.log"

  cmd = "python -m benchmarks.run" + ("" if argv is None and len(sys.argv) < 2
                                      else " " + " ".join(
                                          sys.argv[1:] if argv is None else argv))
  worker_env = host_malloc_env(args.host_malloc)
  started = datetime.datetime.now().astimezone()
  load0 = loadavg()
  head = (f"# sorjax benchmarks ({name})\n\n"
          f"- command: `{cmd}`\n"
          f"- date: {started:%Y-%m-%d %H:%M %Z}\n"
          f"- machine: {_cpu()}, {os.cpu_count()} cores; {_versions(torch_ok)}"
          f"; torch threads {args.torch_threads or len(os.sched_getaffinity(0))}\n"
          f"- load average (1, 5, 15 min) at start: {load0}\n"
          f"- {peak.describe(len(os.sched_getaffinity(0)))}\n"
          f"- rounds per group: {profile.rounds} after "
          f"{profile.warmup_rounds} untimed (order rotating), >= "
          f"{profile.min_round_s} s per timing; {args.clock} clock; medians; "
          f"ratios are medians of per-round ratios\n"
          f"- FLOPs: matmul multiply-adds x 2 of a training step whose "
          f"gradients go to the parameters only, in every framework: "
          f"forward, dW and dh of products by the state, dW of input-only "
          f"products (no dx of the inputs; benchmarks/flops.py)\n"
          + (f"- XLA_FLAGS: `{os.environ['XLA_FLAGS']}`\n"
             if os.environ.get("XLA_FLAGS") else "")
          + (f"- host malloc: {args.host_malloc} in every worker "
             f"(`GLIBC_TUNABLES={worker_env['GLIBC_TUNABLES']}`)\n"
             if worker_env else "")
          + f"- worker log: {log}")
  rep = Report()
  rep.add(head)
  if args.torch_threads:
    os.environ["SORJAX_BENCH_TORCH_THREADS"] = str(args.torch_threads)
  bench = Bench(args, profile, torch_ok, log, worker_env)
  t0 = time.perf_counter()
  failed_writes, stopped, current, interrupted = set(), None, None, None
  finished = 0

  def write(final):
    _write(out, rep, args, bench, load0, t0, final, failed_writes, stopped)

  try:
    for s in args.section_list:
      note(f"[{time.perf_counter() - t0:7.1f}s] section {s} "
            f"(load {loadavg()})")
      n0, current = len(bench.groups), s
      RUNNERS[s](bench, rep)
      current = None
      finished += 1
      write(final=False)
      if failed_writes:  # stop now, not after hours of unwritable results
        stopped = (f"stopped after section {s}: "
                   f"{' and '.join(sorted(failed_writes))} not written")
        break
  except KeyboardInterrupt as e:
    interrupted = e
  finally:
    with sigint_ignored():  # a second Ctrl-C must not cut the writing short
      bench.close(kill=interrupted is not None)
  with sigint_ignored():
    if interrupted is not None:
      stopped = f"interrupted ({_how(interrupted)[0]})" + (
          f" during section {current}" if current else "")
      if current and len(bench.groups) > n0:
        rep.add(unreported_text(bench.groups, n0, current))
      if not finished and not bench.groups:   # an earlier file stays
        note(f"{stopped} before any group finished; nothing written")
        return _how(interrupted)[1]
    write(final=True)
  if stopped:
    kept = [f"{f} {p}" for f, p in (("--out", out), ("--json", args.json))
            if p is not None and f not in failed_writes]
    note(f"{stopped}; what finished is in "
          f"{', '.join(kept) or 'no file (stdout only)'}")
  failed = errors(c for g in bench.groups for c in g.rooflines + g.contenders)
  if failed:  # the report lists them too; a script sees the exit status
    note(f"{len(failed)} contender(s) failed (worker log: {log}):\n"
          + "\n".join(failed))
  if interrupted is not None:
    return _how(interrupted)[1]
  return 1 if failed or failed_writes else 0


@contextlib.contextmanager
def sigint_ignored():
  """Ctrl-C, SIGTERM and SIGHUP ignored meanwhile (a handler is the main
  thread's to set)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  before = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS}
  try:
    yield
  finally:
    for s, handler in before.items():
      signal.signal(s, handler)


def _replace(path: Path, text: str) -> None:
  """Writes `text` to `path` whole or not at all: a regular file through a
  temporary one renamed over it (a run killed while writing leaves the
  previous version); anything else (a FIFO, /dev/stdout) directly."""
  path = Path(os.path.realpath(path))     # a symlink's target is replaced
  if path.exists() and not path.is_file():
    path.write_text(text)
    return
  if path.exists():                       # its mode kept; mkstemp's is 0600
    mode = stat.S_IMODE(path.stat().st_mode)
  else:
    umask = os.umask(0)
    os.umask(umask)
    mode = 0o666 & ~umask
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise


def _write(out, rep, args, bench, load0, t0, final, failed, stopped=None):
  """Writes the JSON, then the report, each on its own: one that fails is
  noted (naming its flag), added to `failed` and not tried again."""
  tail = (f"\n\n---\n{f'**Run {stopped}.** ' if stopped else ''}Load "
          f"average at end: {loadavg()} (start: {load0}); wall time "
          f"{time.perf_counter() - t0:.0f} s."
          if final else "\n\n---\n(partial: run in progress)")
  targets = targets_text(rep, bench.groups)
  text = "\n\n".join(rep.parts[:1] + [targets] + rep.parts[1:]
                     + [cpu_text(bench.groups),
                        placement_text(bench.groups, bench.prober.error)]
                     ) + tail
  if final:
    print(targets + tail, flush=True)
  for flag, path, content in (
      ("--json", args.json and Path(args.json),
       lambda: json.dumps(bench.raw, indent=1, default=str)),
      ("--out", out, lambda: text + "\n")):
    if path is None or flag in failed:
      continue
    try:
      path.parent.mkdir(parents=True, exist_ok=True)
      _replace(path, content())
    except OSError as e:
      failed.add(flag)
      note(f"{flag} {path}: not written ({e.strerror or e})")


if __name__ == "__main__":
  sys.exit(main())
