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
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from benchmarks import flags, flops, peak, placement, specs

# The worker of contenders timed with sorjax.small_loops.compile_whole().
SMALL_LOOPS = "jax_small_loops"


def host_devices_worker(n: int) -> str:
  """The worker of contenders timed on n CPU devices
  (`--xla_force_host_platform_device_count`, read at the process's start)."""
  return f"jax_{n}_devices"

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("lstm", "gemm", "cells", "fused", "dyck", "scaling", "remat",
            "unroll", "trees", "gpu")


# ------------------------------------------------------------------ profiles

@dataclasses.dataclass(frozen=True)
class Profile:
  """Sizes and effort of a run."""
  lstm_shapes: tuple
  cell_shapes: tuple
  cells: tuple
  dyck_shape: tuple
  replicas: int
  scaling: dict            # axis -> ((B, T, H), ...)
  scaling_cells: tuple
  remat_shape: tuple
  remat_cells: tuple
  fused_shapes: tuple      # batched weight gradients vs autodiff, per cell
  unroll_shapes: tuple     # ((B, T, H), cells)
  unroll_factors: tuple
  dyck_variants: tuple     # option dicts of sorjax lstm in the Dyck regime
  replica_unrolls: tuple   # unroll factors of the replica comparison
  # CPU device counts over which the replicas are also timed sharded (the
  # training loop's replica parallelism), each in a worker of its own
  replica_devices: tuple
  # (B, T, H) of a paper's replicated runs, timed on one and on the
  # replica_devices (Mahto et al.: 20 replicas of a 256-unit LSTM, batch 128,
  # up to 200 brackets)
  replica_paper_shapes: tuple
  tree: dict               # B, H, min_leaves, max_leaves
  rounds: int
  warmup_rounds: int       # untimed rounds first (the first ran slow)
  min_round_s: float
  matmul_n: int
  naive_max_step_s: float
  timeout_s: float


_ALL = tuple(n for n in (
    "rnn", "gru", "lstm", "mts_lstm", "tensor_rnn", "general2", "mrnn",
    "mi_rnn", "mlstm", "attention_lstm", "assignment_lstm", "mm_rnn",
    "mm_lstm", "dyck_rnn"))

PROFILES = {
    "full": Profile(
        lstm_shapes=specs.SHAPES, cell_shapes=specs.SHAPES,
        cells=tuple(n for n in _ALL if n != "lstm"),
        dyck_shape=specs.DYCK_SHAPE, replicas=specs.DYCK_REPLICAS,
        scaling={"T": ((32, 100, 256), (32, 300, 256), (32, 1000, 256)),
                 "H": ((32, 100, 128), (32, 100, 256), (32, 100, 512),
                       (32, 100, 1024)),
                 "B": ((8, 100, 256), (32, 100, 256), (128, 100, 256))},
        scaling_cells=("lstm", "mrnn", "mm_rnn"),
        remat_shape=(32, 200, 512),
        remat_cells=("lstm", "mrnn", "mlstm", "attention_lstm", "mm_rnn",
                     "mm_lstm"),
        fused_shapes=specs.SHAPES,
        unroll_shapes=(((32, 100, 256), ("lstm", "mrnn", "mm_rnn")),
                       (specs.DYCK_SHAPE, ("lstm", "mrnn", "mm_rnn"))),
        unroll_factors=(1, 2, 4, 8),
        dyck_variants=({}, {"unroll": 1}, {"hoist": False},
                       {"small_loops": True}),
        replica_unrolls=(None, 1), replica_devices=(2,),
        replica_paper_shapes=((128, 200, 256),),
        tree=dict(B=32, H=256, min_leaves=10, max_leaves=40),
        rounds=5, warmup_rounds=1, min_round_s=0.5, matmul_n=2048,
        naive_max_step_s=8.0, timeout_s=1800.0),
    "quick": Profile(
        lstm_shapes=specs.SHAPES, cell_shapes=((64, 100, 512),),
        cells=specs.TARGET_CELLS,
        dyck_shape=specs.DYCK_SHAPE, replicas=specs.DYCK_REPLICAS,
        scaling={"T": ((32, 100, 256), (32, 1000, 256))},
        scaling_cells=("lstm", "mrnn"),
        remat_shape=(32, 200, 512), remat_cells=("lstm", "mrnn"),
        fused_shapes=((32, 100, 256), (64, 100, 512)),
        unroll_shapes=((specs.DYCK_SHAPE, ("lstm",)),),
        unroll_factors=(1, 2, 4, 8),
        dyck_variants=({}, {"unroll": 1}, {"hoist": False},
                       {"small_loops": True}),
        replica_unrolls=(None, 1), replica_devices=(2,),
        replica_paper_shapes=((128, 50, 256),),
        tree=dict(B=32, H=256, min_leaves=10, max_leaves=40),
        rounds=3, warmup_rounds=1, min_round_s=0.3, matmul_n=2048,
        naive_max_step_s=3.0, timeout_s=900.0),
    "smoke": Profile(  # the test suite's run: seconds, every code path
        lstm_shapes=((2, 5, 8),), cell_shapes=((2, 5, 8),),
        cells=("mrnn", "mm_rnn", "attention_lstm"),
        dyck_shape=(2, 6, 4), replicas=3,
        scaling={"T": ((2, 5, 8), (2, 10, 8))}, scaling_cells=("lstm",),
        remat_shape=(2, 5, 8), remat_cells=("mrnn",),
        fused_shapes=((2, 5, 8),),
        unroll_shapes=(((2, 5, 8), ("lstm",)),), unroll_factors=(1, 2),
        dyck_variants=({}, {"small_loops": True}), replica_unrolls=(None,),
        replica_devices=(3,), replica_paper_shapes=((8, 5, 32),),
        tree=dict(B=2, H=8, min_leaves=3, max_leaves=6),
        rounds=2, warmup_rounds=1, min_round_s=0.0, matmul_n=64,
        naive_max_step_s=0.0, timeout_s=300.0),
}


# ------------------------------------------------------------------ workers

class WorkerError(RuntimeError):
  pass


class Worker:
  """One framework's worker process, started on first use, restarted if it
  dies (e.g. killed for memory) or times out."""

  def __init__(self, module: str, log_path: Path, env: dict | None = None):
    self.module, self.log_path, self.env = module, log_path, env or {}
    self.proc: subprocess.Popen | None = None
    self.lines: queue.Queue = queue.Queue()

  def _start(self):
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", **self.env)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                       if p])
    log = open(self.log_path, "a")
    self.proc = subprocess.Popen(
        [sys.executable, "-m", self.module], cwd=ROOT, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, bufsize=1)
    log.close()
    self.lines = queue.Queue()
    threading.Thread(target=self._pump, args=(self.proc, self.lines),
                     daemon=True).start()

  @staticmethod
  def _pump(proc, lines):
    for line in proc.stdout:
      lines.put(line)
    lines.put(None)  # EOF: the worker died

  def request(self, timeout: float, **msg) -> dict:
    if self.proc is None or self.proc.poll() is not None:
      self._start()
    try:
      self.proc.stdin.write(json.dumps(msg) + "\n")
      self.proc.stdin.flush()
      line = self.lines.get(timeout=timeout)
    except queue.Empty:
      self.kill()
      raise WorkerError(f"{self.module}: no answer in {timeout:.0f} s") from None
    except (BrokenPipeError, OSError):
      line = None
    if line is None:
      code = self.proc.wait()
      self.proc = None
      raise WorkerError(f"{self.module} exited with code {code} (see "
                        f"{self.log_path})")
    return json.loads(line)

  def cpu_seconds(self) -> float:
    """CPU time (user + system, every thread) this worker's process has
    used; 0 when it is not running or /proc cannot tell."""
    if self.proc is None or self.proc.poll() is not None:
      return 0.0
    try:
      stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
    except OSError:
      return 0.0
    return proc_stat_cpu_seconds(stat)

  def kill(self):
    if self.proc is not None:
      self.proc.kill()  # our own child, by its handle
      self.proc.wait()
      self.proc = None

  def close(self):
    if self.proc is not None and self.proc.poll() is None:
      try:
        self.proc.stdin.write('{"cmd": "quit"}\n')
        self.proc.stdin.flush()
        self.proc.wait(timeout=30)
      except (OSError, subprocess.TimeoutExpired):
        self.kill()
    self.proc = None


def proc_stat_cpu_seconds(stat: str) -> float:
  """utime + stime of a /proc/<pid>/stat line, in seconds (fields 14 and 15;
  the command name, field 2, may hold spaces and parentheses)."""
  fields = stat.rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ contenders

@dataclasses.dataclass
class Contender:
  key: str
  spec: dict
  framework: str                 # "jax", "torch" or SMALL_LOOPS
  flops_per_token: float | None = None
  # filled by measurement
  info: dict = dataclasses.field(default_factory=dict)
  rates: list = dataclasses.field(default_factory=list)    # per round, or None
  # per timed round: cores its own process kept busy (CPU time / wall
  # time), cores the other workers used meanwhile (should be ~0), and the
  # core-to-core latency probed just before and just after it (hops_ns)
  cores: list = dataclasses.field(default_factory=list)
  error: str | None = None

  @property
  def label(self) -> str:
    return specs.label(self.spec)

  @property
  def rate(self) -> float | None:
    r = [x for x in self.rates if x is not None]
    return statistics.median(r) if r else None

  @property
  def peak_mb(self) -> float | None:
    b = self.info.get("peak_bytes")
    return None if b is None else b / 2 ** 20


def cell_spec(impl: str, cell: str, B: int, T: int, H: int, **opts) -> dict:
  hp = specs.cell_hparams(cell, H)
  hp.update(opts.pop("hparams", {}))
  return dict(impl=impl, cell=cell, hparams=hp, B=B, T=T,
              D=specs.input_size(cell, H), **opts)


def sorjax(cell, B, T, H, key=None, **opts) -> Contender:
  """small_loops=True: timed in a JAX worker that set
  `sorjax.small_loops.compile_whole()`."""
  spec = cell_spec("sorjax", cell, B, T, H, **opts)
  fw = (SMALL_LOOPS if spec.get("small_loops") else
        host_devices_worker(spec["devices"]) if spec.get("devices") else "jax")
  return Contender(key or specs.label(spec), spec, fw,
                   flops.train_flops(cell, spec["hparams"], spec["D"]))


def naive(cell, B, T, H, profile, budget, **opts) -> Contender:
  spec = cell_spec("naive", cell, B, T, H, mem_budget=budget,
                   max_step_s=profile.naive_max_step_s, **opts)
  return Contender(specs.label(spec), spec, "jax")


def torch_loop(cell, B, T, H) -> Contender:
  spec = cell_spec("torch_loop", cell, B, T, H)
  return Contender(specs.label(spec), spec, "torch",
                   flops.train_flops(cell, spec["hparams"], spec["D"]))


def lstm_peer(impl, B, T, H, framework, **opts) -> Contender:
  spec = dict(impl=impl, B=B, T=T, D=H, H=H, **opts)
  return Contender(specs.label(spec), spec, framework,
                   flops.train_flops("lstm", {"hidden_size": H}, H))


def matmuls(n: int, torch_ok: bool) -> list[Contender]:
  out = [Contender("matmul-jax", dict(impl="matmul", framework="jax", n=n),
                   "jax", flops.matmul_flops(n))]
  if torch_ok:
    out.append(Contender("matmul-torch",
                         dict(impl="matmul", framework="torch", n=n),
                         "torch", flops.matmul_flops(n)))
  return out


# ------------------------------------------------------------------ measuring

class Bench:
  def __init__(self, args, profile: Profile, torch_ok: bool, log: Path,
               env: dict | None = None):
    """env: every worker's extra environment (`host_malloc_env`)."""
    self.args, self.profile, self.torch_ok = args, profile, torch_ok
    self.workers = {"jax": Worker("benchmarks.jax_worker", log, env),
                    "torch": Worker("benchmarks.torch_worker", log, env),
                    # XLA reads its flags once: a process of its own
                    SMALL_LOOPS: Worker("benchmarks.jax_worker", log, dict(
                        env or {}, **{specs.SMALL_LOOPS_ENV: "1"}))}
    for n in profile.replica_devices:  # started only when first used
      flags = (f"--xla_force_host_platform_device_count={n} "
               + os.environ.get("XLA_FLAGS", "")).strip()
      self.workers[host_devices_worker(n)] = Worker(
          "benchmarks.jax_worker", log, dict(env or {}, XLA_FLAGS=flags))
    self.log = log
    self.clock = "cpu_seconds" if args.clock == "cpu" else "seconds"
    self.counter = 0
    self.raw: list[dict] = []
    self.groups: list["Group"] = []
    self.prober = placement.Prober()

  def close(self, kill: bool = False):
    """kill: end the workers now (an interrupted run), not once they
    answer their current request."""
    for w in self.workers.values():
      if kill:
        w.kill()
      else:
        w.close()
    self.prober.close()

  def _call(self, c: Contender, timeout: float, **msg) -> dict | None:
    try:
      rep = self.workers[c.framework].request(timeout, **msg)
    except WorkerError as e:
      c.error = str(e)
      return None
    if not rep.get("ok"):
      c.error = rep.get("error", "failed")
      return None
    return rep

  def group(self, contenders: list[Contender], roofline: bool = True
            ) -> "Group":
    """Prepares, times in rotating rounds, measures torch memory, releases."""
    p = self.profile
    mm = matmuls(p.matmul_n, self.torch_ok) if roofline else []
    todo = [c for c in contenders
            if not (c.framework == "torch" and not self.torch_ok)]
    for c in contenders:
      if c.framework == "torch" and not self.torch_ok:
        c.error = "skipped: torch not installed (pip install -e '.[bench]')"
    live, iters = [], {}
    t0 = time.perf_counter()
    for c in mm + todo:
      self.counter += 1
      c.info["id"] = f"c{self.counter}"
      rep = self._call(c, p.timeout_s, cmd="prepare", id=c.info["id"],
                       spec=c.spec)
      if rep is None:
        _note(f"  ! {c.label}: {c.error}")
        continue
      c.info.update(rep)
      iters[c.info["id"]] = max(1, round(p.min_round_s
                                         / max(rep["step_s"], 1e-6)))
      live.append(c)
    _note(f"  {', '.join(c.label for c in todo)}: prepared in "
          f"{time.perf_counter() - t0:.0f} s; {p.rounds} rounds")
    # Warm-up rounds are timed and dropped: a group's first round was often
    # its slowest (session 11: the mRNN at 28.5k, 37.1k, 40.3k tokens/s).
    # Between timings, the cores' placement is probed (benchmarks.placement).
    hop = self.prober.probe()
    for r in range(p.warmup_rounds + p.rounds):
      k = r % max(len(live), 1)
      for c in live[k:] + live[:k]:
        n = iters[c.info["id"]]
        others = [w for f, w in self.workers.items() if f != c.framework]
        before = sum(w.cpu_seconds() for w in others)
        rep = self._call(c, p.timeout_s, cmd="time", id=c.info["id"], n=n)
        others_s = sum(w.cpu_seconds() for w in others) - before
        after = self.prober.probe()
        hops, hop = [hop, after], after
        if r >= p.warmup_rounds:
          c.rates.append(None if rep is None else
                         c.info["tokens_per_step"] * n / rep[self.clock])
          wall = None if rep is None else max(rep["seconds"], 1e-9)
          c.cores.append(None if rep is None else dict(
              own=rep["cpu_seconds"] / wall, others=others_s / wall,
              seconds=rep["seconds"], hops_ns=hops))
    for c in live:
      self._call(c, 60, cmd="release", id=c.info["id"])
    if self.args.torch_memory:
      for c in live:
        if c.framework == "torch" and c.spec["impl"] not in ("matmul",
                                                             "stepmm"):
          c.info["peak_bytes"] = torch_memory(c.spec, p.timeout_s)
    g = Group(mm, contenders)
    self.raw.append(g.as_json())
    self.groups.append(g)
    return g


def host_malloc_env(mode: str) -> dict:
  """Every worker's extra environment for --host-malloc: "reuse" and
  "hugepages" give each framework's process the glibc settings of
  `sorjax.host_memory` (freed buffers stay in the process; large buffers get
  transparent huge pages), through GLIBC_TUNABLES so that they hold from
  the process's first allocation. The module is loaded from its file:
  importing the sorjax package would import jax into the driver."""
  if mode == "default":
    return {}
  spec = importlib.util.spec_from_file_location(
      "_sorjax_host_memory", ROOT / "sorjax" / "host_memory.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  ours = {"reuse": module.TUNABLES,
          "hugepages": module.HUGEPAGE_TUNABLES}[mode]
  tunables = os.environ.get("GLIBC_TUNABLES")
  return {"GLIBC_TUNABLES": ours + (f":{tunables}" if tunables else "")}


def torch_memory(spec: dict, timeout: float) -> int | None:
  env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
  try:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.torch_worker", "--memory",
         json.dumps(spec)], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=timeout)
    rep = json.loads(out.stdout.strip().splitlines()[-1])
  except (subprocess.TimeoutExpired, ValueError, IndexError):
    return None
  return rep.get("peak_bytes") if rep.get("ok") else None


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


def _rounds_at(place, *cs: Contender) -> set | None:
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
    out = {"roofline": _med(self.roof)}
    for c in self.rooflines:
      out[c.spec["framework"]] = (None if c.rate is None
                                  else c.rate * c.flops_per_token)
    return {k: None if v is None else v / 1e9 for k, v in out.items()}

  def ratio(self, a: Contender, b: Contender, place=None) -> float | None:
    """The median per-round ratio; place = (kind, floor): only the rounds
    both ran at that placement."""
    return _med(_paired(a.rates, b.rates, _rounds_at(place, a, b)))

  def fraction(self, c: Contender, place=None) -> float | None:
    """The median per-round fraction of the roofline; place as in ratio
    (the matmuls' placement is not asked: they ran as fast apart)."""
    if not c.flops_per_token or not self.roof:
      return None
    keep = _rounds_at(place, c)
    return _med([x * c.flops_per_token / y
                 for r, (x, y) in enumerate(zip(c.rates, self.roof))
                 if x is not None and y and (keep is None or r in keep)])

  def as_json(self) -> dict:
    return {"roofline_gflops": self.roof_gflops(),
            "contenders": [dict(label=c.label, spec=c.spec, rates=c.rates,
                                cores=c.cores, info=c.info, error=c.error,
                                flops_per_token=c.flops_per_token,
                                fraction=self.fraction(c))
                           for c in self.contenders]}


def _med(v: Iterable) -> float | None:
  v = [x for x in v if x is not None]
  return statistics.median(v) if v else None


# ------------------------------------------------------------------ formatting

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


def _note(s: str):
  print(s, file=sys.stderr, flush=True)


def errors(cs: Iterable[Contender]) -> list[str]:
  """One line per distinct failure (a contender timed in two groups, such
  as sorjax's cell beside its naive form, may fail twice the same way)."""
  return list(dict.fromkeys(f"- {c.label}: {c.error}" for c in cs
                            if c.error and not c.error.startswith("skipped")))


# ------------------------------------------------------------------ sections

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


def _shape(s) -> str:
  return f"B={s[0]} T={s[1]} H={s[2]}"


def section_lstm(b: Bench, rep: Report):
  rep.add("## LSTM against torch.nn.LSTM and flax\n\nD = H, f32, "
          "forward + backward through time.")
  fast, flax_ok = [], []
  for (B, T, H) in b.profile.lstm_shapes:
    torch_c = lstm_peer("torch_lstm", B, T, H, "torch")
    flax_c = lstm_peer("flax_lstm", B, T, H, "jax")
    ours = sorjax("lstm", B, T, H)
    unhoisted = sorjax("lstm", B, T, H, hoist=False)
    autodiff = sorjax("lstm", B, T, H, fused_grad=False)
    cs = [torch_c, flax_c, ours, unhoisted, autodiff]
    g = b.group(cs)
    rows = [[c.label, f_rate(c), f_pct(g.fraction(c)),
             f_x(g.ratio(c, torch_c)), f_x(g.ratio(c, flax_c)),
             f_mb(c.peak_mb)] for c in cs]
    rep.add(f"### {_shape((B, T, H))}\n\n{roof_line(g)}\n\n" + table(
        ["implementation", "tokens/s", "% roofline", "vs torch.nn.LSTM",
         "vs flax", "peak memory"], rows) + _errs(cs))
    best = max([ours, unhoisted, autodiff], key=lambda c: c.rate or 0)
    fast.append((B, T, H, g.ratio(ours, torch_c), g.ratio(best, torch_c),
                 best, _needs(g, ours, torch_c, 1.0), (ours, torch_c, 1.0)))
    flax_ok.append((B, T, H, g.ratio(ours, flax_c),
                    _needs(g, ours, flax_c, 1.3), (ours, flax_c, 1.3)))
  for B, T, H, r, rb, best, need, pool in fast:
    rep.target(f"lstm >= 1.0x torch.nn.LSTM at {_shape((B, T, H))}",
               None if r is None else r >= 1.0,
               f"{f_x(r)} (best variant {best.label}: {f_x(rb)}){need}", pool)
  for B, T, H, r, need, pool in flax_ok:
    rep.target(f"lstm >= 1.3x flax OptimizedLSTMCell at {_shape((B, T, H))}",
               None if r is None else r >= 1.3, f_x(r) + need, pool)


def _needs(g: "Group", ours: Contender, peer: Contender, x: float) -> str:
  """What a ">= x times the peer" target asks in roofline terms: x times
  the peer's fraction of the roofline (same FLOPs per token), next to ours.
  Above 100% the target needs a faster matmul than the roofline's."""
  fp, fo = g.fraction(peer), g.fraction(ours)
  if fp is None or fo is None:
    return ""
  return f"; needs {f_pct(x * fp)} of the roofline, is at {f_pct(fo)}"


def section_gemm(b: Bench, rep: Report):
  rep.add("## The per-step GEMM ceiling\n\nA recurrent step multiplies "
          "[B, H] by [H, N], T times in sequence: N = 4H in the LSTM (and "
          "mlstm's m_t W_m, mm_rnn's h [W | P_h]), N = H in rnn, mi_rnn, "
          "mrnn, general2 and mlstm's h_{t-1} W_mh. Timed alone (forward "
          "only, the product feeding the next step), in XLA and in torch, "
          "next to the LSTMs (fwd + bwd): an LSTM step can be no faster "
          "than its framework's per-step product, except where the "
          "framework keeps the weights packed across steps, and a cell "
          "whose steps multiply by [H, H] runs its per-step FLOPs at no "
          "more than the N = H row's fraction of the roofline.")
  for (B, T, H) in b.profile.lstm_shapes:
    mms = [Contender(f"stepmm-{fw}" + ("" if N == 4 * H else f"-n{N}"),
                     dict(impl="stepmm", framework=fw, B=B, T=T, H=H, N=N),
                     fw, 2 * H * N)
           for N in (4 * H, H) for fw in ("jax", "torch")]
    cs = mms + [lstm_peer("torch_lstm", B, T, H, "torch"),
                sorjax("lstm", B, T, H)]
    g = b.group(cs)
    rows = [[c.label, f_rate(c), f_pct(g.fraction(c))] for c in cs]
    rep.add(f"### {_shape((B, T, H))}\n\n{roof_line(g)}\n\n" + table(
        ["", "tokens/s", "% roofline"], rows) + _errs(cs))


def _errs(cs) -> str:
  e = errors(cs)
  return ("\n\nErrors:\n" + "\n".join(e)) if e else ""


def section_cells(b: Bench, rep: Report):
  rep.add("## Every cell: factored (sorjax) vs naive materialised W_hh(t) vs "
          "a torch Python loop\n\nD = H (tensor_rnn: D = "
          f"{specs.TENSOR_RNN_INPUT}). Hyperparameters: M = H; S = 2 cells; "
          "K = 4 matrices (mm_lstm 4, 4, 2, 2). 'vs' columns are paired "
          "speed ratios (>1: sorjax faster); 'naive mem' is the naive "
          "form's peak over sorjax's. Naive forms that need more than the "
          "memory budget, or more than a few seconds a step, are timed at a "
          "shorter T (column 'naive T'; tokens/s of the naive form is flat "
          "in T) while their memory is XLA's figure at the full T. Each "
          "naive form is timed in a group of its own beside a second copy "
          "of sorjax's cell (its 'vs naive' ratio): a round of a naive form "
          "maps and faults in gigabytes, and the roofline matmul timed next "
          "to it measured 235-310 GFLOP/s against 361-442 elsewhere "
          "(session 10), so the groups that give '% "
          "roofline' (sorjax, its torch loop, the two matmuls) hold no "
          "naive form.")
  budget = int(b.args.mem_budget_gb * 2 ** 30)
  for (B, T, H) in b.profile.cell_shapes:
    rows, all_cs = [], []
    for name in b.profile.cells:
      variants = [{}]
      if name == "attention_lstm":
        variants.append({"hparams": {"mix": "gates"}})
      for v in variants:
        ours = sorjax(name, B, T, H, **v)
        cs = [ours]
        loop = None
        if name in specs.TORCH_LOOP and not v:
          loop = torch_loop(name, B, T, H)
          cs.append(loop)
        g = b.group(cs)
        all_cs += cs
        nv = gn = mate = None
        mix_states = (name == "attention_lstm"
                      and ours.spec["hparams"].get("mix", "states") == "states")
        if name in specs.SECOND_ORDER and not mix_states:
          mate = sorjax(name, B, T, H, **v)
          nv = naive(name, B, T, H, b.profile, budget, **v)
          gn = b.group([mate, nv], roofline=False)
          all_cs += [mate, nv]
        mem_ratio = (None if nv is None or not nv.peak_mb or not ours.peak_mb
                     else nv.peak_mb / ours.peak_mb)
        vs_naive = None if nv is None else gn.ratio(mate, nv)
        rows.append([
            ours.label.replace("sorjax ", ""),
            flops.fmt_flops(ours.flops_per_token), f_rate(ours),
            f_pct(g.fraction(ours)),
            "-" if nv is None else f_x(vs_naive),
            "-" if mem_ratio is None else f"{mem_ratio:.1f}x",
            "-" if loop is None else f_x(g.ratio(ours, loop)),
            f_mb(ours.peak_mb),
            "-" if nv is None else f_rate(nv),
            "-" if nv is None else str(nv.info.get("measured_T", "-")),
            "-" if nv is None else f_mb(nv.peak_mb),
            "-" if loop is None else f_rate(loop),
            "-" if loop is None else f_mb(loop.peak_mb),
            f"{g.roof_gflops()['roofline'] or 0:.0f}"])
        if H == 512 and name in specs.TARGET_CELLS:
          _cell_targets(rep, name, ours, nv, vs_naive, loop, g, mem_ratio, v)
    rep.add(f"### {_shape((B, T, H))}\n\n" + table(
        ["cell", "FLOP/token", "tokens/s", "% roofline", "vs naive",
         "naive mem", "vs torch loop", "peak memory", "naive tokens/s",
         "naive T", "naive peak", "torch loop tokens/s", "torch loop peak",
         "roofline GFLOP/s"], rows) + _errs(all_cs))


def _cell_targets(rep, name, ours, nv, vs_naive, loop, g, mem_ratio,
                  variant):
  tag = name + (" [mix=gates]" if variant else "")
  if not variant:
    f = g.fraction(ours)
    rep.target(f"{tag} >= 70% of roofline at H=512",
               None if f is None else f >= 0.7, f_pct(f), frac=(g, ours))
    if loop is not None:
      r = g.ratio(ours, loop)
      rep.target(f"{tag} >= 2x torch Python loop at H=512",
                 None if r is None else r >= 2.0,
                 f_x(r) + _needs(g, ours, loop, 2.0), (ours, loop, 2.0))
  if nv is not None:
    r = vs_naive
    rep.target(f"{tag} >= 10x its naive form at H=512",
               None if r is None else r >= 10.0,
               f"{f_x(r)} (naive timed at T={nv.info.get('measured_T')})")
    rep.target(f"{tag} <= 1/10 of the naive form's memory at H=512",
               None if mem_ratio is None else mem_ratio >= 10.0,
               "-" if mem_ratio is None else f"1/{mem_ratio:.0f}")


def section_dyck(b: Bench, rep: Report):
  B, T, H = b.profile.dyck_shape
  R = b.profile.replicas
  rep.add(f"## Small-model regime of the Dyck experiments ({_shape((B, T, H))}, "
          "D = H)")
  torch_c = lstm_peer("torch_lstm", B, T, H, "torch")
  flax_c = lstm_peer("flax_lstm", B, T, H, "jax")
  ours = [sorjax("lstm", B, T, H, **v) for v in b.profile.dyck_variants]
  cs = [torch_c, flax_c] + ours
  g = b.group(cs, roofline=False)
  rows = [[c.label, f_rate(c), f_x(g.ratio(c, torch_c)), f_mb(c.peak_mb)]
          for c in cs]
  rep.add(table(["implementation", "tokens/s", "vs torch.nn.LSTM",
                 "peak memory"], rows) + _errs(cs))
  r1 = g.ratio(ours[0], torch_c)
  best = max(ours, key=lambda c: c.rate or 0)
  rep.target(f"lstm (defaults) >= 1.5x torch.nn.LSTM at {_shape((B, T, H))}",
             None if r1 is None else r1 >= 1.5,
             f"{f_x(r1)} (best variant {best.label}: "
             f"{f_x(g.ratio(best, torch_c))})", (ours[0], torch_c, 1.5))

  trs, _ = replica_table(b, rep, (B, T, H), R, b.profile.replica_unrolls)
  n_u = len(b.profile.replica_unrolls)
  rest = [f"unroll={u}: {f_x(t)}" for u, t in
          zip(b.profile.replica_unrolls[1:], trs[1:n_u])]
  rest += [f"over {n} CPU devices: {f_x(t)}" for n, t in
           zip(replica_device_counts(b, R), trs[n_u:])]
  met = [t for t in trs if t is not None]
  rep.target(f"{R} vmapped replicas in <= 3x the time of one "
             f"({_shape((B, T, H))})",
             None if not met else min(met) <= 3.0,
             f_x(trs[0]) + (f" ({'; '.join(rest)})" if rest else ""))
  for shape in b.profile.replica_paper_shapes:  # no target: a record
    _, speedups = replica_table(
        b, rep, shape, R, (None,), loop_groups=True,
        title=f"at Mahto et al.'s batch and width ({_shape(shape)})")
    for n, x in zip(replica_device_counts(b, R), speedups):
      rep.add(f"Sharded over {n} CPU devices, the {R} replicas ran "
              f"{f_x(x)} as fast as on one device.")


def replica_device_counts(b: Bench, R: int) -> list[int]:
  """The profile's CPU device counts that R replicas divide evenly."""
  return [n for n in b.profile.replica_devices if R % n == 0]


def replica_table(b: Bench, rep: Report, shape, R: int, unrolls,
                  title: str = "", loop_groups: bool = False) -> list:
  """One Adam step of R models at once (vmap) against one model, for each
  unroll factor; then the R models sharded over n CPU devices (R / n each,
  as the training loop shards them), against one model in that process;
  with loop_groups, last, the R models in the training loop's groups
  (`loop.replica_batch_for`) on one device.
  Adds the table. Returns each pair's time ratio (None where unmeasured),
  the unroll pairs first, and the rate of the R replicas on each device
  count over their rate with the first unroll factor on one device."""
  B, T, H = shape
  pairs = [(sorjax("lstm", B, T, H, optimizer="adam", unroll=u),
            sorjax("lstm", B, T, H, optimizer="adam", replicas=R, unroll=u))
           for u in unrolls]
  pairs += [(sorjax("lstm", B, T, H, optimizer="adam", devices=n),
             sorjax("lstm", B, T, H, optimizer="adam", replicas=R, devices=n))
            for n in replica_device_counts(b, R)]
  n_dev = len(pairs) - len(unrolls)
  if loop_groups:
    pairs.append((pairs[0][0], sorjax("lstm", B, T, H, optimizer="adam",
                                      replicas=R, replica_batch="rule")))
  cs = list({id(c): c for p in pairs for c in p}.values())  # each once
  g = b.group(cs, roofline=False)

  def time_ratio(x, y):  # step time of y over x's: R tokens per token of x
    r = g.ratio(x, y)
    return None if r is None else r * R

  rows, seen = [], []
  for single, vm in pairs:
    for c in (single, vm):
      if any(c is x for x in seen):  # the groups' pair reuses one model
        continue
      seen.append(c)
      step_ms = (None if c.rate is None else
                 1e3 * c.info["tokens_per_step"] / c.rate)
      rows.append([c.label, f_rate(c),
                   "-" if step_ms is None else f"{step_ms:.2f}",
                   f_x(time_ratio(single, c)) if c is vm else "1.00x",
                   f_mb(c.peak_mb)])
  rep.add(f"### {R} replicas trained at once (vmap), one Adam step"
          + (f", {title}" if title else "") + "\n\n"
          "A row with n devices ran in a process with n CPU devices "
          "(`XLA_FLAGS=--xla_force_host_platform_device_count=n`); its "
          "replicas' axis is sharded over them, and its single model ran in "
          "that process too." + groups_text(pairs[-1][1] if loop_groups
                                            else None) + "\n\n" + table(
      ["step", "tokens/s (all replicas)", "ms/step", "time vs one model",
       "peak memory"], rows) + _errs(cs))
  return ([time_ratio(*p) for p in pairs],
          [g.ratio(vm, pairs[0][1])
           for _, vm in pairs[len(unrolls):len(unrolls) + n_dev]])


def groups_text(c: Contender | None) -> str:
  """What the training loop's groups row ran (k from its worker)."""
  if c is None:
    return ""
  k = c.info.get("replica_batch", "?")
  return (f" The row of the training loop's groups vmaps {k} "
          f"replica{'' if k == 1 else 's'} at a time, a `lax.map` over the "
          "groups (`loop.replica_batch_for`, as the loop picks it for this "
          "batch and width).")


def section_scaling(b: Bench, rep: Report):
  rep.add("## Scaling with T, H and B\n\nsorjax cells and torch.nn.LSTM; "
          "tokens/s, fraction of the roofline and peak memory.")
  for axis, shapes in b.profile.scaling.items():
    rows, all_cs = [], []
    for (B, T, H) in shapes:
      cs = [lstm_peer("torch_lstm", B, T, H, "torch")]
      cs += [sorjax(n, B, T, H) for n in b.profile.scaling_cells]
      g = b.group(cs)
      all_cs += cs
      for c in cs:
        rows.append([_shape((B, T, H)), c.label, f_rate(c),
                     f_pct(g.fraction(c)), f_x(g.ratio(c, cs[0])),
                     f_mb(c.peak_mb)])
    rep.add(f"### {axis}\n\n" + table(
        ["shape", "implementation", "tokens/s", "% roofline",
         "vs torch.nn.LSTM", "peak memory"], rows) + _errs(all_cs))


def section_remat(b: Bench, rep: Report):
  B, T, H = b.profile.remat_shape
  rep.add(f"## Rematerialisation at {_shape((B, T, H))}\n\nremat=True "
          "saves only the carries; remat=\"dots\" saves matmul outputs and "
          "recomputes the elementwise rest. The autodiff scan "
          "(fused_grad=False, the default under remat) and the batched-dW "
          "scan (fused_grad=True: True recomputes z_t, \"dots\" is no "
          "remat); speed and memory over no remat.")
  rows, all_cs = [], []
  for name in b.profile.remat_cells:
    for fg in ((False, True) if name in specs.SPLIT else (None,)):
      extra = {} if fg is None else {"fused_grad": fg}
      cs = [sorjax(name, B, T, H, remat=r, **extra)
            for r in (False, True, "dots")]
      g = b.group(cs, roofline=False)
      all_cs += cs
      for c in cs:
        mem = (None if not c.peak_mb or not cs[0].peak_mb
               else c.peak_mb / cs[0].peak_mb)
        rows.append([c.label.replace("sorjax ", ""), f_rate(c),
                     f_x(g.ratio(c, cs[0])), f_mb(c.peak_mb),
                     "-" if mem is None else f"{mem:.2f}x"])
  rep.add(table(["cell", "tokens/s", "speed vs no remat", "peak",
                 "memory vs no remat"], rows) + _errs(all_cs))


def section_fused(b: Bench, rep: Report):
  rep.add("## Batched weight gradients (fused_grad) vs autodiff\n\nThe "
          "default path of each split cell (dW = sum_t h_{t-1}^T dz_t as one "
          "matmul after the backward loop; rnn, lstm, mts_lstm, gru, "
          "mlstm, mm_rnn, mm_lstm, attention_lstm, assignment_lstm and "
          "tensor_rnn run their own layer primitives) against JAX's "
          "autodiff of the scan (fused_grad=False, dW accumulated every "
          "step); fwd + bwd.")
  names = [n for n in (b.args.cells or specs.SPLIT) if n in specs.SPLIT]
  for (B, T, H) in b.profile.fused_shapes:
    rows, all_cs = [], []
    for name in names:
      cs = [sorjax(name, B, T, H, fused_grad=True),
            sorjax(name, B, T, H, fused_grad=False)]
      g = b.group(cs, roofline=False)
      all_cs += cs
      mem = (None if not cs[0].peak_mb or not cs[1].peak_mb
             else cs[0].peak_mb / cs[1].peak_mb)
      rows.append([name, f_rate(cs[0]), f_rate(cs[1]),
                   f_x(g.ratio(cs[0], cs[1])), f_mb(cs[0].peak_mb),
                   f_mb(cs[1].peak_mb), "-" if mem is None else f"{mem:.2f}x"])
    rep.add(f"### {_shape((B, T, H))}\n\n" + table(
        ["cell", "tokens/s fused", "tokens/s autodiff", "speed fused/autodiff",
         "peak fused", "peak autodiff", "memory fused/autodiff"], rows)
        + _errs(all_cs))


def section_unroll(b: Bench, rep: Report):
  rep.add("## The lax.scan unroll factor")
  for (B, T, H), names in b.profile.unroll_shapes:
    rows, all_cs = [], []
    for name in names:
      cs = [sorjax(name, B, T, H, unroll=u) for u in b.profile.unroll_factors]
      g = b.group(cs, roofline=False)
      all_cs += cs
      rows += [[name, str(c.spec["unroll"]), f_rate(c), f_x(g.ratio(c, cs[0])),
                f"{c.info.get('compile_s', 0):.1f}"] for c in cs]
    rep.add(f"### {_shape((B, T, H))}\n\n" + table(
        ["cell", "unroll", "tokens/s", "vs unroll=1", "compile s"], rows)
        + _errs(all_cs))


def section_trees(b: Bench, rep: Report):
  t = b.profile.tree
  rep.add(f"## tree_lstm: chunked vs level-scheduled vs node-by-node\n\n"
          f"{t['B']} random binary trees of {t['min_leaves']}-"
          f"{t['max_leaves']} leaves (split points uniform), H = {t['H']}; "
          "throughput in compositions (internal nodes) per second, forward + "
          "backward; slots = steps x width, the compositions computed.")
  cs = [Contender(impl, dict(impl=impl, **t), "jax",
                  flops.train_flops("tree_lstm", {"hidden_size": t["H"]},
                                    t["H"]))
        for impl in ("tree_chunked", "tree_level", "tree_node")]
  g = b.group(cs)
  rows = [[c.label, str(c.info.get("sequential_steps", "-")),
           str(c.info.get("slots", "-")), f_rate(c), f_pct(g.fraction(c)),
           f_x(g.ratio(c, cs[2])), f_x(g.ratio(c, cs[1])), f_mb(c.peak_mb)]
          for c in cs]
  rep.add(roof_line(g) + "\n\n" + table(
      ["schedule", "sequential steps", "slots", "nodes/s", "% roofline",
       "vs node-by-node", "vs level", "peak memory"], rows) + _errs(cs))


def section_gpu(b: Bench, rep: Report):
  probe = Contender("probe", dict(impl="matmul", framework="jax", n=8), "jax")
  rep_ = b._call(probe, b.profile.timeout_s, cmd="prepare", id="probe",
                 spec=probe.spec)
  plat = rep_.get("platform") if rep_ else None
  if rep_:
    b._call(probe, 60, cmd="release", id="probe")
  if plat != "gpu":
    rep.add(f"## GPU: jax.experimental.rnn (cuDNN) LSTM\n\nSkipped: the JAX "
            f"platform is {plat or 'unknown'}, not gpu.")
    return
  rep.add("## GPU: jax.experimental.rnn (cuDNN) LSTM")
  for (B, T, H) in b.profile.lstm_shapes:
    cud = lstm_peer("cudnn_lstm", B, T, H, "jax")
    cs = [cud, lstm_peer("flax_lstm", B, T, H, "jax"), sorjax("lstm", B, T, H),
          sorjax("mrnn", B, T, H), sorjax("mm_rnn", B, T, H)]
    g = b.group(cs, roofline=False)
    rows = [[c.label, f_rate(c), f_x(g.ratio(c, cud)), f_mb(c.peak_mb)]
            for c in cs]
    rep.add(f"### {_shape((B, T, H))}\n\n" + table(
        ["implementation", "tokens/s", "vs cuDNN", "peak memory"], rows)
        + _errs(cs))


RUNNERS: dict[str, Callable[[Bench, Report], None]] = {
    "lstm": section_lstm, "gemm": section_gemm, "cells": section_cells, "dyck": section_dyck,
    "fused": section_fused, "scaling": section_scaling,
    "remat": section_remat,
    "unroll": section_unroll, "trees": section_trees, "gpu": section_gpu}


# ------------------------------------------------------------------ main

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
  args = ap.parse_args(argv)
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
    unknown = [c for c in args.cells if c not in _ALL]
    if unknown or not args.cells:
      ap.error(f"--cells: unknown {unknown or args.cells}; choose from "
               f"{','.join(_ALL)}")
    problem = _cells_unused(args.cells, sections)
    if problem:
      ap.error(f"--cells: {problem}")
  args.json = None if args.json == "-" else args.json
  paths = {}
  for flag, path in (("--out", args.out), ("--json", args.json)):
    if path not in (None, "-"):
      problem = _unwritable(Path(path))
      if problem:  # found now, not after the first group's minutes
        ap.error(f"{flag} {path}: {problem}")
      paths[flag] = Path(path).resolve()
  if len(paths) == 2 and paths["--out"] == paths["--json"]:
    ap.error(f"--json {args.json}: the same file as --out {args.out}; "
             f"give them different files")
  return args


# The sections that take --cells, and which of the cells each runs.
CELL_SECTIONS = {"cells": _ALL, "fused": specs.SPLIT}


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


def main(argv=None) -> int:
  args = parse_args(argv)
  try:
    return run_args(args, argv)
  except KeyboardInterrupt:  # before the first section: nothing to keep
    _note("interrupted (Ctrl-C) before the first section; nothing written")
    return 130


def run_args(args, argv=None) -> int:
  """The run of parsed `args`: 0, 1 if a contender failed or a report could
  not be written, 130 if interrupted (what finished is written)."""
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
  failed_writes, stopped, current, interrupted = set(), None, None, False

  def write(final):
    _write(out, rep, args, bench, load0, t0, final, failed_writes, stopped)

  try:
    for s in args.section_list:
      _note(f"[{time.perf_counter() - t0:7.1f}s] section {s} "
            f"(load {loadavg()})")
      n0, current = len(bench.groups), s
      RUNNERS[s](bench, rep)
      current = None
      write(final=False)
      if failed_writes:  # stop now, not after hours of unwritable results
        stopped = (f"stopped after section {s}: "
                   f"{' and '.join(sorted(failed_writes))} not written")
        break
  except KeyboardInterrupt:
    interrupted = True
  finally:
    with sigint_ignored():  # a second Ctrl-C must not cut the writing short
      bench.close(kill=interrupted)
  with sigint_ignored():
    if interrupted:
      stopped = "interrupted (Ctrl-C)" + (f" during section {current}"
                                          if current else "")
      if current and len(bench.groups) > n0:
        rep.add(unreported_text(bench.groups, n0, current))
    write(final=True)
  if stopped:
    kept = [f"{f} {p}" for f, p in (("--out", out), ("--json", args.json))
            if p is not None and f not in failed_writes]
    _note(f"{stopped}; what finished is in "
          f"{', '.join(kept) or 'no file (stdout only)'}")
  failed = errors(c for g in bench.groups for c in g.rooflines + g.contenders)
  if failed:  # the report lists them too; a script sees the exit status
    _note(f"{len(failed)} contender(s) failed (worker log: {log}):\n"
          + "\n".join(failed))
  return 130 if interrupted else 1 if failed or failed_writes else 0


@contextlib.contextmanager
def sigint_ignored():
  """Ctrl-C ignored meanwhile (a handler is the main thread's to set)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  before = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, before)


def unreported_text(groups: list["Group"], n0: int, section: str) -> str:
  """The groups from number n0 + 1 on, which an interrupted section timed
  but had not tabled yet: each contender's tokens/s and peak memory."""
  rows = [[str(i), c.label, f_rate(c), f_mb(c.peak_mb)]
          for i, g in enumerate(groups[n0:], n0 + 1) for c in g.contenders]
  return (f"### Groups of section {section} finished before the interrupt"
          f"\n\nNot yet in the section's tables (groups numbered as they "
          f"ran; their raw measurements are in the JSON, if asked for).\n\n"
          + table(["group", "contender", "tokens/s", "peak memory"], rows))


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
                     f"{_med(x['own'] for x in seen):.2f}"])
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
      out += _paired(a.rates, b.rates, _rounds_at(place, a, b))
  return out


def _by_place(groups, floor, pool, frac) -> str:
  """A target's value over the rounds run with the cores near and apart."""
  parts = []
  for kind, name in (("near", "cores near"), ("apart", "apart")):
    place = (kind, floor)
    if pool is not None:
      rs = pooled_rounds(groups, *pool[:2], place)
      v, n = (f_x(_med(rs)) if rs else "-"), len(rs)
    else:
      g, c = frac
      n = len(_rounds_at(place, c))
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
        near, apart = _med(at["near"]), _med(at["apart"])
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
      + ("" if error is None else f"; probing stopped: {error}"))
  if not rows:
    return text + "."
  return text + (". Contenders timed both near and apart (median "
                 "tokens/s; groups numbered as they ran):\n\n") + table(
      ["group", "contender", "rounds near / apart", "tokens/s near",
       "tokens/s apart", "apart vs near"], rows)


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
      path.write_text(content())
    except OSError as e:
      failed.add(flag)
      _note(f"{flag} {path}: not written ({e.strerror or e})")


if __name__ == "__main__":
  sys.exit(main())
