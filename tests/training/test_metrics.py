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


class _FullDisk:
  """A file whose writes stop after `room` bytes, as on a full disk."""

  def __init__(self, f, room):
    self.f, self.room = f, room

  def write(self, data):
    if not self.room:
      raise OSError(28, "No space left on device")
    n = min(len(data), self.room)
    self.room -= n
    return self.f.write(bytes(data[:n]))

  def close(self):
    self.f.close()


def test_a_full_disk_is_named_and_leaves_nothing_to_fail_at_close(tmp_path):
  """A line cut short by a full disk: a WriteError naming metrics.jsonl,
  and the writer closes cleanly (a buffered writer kept the rest of the
  line and failed again, unnamed, when the loop closed it)."""
  from sorjax.checks import WriteError
  w = MetricWriter(str(tmp_path), tensorboard=False)
  w.write(1, "train", {"loss": 2.5})
  w._file = _FullDisk(w._file, 20)
  with pytest.raises(WriteError, match=r"cannot append to .*metrics.jsonl: "
                     r"No space left on device; the run stops here"):
    w.write(2, "train", {"loss": 2.0})
  w.close()
  text = (tmp_path / "metrics.jsonl").read_text()
  assert text.count("\n") == 1 and len(text.splitlines()[1]) == 20


def test_a_full_disk_under_tensorboard_is_named_and_raised_once(tmp_path):
  """TensorBoard's event file on a full disk: its bare OSError, raised
  again by close (in the loop's `finally`, in place of the first), is a
  WriteError naming the folder, and close leaves it at that."""
  from sorjax.checks import WriteError
  w = MetricWriter(str(tmp_path))
  w.write(1, "train", {"loss": 2.5})

  def full():
    raise OSError(28, "No space left on device")
  w._tb.flush = w._tb.close = full
  with pytest.raises(WriteError, match=r"cannot append to .*tensorboard: "
                     r"No space left on device; the run stops here"):
    w.write(2, "train", {"loss": 2.0})
  w.close()
