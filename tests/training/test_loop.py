"""The loop: learning, replicas, resume, non-finite losses, sharding."""

import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

from sorjax.training.loop import NonFiniteLossError, Trainer
from sorjax.training.metrics import read_metrics
from tests.training.toy_task import ToyTask, toy_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def run(workdir, task=None, **cfg):
  config = toy_config(**cfg.pop("train", {}))
  for k, v in cfg.items():
    setattr(config, k, v)
  return Trainer(task or ToyTask(), config, str(workdir)).run()


def test_loss_falls_and_files_are_written(tmp_path):
  state = run(tmp_path)
  recs = read_metrics(str(tmp_path), "valid")
  assert len(recs) == 3 and recs[-1]["loss"] < recs[0]["loss"]
  assert int(state.step[0]) == 18
  assert float(state.carry["seen"][0]) == 18.0       # carry crosses batches
  cfg = json.load(open(tmp_path / "config.json"))
  assert cfg["optim"]["name"] == "sgd"
  assert os.listdir(tmp_path / "checkpoints") and os.listdir(tmp_path / "best")


def test_replicas_equal_separate_runs(tmp_path):
  both = run(tmp_path / "r", num_replicas=2, seed=3)
  one = run(tmp_path / "a", seed=3)
  two = run(tmp_path / "b", seed=4)
  np.testing.assert_allclose(both.params["w"][0], one.params["w"][0], rtol=1e-6)
  np.testing.assert_allclose(both.params["w"][1], two.params["w"][0], rtol=1e-6)
  assert not np.allclose(both.params["w"][0], both.params["w"][1])


def test_rerun_resumes_to_the_same_parameters(tmp_path):
  full = run(tmp_path / "full")
  # Interrupt after 7 steps (a checkpoint exists at step 4), then rerun.
  run(tmp_path / "cut", train={"max_steps": 7})
  resumed = run(tmp_path / "cut")
  np.testing.assert_array_equal(resumed.params["w"], full.params["w"])
  steps = [r["step"] for r in read_metrics(str(tmp_path / "cut"), "train")]
  assert steps == sorted(set(steps))          # no duplicated records


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  with pytest.raises(NonFiniteLossError, match="non-finite"):
    run(tmp_path, task=ToyTask(nan_at_batch=105))   # epoch 1, batch 5
  from sorjax.training.checkpoint import Checkpointer
  ck = Checkpointer(str(tmp_path), read_only=True)
  step, meta = ck.restore_meta("latest")
  assert step <= 10 and np.isfinite(step)


def _trained_on(tmp_path, n, run_args=""):
  """In a process with n forced CPU devices: `run(workdir, <run_args>)`;
  returns [device count, the spec and device count of w's sharding, w]."""
  code = (
      "import sys, json; sys.path.insert(0, %r);"
      "from tests.training.test_loop import run;"
      "import jax; w = run(%r%s).params['w'];"
      "print(json.dumps([jax.device_count(), list(w.sharding.spec),"
      " len(w.sharding.device_set), w.tolist()]))"
      % (ROOT, str(tmp_path / str(n)), run_args))
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")
  res = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-2000:]
  return json.loads(res.stdout.strip().splitlines()[-1])


def test_four_devices_match_one(tmp_path):
  """Sharded over a forced 4-device CPU host (the batch; the state
  replicated), the parameters equal one device's."""
  one, four = _trained_on(tmp_path, 1), _trained_on(tmp_path, 4)
  assert one[0] == 1 and four[:3] == [4, [], 4]
  np.testing.assert_allclose(four[3], one[3], rtol=1e-5)


def test_replicas_over_four_devices_match_one(tmp_path):
  """4 replicas on a forced 4-device CPU host: each device trains one
  replica on the whole batch (the state's replica axis sharded, the batch
  replicated), and every replica ends as on one device."""
  args = ", num_replicas=4, seed=5"
  one, four = _trained_on(tmp_path, 1, args), _trained_on(tmp_path, 4, args)
  assert one[0] == 1 and four[:3] == [4, ["devices"], 4]
  np.testing.assert_allclose(four[3], one[3], rtol=1e-5)
  assert not np.allclose(four[3][0], four[3][1])    # distinct seeds


def test_a_multi_process_run_is_refused(tmp_path):
  # Under jax.distributed (here 2 CPU processes on this host) each process
  # would train the same model alone on its own devices and write the same
  # files; the loop refuses it in every process, before writing anything.
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  code = (
      "import sys; sys.path.insert(0, %r); import jax;"
      "jax.distributed.initialize('localhost:%d', num_processes=2, "
      "process_id=int(sys.argv[1]), initialization_timeout=120);"
      "from tests.training.toy_task import ToyTask, toy_config;"
      "from sorjax.training.loop import Trainer;"
      "Trainer(ToyTask(), toy_config(), %r)") % (ROOT, port, str(tmp_path))
  procs = [subprocess.Popen([sys.executable, "-c", code, str(i)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for i in range(2)]
  for i, p in enumerate(procs):
    _, err = p.communicate(timeout=300)
    assert p.returncode != 0
    assert re.search(f"RuntimeError: .*process {i} of 2.*"
                     f"{re.escape(str(tmp_path))}.*one process per run",
                     err), err[-2000:]
  assert not os.listdir(tmp_path)


def test_stop_below_ends_the_run_once_every_replica_is_under_it(tmp_path):
  run(tmp_path / "f", train={"num_epochs": 6})
  full = [r["loss"] for r in read_metrics(str(tmp_path / "f"), "valid")]
  # A threshold between epoch 2's and epoch 1's loss: stops after epoch 2.
  thr = (full[0] + full[1]) / 2
  assert full[1] < thr < full[0]
  config = toy_config(num_epochs=6)
  config.early_stopping.stop_below = thr
  Trainer(ToyTask(), config, str(tmp_path / "s")).run()
  recs = read_metrics(str(tmp_path / "s"), "valid")
  assert [r["epoch"] for r in recs] == [1, 2]
  # A rerun of a stopped run does nothing more.
  Trainer(ToyTask(), config, str(tmp_path / "s")).run()
  assert len(read_metrics(str(tmp_path / "s"), "valid")) == 2
