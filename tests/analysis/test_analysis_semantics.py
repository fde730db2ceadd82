"""Hand-computed semantics of the analyses that the other tests leave
open: the auto-lowercasing threshold and OOV pair counting of minimal
pairs, the minimum principal angle, the word-ablation grouping and
sequence selection, and the dev accuracy / missing-checkpoint handling of
the tree gradient ratios."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sorjax import cells
from sorjax.analysis import attention
from sorjax.analysis import minimal_pairs as mp
from sorjax.analysis import timescales as ts
from sorjax.analysis import tree_gradients as tg
from sorjax.analysis.common import AnalysisError
from tests.analysis.test_attention_analyses import _DyckTask, _e
from tests.analysis.test_attention_analyses import _run as _attention_run
from tests.analysis.test_minimal_pairs import WORDS, _BigramRun
from tests.analysis.test_timescales import _free_input_run


# ---------------------------------------------------------- minimal pairs

def test_lowercasing_is_automatic_only_below_one_percent_capitalised():
  # 12 symbols, 1 capitalised (~8%): far above 1%, so the vocabulary is
  # case-sensitive and the text is not lowercased.
  cased = _BigramRun(symbols=WORDS + ["Cat"])
  assert mp.normalisation(cased)["lowercase"] is False
  # No capitalised symbol: lowercase.
  assert mp.normalisation(_BigramRun())["lowercase"] is True
  # An explicit choice wins.
  assert mp.normalisation(cased, lowercase=True)["lowercase"] is True


def test_a_pair_with_an_oov_word_only_in_its_bad_sentence_is_an_oov_pair():
  run = _BigramRun()
  pairs = [mp.Pair("The cat sleeps", "The dog sleeps", "x"),   # bad: OOV
           mp.Pair("The cat sleeps", "The cat sleep", "x")]    # none
  res = mp.evaluate(run, pairs)
  assert res["oov"]["sentences"] == 1
  assert res["oov"]["pairs"] == 1
  assert res["oov"]["most_common"] == [("dog", 1)]


# ---------------------------------------------------------- attention

def test_min_degrees_is_the_smallest_principal_angle():
  cell = cells.make("attention_lstm", hidden_size=2, num_cells=2)
  task = _DyckTask(cell)
  params = task.init_params(jax.random.key(0))
  # span{e0, e1} vs span{e0 + e2, e3}: angles 45 and 90 degrees.
  W_h = np.stack([np.stack([_e(0), _e(1)]),
                  np.stack([_e(0, 2), _e(3)])])
  params["layer_0"]["W_h"] = jnp.asarray(W_h, jnp.float32)
  res = attention.principal_angles(_attention_run(task, params))
  layer = res["layers"][0]
  np.testing.assert_allclose(layer["degrees"]["0-1"], [45.0, 90.0],
                             atol=1e-5)
  assert layer["min_degrees"] == pytest.approx(45.0, abs=1e-5)


# ---------------------------------------------------------- timescales

def test_default_groups_are_quarters_in_increasing_timescale_order():
  T = [16.0, 2.0, 8.0, 4.0, 16.0, 2.0, 8.0, 4.0]         # H = 8
  seqs = [np.array([1, 2, 3, 1, 2]), np.array([3, 1, 2, 3])]
  run = _free_input_run(T, {"test": seqs})
  ab = ts.word_ablation(run, "test", position=0)
  groups = ab["layers"][0]["groups"]
  assert [len(g["units"]) for g in groups] == [2, 2, 2, 2]   # H // 4
  assert [g["mean_timescale"] for g in groups] == pytest.approx(
      [2.0, 4.0, 8.0, 16.0])
  assert [sorted(np.asarray(g["units"]).tolist()) for g in groups] == [
      [1, 5], [3, 7], [2, 6], [0, 4]]


def test_sequences_shorter_than_the_ablated_position_are_left_out():
  T = [2.0, 8.0]
  seqs = [np.array([1, 2, 3, 1, 2, 3]), np.array([3])]   # lengths 6, 1
  run = _free_input_run(T, {"test": seqs})
  ab = ts.word_ablation(run, "test", position=2, group_size=1)
  assert ab["sequences"] == 1
  layer = ab["layers"][0]
  assert layer["curve"]["sequences"].tolist() == [1, 1, 1, 1]
  assert layer["curve"]["skipped"] == 0
  groups = {round(g["mean_timescale"]): g["curve"] for g in layer["groups"]}
  np.testing.assert_allclose(groups[2]["mean"], np.exp(-np.arange(4) / 2.0),
                             rtol=1e-4)


# ---------------------------------------------------------- tree gradients

def test_dev_accuracy_is_the_runs_replicas(monkeypatch):
  from sorjax.training import metrics
  records = [{"epoch": 1, "replica": 1, "accuracy": 0.7},
             {"epoch": 1, "replica": 0, "accuracy": 0.4},
             {"epoch": 2, "replica": 1, "accuracy": 0.8},
             {"epoch": 2, "replica": 0, "accuracy": 0.5},
             {"epoch": 2, "replica": 1, "loss": 3.0}]
  monkeypatch.setattr(metrics, "read_metrics", lambda workdir, split=None:
                      list(records))
  run = types.SimpleNamespace(workdir="/fake", replica=1)
  assert tg._dev_accuracy(run) == {1: 0.7, 2: 0.8}
  run.replica = 0
  assert tg._dev_accuracy(run) == {1: 0.4, 2: 0.5}


class _MidEpochReader:
  """Only a mid-epoch checkpoint (position set) is kept."""

  def __init__(self, run):
    pass

  def params(self, step):
    return {}, {"epoch": 1, "position": 5}

  def initial_params(self):
    return {}


def test_no_end_of_epoch_checkpoint_is_an_error(monkeypatch):
  monkeypatch.setattr(tg, "CheckpointReader", _MidEpochReader)
  monkeypatch.setattr(tg, "checkpoint_steps", lambda workdir: [5])
  monkeypatch.setattr(tg, "tree_ratios", lambda *a, **k: (
      np.array([1]), np.array([1.0]), np.array([1.0])))
  monkeypatch.setattr(tg, "_dev_accuracy", lambda run: {})
  run = types.SimpleNamespace(
      task=types.SimpleNamespace(name="trees", split_trees={"train": []}),
      workdir="/fake", replica=0,
      config=types.SimpleNamespace(data=types.SimpleNamespace(
          dataset="keyword")))
  for initial in (True, False):
    with pytest.raises(AnalysisError, match="no end-of-epoch checkpoint is "
                       "kept in /fake/checkpoints"):
      tg.gradient_ratio(run, initial=initial)
  # in the first epoch, keeping more checkpoints would not help: said so
  monkeypatch.setattr(_MidEpochReader, "params",
                      lambda self, step: ({}, {"epoch": 0, "position": 5}))
  with pytest.raises(AnalysisError, match=r"the run has not finished an "
                     r"epoch yet \(every checkpoint in /fake/checkpoints is "
                     r"mid-epoch\)"):
    tg.gradient_ratio(run)
