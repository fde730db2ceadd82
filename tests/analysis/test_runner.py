"""The analysis registry: names, option errors, JSON output."""

import json
import math

import numpy as np
import pytest

from sorjax.analysis import runner
from sorjax.analysis.common import AnalysisError, jsonable, write_json
from tests.analysis.test_minimal_pairs import _BigramRun, _write


def test_json_output_is_plain_and_strict(tmp_path):
  obj = {1: np.arange(3), "x": (np.float32(0.5), math.inf, np.nan),
         "ok": np.bool_(True), "n": np.int64(7)}
  assert jsonable(obj) == {"1": [0, 1, 2], "x": [0.5, None, None],
                           "ok": True, "n": 7}
  path = write_json(str(tmp_path / "a.json"), obj)
  with open(path) as f:
    assert json.load(f)["x"] == [0.5, None, None]


def test_unknown_analyses_and_missing_inputs_are_errors(tmp_path):
  run = _BigramRun()
  with pytest.raises(AnalysisError, match=r"unknown analyses \['ldpaa'\]; "
                     r"known: perplexity, ldpa"):
    runner.run_analyses(run, "perplexity,ldpaa", str(tmp_path))
  with pytest.raises(AnalysisError, match="give --pairs"):
    runner.run_analyses(run, ["minimal_pairs"], str(tmp_path))
  with pytest.raises(AnalysisError, match="give --sentence"):
    runner.run_analyses(run, ["token_losses"], str(tmp_path))
  assert sorted(runner.names()) == sorted(runner.ANALYSES)


def test_minimal_pairs_and_token_losses_write_their_files(tmp_path):
  pairs = _write(tmp_path / "p.jsonl", [
      {"sentence_good": "the cat sleeps", "sentence_bad": "the cat sleep",
       "UID": "agr"}])
  run, other = _BigramRun(), _BigramRun(seed=3)
  out = runner.run_analyses(run, "minimal_pairs,token_losses",
                            str(tmp_path / "out"), pairs=(pairs,),
                            sentence="the cats sleep", compare=other,
                            labels=("a", "b"))
  for paths in out.values():
    for p in paths:
      assert (tmp_path / "out" / p.split("/")[-1]).stat().st_size > 0
  with open(out["minimal_pairs"][0]) as f:
    res = json.load(f)
  assert [r["categories"]["agr"]["pairs"] for r in res["results"]] == [1, 1]
