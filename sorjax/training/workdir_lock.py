"""One run per work directory at a time.

Two processes training into one work directory (a command started twice,
two reproduce invocations) each append to `metrics.jsonl` and rotate
`checkpoints/`, so their rows and steps interleave and every result is
counted twice, silently (QA, session 41). `held(workdir)` takes an
exclusive advisory lock on `WORKDIR/.lock` (flock: released when the
process ends, however it ends, so a killed run leaves no stale lock) for
as long as the run trains; the second process is refused at once, naming
the first. Where flock does not exist (not POSIX) nothing is locked.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket

from absl import logging

try:
  import fcntl
except ImportError:  # not POSIX
  fcntl = None

from sorjax.training.tasks.common import ConfigError

LOCK_NAME = ".lock"


class WorkdirInUse(ConfigError):
  """The work directory is being trained into by another process."""


@contextlib.contextmanager
def held(workdir: str):
  """Holds WORKDIR/.lock while the block runs; WorkdirInUse if another
  process holds it."""
  if fcntl is None:
    yield
    return
  path = os.path.join(workdir, LOCK_NAME)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
      raise WorkdirInUse(
          f"{workdir} is being trained into by another process "
          f"({holder or 'unknown'}): two runs in one work directory would "
          "interleave their metrics and checkpoints; wait for it to end, or "
          "give another --workdir") from None
    except OSError as e:     # no flock here (ENOLCK on some NFS mounts)
      logging.warning("%s cannot be locked (%s): runs into it are not "
                      "kept apart", path, e.strerror or e)
      yield
      return
    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                  f"{stamp}\n".encode(), 0)
    yield
  finally:
    os.close(fd)   # releases the lock
