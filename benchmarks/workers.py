"""The framework worker processes the benchmark driver talks to.

`Worker` runs one framework's process (`python -m benchmarks.jax_worker` or
`benchmarks.torch_worker`, from the checkout at `ROOT`): it starts it on
first use, sends it JSON requests a line each and reads its answers,
restarts it if it died and kills it if it does not answer in time
(`WorkerError`), and reads its CPU time from /proc
(`proc_stat_cpu_seconds`). `torch_memory` measures a torch step's peak
memory in a fresh process; `host_malloc_env` is every worker's environment
for --host-malloc. Like the driver, this module imports neither jax nor
torch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path


# The checkout: the workers' working directory and first import path.
ROOT = Path(__file__).resolve().parent.parent


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
