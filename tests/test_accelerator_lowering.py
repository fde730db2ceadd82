"""Every cell's forward + backward lowers for GPU and TPU (tests/lowering.py).

No accelerator is lent to this project, so "runs on GPU/TPU unchanged" is
checked the way `jax.export` allows on a CPU: each path of `sorjax.unroll`
(the layer primitives, the generic fused backward, JAX's autodiff of the
scan, remat, lengths and reverse, bfloat16) is lowered for cuda and tpu with
their own lowering rules. Shapes only: parameters and inputs are
`jax.eval_shape` / `ShapeDtypeStruct`s, so the H = 512 defaults cost no
FLOPs. The loop's data-parallel step is lowered for 4 devices here, the
paper configs' whole train steps in tests/experiments/test_configs.py.
"""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax import cells
from sorjax.fused_lstm import GATE_MAJOR_FROM
from tests.cells.configs import SMALL
from tests.experiments import tiny_dyck
from tests.xla_env import with_cpu_devices
from tests.lowering import (ACCELERATORS, assert_lowers_for_accelerators,
                            custom_calls, train_step_args)

B, T = 3, 6
LENGTHS = np.array([6, 2, 4], np.int32)


def abstract(cell, D, dtype=jnp.float32):
  params = jax.eval_shape(
      functools.partial(cell.init, input_size=D, dtype=dtype),
      jax.random.key(0))
  return params, jax.ShapeDtypeStruct((B, T, D), dtype)


def grads_of_unroll(cell, aux, **opts):
  """d/d(params, xs) of a loss on every output and the final carry."""
  def loss(params, xs):
    carry, ys = sorjax.unroll(cell, params, xs, **opts, **aux)
    leaves = jax.tree_util.tree_leaves((carry, ys))
    return sum(jnp.sum(l.astype(jnp.float32)) for l in leaves)
  return jax.grad(loss, argnums=(0, 1))


@pytest.mark.parametrize("masked", [False, True], ids=["full", "lengths-rev"])
@pytest.mark.parametrize("fused_grad", [None, True, False])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_cell_path_lowers(name, fused_grad, masked):
  hp, D, make_aux = SMALL[name]
  cell = cells.make(name, **hp)
  opts = dict(fused_grad=fused_grad)
  if masked:
    opts.update(lengths=LENGTHS, reverse=True)
  assert_lowers_for_accelerators(
      grads_of_unroll(cell, make_aux(jax.random.key(1), B, T), **opts),
      *abstract(cell, D))


def at_size(name, H):
  """SMALL's hyperparameters with every width set to H."""
  hp, D, make_aux = SMALL[name]
  hp = dict(hp, hidden_size=H)
  if "intermediate_size" in hp:
    hp["intermediate_size"] = H
  if name == "mts_lstm":
    hp["timescales"] = tuple(float(2 ** (i % 5)) for i in range(H))
  return cells.make(name, **hp), (D if name == "dyck_rnn" else H), make_aux


@pytest.mark.parametrize("name", sorted(SMALL))
def test_the_defaults_at_the_benchmark_width_lower(name):
  # H = 512: the generic fused backward (hidden_size >= 128) and the LSTM
  # layer's gate-major layout (GATE_MAJOR_FROM), which H = 5 never takes.
  assert GATE_MAJOR_FROM <= 512
  cell, D, make_aux = at_size(name, 512)
  assert_lowers_for_accelerators(
      grads_of_unroll(cell, make_aux(jax.random.key(1), B, T)),
      *abstract(cell, D))


@pytest.mark.parametrize("remat", [True, "dots"])
@pytest.mark.parametrize("name", ["lstm", "mrnn", "mm_rnn", "attention_lstm"])
def test_remat_lowers(name, remat):
  hp, D, make_aux = SMALL[name]
  cell = cells.make(name, **hp)
  assert_lowers_for_accelerators(
      grads_of_unroll(cell, make_aux(jax.random.key(1), B, T), remat=remat),
      *abstract(cell, D))


@pytest.mark.parametrize("name", ["lstm", "mrnn", "mm_rnn", "tensor_rnn",
                                  "attention_lstm"])
def test_bfloat16_lowers(name):
  # What a TPU user trains in: parameters, inputs and carries in bfloat16
  # (the layers sum weight gradients in float32, fused_lstm's doc).
  cell, D, make_aux = at_size(name, 128)
  exported = assert_lowers_for_accelerators(
      grads_of_unroll(cell, make_aux(jax.random.key(1), B, T)),
      *abstract(cell, D, jnp.bfloat16))
  assert {a.dtype for a in jax.tree_util.tree_leaves(exported.out_avals)} == {
      jnp.dtype(jnp.bfloat16)}


def sharded_step_export(workdir: str, replicas: int = 2,
                        group: int | None = None) -> dict:
  """In a process with 4 devices: lowers the loop's train step of
  tests/experiments/tiny_dyck.py with the shardings the loop gives it
  (2 replicas: the batch axis over the devices, the state replicated;
  4 or 8 replicas: the state's replica axis over the devices, the batch
  replicated; `group`: config.replica_batch_size); reports what the
  export recorded."""
  from sorjax.training.loop import Trainer
  from sorjax.training.tasks import make_task
  cfg = tiny_dyck.get_config()
  cfg.num_replicas = replicas
  cfg.replica_batch_size = group
  task = make_task(cfg)
  trainer = Trainer(task, cfg, workdir)
  state, batch, temperature = train_step_args(task, trainer, sharded=True)
  exported = assert_lowers_for_accelerators(trainer._step_fn, state, batch,
                                            temperature)
  specs = [None if s is None else tuple(s.spec)
           for s in exported.in_shardings_jax(trainer.mesh)]
  n_state = len(jax.tree_util.tree_leaves(state))
  return {"devices": jax.device_count(), "nr_devices": exported.nr_devices,
          "state": sorted(set(map(str, specs[:n_state]))),
          "batch": dict(zip(sorted(batch), map(str, specs[n_state:-1])))}


@pytest.mark.parametrize("replicas, group, state, batch", [
    (2, None, "()", "('devices',)"),     # data parallel
    (4, None, "('devices',)", "()"),     # one replica per device
    (8, 1, "('devices',)", "()"),        # two a device, one at a time
])
def test_the_sharded_step_lowers_for_four_accelerators(tmp_path, replicas,
                                                       group, state, batch):
  env = with_cpu_devices(4)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  code = ("import json, sys; sys.path.insert(0, %r); from "
          "tests.test_accelerator_lowering import sharded_step_export; "
          "print(json.dumps(sharded_step_export(%r, %d, %r)))"
          % (root, str(tmp_path), replicas, group))
  res = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  out = json.loads(res.stdout.strip().splitlines()[-1])
  assert out["devices"] == out["nr_devices"] == 4
  assert out["state"] == [state]
  assert out["batch"] == {k: batch for k in ("inputs", "lengths", "targets")}


def test_a_host_callback_in_a_step_is_refused():
  # The check can fail: a forward that calls back into Python has no
  # accelerator lowering (pure callbacks have no VJP, so no grad here).
  hp, D, make_aux = SMALL["mrnn"]
  cell = cells.make("mrnn", **hp)

  def host_tanh(ys):
    return jax.pure_callback(np.tanh, jax.ShapeDtypeStruct(ys.shape, ys.dtype),
                             ys)

  def loss(params, xs):
    return jnp.sum(host_tanh(sorjax.unroll(cell, params, xs)[1]))
  with pytest.raises(NotImplementedError, match="python_callback"):
    assert_lowers_for_accelerators(loss, *abstract(cell, D))


def test_custom_calls_are_named():
  # ... and so can the custom-call check: eigh lowers to cuSOLVER on cuda.
  exported = jax.export.export(
      jax.jit(lambda a: jnp.linalg.eigh(a)[0]), platforms=ACCELERATORS)(
          jax.ShapeDtypeStruct((3, 3), jnp.float32))
  assert any("syevd" in c for c in custom_calls(exported))
  with pytest.raises(AssertionError, match="custom calls.*syevd"):
    assert_lowers_for_accelerators(lambda a: jnp.linalg.eigh(a)[0],
                                   jax.ShapeDtypeStruct((3, 3), jnp.float32))
