"""experiments.crossval: every fold trained once, the summary against the
folds' own metrics files, named errors, and the command on the real
corpus."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import crossval
from sorjax.training.metrics import read_metrics
from tests.training.test_lm_documents import _config, corpus  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _tiny(hidden_size=8, **data):
  c = _config(folds=3, fold_valid_fraction=0.25, **data)
  c.model.hidden_size = hidden_size
  c.num_replicas = 2
  c.train.num_epochs = 2
  c.train.log_every = 1
  c.train.tensorboard = False
  return c


def _by_hand(wd):
  """A fold's test bits per char, from its metrics.jsonl: per replica, the
  test record at the step of its lowest valid loss; their mean."""
  recs = read_metrics(wd)
  out = []
  for r in (0, 1):
    valid = [x for x in recs if x["split"] == "valid" and x["replica"] == r]
    best = min(valid, key=lambda x: x["loss"])["step"]
    (test,) = [x for x in recs if x["split"] == "test" and x["replica"] == r
               and x["step"] == best]
    out.append(test["bits_per_char"])
  return np.mean(out)


def test_every_fold_trains_once_and_the_summary_averages_them(
    corpus, tmp_path, monkeypatch):  # noqa: F811
  s = crossval.crossval(_tiny(), str(tmp_path))
  assert s["finished"] == [0, 1, 2] and s["folds"] == 3
  want = [_by_hand(tmp_path / f"fold_{f}") for f in range(3)]
  bpc = s["test"]["bits_per_char"]
  np.testing.assert_allclose(bpc["values"], want, rtol=1e-12)
  np.testing.assert_allclose(bpc["mean"], np.mean(want), rtol=1e-12)
  np.testing.assert_allclose(bpc["std"], np.std(want, ddof=1), rtol=1e-12)
  assert {"loss", "document_bits_per_char"} <= set(s["test"])
  assert "best_epoch" not in s["test"]
  # each fold trained its own fold of the config
  for f in range(3):
    saved = json.load(open(tmp_path / f"fold_{f}" / "config.json"))
    assert (saved["data"]["fold"], saved["data"]["folds"]) == (f, 3)
  assert json.load(open(tmp_path / "crossval.json"))["test"] == json.loads(
      json.dumps(s["test"]))
  # a rerun trains nothing further and summarises the same folds
  before = (tmp_path / "fold_1" / "metrics.jsonl").read_text()
  again = crossval.crossval(_tiny(), str(tmp_path))
  assert again["test"] == s["test"]
  assert (tmp_path / "fold_1" / "metrics.jsonl").read_text() == before
  # other values: refused before any fold trains on under them
  with pytest.raises(crossval.CrossvalError, match=r"fold_0 was trained "
                     r"with another config: model.hidden_size: 8 -> 9 "
                     r"\(saved -> given\); delete .*fold_0 to train"):
    crossval.crossval(_tiny(hidden_size=9), str(tmp_path))
  # fewer epochs: a finished fold cannot be shortened; nothing rewritten
  fewer = _tiny()
  fewer.train.num_epochs = 1
  saved = (tmp_path / "fold_0" / "config.json").read_text()
  with pytest.raises(crossval.CrossvalError, match=r"fold_0 trained for "
                     r"longer than the config asks: train.num_epochs: 2 -> 1"):
    crossval.crossval(fewer, str(tmp_path))
  assert (tmp_path / "fold_0" / "config.json").read_text() == saved
  assert (tmp_path / "fold_1" / "metrics.jsonl").read_text() == before
  # more epochs: every fold trains on
  more = _tiny()
  more.train.num_epochs = 3
  third = crossval.crossval(more, str(tmp_path))
  assert third["test"] != s["test"]
  assert {r["epochs_run"] for f in third["per_fold"].values()
          for r in f["per_replica"]} == {3}


def test_some_folds_only_and_never_folds_of_other_runs(
    corpus, tmp_path):  # noqa: F811
  s = crossval.crossval(_tiny(), str(tmp_path), ["2"])
  assert s["finished"] == [2] and [r["fold"] for r in s["runs"]] == [2]
  assert s["test"]["loss"]["n"] == 1
  assert not os.path.exists(tmp_path / "fold_0")
  # fold 1 of another model would be averaged with fold 2: refused before
  # fold 1 trains
  with pytest.raises(crossval.CrossvalError, match=r"fold_2 was trained "
                     r"with another config: model.hidden_size: 8 -> 9"):
    crossval.crossval(_tiny(hidden_size=9), str(tmp_path), ["1"])
  assert not os.path.exists(tmp_path / "fold_1")
  longer = _tiny()
  longer.train.num_epochs = 3
  with pytest.raises(crossval.CrossvalError,
                     match=r"fold_2 finished with train.num_epochs: 2 -> 3 "
                     r"\(saved -> given\); train it on with --folds=2"):
    crossval.crossval(longer, str(tmp_path), ["0"])
  assert not os.path.exists(tmp_path / "fold_0")
  # the remedy the error names works
  assert crossval.crossval(longer, str(tmp_path), ["2"])["finished"] == [2]


def test_a_damaged_finished_fold_is_named(corpus, tmp_path):  # noqa: F811
  crossval.crossval(_tiny(), str(tmp_path), ["1"])
  metrics = tmp_path / "fold_1" / "metrics.jsonl"
  metrics.write_text(metrics.read_text()[:-5])
  with pytest.raises(crossval.CrossvalError, match=r"metrics.jsonl:\d+: not "
                     r"a JSON line .*the finished fold in .*fold_1 cannot be "
                     r"summarised; delete"):
    crossval.summarise_folds(str(tmp_path), _tiny())
  os.remove(tmp_path / "fold_1" / "config.json")
  with pytest.raises(crossval.CrossvalError, match=r"config.json is not a "
                     r"file: the fold in .*fold_1 cannot be checked"):
    crossval.crossval(_tiny(), str(tmp_path), ["0"])
  assert not os.path.exists(tmp_path / "fold_0")


def test_max_steps_may_grow_or_go_but_not_shrink():
  assert crossval._longer("max_steps", 5, None)
  assert crossval._longer("max_steps", 5, 7)
  assert not crossval._longer("max_steps", None, 7)
  assert not crossval._longer("max_steps", 7, 5)
  assert crossval._longer("num_epochs", 2, 3)
  assert not crossval._longer("num_epochs", 3, 2)


@pytest.mark.parametrize("chosen, match", [
    (["3"], r"--folds=3: '3' is not a new fold of 0..2 \(data.folds=3\)"),
    (["0", "0"], r"'0' is not a new fold"),
    (["x"], r"'x' is not a new fold"),
])
def test_bad_folds_are_named(chosen, match, tmp_path):
  with pytest.raises(crossval.CrossvalError, match=match):
    crossval.crossval(_tiny(), str(tmp_path), chosen)


def test_a_config_without_folds_is_refused(tmp_path):
  with pytest.raises(crossval.CrossvalError,
                     match=r"data.folds is None .*--config.data.folds=5"):
    crossval.crossval(_config(), str(tmp_path))
  (tmp_path / "file").write_text("")
  with pytest.raises(crossval.CrossvalError, match=r"--workdir=.*file"):
    crossval.crossval(_tiny(), str(tmp_path / "file"))


def test_the_command_runs_a_fold_of_maupome_on_the_real_corpus(
    shared_data, tmp_path):
  """`python -m experiments.crossval` on the paper config, one fold of a
  few hundred characters; --config.data.fold is refused (crossval sets
  it)."""
  tfds = tmp_path / "tfds"
  base = [sys.executable, "-m", "experiments.crossval",
          "--config=experiments/configs/maupome_ablation.py:none,tanh",
          f"--workdir={tmp_path / 'cv'}"]
  env = {**os.environ, "SORJAX_DATA_DIR": shared_data}
  res = subprocess.run(base + ["--config.data.fold=1"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert res.returncode != 0 and "crossval trains every fold" in res.stderr
  small = ["--folds=4", f"--config.data.data_dir={tfds}",
           "--config.model.budget=4000", "--config.model.budget_tol=0.1",
           "--config.data.batch_size=2", "--config.data.eval_batch_size=2",
           "--config.data.max_train_tokens=300",
           "--config.data.max_eval_tokens=40",
           "--config.data.num_buckets=1", "--config.train.num_epochs=1",
           "--config.train.tensorboard=False"]
  res = subprocess.run(base + small, cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  assert "1 of 5 folds finished [4]" in res.stdout
  assert "test bits_per_char:" in res.stdout
  s = json.load(open(tmp_path / "cv" / "crossval.json"))
  assert s["finished"] == [4] and s["config"]["data"]["documents"]


def test_a_folds_wall_time_counts_every_invocation(tmp_path, monkeypatch):
  # an interrupted fold's seconds were lost, and a fold trained on
  # recorded the last call's only (QA, session 41)
  import time
  import ml_collections
  calls = []

  def fake_train(cfg, wd):
    os.makedirs(wd, exist_ok=True)
    calls.append(wd)
    time.sleep(0.2)
    if len(calls) == 1:
      raise KeyboardInterrupt

  monkeypatch.setattr("experiments.train.train_and_evaluate", fake_train)
  cfg = ml_collections.ConfigDict({"data": {"folds": 2, "fold": 0}})
  with pytest.raises(KeyboardInterrupt):
    crossval.run_fold(cfg, 1, str(tmp_path))
  first = crossval.run_fold(cfg, 1, str(tmp_path))
  assert first["wall_s"] >= 0.4
  assert not (tmp_path / "fold_1" / crossval.PARTIAL).exists()
  again = crossval.run_fold(cfg, 1, str(tmp_path))   # trained nothing
  assert again["wall_s"] == first["wall_s"]
  os.makedirs(tmp_path / "fold_1" / "checkpoints" / "7")   # trained on
  monkeypatch.setattr(crossval, "_latest_step",
                      lambda wd, s=iter([None, 7]): next(s))
  more = crossval.run_fold(cfg, 1, str(tmp_path))
  assert more["wall_s"] >= first["wall_s"] + 0.15   # (rounded to 0.1 s)


def test_a_failed_write_of_a_folds_record_is_named_and_leaves_none(
    tmp_path, monkeypatch):
  """A full disk while a finished fold's record (DONE) is written: the
  error names it, and no record cut short is left to read as a finished
  fold of 0 s; crossval.json's rewrite goes the same way (write_text)."""
  from tests.disk_full import fill_disk
  import ml_collections
  from sorjax.checks import WriteError
  monkeypatch.setattr("experiments.train.train_and_evaluate",
                      lambda cfg, wd: os.makedirs(wd, exist_ok=True))
  fill_disk(monkeypatch)
  cfg = ml_collections.ConfigDict({"data": {"folds": 2, "fold": 0}})
  with pytest.raises(WriteError, match=rf"cannot write .*fold_1/"
                     rf"{crossval.DONE}: No space left on device"):
    crossval.run_fold(cfg, 1, str(tmp_path))
  assert os.listdir(tmp_path / "fold_1") == []
