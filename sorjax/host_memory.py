"""Cheaper large host buffers for XLA:CPU (glibc malloc settings).

XLA:CPU allocates each call's temporary buffer on its thread pool's
threads. glibc mmaps every allocation above its mmap threshold, which it
raises as such buffers are freed but never past 32 MB, and unmaps it again
on free: the next call page-faults it back in and the kernel zero-fills
it (measured: a 31 MB temp is reused from the second call on, a 48 MB one
faults in on every call). Raising the threshold alone does not help those
threads: their arenas' heaps hold at most 64 MB. For the LSTM layer at
B=64 T=100 H=512 (forward + backward, a 105 MB temp) that is 25.7k page
faults and 44-65 ms of system time in a ~210 ms call (BUILD_NOTES, "Host
memory").

`reuse_freed_memory()` sets glibc's malloc to one arena (the main heap,
which grows without that limit), serves allocations below 1 GiB from
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

`use_huge_pages()` costs no memory: glibc keeps mmap'ing and unmapping the
large buffers, but asks the kernel for transparent huge pages for them
(`glibc.malloc.hugetlb=1`, madvise(MADV_HUGEPAGE)), so a 2 MB page
faults in where 512 small ones did (that LSTM step: 29.6k -> 0.8-1.5k
faults a call and 1.00-1.20x faster, median 1.15x in five pairs of
processes, at the same RSS; mm_rnn at that shape 1.11x and 1.16x).
glibc reads this setting only when a process starts, so
`use_huge_pages()` restarts the process once (`os.execve` of its own
command line) with it in GLIBC_TUNABLES: the launchers' first act under
`--host_malloc=hugepages`. It needs the kernel's transparent huge pages
set to "madvise" or "always" (/sys/kernel/mm/transparent_hugepage/enabled).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import re
import sys

# mallopt(3) parameters (malloc.h) and the values set.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = (1 << 31) - 1

TUNABLES = (f"glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold="
            f"{MMAP_THRESHOLD}:glibc.malloc.trim_threshold={TRIM_THRESHOLD}")

HUGEPAGE_TUNABLES = "glibc.malloc.hugetlb=1"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
# Set in the restarted process, so that a restart that did not take effect
# raises instead of restarting again.
_RESTARTED = "SORJAX_HUGEPAGES_RESTARTED"


def backend_started() -> bool:
  """Whether JAX has created its backends (its CPU client and threads)."""
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
  if backend_started():
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


def kernel_thp(path: str = THP_SETTING) -> str | None:
  """The kernel's transparent-huge-page mode: "always", "madvise" or
  "never" (the bracketed word of `path`); None where it cannot be read."""
  try:
    with open(path) as f:
      m = re.search(r"\[(\w+)\]", f.read())
  except OSError:
    return None
  return m.group(1) if m else None


# glibc.malloc.hugetlb exists from glibc 2.35 on; older ones ignore it.
HUGETLB_GLIBC = (2, 35)


def glibc_version() -> tuple[int, ...] | None:
  """This process's glibc version, e.g. (2, 36); None if not glibc."""
  if not on_glibc():
    return None
  m = re.match(r"(\d+)\.(\d+)", platform.libc_ver()[1])
  return (int(m.group(1)), int(m.group(2))) if m else None


def why_not(mode: str) -> str | None:
  """Why `configure(mode)` cannot apply on this machine (None if it can):
  for the launchers' warning when it returns False."""
  if mode not in ("reuse", "hugepages"):
    return None
  if not on_glibc():
    return (f"the C library is {platform.libc_ver()[0] or 'unknown'} on "
            f"{sys.platform}, not glibc (whose malloc settings these are)")
  if mode == "reuse":
    return None
  version = glibc_version()
  if version is None or version < HUGETLB_GLIBC:
    return (f"glibc {platform.libc_ver()[1] or '(unknown version)'} predates "
            f"glibc.malloc.hugetlb (2.35)")
  thp = kernel_thp()
  if thp not in ("always", "madvise"):
    return (f"the kernel's transparent huge pages are "
            f"{thp or 'unknown'} ({THP_SETTING}; 'madvise' or 'always' "
            "needed)")
  return None


def huge_pages_possible() -> bool:
  """Whether `use_huge_pages()` can apply: glibc >= 2.35, and the kernel's
  transparent huge pages on ("madvise" or "always")."""
  return why_not("hugepages") is None


def _hugetlb_setting() -> str | None:
  """The value GLIBC_TUNABLES gives glibc.malloc.hugetlb (its last entry
  wins), None if it gives none."""
  value = None
  for entry in os.environ.get("GLIBC_TUNABLES", "").split(":"):
    name, _, v = entry.partition("=")
    if name == "glibc.malloc.hugetlb":
      value = v
  return value


def huge_pages_active() -> bool:
  """Whether this process started with glibc.malloc.hugetlb=1 as
  GLIBC_TUNABLES' last word on it (glibc reads it at start-up only)."""
  return _hugetlb_setting() == "1"


def _cannot_rerun() -> str | None:
  """Why re-executing this process's command line would not run the same
  program again (None if it would)."""
  if "ipykernel" in sys.modules:
    return "a Jupyter kernel"
  if hasattr(sys, "ps1") or sys.flags.interactive:
    return "an interactive interpreter"
  if not getattr(sys, "orig_argv", None):
    return "its command line is unknown (no sys.orig_argv)"
  if sys.argv[0] in ("", "-"):
    return "its program came from standard input"
  return None


def use_huge_pages() -> bool:
  """Large malloc'd buffers get transparent huge pages (module doc). True
  when they do: at once if the process started with `HUGEPAGE_TUNABLES`;
  otherwise the process restarts itself with it (`os.execve` of
  `sys.orig_argv`, the environment plus the tunable; this call does not
  return). False, changing nothing, where the C library is not glibc or the
  kernel's transparent huge pages are off or unknown.

  Raises:
    RuntimeError: the restarted process still lacks the tunable; or a
      restart would lose work or not rerun the program: JAX's backend has
      started (the program would run again from its start), or the
      process is a notebook kernel, an interactive interpreter or a
      program read from standard input.
    ValueError: GLIBC_TUNABLES already sets glibc.malloc.hugetlb to
      another value (the user's own setting is not replaced).
  """
  if not huge_pages_possible():
    return False
  if huge_pages_active():
    return True
  setting = _hugetlb_setting()
  if setting is not None:
    raise ValueError(
        f"use_huge_pages(): GLIBC_TUNABLES already sets glibc.malloc."
        f"hugetlb={setting} ({os.environ['GLIBC_TUNABLES']!r}); remove it "
        f"or set {HUGEPAGE_TUNABLES} there instead")
  if os.environ.get(_RESTARTED):
    raise RuntimeError(
        f"use_huge_pages(): restarted with GLIBC_TUNABLES={HUGEPAGE_TUNABLES}"
        f" but the process's environment lacks it")
  why = ("JAX's backend has started, so the restart would run the program "
         "again from its start" if backend_started() else _cannot_rerun())
  if why:
    raise RuntimeError(
        f"use_huge_pages() restarts the process, which cannot be done here: "
        f"{why}; start it with GLIBC_TUNABLES={HUGEPAGE_TUNABLES} instead "
        "(or call use_huge_pages() first in a script's main())")
  argv = sys.orig_argv
  tunables = os.environ.get("GLIBC_TUNABLES")
  env = dict(os.environ, **{_RESTARTED: "1", "GLIBC_TUNABLES": (
      f"{tunables}:{HUGEPAGE_TUNABLES}" if tunables else HUGEPAGE_TUNABLES)})
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, argv, env)


MODES = ("default", "reuse", "hugepages")

# What each mode does, for the launchers' log.
APPLIED = {"reuse": "freed host buffers are reused (one arena, no trimming)",
           "hugepages": "large host buffers get transparent huge pages "
                        f"({HUGEPAGE_TUNABLES})"}


def configure(mode: str, flag: str = "--host_malloc") -> bool:
  """The launchers' `--host_malloc`: "reuse" applies `reuse_freed_memory()`,
  "hugepages" `use_huge_pages()` (which may restart the process: call this
  first), "default" leaves malloc alone. True if the settings apply."""
  if mode not in MODES:
    raise ValueError(f"{flag}={mode!r}: expected one of {', '.join(MODES)}")
  if mode == "reuse":
    return reuse_freed_memory()
  return mode == "hugepages" and use_huge_pages()
