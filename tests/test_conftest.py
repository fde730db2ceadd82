"""The suite's own conftest: what one test module compiled is freed before
the next module runs (else a worker runs out of memory maps; conftest)."""

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
