"""The launcher's own checks of its path flags, and a signal's exit: run as
the absl binary (`python -m experiments.main`)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

# experiments.main defines absl flags (experiments.reproduce too): its
# argv checks live in experiments.train, importable beside both.
from experiments import train as launcher

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "tests", "experiments", "tiny_dyck.py")
# tiny_dyck with train.max_steps settable: the runs below train one step
TINY = os.path.join(ROOT, "tests", "experiments",
                    "tiny_dyck_overridable.py")
LIN = os.path.join(ROOT, "experiments", "configs", "lin_dyck.py")
# The training runs' model, given on the command line: tiny_dyck's mrnn
# made an lstm by unsetting an int field (None), rematerialised with
# "dots". The SIGINT run trains the same programs, so the one of the two
# that runs second reads them from the session's compilation cache.
LSTM_DOTS = ["--config.model.cell=lstm",
             "--config.model.intermediate_size=None",
             "--config.model.remat=dots"]

# one worker runs the module: `lstm_dots_run` once, after the SIGINT run
pytestmark = pytest.mark.xdist_group("experiments.test_main")


def argv(config, workdir):
  return ["main", f"--config={config}", f"--workdir={workdir}"]


def run_main(*args, timeout=300):
  return subprocess.run([sys.executable, "-m", "experiments.main", *args],
                        cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout)


@pytest.fixture(scope="session")
def lstm_dots_run(tmp_path_factory):
  """One step of `LSTM_DOTS` through the binary: (result, the run's
  config.json)."""
  workdir = tmp_path_factory.mktemp("lstm_dots")
  res = run_main(*argv(TINY, workdir)[1:], *LSTM_DOTS,
                 "--config.train.max_steps=1")
  assert res.returncode == 0, res.stderr[-2000:]
  with open(workdir / "config.json", encoding="utf-8") as f:
    return res, json.load(f)


def test_bad_config_file_variant_and_workdir_are_named(tmp_path):
  """A missing file used to surface later as a traceback ending in
  ml_collections' 'Configuration is not available'; a variant given to a
  config without one as get_config's TypeError; a workdir that is a file
  as os.makedirs' FileExistsError."""
  missing = str(tmp_path / "nope.py")
  assert launcher.bad_path(argv(missing, tmp_path)) == (
      f"flag --config={missing}: no such file {missing!r}")
  assert launcher.bad_path(argv(CONFIG + ":x", tmp_path)) == (
      f"flag --config={CONFIG}:x: tiny_dyck.py takes no variant (after "
      f"':'); give --config={CONFIG}")
  msg = launcher.bad_path(argv(LIN + ":bogus", tmp_path))
  assert msg.startswith(f"flag --config={LIN}:bogus: lin_dyck.py:'bogus': "
                        "model must be one of lstm, attention, assignment")
  afile = tmp_path / "afile"
  afile.write_text("")
  assert launcher.bad_path(argv(CONFIG, afile)) == (
      f"flag --workdir={afile}: {afile} is a file, not a directory")
  # a file further up (os.makedirs' NotADirectoryError), and an empty flag
  # (os.makedirs('')'s FileNotFoundError)
  assert launcher.bad_path(argv(CONFIG, afile / "sub" / "run")) == (
      f"flag --workdir={afile / 'sub' / 'run'}: {afile} is a file, not a "
      f"directory")
  assert launcher.bad_path(argv(CONFIG, "")) == "flag --workdir=: empty"
  for good in (argv(CONFIG, tmp_path / "new"), argv(LIN + ":lstm,m4", tmp_path),
               ["main"]):
    assert launcher.bad_path(good) is None
  res = subprocess.run([sys.executable, "-m", "experiments.main",
                        *argv(missing, tmp_path)[1:]], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert res.returncode == 1
  assert res.stderr.startswith(f"FATAL Flags parsing error: flag "
                               f"--config={missing}: no such file")


# experiments.main with SIGINT handled as in a terminal's process: pytest
# started in the background (`make test &` from a script) passes SIGINT on
# ignored, and the training loop rightly leaves an ignored signal ignored.
# (A preexec_fn would fork this multithreaded process.)
TERMINAL_MAIN = ("import runpy, signal\n"
                 "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
                 "runpy.run_module('experiments.main', run_name='__main__',"
                 " alter_sys=True)")


def test_sigint_saves_the_step_and_exits_130_without_a_traceback(tmp_path):
  workdir = tmp_path / "run"
  proc = subprocess.Popen(
      [sys.executable, "-c", TERMINAL_MAIN, *argv(TINY, workdir)[1:],
       *LSTM_DOTS, "--config.train.num_epochs=100000",
       "--config.train.log_every=1",
       "--config.train.checkpoint_every=100000"],
      cwd=ROOT, stderr=subprocess.PIPE, text=True)
  metrics = workdir / "metrics.jsonl"
  deadline = time.time() + 240
  while not (metrics.exists() and metrics.stat().st_size) and \
      time.time() < deadline and proc.poll() is None:
    time.sleep(0.2)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err[-2000:]
  assert "Traceback" not in err
  saved = [l for l in err.splitlines() if "SIGINT at step" in l]
  assert saved and "the same command resumes the run" in saved[0]
  step = int(saved[0].split("SIGINT at step ")[1].split(":")[0])
  assert max(map(int, os.listdir(workdir / "checkpoints"))) == step


def test_a_write_error_exits_with_its_message_without_a_traceback(tmp_path):
  """A full disk stops training with a WriteError naming the file and
  what is kept (here raised by a stand-in for the training): the binary
  exits with that message, as with a config error, not a traceback."""
  code = (
      "import runpy, sys\n"
      "from experiments import train\n"
      "from sorjax.checks import WriteError\n"
      "def full(*a):\n"
      "  raise WriteError('cannot append to X/metrics.jsonl: No space left "
      "on device')\n"
      "train.train_and_evaluate = full\n"
      f"sys.argv = {argv(CONFIG, tmp_path / 'run')!r}\n"
      "runpy.run_module('experiments.main', run_name='__main__')\n")
  res = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 1, res.stderr[-2000:]
  assert "Traceback" not in res.stderr
  assert res.stderr.splitlines()[-1] == (
      "write error: cannot append to X/metrics.jsonl: No space left on "
      "device")


def test_none_and_literal_overrides_are_taken_out_and_the_last_flag_wins():
  argv = ["main", "--config=c.py", "--config.model.intermediate_size=None",
          "--config.seed=None", "--config.seed=3", "--config.a[0]=None",
          "--workdir=None", "--config.model.timescales=('inverse_gamma', 0.5)",
          "--config.model.num_matrices=3",
          "--config.model.locked_dropout=('output',)"]
  kept, literal = launcher.literal_overrides(argv)
  assert kept == ["main", "--config=c.py", "--config.seed=3",
                  "--workdir=None"]
  assert [(p, v) for _, p, v in literal] == [
      ("model.intermediate_size", None), ("a[0]", None),
      ("model.timescales", ("inverse_gamma", 0.5)),
      ("model.num_matrices", 3), ("model.locked_dropout", ("output",))]
  with pytest.raises(ValueError, match=r"flag --config.model.timescales="
                     r"inverse_gamma: model.timescales takes a Python "
                     r"literal"):
    launcher.literal_overrides(["main",
                                "--config.model.timescales=inverse_gamma"])


@pytest.mark.parametrize("config, flag, msg", [
    ("demo.py", "--config.model.layers[0].hidden_size=6",
     "model.layers is a NoneType, not a sequence to index"),
    ("mahto_lm.py:mts,ptb,sizes=8-8-4",
     "--config.model.layers[5].hidden_size=6",
     "model.layers holds 3 entries (indices 0..2)")])
def test_an_index_past_the_layers_is_a_flag_error(config, flag, msg,
                                                  tmp_path):
  # ml_collections' ValueError / IndexError came out as tracebacks (QA,
  # session 41)
  res = run_main(f"--config=experiments/configs/{config}",
                 f"--workdir={tmp_path}", flag, timeout=120)
  assert res.returncode != 0 and "Traceback" not in res.stderr
  assert f"Flags parsing error: flag {flag}: {msg}" in res.stderr


def test_indexed_overrides_are_checked_like_fields():
  import ml_collections
  c = ml_collections.ConfigDict({"model": {"layers": (
      {"cell": "lstm", "hidden_size": 8}, {"cell": "lstm", "hidden_size": 4})}})
  ok = launcher.unknown_override(c, ["m", "--config.model.layers[1]."
                                     "hidden_size=6"])
  assert ok is None
  assert launcher.unknown_override(c, [
      "m", "--config.model.layers[0].hidden_sise=6"]) == (
          "flag --config.model.layers[0].hidden_sise=6: model.layers[0] has "
          "no field 'hidden_sise'; did you mean 'hidden_size'? (its fields: "
          "cell, hidden_size)")
  assert launcher.unknown_override(c, [
      "m", "--config.model.layers[5].hidden_size=6"]) == (
          "flag --config.model.layers[5].hidden_size=6: model.layers holds 2 "
          "entries (indices 0..1)")


def test_a_spec_field_is_set_from_the_command_line(tmp_path):
  """model.timescales is None in the tiny config: an mts_lstm needs it,
  and ml_collections could not parse it for a None field."""
  res = run_main(*argv(CONFIG, tmp_path / "mts")[1:],
                 "--config.model.cell=mts_lstm",
                 "--config.model.intermediate_size=None",
                 "--config.model.timescales=('inverse_gamma', 0.56)",
                 "--config.train.num_epochs=1", timeout=300)
  assert res.returncode == 0, res.stderr[-2000:]
  saved = json.load(open(tmp_path / "mts" / "config.json"))
  assert saved["model"]["timescales"] == ["inverse_gamma", 0.56]


def test_an_int_field_is_unset_by_none_from_the_command_line(
    tmp_path, lstm_dots_run):
  """ml_collections parses an override with the field's type, so the
  tiny config's mrnn could not become an lstm (intermediate_size=12 is
  not an lstm hyperparameter) without editing the file."""
  res, config = lstm_dots_run
  assert res.returncode == 0
  model = config["model"]
  assert model["cell"] == "lstm" and model["intermediate_size"] is None
  res = run_main(*argv(CONFIG, tmp_path / "lstm")[1:],
                 "--config.model.intermedate_size=None", timeout=120)
  assert res.returncode == 1
  assert "model has no field 'intermedate_size'; did you mean " \
      "'intermediate_size'?" in res.stderr


def test_cpu_devices_and_small_loops_together(tmp_path):
  """--cpu_devices counted the devices (starting JAX's backend) before
  --small_loops set its XLA flags, which XLA then never read."""
  code = ("from experiments import train; "
          "train.prepare_process('default', True, 2); "
          "import jax; from sorjax import small_loops; "
          "print(jax.device_count(), small_loops.compiled_whole())")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
  assert res.returncode == 0, res.stderr[-2000:]
  assert res.stdout.split() == ["2", "True"]


def test_remat_dots_from_the_command_line(tmp_path, lstm_dots_run):
  """model.remat was a bool field, so "dots" (unroll's third value) was a
  flag error; any other value is a config error naming the field."""
  res, config = lstm_dots_run
  assert res.returncode == 0
  assert config["model"]["remat"] == "dots"
  res = run_main(*argv(CONFIG, tmp_path / "one")[1:],
                 "--config.train.num_epochs=1", "--config.model.remat=1")
  assert res.returncode == 1
  assert res.stderr.strip().endswith(
      "config error: model.remat must be False, True or \"dots\", got 1")
