import glob
import os

import numpy as np
import pytest

from sorjax.training.metrics import MetricWriter, read_metrics


def test_jsonl_and_tensorboard_files(tmp_path):
  with MetricWriter(str(tmp_path)) as w:
    w.write(1, "train", {"loss": np.float32(2.5), "tokens_per_s": 100})
    w.write(2, "valid", {"loss": 2.0})
  with MetricWriter(str(tmp_path), tensorboard=False) as w:  # resumed run appends
    w.write(3, "train", {"loss": 1.5})
  recs = read_metrics(str(tmp_path))
  assert [(r["step"], r["split"], r["loss"]) for r in recs] == [
      (1, "train", 2.5), (2, "valid", 2.0), (3, "train", 1.5)]
  assert read_metrics(str(tmp_path), "valid")[0]["loss"] == 2.0
  events = glob.glob(os.path.join(tmp_path, "tensorboard", "events.out.tfevents.*"))
  assert events and os.path.getsize(events[0]) > 0


def test_bad_values_and_lines_are_named(tmp_path):
  with MetricWriter(str(tmp_path), tensorboard=False) as w:
    with pytest.raises(ValueError, match="scalars"):
      w.write(1, "train", {"loss": np.ones(3)})
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write("{broken\n")
  with pytest.raises(ValueError, match="metrics.jsonl:1"):
    read_metrics(str(tmp_path))
  with pytest.raises(FileNotFoundError):
    read_metrics(str(tmp_path / "nope"))
