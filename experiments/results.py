"""What a finished run's metrics say: per replica, the test metrics at the
epoch its selection chose, and their spread (shared by experiments.reproduce
and experiments.crossval).

    rows = per_replica("runs/x")           # one dict per replica
    summarise(rows, ("loss", "bits_per_char"))
    fold_stats([replica_means(rows_f, names) for rows_f in folds], names)
"""

from __future__ import annotations

import os

import numpy as np


class ResultsError(ValueError):
  """A run directory whose metrics cannot give the asked-for result."""


def _selection(wd: str) -> tuple[str, str]:
  """(metric, mode) the run in `wd` selected its best checkpoint by: its
  config.json's selection (("loss", "min") for a config written before
  selection existed); a run without config.json is a ResultsError, not
  read by a guess (Le & Zuidema's runs select by accuracy)."""
  from sorjax.runs import read_config_json
  from sorjax.training.optim import selection_of
  path = os.path.join(wd, "config.json")
  try:
    return selection_of(read_config_json(path))
  except ValueError as e:
    raise ResultsError(f"{e} (the run's config); remove {wd} to retrain "
                       "it") from None


def per_replica(wd: str, select: str | None = None, report: str = "test"
                ) -> list[dict]:
  """Per replica: the `report` split's metrics at the epoch whose `select`
  split (default: the "dev" or "valid" split) was best by the run's
  selection (config.json's selection.metric / mode: the lowest loss unless
  the run chose otherwise, as Le & Zuidema's highest dev accuracy), with
  that epoch (`best_epoch`) and the epochs run."""
  from sorjax.training.metrics import read_metrics
  metric, mode = _selection(wd)
  try:
    recs = read_metrics(wd)
  except (OSError, ValueError) as e:   # missing, or a damaged line
    raise ResultsError(f"{e}; remove {wd} to retrain it") from None
  splits = {r["split"] for r in recs}
  if select is None:
    select = next((s for s in ("dev", "valid") if s in splits), "dev")
  if select not in splits:
    raise ResultsError(f"{wd}/metrics.jsonl: no {select!r} records "
                         f"(splits: {sorted(splits)})")
  out = []
  replicas = sorted({int(r["replica"]) for r in recs if r["split"] == select})
  for r in replicas:
    sel = [x for x in recs if x["split"] == select and x["replica"] == r]
    if any(metric not in x for x in sel):
      raise ResultsError(f"{wd}/metrics.jsonl: the {select!r} records lack "
                           f"{metric!r}, the run's selection.metric")
    best = (min if mode == "min" else max)(sel, key=lambda x: x[metric])
    rep = [x for x in recs if x["split"] == report and x["replica"] == r
           and x["step"] == best["step"]]
    if not rep:
      raise ResultsError(f"{wd}/metrics.jsonl: no {report!r} record at "
                           f"step {best['step']} (replica {r})")
    row = {k: v for k, v in rep[-1].items()
           if k not in ("split", "time", "replica", "temperature")}
    row.update(best_epoch=int(best["epoch"]),
               epochs_run=int(max(x["epoch"] for x in sel)))
    out.append(row)
  return out


def stats(values) -> dict:
  """Mean, sample standard deviation, min and max over seeds."""
  v = np.asarray([float(x) for x in values], np.float64)
  return {"mean": float(v.mean()),
          "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
          "min": float(v.min()), "max": float(v.max()), "n": int(v.size),
          "values": v.tolist()}


def summarise(rows: list[dict], keys) -> dict:
  return {k: stats([r[k] for r in rows]) for k in keys if k in rows[0]}


def replica_means(rows: list[dict], names) -> dict:
  """Each of `names` that the rows have, averaged over the replicas."""
  return {n: float(np.mean([r[n] for r in rows])) for n in names
          if n in rows[0]}


def fold_stats(means: list[dict], names) -> dict:
  """Over folds (one dict of replica means each), the stats of each of
  `names` that every fold has."""
  return {n: stats([m[n] for m in means]) for n in names
          if all(n in m for m in means)}


if __name__ == "__main__":
  raise SystemExit("experiments.results is a library (experiments.reproduce "
                   "and experiments.crossval read runs with it); it has no "
                   "command line")
