"""LDPA / WCPA over a run's split (80% rule on hand-set probabilities) and
PCFG accuracy by maximum timescale (Mahto Fig. 2) on hand-made sequences."""

import types

import numpy as np
import pytest

from sorjax.analysis import dyck
from sorjax.analysis.common import AnalysisError
from sorjax.data.dyck import DyckKM
from sorjax.data.pcfg import DyckPCFG
from sorjax.training.tasks.dyck import DyckClosing, DyckLM

# Dyck-(2, 3) ids: ( [ ) ] START END -> 0 1 2 3 4 5
SEQS = [np.array([4, 0, 1, 3, 2, 5]), np.array([4, 0, 2, 5])]


def _next_token_rows(name):
  """Rows t predicting token t+1 of SEQS (padded to T = 5)."""
  p = np.full((2, 5, 6), 1 / 6)
  p[0, 2] = [0, 0, 0.19, 0.81, 0, 0]   # ] at 3 (distance 1): 81% -> correct
  p[0, 3] = [0.5, 0, 0.79 / 2, 0.21 / 2, 0, 0]   # ) at 4 (distance 3): 79%
  p[1, 1] = [0, 0, 1.0, 0, 0, 0]       # ) at 2 (distance 1): correct
  if name == "dyck_closing":           # the closing head: k-way softmax
    q = p[..., 2:4] / p[..., 2:4].sum(-1, keepdims=True)
    return np.log(np.maximum(q, 1e-30))
  return np.log(np.maximum(p, 1e-30))


class _DyckTask:
  """Hand-set log-probs in place of a model; the LDPA bookkeeping is the
  real tasks' (`ldpa_batch`, `close_probs`)."""
  ldpa_batch = DyckLM.ldpa_batch

  def __init__(self, name):
    self.name, self.k, self.lang = name, 2, DyckKM(2, 3)
    self.splits = {"dev": (SEQS, 1, 6), "test": (SEQS, 1, 6)}

  def close_probs(self, lp):
    real = DyckClosing if self.name == "dyck_closing" else DyckLM
    return real.close_probs(self, lp)

  def log_probs(self, params, split, temperature):
    inputs = np.zeros((2, 5), np.int32)
    targets = np.zeros((2, 5), np.int32)
    for r, s in enumerate(SEQS):
      inputs[r, :len(s) - 1], targets[r, :len(s) - 1] = s[:-1], s[1:]
    yield (types.SimpleNamespace(inputs=inputs, targets=targets), SEQS,
           _next_token_rows(self.name))


def _run(task):
  return types.SimpleNamespace(task=task, params=None, workdir="/fake",
                               eval_temperature=lambda: 1.0)


@pytest.mark.parametrize("name", ["dyck_lm", "dyck_closing"])
def test_ldpa_and_wcpa_of_hand_set_probabilities(name, tmp_path):
  res = dyck.ldpa(_run(_DyckTask(name)), ("test",))
  t = res["splits"]["test"]
  assert {d: (v["correct"], v["total"]) for d, v in t["ldpa"].items()} == {
      1: (2, 2), 3: (0, 1)}
  assert t["wcpa"] == 0.0
  assert t["close_accuracy"] == pytest.approx(2 / 3)
  assert (res["k"], res["m"], res["threshold"]) == (2, 3, 0.8)
  path = dyck.plot_ldpa(res, str(tmp_path / "ldpa.png"))
  assert (tmp_path / "ldpa.png").stat().st_size > 0 and path


def test_ldpa_needs_a_dyck_run_and_a_known_split():
  task = _DyckTask("dyck_lm")
  with pytest.raises(AnalysisError, match="unknown split 'train'"):
    dyck.ldpa(_run(task), ("train",))
  task.name = "lm"
  with pytest.raises(AnalysisError, match="needs a 'dyck_lm' or "
                     "'dyck_closing' run; this run's task is 'lm'"):
    dyck.ldpa(_run(task))


# "( )": max timescale 1; "( [ ] )": 3; "[ ( ) ] ( )": 3
PCFG_SEQS = [np.array([0, 2]), np.array([0, 1, 3, 2]),
             np.array([1, 0, 2, 3, 0, 2])]


class _PCFGTask:
  name = "dyck_pcfg"

  def __init__(self):
    self.grammar = DyckPCFG()
    self.splits = {"train": PCFG_SEQS, "test": PCFG_SEQS}

  def predictions(self, params, split, temperature):
    T = 8
    tgt = np.zeros((4, T, 2), np.float32)
    for r, s in enumerate(PCFG_SEQS):
      tgt[r, :len(s)] = self.grammar.closing_targets(s)
    probs = np.where(tgt > 0.5, 0.9, 0.1)
    probs[2, 4, 1] = 0.6          # one wrong step in the third sequence
    probs[3] = 0.7                # the padding row: ignored
    batch = types.SimpleNamespace(lengths=np.array([2, 4, 6, 0]),
                                  index=np.array([0, 1, 2, -1]))
    yield batch, {"targets": tgt}, probs, None


def test_pcfg_accuracy_by_maximum_timescale(tmp_path):
  res = dyck.pcfg_timescales(_run(_PCFGTask()), "test", bin_width=2)
  assert res["sequence_accuracy"] == pytest.approx(2 / 3)
  assert res["per_sequence"]["max_timescale"].tolist() == [1, 3, 3]
  assert res["per_sequence"]["correct"].tolist() == [True, True, False]
  assert [(b["low"], b["high"], b["sequences"], b["correct"])
          for b in res["bins"]] == [(0, 2, 1, 1), (2, 4, 2, 1)]
  t = res["train_timescales"]
  assert t["timescale"].tolist() == [1, 3] and t["count"].tolist() == [4, 2]
  dyck.plot_pcfg_timescales(res, str(tmp_path / "p.png"))
  assert (tmp_path / "p.png").stat().st_size > 0
  with pytest.raises(ValueError, match="bin_width"):
    dyck.pcfg_timescales(_run(_PCFGTask()), "test", bin_width=0)


class _PaddedPCFGTask(_PCFGTask):
  """Every real step predicted right, every padded step (t >= length) of
  the real rows wrong; the train split differs from the test split."""

  def __init__(self):
    super().__init__()
    self.splits = {"train": [np.array([0, 1, 0, 2, 3, 2])],   # ( [ ( ) ] )
                   "test": PCFG_SEQS}

  def predictions(self, params, split, temperature):
    batch, b, probs, _ = next(super().predictions(params, split, temperature))
    probs[2, 4, 1] = 0.1                       # the third sequence right too
    for r, n in enumerate(batch.lengths):
      probs[r, n:] = 0.9                       # padded steps: all wrong
    yield batch, b, probs, None


def test_pcfg_accuracy_ignores_padded_steps_and_bins_include_their_low_edge():
  res = dyck.pcfg_timescales(_run(_PaddedPCFGTask()), "test", bin_width=3)
  assert res["per_sequence"]["correct"].tolist() == [True, True, True]
  assert res["sequence_accuracy"] == 1.0
  # Max timescales 1, 3, 3: bins [0, 3) and [3, 6), 3 in the second.
  assert [(b["low"], b["high"], b["sequences"]) for b in res["bins"]] == [
      (0, 3, 1), (3, 6, 2)]
  # Fig. 2 right: the train split's pairs only: ( [ ( ) ] ) has 5, 3, 1.
  t = res["train_timescales"]
  assert t["timescale"].tolist() == [1, 3, 5]
  assert t["count"].tolist() == [1, 1, 1]
