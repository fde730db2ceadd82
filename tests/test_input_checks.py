"""Inputs that passed unchecked into a silent wrong result or an error
naming something else: unroll's fused_grad and int64 lengths, restore's
`~` and a config.json edited after training. Shapes only or a tiny
checkpoint: nothing compiles."""

import json
import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax import cells, layer_scan
from sorjax.training import loop, tasks
from sorjax.training.checkpoint import Checkpointer
from sorjax.training.config import base_config

B, T, D, H = 2, 4, 2, 3


def rnn():
  cell = cells.make("rnn", hidden_size=H)
  return cell, jax.eval_shape(lambda k: cell.init(k, D), jax.random.key(0))


def unroll_shapes(cell, params, **kwargs):
  xs = jax.ShapeDtypeStruct((B, T, D), jnp.float32)
  return jax.eval_shape(lambda p, x: sorjax.unroll(cell, p, x, **kwargs),
                        params, xs)


# ------------------------------------------------------------- fused_grad

def test_unroll_names_a_fused_grad_that_is_not_a_bool():
  cell, params = rnn()
  for bad in (1, 0, "yes", 1.0):
    with pytest.raises(ValueError, match=re.escape(
        f"unroll: fused_grad must be None, True or False, got {bad!r}")):
      unroll_shapes(cell, params, fused_grad=bad)
  for ok in (None, np.True_, np.False_):  # NumPy bools are bools
    _, ys = unroll_shapes(cell, params, fused_grad=ok)
    assert ys.shape == (B, T, H)


# ---------------------------------------------------------------- lengths

def test_int64_lengths_past_int32_are_checked_before_the_cast():
  """2^32 + 2 wrapped to 2 in the cast to int32, inside [0, T]."""
  cell, params = rnn()
  big = np.array([2**32 + 2, 3], np.int64)
  assert np.asarray(jnp.asarray(big))[0] == 2  # the wrap the check precedes
  with pytest.raises(ValueError, match=re.escape(
      f"unroll: lengths must be in [0, T] = [0, {T}], got [{2**32 + 2}]")):
    unroll_shapes(cell, params, lengths=big)
  with pytest.raises(ValueError, match=re.escape(
      f"f: lengths must be in [0, T] = [0, {T}], got [{-2**31 - 1}]")):
    layer_scan.check_lengths("f", np.array([-2**31 - 1, 1]), B, T)
  ok = layer_scan.check_lengths("f", np.array([T, 0], np.int64), B, T)
  assert ok.dtype == jnp.int32 and ok.tolist() == [T, 0]
  _, ys = unroll_shapes(cell, params, lengths=np.array([T, 1], np.int64))
  assert ys.shape == (B, T, H)


# ---------------------------------------------------------------- restore

class State(NamedTuple):
  step: Any
  params: Any


class Trainer:
  """Stands in for the loop's Trainer: init_state from config.json's model
  (one cell layer, one replica), as restore reads it. Building the real
  task initialises a model eagerly, seconds of compiling."""

  def __init__(self, task, config, workdir):
    self.model = config.model

  def init_state(self):
    cell = cells.make(self.model.cell, hidden_size=self.model.hidden_size)
    p = cell.init(jax.random.key(0), D)
    return State(jnp.zeros((1,), jnp.int32),
                 {"layer_0": jax.tree_util.tree_map(lambda a: a[None], p)})


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
  """A run directory of an rnn: config.json and checkpoint 1, written with
  the library's Checkpointer; restore builds its target with Trainer."""
  monkeypatch.setattr(tasks, "make_task", lambda config: None)
  monkeypatch.setattr(loop, "Trainer", Trainer)
  workdir = tmp_path / "run"
  workdir.mkdir()
  config = {**base_config().to_dict(), "task": "lm", "data": {},
            "model": {"cell": "rnn", "hidden_size": H}}
  (workdir / "config.json").write_text(json.dumps(config))
  abstract = jax.eval_shape(Trainer(None, _Dot(config), "").init_state)
  state = jax.tree_util.tree_map(
      lambda a: np.ones(a.shape, a.dtype), abstract)
  ck = Checkpointer(str(workdir))
  ck.save(1, state, {"epoch": 1})
  ck.wait()
  ck.close()
  return workdir


class _Dot(dict):
  def __getattr__(self, k):
    v = self[k]
    return _Dot(v) if isinstance(v, dict) else v


def edit_config(workdir, **model):
  path = workdir / "config.json"
  config = json.loads(path.read_text())
  config["model"].update(model)
  path.write_text(json.dumps(config))


def test_restore_expands_the_home_directory(run_dir, monkeypatch):
  monkeypatch.setenv("HOME", str(run_dir.parent))
  run = sorjax.restore("~/run", "latest")
  assert run.workdir == str(run_dir) and run.step == 1
  np.testing.assert_array_equal(run.params["layer_0"]["W"], np.ones((H, H)))
  with pytest.raises(FileNotFoundError, match=re.escape(
      f"{run_dir.parent / 'nothing' / 'config.json'} not found")):
    sorjax.restore("~/nothing")


def test_restore_names_a_config_json_of_another_cell(run_dir):
  """config.json's cell edited to one with other entries: the config
  disagrees with the checkpoint, which is not damaged."""
  where = re.escape(f"{run_dir}/config.json disagrees with checkpoint "
                    f"{run_dir}/checkpoints/1: ")
  edit_config(run_dir, cell="gru")  # W_x, W_h, b, b_hn for rnn's U, W, b
  with pytest.raises(ValueError, match=where + re.escape(
      "the config's model has params.layer_0.W_h, which the checkpoint does "
      "not hold (4 more entries differ). The config is not the one this run "
      "was trained with")):
    sorjax.restore(str(run_dir), "latest")
  edit_config(run_dir, cell="tensor_rnn")  # A, b: the checkpoint holds more
  with pytest.raises(ValueError, match=where + re.escape(
      "the config's model has params.layer_0.A, which the checkpoint does "
      "not hold (2 more entries differ)")):
    sorjax.restore(str(run_dir), "latest")
  edit_config(run_dir, cell="rnn", hidden_size=H + 1)  # same entries
  with pytest.raises(ValueError, match=re.escape(
      f"checkpoint {run_dir}/checkpoints/1 holds arrays of other shapes than "
      f"the config makes ({run_dir}/config.json): params.layer_0.U "
      f"(1, {D}, {H}) (expected (1, {D}, {H + 1}))")):
    sorjax.restore(str(run_dir), "latest")


def test_checkpointer_names_entries_the_target_does_not_have(tmp_path):
  """At the Checkpointer: stored entries the target lacks (a smaller
  model) are named too, not read as damage."""
  ck = Checkpointer(str(tmp_path))
  w = np.zeros((2,), np.float32)
  ck.save(1, {"params": {"u": w, "w": w}}, {})
  ck.wait()
  with pytest.raises(ValueError, match=re.escape(
      f"{tmp_path}/config.json disagrees with checkpoint "
      f"{tmp_path}/checkpoints/1: the checkpoint holds params.u, which the "
      "config's model does not have.")):
    ck.restore({"params": {"w": w}}, "latest")
  assert ck.restore({"params": {"u": w, "w": w}}, "latest")[0] == 1
  ck.close()
