"""benchmarks.compile_time: a one-setting smoke run, its arguments, and
that its last setting is the suite's (tests/conftest.py)."""

import importlib.metadata

import pytest

from benchmarks import compile_time
from tests.conftest import _with_legacy_cpu_emitters


def test_one_setting_prints_its_times_against_itself(monkeypatch, capsys):
  name, env = list(compile_time.SETTINGS.items())[-1]  # the quickest
  monkeypatch.setattr(compile_time, "SETTINGS", {name: env})
  assert compile_time.main(["--repeats", "1"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == ("| setting | fused gradient | autodiff gradient | "
                      "eager op |")
  cells = lines[2].split("|")[2:-1]
  assert lines[2].startswith(f"| {name} |") and len(cells) == 3
  for cell in cells:  # "1234 ms (1.0x)": each against itself
    ms, ratio = cell.split()[0], cell.split()[-1]
    assert float(ms) > 0 and ratio == "(1.0x)"


def test_bad_repeats_are_named(capsys):
  with pytest.raises(SystemExit):
    compile_time.main(["--repeats", "0"])
  assert "--repeats must be >= 1, got 0" in capsys.readouterr().err


def test_the_last_setting_is_the_suites():
  env = list(compile_time.SETTINGS.values())[-1]
  assert env["JAX_DISABLE_MOST_OPTIMIZATIONS"] == "1"
  version = importlib.metadata.version("jaxlib")
  assert env["XLA_FLAGS"] == _with_legacy_cpu_emitters("", "0.10.2")
  if version.startswith("0.10."):
    assert env["XLA_FLAGS"] == _with_legacy_cpu_emitters("", version)
