"""--cpu_devices: the launchers make XLA:CPU offer n devices (read from
XLA_FLAGS at the backend's start, so each case runs in a fresh process),
check that it did, and refuse a setting that would not reach XLA."""

import os
import subprocess
import sys

import pytest

from experiments import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _run(code, xla_flags=None):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  if xla_flags is not None:
    env["XLA_FLAGS"] = xla_flags
  env["PYTHONPATH"] = ROOT
  return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)


# Applies --cpu_devices=2 as a launcher does, then builds the loop for the
# tiny Dyck config with 2 and with 3 replicas.
_LAUNCH = """
from absl import logging; logging.set_verbosity('info')
from experiments import train
train.prepare_process('default', False, 2)
import jax, os, tempfile
from sorjax.training.loop import Trainer
from sorjax.training.tasks import make_task
from tests.experiments import tiny_dyck
out = [jax.device_count(), os.environ['XLA_FLAGS']]
for r in (2, 3):
  cfg = tiny_dyck.get_config()
  cfg.num_replicas = r
  t = Trainer(make_task(cfg), cfg, tempfile.mkdtemp())
  out.append([t.replica_parallel, list(t.state_sharding.spec)])
print(out)
"""


def test_launchers_make_the_devices_and_the_loop_shards_replicas_over_them():
  res = _run(_LAUNCH, xla_flags="--xla_cpu_enable_fast_math=false")
  assert res.returncode == 0, res.stderr[-3000:]
  assert res.stdout.strip().splitlines()[-1] == str([
      2, "--xla_force_host_platform_device_count=2 "
      "--xla_cpu_enable_fast_math=false",
      [True, ["devices"]],   # 2 replicas: one a device
      [False, []]])          # 3 replicas: the batch is sharded instead
  assert "cpu_devices: 2" in res.stderr


def test_a_count_already_in_xla_flags_is_refused():
  res = _run("from experiments import train\n"
             "train.prepare_process('default', False, 2)\n",
             xla_flags="--xla_force_host_platform_device_count=4")
  assert res.returncode != 0
  assert ("ValueError: --cpu_devices: XLA_FLAGS already sets "
          "--xla_force_host_platform_device_count") in res.stderr


def test_too_late_is_refused():
  import jax
  jax.devices()  # this process's backend has started
  with pytest.raises(RuntimeError, match="before JAX starts its backend"):
    train.force_cpu_devices(2)


@pytest.mark.parametrize("bad", [-1, 1.5, "2"])
def test_a_bad_count_is_named(bad):
  with pytest.raises(ValueError, match="--cpu_devices must be an int >= 1"):
    train.force_cpu_devices(bad)


def test_off_cpu_it_is_refused():
  res = _run("import jax\n"
             "jax.default_backend = lambda: 'gpu'\n"
             "from experiments import train\n"
             "train.prepare_process('default', False, 2)\n")
  assert res.returncode != 0
  assert ("--cpu_devices is an XLA:CPU setting; this process computes on "
          "gpu") in res.stderr
