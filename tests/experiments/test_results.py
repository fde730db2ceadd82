"""experiments.results: per-seed selection and spread against hand-written
metrics, with named errors."""

import json
import os

import numpy as np
import pytest

from experiments import results


def _write_metrics(path, records):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  config = os.path.join(path, "config.json")
  if not os.path.exists(config):   # a run's; {}: one before `selection`
    with open(config, "w") as f:
      f.write("{}")


def test_a_run_missing_or_damaging_its_files_is_a_results_error(tmp_path):
  # they were tracebacks out of reproduce, and a missing config.json was
  # read as selecting by the lowest loss (QA, session 41)
  _write_metrics(str(tmp_path), [{"step": 1, "split": "dev", "replica": 0,
                                  "loss": 1.0}])
  os.remove(tmp_path / "config.json")
  with pytest.raises(results.ResultsError, match=r"config.json is not a "
                     r"file \(the run's config\); remove .* to retrain"):
    results.per_replica(str(tmp_path))
  (tmp_path / "config.json").write_text("{}")
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 2, "spl')
  with pytest.raises(results.ResultsError, match=r"metrics.jsonl:2: not a "
                     r"JSON line .*; remove .* to retrain it"):
    results.per_replica(str(tmp_path))
  os.remove(tmp_path / "metrics.jsonl")
  with pytest.raises(results.ResultsError, match="no metrics file"):
    results.per_replica(str(tmp_path))


def test_per_replica_reports_test_at_the_best_dev_epoch(tmp_path):
  recs = []
  # replica 0: dev loss best at epoch 2; replica 1: best at epoch 1
  for step, epoch, dev0, dev1 in ((10, 1, 0.9, 0.5), (20, 2, 0.4, 0.7),
                                  (30, 3, 0.6, 0.8)):
    for r, dev in ((0, dev0), (1, dev1)):
      recs.append({"step": step, "split": "dev", "replica": r,
                   "epoch": epoch, "loss": dev, "time": 0.0})
      recs.append({"step": step, "split": "test", "replica": r,
                   "epoch": epoch, "loss": 10 * step + r, "wcpa": step / 100,
                   "time": 0.0})
  recs.append({"step": 5, "split": "train", "replica": 0, "loss": 0.0,
               "time": 0.0})
  _write_metrics(str(tmp_path), recs)
  rows = results.per_replica(str(tmp_path))
  assert [r["step"] for r in rows] == [20, 10]
  assert [r["loss"] for r in rows] == [200, 101]
  assert [r["wcpa"] for r in rows] == [0.2, 0.1]
  assert [r["best_epoch"] for r in rows] == [2, 1]
  assert [r["epochs_run"] for r in rows] == [3, 3]


def test_per_replica_follows_the_runs_selection(tmp_path):
  """A run that selected on dev accuracy (Le & Zuidema) reports test at the
  epoch of the highest dev accuracy, not of the lowest dev loss."""
  recs = []
  for step, loss, acc in ((10, 0.9, 0.3), (20, 0.7, 0.8), (30, 0.5, 0.6)):
    recs.append({"step": step, "split": "dev", "replica": 0,
                 "epoch": step // 10, "loss": loss, "accuracy": acc})
    recs.append({"step": step, "split": "test", "replica": 0,
                 "epoch": step // 10, "loss": 1.0, "accuracy": step / 100})
  _write_metrics(str(tmp_path), recs)
  assert results.per_replica(str(tmp_path))[0]["step"] == 30  # no config
  (tmp_path / "config.json").write_text(
      '{"selection": {"metric": "accuracy", "mode": "max"}}')
  (row,) = results.per_replica(str(tmp_path))
  assert (row["step"], row["accuracy"], row["best_epoch"]) == (20, 0.2, 2)
  (tmp_path / "config.json").write_text(
      '{"selection": {"metric": "wcpa", "mode": "max"}}')
  with pytest.raises(results.ResultsError,
                     match="the 'dev' records lack 'wcpa', the run's "
                     "selection.metric"):
    results.per_replica(str(tmp_path))


def test_per_replica_names_a_missing_test_record(tmp_path):
  _write_metrics(str(tmp_path), [
      {"step": 10, "split": "dev", "replica": 0, "epoch": 1, "loss": 1.0}])
  with pytest.raises(results.ResultsError,
                     match=r"metrics.jsonl: no 'test' record at step 10"):
    results.per_replica(str(tmp_path))


def test_per_replica_selects_on_valid_for_language_models(tmp_path):
  recs = []
  for step, valid, test in ((10, 2.0, 5.0), (20, 1.5, 4.0), (30, 1.7, 3.0)):
    recs.append({"step": step, "split": "valid", "replica": 0,
                 "epoch": step // 10, "loss": valid})
    recs.append({"step": step, "split": "test", "replica": 0,
                 "epoch": step // 10, "loss": test, "perplexity": 2 * test})
  _write_metrics(str(tmp_path), recs)
  (row,) = results.per_replica(str(tmp_path))
  assert (row["step"], row["loss"], row["perplexity"]) == (20, 4.0, 8.0)
  with pytest.raises(results.ResultsError, match="no 'dev' records"):
    results.per_replica(str(tmp_path), select="dev")


def test_stats_are_mean_and_sample_sd():
  s = results.stats([1.0, 2.0, 4.0])
  assert s["mean"] == pytest.approx(7 / 3)
  assert s["std"] == pytest.approx(np.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3)
                                            ** 2 + (4 - 7 / 3) ** 2) / 2))
  assert (s["min"], s["max"], s["n"]) == (1.0, 4.0, 3)
  assert results.stats([3.0])["std"] == 0.0
