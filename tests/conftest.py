"""Strict numerics for every test: silent broadcasting or dtype promotion
in an einsum becomes an error (as in Equinox's test configuration). One
compilation cache for the whole session; jax's in-memory caches cleared
after each test module."""

import gc
import importlib.metadata
import os
import shutil
import tempfile

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# Tests compile with LLVM's cheap settings (backend optimisation level 0,
# no expensive passes: jax's jax_disable_most_optimizations). XLA's HLO
# passes (fusion, layout, the loops small_loops reads) run as for users and
# matmuls call the same library kernels, so the programs the tests check
# compute as users' do; only the generated elementwise code is slower, and
# compiling, most of a tiny test's time, ~35% faster. The training runs tests
# start in subprocesses inherit it. JAX_DISABLE_MOST_OPTIMIZATIONS=0 tests
# fully optimised programs.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")


def _with_legacy_cpu_emitters(flags: str, jaxlib_version: str) -> str:
  """XLA_FLAGS with XLA:CPU's older loop emitters in place of its MLIR
  fusion emitters, for the jaxlib versions known to take the flag (XLA
  aborts on an unknown one), unless the flags already choose. Compiling
  then takes ~2.5x less time (a fused mm_lstm gradient: 2.0 -> 0.5 s; one
  eager op: ~53 -> ~31 ms). Two things change in XLA:CPU's backend:
  how a fusion's loop is emitted, and XLA then
  compiles a small while loop whole, within its own size limit (the "small
  call" sorjax.small_loops turns on for users). The tests of that rewrite
  and the host-memory probes run in subprocesses with XLA's defaults.
  XLA_FLAGS=--xla_cpu_use_fusion_emitters=true tests the default
  emitters."""
  if "xla_cpu_use_fusion_emitters" in flags:
    return flags
  major_minor = tuple(int(p) for p in jaxlib_version.split(".")[:2])
  if major_minor != (0, 10):
    return flags
  return f"{flags} --xla_cpu_use_fusion_emitters=false".strip()


# Before jax starts its CPU client (which reads XLA_FLAGS once); training
# runs in subprocesses inherit it.
_flags = _with_legacy_cpu_emitters(os.environ.get("XLA_FLAGS", ""),
                                   importlib.metadata.version("jaxlib"))
if _flags:
  os.environ["XLA_FLAGS"] = _flags

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


# The compilation cache this process made, removed at the session's end.
_owned_cache = None


def pytest_configure(config):
  """One persistent compilation cache per test session, unless the caller
  set JAX_COMPILATION_CACHE_DIR: both xdist workers and the training runs
  that tests start in subprocesses (which inherit the environment) compile
  many of the same programs, and on a CPU compiling is most of a small
  run's time (the suite: 18.5 -> 14.5 min). A hit is keyed by the
  program, its compile options and XLA_FLAGS, so it is what a compile
  would return."""
  global _owned_cache
  del config
  if "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return  # the caller's, or in an xdist worker the session's: jax read it
  _owned_cache = tempfile.mkdtemp(prefix="sorjax-test-xla-cache-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _owned_cache
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  # jax read its environment when imported above, before these were set.
  jax.config.update("jax_compilation_cache_dir", _owned_cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def pytest_unconfigure(config):
  del config
  if _owned_cache:
    shutil.rmtree(_owned_cache, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Frees the programs a test module compiled. jax keeps every program a
  jitted function compiles (its cache), and XLA:CPU maps each kernel's
  code, constants and data apart, so a worker's memory maps only grew:
  one reached 58k of the kernel's limit of 65530 (vm.max_map_count) by
  the test at which a CI worker crashed; with this, at most 17k. After
  jax.clear_caches a later compile of the same program loads it from the
  session's compilation cache."""
  yield
  jax.clear_caches()
  gc.collect()


SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                           "data")


@pytest.fixture(scope="session")
def shared_data():
  """Path to ../shared/data; skips the test when it is absent."""
  path = os.environ.get("SORJAX_DATA_DIR", SHARED_DATA)
  if not os.path.isdir(path):
    pytest.skip(f"real corpora not found at {os.path.abspath(path)} "
                "(set SORJAX_DATA_DIR)")
  return os.path.abspath(path)


# optax itself is not clean under strict dtype promotion (adam's bias
# correction mixes a Python float with an int32 count), so tests that run
# optimisers end to end use standard dtype promotion; rank promotion stays
# strict everywhere.
_OPTAX_DIRS = ("training", "experiments")


@pytest.fixture(autouse=True)
def _dtype_promotion_for_optax(request):
  parts = request.node.path.parts
  i = len(parts) - 1 - parts[::-1].index("tests") if "tests" in parts else -1
  if 0 <= i < len(parts) - 1 and parts[i + 1] in _OPTAX_DIRS:
    with jax.numpy_dtype_promotion("standard"):
      yield
  else:
    yield
