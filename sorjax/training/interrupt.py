"""Stopping a run at a step boundary: within `deferred()` the first SIGINT
(Ctrl-C) or SIGTERM (a scheduler's preemption) only records the signal;
the loop looks after every step, saves a checkpoint of that step and
raises `Interrupted`. A second signal acts at once, as before."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

from absl import logging

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
  """Raised by the loop once the interrupted step is saved."""

  def __init__(self, signum: int, message: str):
    super().__init__(message)
    self.signum = signum

  @property
  def exit_code(self) -> int:  # the shell's 128 + signal number
    return 128 + self.signum

  def exit(self):
    """What a launcher does with it: the message logged, no traceback (the
    step is saved), and the shell's exit status for the signal."""
    logging.warning("%s", self)
    sys.exit(self.exit_code)


@contextlib.contextmanager
def deferred():
  """Yields the list of signals received while inside (empty until one
  comes). Outside the main thread, where Python delivers no signal, it
  changes nothing. A signal the process ignores stays ignored: a run
  started with `&` by a shell without job control (a script, a subshell)
  has SIGINT ignored so that Ctrl-C in that terminal leaves it alone, and
  it still does."""
  got: list[int] = []
  if threading.current_thread() is not threading.main_thread():
    yield got
    return
  old = {s: h for s in SIGNALS
         if (h := signal.getsignal(s)) is not signal.SIG_IGN}

  def record(signum, frame):
    got.append(signum)
    signal.signal(signum, old[signum])  # the next one acts as usual

  for s in old:
    signal.signal(s, record)
  try:
    yield got
  finally:
    for s, h in old.items():
      signal.signal(s, h)
