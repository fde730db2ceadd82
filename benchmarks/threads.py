"""Thread wake-ups between per-step products (issue 7: the LSTM at H = 256).

    python -m benchmarks.threads [--sections gap,torch,spinners]
        [--rounds 5] [--min-seconds 0.3] [--shape 32,100,256]

Two threads, wall clock; a ratio is the median of per-round ratios, the
contenders of a table alternating within each round. Sections:

- gap: T steps of XLA's per-step product h @ W ([B, H] x [H, 4H], which
  XLA splits over both threads), each followed by K elementwise passes over
  [B, H] of it. For small K XLA runs that fusion on one thread (its cost model
  splits an I/O-bound fusion from 512 KB accessed, a compute-bound one from
  200k cost units: parallel_task_assignment.cc); for large K it splits it.
  From a `jax.profiler` trace (which slows a step a little, so its times
  and the timed rounds' need not add up): the product's own time per step
  and, within it, the main thread's wait for the other thread's half
  (`SlinkyThreadPool::Await`).
- torch: torch.nn.LSTM forward + backward at the shape, in one process per
  OpenMP wait policy (OMP_WAIT_POLICY unset, ACTIVE, PASSIVE): whether its
  threads busy-wait between parallel regions or sleep.
- spinners: sorjax's LSTM step (forward + backward) at the shape and at the
  Dyck shape B=10 T=200 H=12, alone and with one busy-looping process per
  core at SCHED_IDLE priority (which yields to any other thread at once, so
  a core is never idle and never halts). Linux only.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import sorjax
from benchmarks import flags
from benchmarks.small_model import (SHAPE, Case, chosen_sections, ratio,
                                     rounds, shape_arg, table, unused_flags)

SECTIONS = ("gap", "torch", "spinners")
GAPS = (0, 1, 2, 3, 4, 8)
POLICIES = (None, "ACTIVE", "PASSIVE")


def wall_case(label, fn, *args):
  """`small_model.Case` of fn at args, timed by wall clock (two threads)."""
  return Case(label, fn, args, clock=time.perf_counter)


def gap_step(B, T, H, K):
  """h_t = g_K(h_{t-1} W)[:, :H] / 2, where g_K is K passes
  z <- tanh(0.9 z + x_t) (XLA computes them on the H columns kept);
  barriers keep them out of the product's YNN fusion, which would take
  them as its epilogue."""
  kh, kw = jax.random.split(jax.random.key(0))
  h0 = jax.random.normal(kh, (B, H), jnp.float32)
  W = jax.random.normal(kw, (H, 4 * H), jnp.float32) / H ** 0.5
  xs = jax.random.normal(kh, (T, B, 4 * H), jnp.float32)

  def fn(h0, W, xs):
    def body(h, x):
      z = jax.lax.optimization_barrier(h @ W)
      for _ in range(K):
        z = jax.lax.optimization_barrier(jnp.tanh(0.9 * z + x))
      return 0.5 * z[:, :H], None
    return jax.lax.scan(body, h0, xs)[0]
  return wall_case(f"K={K}", fn, h0, W, xs)


def thunk_us(case, T, calls=5):
  """Microseconds per loop step of every event in a trace of `calls` calls
  (a thunk of the loop body runs once per step; the main thread's waits
  for the other thread, `SlinkyThreadPool::Await`, only when it is behind)."""
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      for _ in range(calls):
        jax.block_until_ready(case.compiled(*case.args))
    path = next(Path(d).rglob("*.trace.json.gz"))
    events = json.load(gzip.open(path))["traceEvents"]
  total = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and "dur" in e:
      total[e["name"]] += e["dur"]
  return {k: total[k] / (T * calls) for k in total}


def loop_fusions(case):
  """(products, split loop fusions, loop fusions) of the compiled module:
  names of the dots / YNN fusions, of the loop fusions, and of those XLA
  split over threads. (Outside the loop they run once a call, so their
  time per step is negligible in `thunk_us`.)"""
  text = case.compiled.as_text()
  products, split, loops = [], [], []
  for line in text.splitlines():
    m = re.match(r"\s*(?:ROOT )?%([\w.-]+) = .*?fusion\(", line)
    if not m:
      m = re.match(r"\s*(?:ROOT )?%([\w.-]+) = \S+ dot\(", line)
      if m:
        products.append(m.group(1))
      continue
    if "kind=kCustom" in line:
      products.append(m.group(1))
    elif "kind=kLoop" in line:
      loops.append(m.group(1))
      if '"outer_dimension_partitions":["' in line:
        split.append(m.group(1))
  return products, split, loops


def section_gap(args):
  B, T, H = args.shape
  cases = [gap_step(B, T, H, K) for K in args.gaps]
  ts = rounds(cases, args.rounds, args.min_seconds)
  rows = []
  for c in cases:
    us = thunk_us(c, T)
    products, split, loops = loop_fusions(c)
    step = 1e6 * statistics.median(ts[c.label]) / T
    gap = sum(us.get(n, 0.0) for n in loops if n in split or us.get(n, 0) > 1)
    prod = max((us[p] for p in products if p in us), default=None)
    wait = us.get("SlinkyThreadPool::Await", 0.0)
    rows.append([c.label, f"{step:.1f}", f"{gap:.1f}", f"{step - gap:.1f}",
                 "-" if prod is None else f"{prod:.1f}", f"{wait:.1f}",
                 "both" if split else "one"])
  print(f"## XLA's per-step product [{B}, {H}] x [{H}, {4 * H}] after K "
        "elementwise passes over [B, H]\n")
  print(table(["K", "us per step", "gap us", "step - gap us",
               "product us (trace)", "of which waiting for the other thread",
               "gap fusion runs on"], rows) + "\n")
  print("'us per step' is timed; the rest comes from a profiler trace. "
        "'step - gap' is what the product and the loop cost per step.\n")


TORCH_CHILD = """
import json, sys, time, torch
B, T, H, n_rounds, min_s = map(float, sys.argv[1:6])
B, T, H, n_rounds = int(B), int(T), int(H), int(n_rounds)
torch.manual_seed(0)
m = torch.nn.LSTM(H, H, batch_first=True)
x, g = torch.randn(B, T, H), torch.randn(B, T, H)
def step():
  m.zero_grad(); y, _ = m(x); y.backward(g)
for _ in range(3): step()
out = []
for _ in range(n_rounds):
  t0, n = time.perf_counter(), 0
  while n == 0 or time.perf_counter() - t0 < min_s: step(); n += 1
  out.append((time.perf_counter() - t0) / n)
print(json.dumps({"threads": torch.get_num_threads(), "step_s": out}))
"""


def torch_round(policy, args):
  env = dict(os.environ)
  env.pop("OMP_WAIT_POLICY", None)
  if policy:
    env["OMP_WAIT_POLICY"] = policy
  B, T, H = args.shape
  res = subprocess.run(
      [sys.executable, "-c", TORCH_CHILD, str(B), str(T), str(H), "1",
       str(args.min_seconds)], env=env, capture_output=True, text=True,
      timeout=600)
  if res.returncode:
    raise RuntimeError(f"torch child (OMP_WAIT_POLICY={policy}) failed:\n"
                       f"{res.stderr[-2000:]}")
  return json.loads(res.stdout.strip().splitlines()[-1])


def section_torch(args):
  try:
    import torch  # noqa: F401
  except ImportError:
    print("## torch.nn.LSTM by OpenMP wait policy\n\nskipped: torch not "
          "installed (pip install -e '.[bench]')\n")
    return
  B, T, H = args.shape
  ts = {p: [] for p in POLICIES}
  threads = None
  for r in range(args.rounds):  # one process per timing, policies rotating
    k = r % len(POLICIES)
    for p in POLICIES[k:] + POLICIES[:k]:
      rep = torch_round(p, args)
      threads = rep["threads"]
      ts[p].append(rep["step_s"][0])
  rows = [[p or "unset (libgomp's default)", f"{B * T / statistics.median(ts[p]):,.0f}",
           f"{ratio(ts, None, p):.2f}x"] for p in POLICIES]
  print(f"## torch.nn.LSTM (B={B} T={T} H={H}, {threads} threads) by OpenMP "
        "wait policy, one process per timing\n")
  print(table(["OMP_WAIT_POLICY", "tokens/s", "speed vs unset"], rows) + "\n")


def lstm_step(B, T, H):
  cell = sorjax.cells.make("lstm", hidden_size=H)
  params = cell.init(jax.random.key(0), input_size=H)
  xs = jax.random.normal(jax.random.key(1), (B, T, H), jnp.float32)
  G = jax.random.normal(jax.random.key(2), (B, T, H), jnp.float32)

  def fn(params, xs, G):
    _, pull = jax.vjp(lambda p: sorjax.unroll(cell, p, xs)[1], params)
    return pull(G)[0]
  return wall_case(f"sorjax lstm B={B} T={T} H={H}", fn, params, xs, G)


class Spinners:
  """One busy-looping process per core at SCHED_IDLE priority."""

  CODE = ("import os\nos.sched_setscheduler(0, os.SCHED_IDLE, "
          "os.sched_param(0))\nprint('up', flush=True)\nwhile True:\n  pass\n")

  def __init__(self, n):
    self.procs = [subprocess.Popen([sys.executable, "-c", self.CODE],
                                   stdout=subprocess.PIPE, text=True)
                  for _ in range(n)]
    for p in self.procs:
      if p.stdout.readline().strip() != "up":
        self.close()
        raise RuntimeError("a SCHED_IDLE spinner process failed to start")

  def close(self):
    for p in self.procs:
      p.kill()
      p.wait()


class WithSpinners:
  """Times `case` with the spinners running (started and stopped around
  each timing, so rounds alternate with and without)."""

  def __init__(self, case, n):
    self.case, self.n = case, n
    self.label = case.label + " + spinners"

  def time(self, n):
    s = Spinners(self.n)
    try:
      return self.case.time(n)
    finally:
      s.close()


def section_spinners(args):
  if not hasattr(os, "SCHED_IDLE"):
    print("## Idle cores\n\nskipped: SCHED_IDLE needs Linux\n")
    return
  n = len(os.sched_getaffinity(0))
  rows = []
  for shape in (args.shape, args.dyck_shape):
    plain = lstm_step(*shape)
    spun = WithSpinners(plain, n)
    ts = rounds([plain, spun], args.rounds, args.min_seconds)
    B, T, _ = shape
    rows.append([plain.label,
                 f"{B * T / statistics.median(ts[plain.label]):,.0f}",
                 f"{B * T / statistics.median(ts[spun.label]):,.0f}",
                 f"{ratio(ts, plain.label, spun.label):.2f}x"])
  print(f"## sorjax's LSTM step alone and beside {n} SCHED_IDLE spinners\n")
  print(table(["step (fwd + bwd)", "tokens/s alone", "tokens/s with "
               "spinners", "speed with / alone"], rows) + "\n")


def main(argv=None):
  ap = argparse.ArgumentParser(prog="python -m benchmarks.threads",
                               description=__doc__.split("\n")[0])
  ap.add_argument("--sections", default=",".join(SECTIONS))
  ap.add_argument("--rounds", type=flags.at_least(1), default=5)
  ap.add_argument("--min-seconds", default=0.3,
                  type=flags.number(">= 0", lambda v: v >= 0))
  ap.add_argument("--shape", default="32,100,256", help="B,T,H (D = H)")
  ap.add_argument("--dyck-shape", default=None,
                  help="B,T,H of the spinners section's second step "
                  f"(default {','.join(map(str, SHAPE))})")
  ap.add_argument("--gaps", default=None,
                  help="the gap section's K values (default "
                  + ",".join(map(str, GAPS)) + ")")
  args = ap.parse_args(argv)
  chosen = chosen_sections(ap, args.sections, SECTIONS)
  unused_flags(ap, chosen, {"--dyck-shape": args.dyck_shape,
                            "--gaps": args.gaps},
               {"--dyck-shape": ("spinners",), "--gaps": ("gap",)})
  args.shape = shape_arg(ap, "--shape", args.shape)
  args.dyck_shape = (SHAPE if args.dyck_shape is None else
                    shape_arg(ap, "--dyck-shape", args.dyck_shape))
  if args.gaps is None:
    args.gaps = ",".join(map(str, GAPS))
  try:
    gaps = [int(k) for k in args.gaps.split(",")]
  except ValueError:
    gaps = []
  if gaps and min(gaps) >= 0:
    args.gaps = gaps
  else:
    ap.error(f"--gaps: want non-negative ints joined by ',', got "
             f"{args.gaps!r}")
  print(f"# Thread wake-ups: {time.strftime('%Y-%m-%d %H:%M')}, load "
        f"{os.getloadavg()[0]:.2f}, {len(os.sched_getaffinity(0))} cores, "
        f"jax {jax.__version__}\n")
  for s in chosen:
    globals()[f"section_{s}"](args)


if __name__ == "__main__":
  main()
