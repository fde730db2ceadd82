"""Metrics of a run: JSONL (for scripts) and TensorBoard event files.

TensorBoard files are written with tensorboardX: it is maintained, writes
the standard event format, and needs neither TensorFlow (flax.metrics and
clu's writers do) nor torch (torch.utils.tensorboard does).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Mapping

import numpy as np
from absl import logging

from sorjax.checks import write_error


def _scalar(v) -> float:
  v = np.asarray(v)
  if v.size != 1:
    raise ValueError(f"metric values must be scalars, got shape {v.shape}")
  return float(v.reshape(()))


class MetricWriter:
  """Appends scalars to `<workdir>/metrics.jsonl` and TensorBoard events.

  Each JSONL line is {"step": int, "split": str, "time": float, **scalars}.
  Appending makes a resumed run continue the same file.
  """

  def __init__(self, workdir: str, tensorboard: bool = True):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    # unbuffered: a line that fails to be written (a full disk) is not
    # kept in a buffer to be written, or fail again, at close
    self._file = open(self.path, "ab", buffering=0)
    self._tb, self._failed = None, False
    self._tb_dir = os.path.join(workdir, "tensorboard")
    if tensorboard:
      from tensorboardX import SummaryWriter  # only when wanted
      self._tb = SummaryWriter(self._tb_dir)

  def write(self, step: int, split: str, scalars: Mapping[str, float]):
    values = {k: _scalar(v) for k, v in scalars.items()}
    record = {"step": int(step), "split": split, "time": time.time(), **values}
    line = memoryview((json.dumps(record, allow_nan=True) + "\n").encode())
    try:
      while line:
        line = line[self._file.write(line):]
    except OSError as e:  # a full disk: the line may be cut short
      raise self._error(self.path, e) from None
    if self._tb is not None:
      try:
        for k, v in values.items():
          if math.isfinite(v):
            self._tb.add_scalar(f"{split}/{k}", v, int(step))
        self._tb.flush()
      except OSError as e:
        raise self._error(self._tb_dir, e) from None

  def _error(self, path: str, e: OSError):
    self._failed = True
    return write_error(
        f"cannot append to {path}: {e.strerror or e}; the run stops here "
        "and its checkpoints keep the last good state (rerunning the same "
        "command resumes from it)", e)

  def close(self):
    self._file.close()
    if self._tb is not None:
      try:
        self._tb.close()
      except OSError as e:  # once a write has failed: that error stands
        if not self._failed:
          raise self._error(self._tb_dir, e) from None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def read_metrics(workdir: str, split: str | None = None) -> list[dict]:
  """The records of `<workdir>/metrics.jsonl`, optionally of one split."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    raise FileNotFoundError(f"no metrics file {path}")
  with open(path, encoding="utf-8") as f:
    return [rec for _, rec in json_lines(path, f.readlines())
            if split is None or rec.get("split") == split]


def json_lines(path: str, lines: list[str], drop_cut_last: bool = False,
               remedy: str = ""):
  """(line, record) of each non-blank line of `lines` (those of `path`);
  a line that is not JSON is a ValueError naming `path:N` (then
  `remedy`). drop_cut_last: a last line without its newline, cut short
  by a write that stopped (a full disk), is dropped with a warning."""
  for i, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      yield line, json.loads(line)
    except json.JSONDecodeError as e:
      if drop_cut_last and i == len(lines) and not line.endswith("\n"):
        logging.warning("%s:%d: dropped a line cut short by the run that "
                        "wrote it: %r", path, i, line[:80])
        continue
      raise ValueError(f"{path}:{i}: not a JSON line ({e}){remedy}"
                       ) from None
