"""The worker side of the driver <-> worker protocol (JSON lines).

A worker process serves one framework. The driver writes one request per
line on its stdin and reads one reply per line:

    {"cmd": "prepare", "id": "c3", "spec": {...}}
        -> {"ok": true, "step_s": 0.012, "peak_bytes": ..., ...}
    {"cmd": "time", "id": "c3", "n": 10}
        -> {"ok": true, "seconds": 0.118, "cpu_seconds": 0.230}
    {"cmd": "release", "id": "c3"}         -> {"ok": true}
    {"cmd": "quit"}

`prepare` builds the contender, compiles it and runs it twice (warm-up);
`time` runs n training steps back to back and returns the wall time. A
failure is a reply {"ok": false, "error": "..."}, never a dead worker.
Replies go to a private copy of the original stdout; fd 1 is pointed at
stderr so that a library printing to stdout cannot corrupt the protocol.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from typing import Callable, Protocol


class Case(Protocol):
  """A prepared contender."""
  info: dict   # extra facts for the driver (peak_bytes, measured_T, ...)

  def run(self, n: int) -> None:
    """n training steps, finished (synchronised) on return."""


def _channel():
  out = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)
  sys.stdout = sys.stderr
  return out


def serve(make_case: Callable[[dict], Case]) -> None:
  """Answers requests on stdin until EOF or "quit"."""
  out = _channel()
  cases: dict[str, Case] = {}

  def reply(**kw):
    out.write(json.dumps(kw) + "\n")
    out.flush()

  for line in sys.stdin:
    if not line.strip():
      continue
    msg = json.loads(line)
    cmd = msg.get("cmd")
    if cmd == "quit":
      break
    try:
      if cmd == "prepare":
        case = make_case(msg["spec"])
        case.run(1)                               # compile / first touch
        t0 = time.perf_counter()
        case.run(1)
        step_s = time.perf_counter() - t0
        cases[msg["id"]] = case
        reply(ok=True, step_s=step_s, **case.info)
      elif cmd == "time":
        case = cases[msg["id"]]
        t0, c0 = time.perf_counter(), time.process_time()
        case.run(int(msg["n"]))
        reply(ok=True, seconds=time.perf_counter() - t0,
              cpu_seconds=time.process_time() - c0)
      elif cmd == "release":
        cases.pop(msg["id"], None)
        gc.collect()
        reply(ok=True)
      elif cmd == "ping":
        reply(ok=True)
      else:
        reply(ok=False, error=f"unknown command {cmd!r}")
    except Exception as e:  # report, keep serving
      traceback.print_exc(file=sys.stderr)
      cases.pop(msg.get("id"), None)
      gc.collect()
      reply(ok=False, error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
