"""Which checkpoint is "best" and when early stopping ends a run: both follow
the FIRST eval split's selection metric (the loss by default, or one to
maximise such as an accuracy), the best checkpoint its mean over replicas,
and stopping needs every replica's criterion. A scripted task fixes the
eval metrics per (epoch, replica, split) so the expectations are by hand."""

import os

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from sorjax.training.checkpoint import Checkpointer
from tests.training.test_loop import run


class ScriptedEvalTask:
  """One training batch an epoch (so step == epoch); `evaluate` returns
  script[epoch][replica][split] in the loop's call order (epochs, then
  replicas, then splits)."""
  name, vocab = "scripted", None

  def __init__(self, script, splits=("valid",)):
    self.script, self.splits = script, tuple(splits)
    self.calls = []

  def init_params(self, rng):
    del rng
    return {"w": jnp.zeros((2,), jnp.float32)}

  def init_carry(self, params):
    return ()

  def num_train_batches(self):
    return 1

  def train_batches(self, epoch, position):
    yield {"x": np.ones((2,), np.float32)}, {"batch": 1}

  def loss(self, params, carry, batch, rng, temperature, train):
    return jnp.mean((params["w"] - batch["x"]) ** 2), (carry, {})

  def evaluate(self, params, split, temperature):
    n = len(self.calls)
    R = len(self.script[0])
    per_epoch = R * len(self.splits)
    e, r, s = n // per_epoch, (n % per_epoch) // len(self.splits), \
        n % len(self.splits)
    assert split == self.splits[s]
    self.calls.append((e, r, split))
    v = self.script[e][r][s]
    return dict(v) if isinstance(v, dict) else {"loss": float(v)}

  def eval_splits(self):
    return self.splits


class DeclaredMetricsTask(ScriptedEvalTask):
  """The scripted task, declaring what it evaluates (as the real tasks do)."""

  def metric_names(self):
    return ("loss", "accuracy")


def _select(metric, mode):
  return ml_collections.ConfigDict(dict(metric=metric, mode=mode))


def _stop_below(v):
  return ml_collections.ConfigDict(dict(patience=None, stop_below=v))


def _best(workdir):
  ck = Checkpointer(str(workdir), read_only=True)
  try:
    step, meta = ck.restore_meta("best")
  finally:
    ck.close()
  return step, meta


def test_best_checkpoint_follows_the_mean_over_replicas(tmp_path):
  # epoch 1: [1.0, 1.0] mean 1.0; epoch 2: replica 0 improves (0.5) but the
  # mean rises (1.25); epoch 3: mean 1.1 -- still worse than epoch 1.
  task = ScriptedEvalTask([[[1.0], [1.0]], [[0.5], [2.0]], [[0.2], [2.0]]])
  state = run(tmp_path, task=task, num_replicas=2)
  assert int(state.step[0]) == 3
  step, meta = _best(tmp_path)
  assert step == 1
  assert meta["best_mean"] == 1.0 and meta["epoch"] == 1


def test_best_checkpoint_is_the_lowest_not_the_latest(tmp_path):
  # 1.0, then 0.5 (best), then 0.8: worse than the best, better than inf.
  task = ScriptedEvalTask([[[1.0]], [[0.5]], [[0.8]]])
  run(tmp_path, task=task)
  step, meta = _best(tmp_path)
  assert step == 2
  assert meta["best_mean"] == 0.5 and meta["epoch"] == 2


def test_stop_below_needs_every_replica(tmp_path):
  # replica 0 is below 0.5 from epoch 1, replica 1 never: no early stop.
  task = ScriptedEvalTask([[[0.1], [1.0]]] * 3)
  state = run(tmp_path, task=task, num_replicas=2,
              early_stopping=_stop_below(0.5))
  assert int(state.step[0]) == 3
  assert [c[0] for c in task.calls] == [0, 0, 1, 1, 2, 2]


def test_stop_below_stops_when_every_replica_is_below(tmp_path):
  # both below 0.5 after epoch 2: the run ends there (of 3 epochs).
  task = ScriptedEvalTask([[[0.1], [1.0]], [[0.1], [0.4]], [[0.1], [0.4]]])
  state = run(tmp_path, task=task, num_replicas=2,
              early_stopping=_stop_below(0.5))
  assert int(state.step[0]) == 2
  assert len(task.calls) == 4


def test_best_checkpoint_follows_the_first_eval_split(tmp_path):
  # valid: 1.0, 0.5, 0.8 -> best at step 2; the second split (test) moves
  # the other way: 1.0, 2.0, 0.1 (its best would be step 3).
  task = ScriptedEvalTask([[[1.0, 1.0]], [[0.5, 2.0]], [[0.8, 0.1]]],
                          splits=("valid", "test"))
  state = run(tmp_path, task=task)
  assert int(state.step[0]) == 3
  step, meta = _best(tmp_path)
  assert step == 2 and meta["best_mean"] == 0.5


def test_stop_below_follows_the_first_eval_split(tmp_path):
  # the second split is below 0.5 from epoch 1, the first never: no stop.
  task = ScriptedEvalTask([[[1.0, 0.1]], [[0.9, 0.1]], [[0.8, 0.1]]],
                          splits=("valid", "test"))
  state = run(tmp_path, task=task,
              early_stopping=_stop_below(0.5))
  assert int(state.step[0]) == 3
  assert len(task.calls) == 6


def _tree(v):
  return {"w": jnp.full((3,), v, jnp.float32)}


def test_restoring_an_int_step_in_both_prefers_the_latest(tmp_path):
  ck = Checkpointer(str(tmp_path), keep=3)
  ck.save(4, _tree(1.0), {"which": "latest"})
  ck.save_best(4, _tree(2.0), {"which": "best"})
  ck.wait()
  try:
    assert ck.best_step() == 4 and ck.latest_step() == 4
    s, st, meta = ck.restore(_tree(0.0), 4)
    assert s == 4 and meta == {"which": "latest"}
    np.testing.assert_array_equal(st["w"], 1.0)
    s, st, meta = ck.restore(_tree(0.0), "best")
    assert s == 4 and meta == {"which": "best"}
    np.testing.assert_array_equal(st["w"], 2.0)
  finally:
    ck.close()


# ------------------------------------------------------------ selection.*
def _m(loss, acc):
  return {"loss": loss, "accuracy": acc}


def test_best_checkpoint_follows_the_accuracy_when_selected(tmp_path):
  # the loss falls every epoch (best at 3), the accuracy peaks at epoch 2
  task = DeclaredMetricsTask([[[_m(1.0, 0.5)]], [[_m(0.8, 0.9)]],
                              [[_m(0.6, 0.7)]]])
  run(tmp_path, task=task, selection=_select("accuracy", "max"))
  step, meta = _best(tmp_path)
  assert step == 2 and meta["best_mean"] == 0.9 and meta["epoch"] == 2
  # the same script by the default selection (the loss): the last epoch
  task = DeclaredMetricsTask([[[_m(1.0, 0.5)]], [[_m(0.8, 0.9)]],
                              [[_m(0.6, 0.7)]]])
  run(tmp_path / "loss", task=task)
  step, meta = _best(tmp_path / "loss")
  assert step == 3 and meta["best_mean"] == 0.6


def test_best_accuracy_is_the_mean_over_replicas(tmp_path):
  # epoch 1 mean 0.5; epoch 2: replica 0 at 1.0 but the mean 0.45; epoch 3
  # mean 0.55, the best
  task = DeclaredMetricsTask([
      [[_m(1.0, 0.5)], [_m(1.0, 0.5)]],
      [[_m(1.0, 1.0)], [_m(1.0, 0.0)]],
      [[_m(1.0, 0.6)], [_m(1.0, 0.5)]]])
  run(tmp_path, task=task, num_replicas=2,
      selection=_select("accuracy", "max"))
  step, meta = _best(tmp_path)
  assert step == 3 and meta["best_mean"] == pytest.approx(0.55)


def test_early_stopping_counts_epochs_without_a_higher_accuracy(tmp_path):
  # accuracy 0.5, 0.7, 0.7, 0.6 with patience 2: epochs 3 and 4 do not
  # improve, so the run ends after epoch 4 of 6, although the loss falls
  # throughout (by the loss it would run all 6)
  script = [[[_m(1.0 - 0.1 * e, a)]] for e, a in
            enumerate([0.5, 0.7, 0.7, 0.6, 0.9, 0.9])]
  task = DeclaredMetricsTask(script)
  state = run(tmp_path, task=task, train={"num_epochs": 6},
              selection=_select("accuracy", "max"),
              early_stopping=ml_collections.ConfigDict(
                  dict(patience=2, stop_below=None)))
  assert int(state.step[0]) == 4
  task = DeclaredMetricsTask(script)
  state = run(tmp_path / "loss", task=task, train={"num_epochs": 6},
              early_stopping=ml_collections.ConfigDict(
                  dict(patience=2, stop_below=None)))
  assert int(state.step[0]) == 6


def test_an_unknown_selection_metric_fails_before_training(tmp_path):
  task = DeclaredMetricsTask([[[_m(1.0, 0.5)]]])
  with pytest.raises(ValueError, match=r"selection.metric='acc' is not among "
                     r"the metrics scripted evaluates: \['accuracy', 'loss'\]"):
    run(tmp_path / "w", task=task, selection=_select("acc", "max"))
  assert not task.calls and not os.path.exists(tmp_path / "w")


def test_an_unknown_selection_metric_fails_at_the_first_evaluation(tmp_path):
  # a task that does not declare its metrics: caught at the first one
  task = ScriptedEvalTask([[[_m(1.0, 0.5)]]] * 3)
  with pytest.raises(ValueError, match=r"selection.metric='wcpa' is not "
                     r"among the metrics of the 'valid' evaluation: "
                     r"\['accuracy', 'loss'\]"):
    run(tmp_path, task=task, selection=_select("wcpa", "max"))
  assert len(task.calls) == 1


def test_a_bad_selection_mode_is_refused(tmp_path):
  with pytest.raises(ValueError, match="selection.mode must be 'min' or "
                     "'max', got 'up'"):
    run(tmp_path, task=DeclaredMetricsTask([[[_m(1.0, 0.5)]]]),
        selection=_select("accuracy", "up"))


def test_a_non_finite_selected_metric_stops_the_run(tmp_path):
  from sorjax.training.loop import NonFiniteLossError
  task = DeclaredMetricsTask([[[_m(1.0, float("nan"))]]])
  with pytest.raises(NonFiniteLossError, match="non-finite validation "
                     "accuracy"):
    run(tmp_path, task=task, selection=_select("accuracy", "max"))


def test_a_max_selection_checkpointed_before_its_first_evaluation_resumes(
    tmp_path):
  """best_mean starts at -inf for "max"; a checkpoint written before the
  first evaluation holds it and resumes: the first evaluation is then the
  best."""
  from tests.training.toy_task import ToyTask
  sel = _select("loss", "max")
  run(tmp_path, task=ToyTask(), selection=sel, train={"max_steps": 4})
  ck = Checkpointer(str(tmp_path), read_only=True)
  try:
    step, meta = ck.restore_meta("latest")
  finally:
    ck.close()
  assert step == 4 and meta["best_mean"] == float("-inf")
  run(tmp_path, task=ToyTask(), selection=sel, train={"max_steps": 8})
  step, meta = _best(tmp_path)
  assert step == 6 and np.isfinite(meta["best_mean"])
