"""Every cell's forward + backward lowers for GPU and TPU (tests/lowering.py).

No accelerator is lent to this project, so "runs on GPU/TPU unchanged" is
checked the way `jax.export` allows on a CPU: each path of `sorjax.unroll`
(the layer primitives, the generic fused backward, JAX's autodiff of the
scan, remat, lengths and reverse, bfloat16) is lowered for cuda and tpu with
their own lowering rules. Shapes only: parameters and inputs are
`jax.eval_shape` / `ShapeDtypeStruct`s, so the H = 512 defaults cost no
FLOPs. The loop's data-parallel step is lowered for 4 devices here, the
paper configs' whole train steps in tests/experiments/test_configs.py.
Also here: a CPU-measured layout that GPU and TPU must not get (the LSTM
layer's gate-major default), and what would cost an accelerator copies or
compilations: evaluation's params, the data-parallel step's state
shardings, the minimal-pairs scorer's params.
"""

import functools
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax import cells
from sorjax.cells.base import LSTMCarry
from sorjax.fused_lstm import GATE_MAJOR_FROM, lstm_layer
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
  # layer from GATE_MAJOR_FROM, which H = 5 never takes (gate-major on CPU
  # only: test_the_lstm_layers_gate_major_default_is_for_cpu_only).
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


@pytest.mark.parametrize("platform, gate_major", [
    ("cpu", True), ("cuda", False), ("tpu", False)])
def test_the_lstm_layers_gate_major_default_is_for_cpu_only(platform,
                                                            gate_major):
  # GATE_MAJOR_FROM is an XLA:CPU measurement: lowered for GPU or TPU the
  # default (layout=None) keeps the batch-major layout, h [B, H] and z
  # [B, 4H], not z^T [4H, B] (the batch the minor axis of every buffer,
  # transposes around the loops), chosen by the platform lowered for.
  H = 512
  cell, D, make_aux = at_size("lstm", H)
  exported = jax.export.export(
      jax.jit(grads_of_unroll(cell, make_aux(jax.random.key(1), B, T))),
      platforms=[platform])(*abstract(cell, D))
  text = exported.mlir_module()
  assert (f"tensor<{4 * H}x{B}xf32>" in text) == gate_major
  assert (f"tensor<{B}x{4 * H}xf32>" in text) != gate_major
  # Asked for, the gate-major layout still lowers there.
  def explicit(W_h, W_x, b, xs):
    z = jnp.zeros((B, H), xs.dtype)
    ys = lstm_layer(W_h, W_x, b, xs, LSTMCarry(z, z), layout="gate_major")[1]
    return jnp.sum(ys)
  params = abstract(cell, D)[0]
  assert_lowers_for_accelerators(
      jax.grad(explicit, argnums=(0, 1, 2)), params["W_h"], params["W_x"],
      params["b"], jax.ShapeDtypeStruct((T, B, D), jnp.float32))


class _DeviceParamsTask:
  """tests/training/toy_task.py's task whose evaluation calls a jitted
  function of the params per "batch" with host-to-device copies refused,
  as the real tasks' per-batch evaluation would copy host params."""

  def __init__(self):
    from tests.training.toy_task import ToyTask
    self.toy, self.evaluated = ToyTask(), 0
    self._score = jax.jit(lambda params: jnp.sum(params["w"] ** 2))

  def __getattr__(self, name):
    return getattr(self.toy, name)

  def evaluate(self, params, split, temperature):
    with jax.transfer_guard_host_to_device("disallow"):
      for _ in range(3):   # batches
        self._score(params)
    self.evaluated += 1
    return self.toy.evaluate(params, split, temperature)


def test_the_loop_evaluates_with_params_on_the_device(tmp_path):
  # The loop reads the state to the host at an epoch's end (checkpoints,
  # NT-ASGD); evaluating with those NumPy params copied them to the
  # accelerator again on every evaluation batch.
  from sorjax.training.loop import Trainer
  from tests.training.toy_task import toy_config
  task = _DeviceParamsTask()
  config = toy_config(num_epochs=2)
  config.num_replicas = 2
  Trainer(task, config, str(tmp_path)).run()
  assert task.evaluated == 4


def test_minimal_pairs_pass_the_params_to_their_jitted_scorer(monkeypatch):
  # Closed over, the params were constants of every compiled length: a copy
  # of the weights in each executable (device memory on a GPU / TPU).
  import types
  from sorjax.analysis import minimal_pairs
  V = 11
  table = jax.random.normal(jax.random.key(0), (V, V))

  class Task:
    name, aux = "lm", ()

    def apply(self, params, tokens, lengths, temperature):
      return params["table"][tokens] / temperature, None

  run = types.SimpleNamespace(task=Task(), params={"table": table},
                              eval_temperature=lambda: 1.0)
  lowered, jit = [], jax.jit

  def spy(fn, **kw):
    jitted = jit(fn, **kw)

    def call(*args):
      lowered.append(jitted.lower(*args).as_text())
      return jitted(*args)
    return call

  monkeypatch.setattr(jax, "jit", spy)
  seqs = [np.array([0, 3, 4, 5]), np.array([0, 2, 7, 8, 9, 1, 6, 3, 2])]
  out = minimal_pairs.token_log_probs(run, seqs, batch_size=1)
  want = jax.nn.log_softmax(table, -1)
  np.testing.assert_allclose(out[1], want[seqs[1][:-1], seqs[1][1:]],
                             rtol=1e-5)
  assert len(lowered) == 2                   # two lengths: 8 and 16
  for text in lowered:
    main = re.search(r"func\.func public @main\((.*?)\) ->", text).group(1)
    assert f"tensor<{V}x{V}xf32>" in main        # an argument
    assert 'dense<"0x' not in text                # not a baked-in constant


def data_parallel_steps(workdir: str, steps: int = 3) -> dict:
  """In a process with 4 devices: `steps` train steps of a task whose
  carry has a batch axis (as the LM's streams), data parallel (1 replica:
  the batch over the devices, the state replicated); reports the state's
  shardings after them and how often the step compiled."""
  from sorjax.training.loop import Trainer
  from tests.training.toy_task import ToyTask, toy_config

  class BatchCarry(ToyTask):
    def init_carry(self, params):
      return {"h": jnp.zeros((self.batch,), jnp.float32)}

    def loss(self, params, carry, batch, rng, temperature, train):
      pred = batch["x"] @ params["w"] + 0.1 * carry["h"]
      return jnp.mean((pred - batch["y"]) ** 2), (
          {"h": jax.lax.stop_gradient(pred)}, {})

  task = BatchCarry()
  trainer = Trainer(task, toy_config(), workdir)
  state = trainer._place_state(trainer.init_state())
  batches = task.train_batches(0, None)
  for _ in range(steps):
    batch, _ = next(batches)
    state, _ = trainer._step_fn(state, trainer._shard_batch(batch),
                                jnp.float32(1.0))
  return {"devices": jax.device_count(),
          "replica_parallel": trainer.replica_parallel,
          "state": sorted({str(a.sharding.spec)
                           for a in jax.tree_util.tree_leaves(state)}),
          "compiles": trainer._step_fn._cache_size()}


def test_the_data_parallel_step_keeps_the_state_replicated(tmp_path):
  # Left to XLA, the carry came out of the step sharded along the batch:
  # every run compiled its step twice (minutes for a large model on an
  # accelerator), and the donated replicated buffers went unused.
  env = with_cpu_devices(4)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  code = ("import json, sys; sys.path.insert(0, %r); from "
          "tests.test_accelerator_lowering import data_parallel_steps; "
          "print(json.dumps(data_parallel_steps(%r)))" % (root, str(tmp_path)))
  res = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  out = json.loads(res.stdout.strip().splitlines()[-1])
  assert out == {"devices": 4, "replica_parallel": False, "state": ["P()"],
                 "compiles": 1}
