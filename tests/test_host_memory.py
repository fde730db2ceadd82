"""sorjax.host_memory: a CPU step whose XLA temporaries exceed glibc's 32 MB
mmap threshold page-faults them in on every call; with freed host buffers
reused it stops, and with transparent huge pages it takes 512x fewer
faults. Each case runs in a fresh process (the settings must precede JAX's
CPU client; huge pages restart the process)."""

import json
import os
import subprocess
import sys

import pytest

from sorjax import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
glibc_only = pytest.mark.skipif(
    not host_memory.on_glibc(),
    reason="glibc malloc settings (Linux with glibc only)")
THP = host_memory.kernel_thp()
thp_only = pytest.mark.skipif(
    not host_memory.huge_pages_possible(),
    reason=f"needs glibc and the kernel's transparent huge pages on "
           f"(madvise or always; {host_memory.THP_SETTING}: {THP})")

# A jitted step with a 128 MB temporary (tanh of the [8192, 4096] product,
# read by a second product); prints the temp size and the median minor page
# faults of 30 calls after five warm-ups. With reuse the heap still grows
# now and then, until it holds a few temps (small allocations land in a
# freed one): in 16 probes of 40 calls, 0-4 calls after the first faulted
# their temp in, as late as the 27th. The median skips those; over the nine
# calls this probe used to take, five such calls failed it once in CI.
_PROBE = """
import json, os, resource, sys
from sorjax import host_memory
applied = host_memory.configure(sys.argv[1])  # hugepages: restarts once
import jax, jax.numpy as jnp
f = jax.jit(lambda a, b: jnp.tanh(a @ b).T @ a)
a, b = jnp.ones((8192, 64)), jnp.ones((64, 4096))
temp = f.lower(a, b).compile().memory_analysis().temp_size_in_bytes
faults = []
for i in range(35):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  f(a, b).block_until_ready()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "temp": temp,
                  "faults": sorted(faults[5:])[15],
                  "tunables": os.environ.get("GLIBC_TUNABLES")}))
"""


def _probe(mode, tunables=None):
  # jax's and XLA's defaults, as a user's run has them: the suite's cheap
  # compile settings (tests/conftest.py) made the probe's tanh loop ~2x
  # slower to run
  env = {k: v for k, v in os.environ.items()
         if k not in ("XLA_FLAGS", "JAX_DISABLE_MOST_OPTIMIZATIONS")}
  env["JAX_PLATFORMS"] = "cpu"
  env.pop("GLIBC_TUNABLES", None)
  if tunables:
    env["GLIBC_TUNABLES"] = tunables
  out = subprocess.run([sys.executable, "-c", _PROBE, mode], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  return json.loads(out.stdout.strip().splitlines()[-1])


@glibc_only
def test_reuse_stops_the_page_faults_of_a_large_temporary():
  plain, reuse = _probe("default"), _probe("reuse")
  pages = plain["temp"] / 4096
  assert plain["temp"] >= 128 << 20
  assert not plain["applied"] and reuse["applied"]
  if THP != "always":  # else the kernel maps plain's buffers in 2 MB pages
    assert plain["faults"] > 0.9 * pages    # unmapped and faulted every call
  assert reuse["faults"] < 0.01 * pages     # kept in the process


@thp_only
def test_huge_pages_fault_a_large_temporary_in_2mb_pages():
  huge = _probe("hugepages")
  pages = huge["temp"] / 4096
  assert huge["applied"]
  assert huge["tunables"] == host_memory.HUGEPAGE_TUNABLES  # the restart's
  assert huge["faults"] < 0.05 * pages      # ~1/512 of the pages, + small


def test_kernel_thp_reads_the_bracketed_mode(tmp_path):
  f = tmp_path / "enabled"
  f.write_text("always [madvise] never\n")
  assert host_memory.kernel_thp(str(f)) == "madvise"
  assert host_memory.kernel_thp(str(tmp_path / "missing")) is None


def test_huge_pages_without_kernel_support_change_nothing(monkeypatch):
  monkeypatch.setattr(host_memory, "kernel_thp", lambda: "never")
  monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
  assert host_memory.use_huge_pages() is False
  assert host_memory.configure("hugepages") is False


def test_a_restart_without_the_tunable_raises(monkeypatch):
  # The restarted process must see the tunable; if it does not (something
  # between stripped it), it raises rather than restarting again.
  monkeypatch.setattr(host_memory, "on_glibc", lambda: True)
  monkeypatch.setattr(host_memory, "kernel_thp", lambda: "madvise")
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
  monkeypatch.setenv(host_memory._RESTARTED, "1")
  with pytest.raises(RuntimeError, match="restarted with GLIBC_TUNABLES"):
    host_memory.use_huge_pages()


def test_an_active_tunable_needs_no_restart(monkeypatch):
  monkeypatch.setattr(host_memory, "on_glibc", lambda: True)
  monkeypatch.setattr(host_memory, "kernel_thp", lambda: "always")
  monkeypatch.setenv("GLIBC_TUNABLES",
                     f"glibc.malloc.arena_max=2:{host_memory.HUGEPAGE_TUNABLES}")
  monkeypatch.setattr(host_memory.os, "execve", None)  # must not be called
  assert host_memory.use_huge_pages() is True


def test_after_the_backend_started_it_refuses():
  code = ("import jax; jax.devices()\n"
          "from sorjax import host_memory\n"
          "host_memory.reuse_freed_memory()\n")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode != 0
  assert "must run before JAX starts its backend" in out.stderr


def test_unknown_mode_names_the_flag():
  with pytest.raises(ValueError,
                     match=r"--host_malloc='fast'.*default, reuse, hugepages"):
    host_memory.configure("fast")


def test_default_mode_changes_nothing():
  assert host_memory.configure("default") is False


def test_not_glibc_is_a_no_op(monkeypatch):
  monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("musl", ""))
  monkeypatch.setattr(host_memory, "backend_started", lambda: False)
  assert host_memory.reuse_freed_memory() is False


@glibc_only
def test_the_tunables_for_a_shell_do_the_same():
  # What the docstring gives for a shell and `benchmarks.run --host-malloc
  # reuse` gives every worker.
  probe = _probe("default", tunables=host_memory.TUNABLES)
  assert probe["faults"] < 0.01 * probe["temp"] / 4096


@pytest.mark.parametrize("launcher", ["main", "reproduce"])
def test_launchers_offer_the_modes(launcher):
  out = subprocess.run([sys.executable, "-m", f"experiments.{launcher}",
                        "--helpfull"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
  assert f"--host_malloc: <{'|'.join(host_memory.MODES)}>" in out.stdout


# --------------------------------------------- restarts that would lose work
@pytest.fixture
def possible(monkeypatch):
  """Huge pages possible, no tunable set, and no restart may happen."""
  monkeypatch.setattr(host_memory, "on_glibc", lambda: True)
  monkeypatch.setattr(host_memory, "glibc_version", lambda: (2, 36))
  monkeypatch.setattr(host_memory, "kernel_thp", lambda: "madvise")
  monkeypatch.setattr(host_memory, "backend_started", lambda: False)
  monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
  monkeypatch.delenv(host_memory._RESTARTED, raising=False)

  def execve(*args):
    raise AssertionError(f"os.execve{args} was called")
  monkeypatch.setattr(host_memory.os, "execve", execve)
  return monkeypatch


@pytest.mark.parametrize("where, how, why", [
    ("backend", lambda m: m.setattr(host_memory, "backend_started",
                                    lambda: True),
     "JAX's backend has started, so the restart would run the program "
     "again from its start"),
    ("stdin", lambda m: m.setattr(sys, "argv", ["-"]),
     "its program came from standard input"),
    ("repl", lambda m: m.setattr(sys, "ps1", ">>> ", raising=False),
     "an interactive interpreter"),
    ("jupyter", lambda m: m.setitem(sys.modules, "ipykernel", sys),
     "a Jupyter kernel")])
def test_a_restart_that_would_lose_work_is_refused(possible, where, how, why):
  # `python - < script` reran an empty stdin and exited 0, a REPL lost its
  # session, a call after the backend ran the script twice (QA, session 41)
  how(possible)
  with pytest.raises(RuntimeError, match=rf"cannot be done here: {why}; "
                     rf"start it with GLIBC_TUNABLES=glibc.malloc.hugetlb=1"):
    host_memory.use_huge_pages()


@pytest.mark.parametrize("tunables", ["glibc.malloc.hugetlb=0",
                                      "glibc.malloc.hugetlb=1:"
                                      "glibc.malloc.hugetlb=0",
                                      "glibc.malloc.hugetlb=2"])
def test_the_users_own_hugetlb_setting_is_not_replaced(possible, tunables):
  # the last entry wins: "=1:=0" had read as active (QA, session 41)
  possible.setenv("GLIBC_TUNABLES", tunables)
  assert not host_memory.huge_pages_active()
  with pytest.raises(ValueError, match=r"GLIBC_TUNABLES already sets glibc"
                     rf"\.malloc\.hugetlb={tunables[-1]}"):
    host_memory.use_huge_pages()


def test_why_not_names_the_missing_support(monkeypatch):
  monkeypatch.setattr(host_memory, "kernel_thp", lambda: "never")
  if host_memory.on_glibc():
    assert "transparent huge pages are never" in (
        host_memory.why_not("hugepages") or "glibc.malloc.hugetlb (2.35)")
    assert host_memory.why_not("reuse") is None
  monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("", ""))
  for mode in ("reuse", "hugepages"):
    assert "not glibc" in host_memory.why_not(mode)
  monkeypatch.setattr(host_memory.platform, "libc_ver",
                      lambda: ("glibc", "2.31"))
  monkeypatch.setattr(host_memory, "on_glibc", lambda: True)
  assert host_memory.why_not("hugepages") == (
      "glibc 2.31 predates glibc.malloc.hugetlb (2.35)")


def test_the_launcher_warns_when_a_mode_cannot_apply(monkeypatch):
  from absl import logging
  from experiments import train
  monkeypatch.setattr(host_memory, "configure", lambda mode: False)
  monkeypatch.setattr(host_memory, "why_not", lambda mode: "a reason")
  said = []
  monkeypatch.setattr(logging, "warning", lambda *a: said.append(a[0] % a[1:]))
  train.prepare_process("hugepages")
  assert said == ["--host_malloc=hugepages is not applied: a reason"]
