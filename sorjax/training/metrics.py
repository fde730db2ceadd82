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
    self._file = open(self.path, "a", encoding="utf-8")
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter  # only when wanted
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, split: str, scalars: Mapping[str, float]):
    values = {k: _scalar(v) for k, v in scalars.items()}
    record = {"step": int(step), "split": split, "time": time.time(), **values}
    self._file.write(json.dumps(
        record, allow_nan=True) + "\n")
    self._file.flush()
    if self._tb is not None:
      for k, v in values.items():
        if math.isfinite(v):
          self._tb.add_scalar(f"{split}/{k}", v, int(step))
      self._tb.flush()

  def close(self):
    self._file.close()
    if self._tb is not None:
      self._tb.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def read_metrics(workdir: str, split: str | None = None) -> list[dict]:
  """The records of `<workdir>/metrics.jsonl`, optionally of one split."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    raise FileNotFoundError(f"no metrics file {path}")
  out = []
  with open(path, encoding="utf-8") as f:
    for i, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{i}: not a JSON line ({e})") from None
      if split is None or rec.get("split") == split:
        out.append(rec)
  return out
