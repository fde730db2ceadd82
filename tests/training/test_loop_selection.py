"""Which checkpoint is "best" and when early stopping ends a run: both follow
the FIRST eval split's loss, the best checkpoint its mean over replicas, and
stopping needs every replica's criterion. A scripted task fixes the eval
losses per (epoch, replica, split) so the expectations are by hand."""

import jax.numpy as jnp
import ml_collections
import numpy as np

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
    return {"loss": float(self.script[e][r][s])}

  def eval_splits(self):
    return self.splits


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
