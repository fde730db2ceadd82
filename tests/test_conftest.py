"""The suite's own conftest: what one test module compiled is freed before
the next module runs (else a worker runs out of memory maps; conftest), and
the XLA flag it adds to make compiling cheaper."""

import os
import shutil
import subprocess
import sys
import textwrap


def test_programs_compiled_in_one_module_are_freed_before_the_next(tmp_path):
  shutil.copy(os.path.join(os.path.dirname(__file__), "conftest.py"),
              tmp_path / "conftest.py")
  (tmp_path / "helper.py").write_text(textwrap.dedent("""\
      import jax
      double = jax.jit(lambda x: 2 * x)
      """))
  (tmp_path / "test_a.py").write_text(textwrap.dedent("""\
      import helper
      def test_compiles():
        helper.double(1.0)
        assert helper.double._cache_size() == 1
      """))
  (tmp_path / "test_b.py").write_text(textwrap.dedent("""\
      import helper
      def test_starts_with_nothing_compiled():
        assert helper.double._cache_size() == 0
      """))
  res = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p",
       "no:cacheprovider", "test_a.py", "test_b.py"],
      cwd=tmp_path, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, PYTHONPATH=str(tmp_path)))
  assert res.returncode == 0, res.stdout + res.stderr
  assert "2 passed" in res.stdout


def test_legacy_cpu_emitters_are_added_for_jaxlib_0_10_only():
  from tests.conftest import _with_legacy_cpu_emitters as add
  off = "--xla_cpu_use_fusion_emitters=false"
  assert add("", "0.10.2") == off
  assert add("--xla_force_host_platform_device_count=4", "0.10.0") == (
      "--xla_force_host_platform_device_count=4 " + off)
  # the caller's choice stands; a jaxlib that may not know the flag (XLA
  # aborts on an unknown one) gets none
  on = "--xla_cpu_use_fusion_emitters=true"
  assert add(on, "0.10.2") == on
  assert add("", "0.11.0") == "" and add("", "0.9.1") == ""


def test_the_suite_runs_with_them():
  import importlib.metadata
  if importlib.metadata.version("jaxlib").startswith("0.10."):
    assert "--xla_cpu_use_fusion_emitters=" in os.environ["XLA_FLAGS"]
