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
from sorjax.training.tasks.common import ConfigError
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
  # other values: the loop refuses to resume a fold under them
  with pytest.raises(ConfigError, match=r"fold_0 holds checkpoints trained "
                     r"with another config .*model.hidden_size: 8 -> 9"):
    crossval.crossval(_tiny(hidden_size=9), str(tmp_path))
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
  # fold 1 of another model would be averaged with fold 2: refused
  with pytest.raises(crossval.CrossvalError, match=r"fold_2 finished with "
                     r"another config: model.hidden_size: 8 -> 9"):
    crossval.crossval(_tiny(hidden_size=9), str(tmp_path), ["1"])
  longer = _tiny()
  longer.train.num_epochs = 3
  with pytest.raises(crossval.CrossvalError,
                     match=r"train.num_epochs: 2 -> 3"):
    crossval.crossval(longer, str(tmp_path), ["0"])


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
