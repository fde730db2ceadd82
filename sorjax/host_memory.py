"""Keep XLA:CPU's freed host buffers in the process (glibc malloc settings).

XLA:CPU allocates each call's temporary buffer on its thread pool's
threads. glibc serves those threads from per-thread arenas, whose heaps
hold at most 64 MB, so a larger buffer is mmap'd and unmapped again on
every call: the next call page-faults it back in and the kernel zero-fills
it. For the LSTM layer at B=64 T=100 H=512 (forward + backward, a 105 MB
temp) that is 25.7k page faults and 44-65 ms of system time in a
~210 ms call (BUILD_NOTES, "Host memory").

`reuse_freed_memory()` sets glibc's malloc to one arena (the main heap,
which grows without the 64 MB limit), serves allocations below 1 GiB from
it and never trims it, so freed buffers are reused by the next call
(that LSTM step: 0 faults, 8-12% faster). The price is memory: the heap
keeps its peak, and small allocations placed in a freed buffer make the
next one grow it, until it holds a few temps (the LSTM step: RSS 517 ->
640 MB; a 128 MB temp alone: a 1.1 GB plateau within 100 calls). So it
is opt-in: `--host_malloc=reuse` in the experiment launchers and
`--host-malloc reuse` in the benchmarks. It must run before JAX creates
its CPU client (the first computation or `jax.devices()`): threads that
already have an arena keep it. It does nothing for buffers on a GPU/TPU.

The same settings for a process started from a shell:

    GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=2147483647
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys

# mallopt(3) parameters (malloc.h) and the values set.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = (1 << 31) - 1

TUNABLES = (f"glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold="
            f"{MMAP_THRESHOLD}:glibc.malloc.trim_threshold={TRIM_THRESHOLD}")


def _backend_started() -> bool:
  bridge = sys.modules.get("jax._src.xla_bridge")
  started = getattr(bridge, "backends_are_initialized", None)
  return bool(started and started())


def on_glibc() -> bool:
  """Whether this process runs on Linux with glibc (where the settings
  exist)."""
  return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def reuse_freed_memory() -> bool:
  """Applies the settings above; True if applied, False where the C library
  is not glibc (the call changes nothing there).

  Raises:
    RuntimeError: JAX's backend has already started, so its threads keep
      their arenas and the settings would not reach them.
  """
  if _backend_started():
    raise RuntimeError(
        "reuse_freed_memory() must run before JAX starts its backend (the "
        "first computation or jax.devices()); call it first in main()")
  if not on_glibc():
    return False
  libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
  for param, value, name in ((_M_ARENA_MAX, 1, "M_ARENA_MAX"),
                             (_M_MMAP_THRESHOLD, MMAP_THRESHOLD,
                              "M_MMAP_THRESHOLD"),
                             (_M_TRIM_THRESHOLD, TRIM_THRESHOLD,
                              "M_TRIM_THRESHOLD")):
    if libc.mallopt(param, value) != 1:
      raise OSError(f"glibc mallopt({name}, {value}) was refused")
  return True


MODES = ("default", "reuse")


def configure(mode: str, flag: str = "--host_malloc") -> bool:
  """The launchers' `--host_malloc`: "reuse" applies `reuse_freed_memory()`,
  "default" leaves malloc alone. True if the settings were applied."""
  if mode not in MODES:
    raise ValueError(f"{flag}={mode!r}: expected one of {', '.join(MODES)}")
  return mode == "reuse" and reuse_freed_memory()
