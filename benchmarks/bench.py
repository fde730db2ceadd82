"""`Bench`: times groups of contenders in the framework workers.

A Bench owns a run's workers (jax, torch, the JAX worker that compiles
small loops whole, one JAX worker per CPU device count) and the probe of
the cores' placement. `Bench.group` prepares each contender beside the
roofline matmuls, times them in warm-up then timed rounds whose order
rotates, reads the other workers' CPU time and the core-to-core latency
around every timing, releases them, measures torch's peak memory in fresh
processes, and keeps the `Group` and its raw measurements.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from benchmarks import placement, specs
from benchmarks.contenders import (SMALL_LOOPS, Contender, host_devices_worker,
                                   matmuls)
from benchmarks.groups import Group
from benchmarks.profiles import Profile
from benchmarks.report import note
from benchmarks.workers import Worker, WorkerError, torch_memory


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

  def call(self, c: Contender, timeout: float, **msg) -> dict | None:
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
      rep = self.call(c, p.timeout_s, cmd="prepare", id=c.info["id"],
                       spec=c.spec)
      if rep is None:
        note(f"  ! {c.label}: {c.error}")
        continue
      c.info.update(rep)
      iters[c.info["id"]] = max(1, round(p.min_round_s
                                         / max(rep["step_s"], 1e-6)))
      live.append(c)
    note(f"  {', '.join(c.label for c in todo)}: prepared in "
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
        rep = self.call(c, p.timeout_s, cmd="time", id=c.info["id"], n=n)
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
      self.call(c, 60, cmd="release", id=c.info["id"])
    if self.args.torch_memory:
      for c in live:
        if c.framework == "torch" and c.spec["impl"] not in ("matmul",
                                                             "stepmm"):
          c.info["peak_bytes"] = torch_memory(c.spec, p.timeout_s)
    g = Group(mm, contenders)
    self.raw.append(g.as_json())
    self.groups.append(g)
    return g
