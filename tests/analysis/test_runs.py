"""sorjax.runs: Run.log_probs checks its inputs on the host (tokens,
lengths, temperature) and load_config names what is wrong with a damaged
config.json."""

import dataclasses
import json
import math

import jax
import numpy as np
import pytest

from sorjax.runs import Run, load_config
from sorjax.training.loop import Trainer
from sorjax.training.tasks import make_task
from tests.experiments import tiny_dyck

# one worker builds the module's fixtures (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("analysis.test_runs")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """An untrained tiny Dyck run (the init params; no checkpoint needed)."""
  cfg = tiny_dyck.get_config()
  task = make_task(cfg)
  workdir = str(tmp_path_factory.mktemp("run"))
  params = jax.jit(Trainer(task, cfg, workdir).init_state)().params
  return Run(workdir, 0, cfg, task, params, {})


@pytest.mark.parametrize("tau", [0, -1.0, math.nan, math.inf, "hot"])
def test_log_probs_refuse_a_temperature_not_finite_and_positive(run, tau):
  with pytest.raises(ValueError, match=r"log_probs: temperature must be a "
                     r"finite number > 0, got"):
    run.log_probs(np.zeros((2, 3), np.int32), temperature=tau)


@pytest.mark.parametrize("lengths, msg", [
    ([5, 5], r"lengths must be in \[0, T\] = \[0, 3\], got \[5\]"),
    ([-1, -1], r"lengths must be in \[0, T\] = \[0, 3\], got \[-1\]"),
    ([1.5, 2.0], "lengths must be integers, got float"),
    ([3], r"lengths must have shape \[B\] = \[2\]")])
def test_log_probs_check_lengths(run, lengths, msg):
  with pytest.raises(ValueError, match="log_probs: " + msg):
    run.log_probs(np.zeros((2, 3), np.int32), lengths=lengths)


def test_log_probs_pass_the_temperature_to_the_model(tmp_path):
  """An attention LSTM's softmax(x V / tau) reads it: log_probs at a
  temperature equal the task's own logits at that temperature."""
  cfg = tiny_dyck.get_config()
  cfg.model.cell, cfg.model.intermediate_size = "attention_lstm", None
  cfg.model.num_cells = 2
  task = make_task(cfg)
  params = jax.jit(Trainer(task, cfg, str(tmp_path)).init_state)().params
  r = Run(str(tmp_path), 0, cfg, task, params, {})
  tokens = np.array([[4, 0, 1, 3, 2]], np.int32)
  cold, hot = r.log_probs(tokens, temperature=0.1), r.log_probs(
      tokens, temperature=10.0)
  assert np.abs(cold - hot).max() > 1e-3
  p0 = jax.tree.map(lambda a: a[0], params)
  logits, _ = task.apply(p0, tokens, np.array([5], np.int32),
                         temperature=0.1)
  np.testing.assert_allclose(cold, jax.nn.log_softmax(logits, -1),
                             atol=1e-5)


def test_log_probs_with_valid_lengths_and_ragged_tokens(run):
  tokens = np.array([[1, 2, 0], [2, 1, 1]], np.int32)
  full = run.log_probs(tokens, lengths=[3, 3])
  np.testing.assert_allclose(full, run.log_probs(tokens), rtol=1e-6)
  np.testing.assert_allclose(run.log_probs(tokens[0], lengths=3), full[0],
                             rtol=1e-6)
  with pytest.raises(ValueError, match=r"tokens must be a rectangular int "
                     r"array \[B, T\] or \[T\]"):
    run.log_probs([[1, 2], [1]])
  # a Dyck run reads text as its language's space-separated symbols
  ids = run.encode("( [ ] )")
  assert ids.tolist() == [run.task.lang.vocab.index(s) for s in "([])"]
  np.testing.assert_array_equal(run.log_probs("( [ ] )"), run.log_probs(ids))
  with pytest.raises(ValueError, match="unknown symbol '\\(\\(\\)' at "
                     "position 0"):
    run.log_probs("(()")
  for bad in (b"( )", ["(", ")"]):
    with pytest.raises(TypeError, match="encode: text must be a str, got "
                       f"{type(bad).__name__}"):
      run.encode(bad)


@pytest.mark.parametrize("replica", [True, 1.0, "0", -1])
def test_a_replica_that_is_no_int_ge_0_is_named(run, replica):
  with pytest.raises(ValueError, match=f"replica must be an int >= 0, got "
                     f"{replica!r}"):
    run.with_replica(replica)
  assert run.with_replica(np.int64(0)).replica == 0


def test_runs_on_other_dyck_test_sets_are_not_compared(run):
  """--compare reads two runs' numbers side by side: Dyck runs whose test
  sets differ (another num_test, max_length or seed) are refused."""
  from sorjax.analysis import runner
  from sorjax.analysis.common import AnalysisError
  for field, value in (("num_test", 41), ("max_length", 12), ("seed", 1)):
    cfg = run.config.copy_and_resolve_references()
    cfg.data[field] = value
    other = dataclasses.replace(run, config=cfg)
    with pytest.raises(AnalysisError, match=f"cannot compare runs of another "
                       f"task or data: .*data.{field} {value}"):
      runner.check(run, ["perplexity"], runner.Options(compare=other))
  runner.check(run, ["perplexity"], runner.Options(compare=run))


def test_log_probs_of_ragged_rows_ignore_the_padding(run):
  # lengths reach the model: a padded step's trunk output is zero
  # (layer_scan), so there log_probs = log_softmax(head bias), whatever the
  # padding tokens; valid steps equal the row alone, unpadded.
  bias = np.array([0.5, -1.0, 2.0, 0.0, 0.3, -0.7], np.float32)
  p = jax.tree.map(np.asarray, run.all_params)
  p["head"]["bias"] = bias[None]
  r = dataclasses.replace(run, all_params=p)
  tokens = np.array([[1, 2, 0, 3, 4, 1], [2, 1, 1, 0, 3, 4]], np.int32)
  other = tokens.copy()
  other[0, 2:] = [4, 4, 0, 2]                 # different padding in row 0
  lp = r.log_probs(tokens, lengths=[2, 6])
  b = bias.astype(np.float64)
  want = b - b.max() - np.log(np.exp(b - b.max()).sum())
  np.testing.assert_allclose(lp[0, 2:], np.broadcast_to(want, (4, 6)),
                             atol=1e-6)
  np.testing.assert_allclose(lp[0, :2], r.log_probs(tokens[0, :2]), atol=1e-6)
  np.testing.assert_allclose(lp[1], r.log_probs(tokens[1]), atol=1e-6)
  np.testing.assert_allclose(r.log_probs(other, lengths=[2, 6]), lp,
                             atol=1e-6)


def _without(section):
  cfg = json.loads(tiny_dyck.get_config().to_json())
  del cfg[section]
  return json.dumps(cfg)


def _as_list(section):
  cfg = json.loads(tiny_dyck.get_config().to_json())
  cfg[section] = []
  return json.dumps(cfg)


def _task(value):
  cfg = json.loads(tiny_dyck.get_config().to_json())
  cfg["task"] = value
  return json.dumps(cfg)


@pytest.mark.parametrize("text, msg", [
    ('{"task": "lm",\n', r"is not valid JSON \(line 2, column 1"),
    ("{}", "has no section 'task'"),
    ("[1, 2]", "must hold a JSON object, got list"),
    (_without("optim"), "has no section 'optim'"),
    (_without("data"), "has no section 'data'"),
    (_as_list("train"), "section 'train' must be a JSON object, got list"),
    (_task(3), "'task' must be a task name, got 3")])
def test_a_damaged_config_is_named(tmp_path, text, msg):
  (tmp_path / "config.json").write_text(text)
  with pytest.raises(ValueError, match=r"config\.json:? .*" + msg):
    load_config(str(tmp_path))


def test_a_config_written_before_selection_existed_loads_its_defaults(
    tmp_path):
  (tmp_path / "config.json").write_text(_without("selection"))
  cfg = load_config(str(tmp_path))
  assert (cfg.selection.metric, cfg.selection.mode) == ("loss", "min")
  (tmp_path / "config.json").write_text(_as_list("selection"))
  with pytest.raises(ValueError, match="section 'selection' must be a JSON "
                     "object, got list"):
    load_config(str(tmp_path))


def test_a_config_that_is_a_directory_or_absent(tmp_path):
  with pytest.raises(FileNotFoundError, match="is not a sorjax run"):
    load_config(str(tmp_path))
  (tmp_path / "config.json").mkdir()
  with pytest.raises(ValueError, match=r"config\.json is not a file"):
    load_config(str(tmp_path))
  good = tmp_path / "ok"
  good.mkdir()
  (good / "config.json").write_text(tiny_dyck.get_config().to_json())
  assert load_config(str(good)).task == "dyck_lm"


@pytest.mark.parametrize("temperature, step, meta, want", [
    (dict(eval_value=0.01), 7, {"epoch": 3}, 0.01),
    # end of epoch 3 (position None): the loop evaluated at epoch 2
    (dict(decay=0.5), 30, {"epoch": 3, "position": None}, 0.25),
    # saved mid-epoch 3: the schedule's value there
    (dict(decay=0.5), 35, {"epoch": 3, "position": {"batch": 5}}, 0.125),
    (dict(decay=0.5, floor=0.3), 30, {"epoch": 3, "position": None}, 0.3),
    (dict(decay=0.9, per="step"), 10, {"epoch": 1, "position": None},
     0.9 ** 10),
    # end of the first epoch: evaluated at epoch 0's value
    (dict(decay=0.5), 10, {"epoch": 1, "position": None}, 1.0),
])
def test_eval_temperature_is_the_loops_evaluation(run, temperature, step,
                                                  meta, want):
  """It ignored the floor and per-step decay, and read the epoch after the
  one the loop evaluated an end-of-epoch checkpoint at."""
  import dataclasses
  config = run.config.copy_and_resolve_references()
  config.temperature.update(temperature)
  r = dataclasses.replace(run, config=config, step=step, meta=meta)
  assert r.eval_temperature() == pytest.approx(want, rel=1e-6)


def test_log_probs_refuse_a_temperature_the_model_does_not_read(run):
  # tiny_dyck's cell has no attention softmax: a "sampling temperature"
  # changed nothing (QA, session 41)
  with pytest.raises(ValueError, match=r"temperature=0.5 is the attention "
                     r"LSTM's softmax tau, which this run's cells"):
    run.log_probs(np.zeros((1, 3), np.int32), temperature=0.5)
  with pytest.raises(ValueError, match="finite number > 0, got '0.5'"):
    run.log_probs(np.zeros((1, 3), np.int32), temperature="0.5")
  assert run.log_probs([]).shape == (0, run.task.model.vocab_size)
