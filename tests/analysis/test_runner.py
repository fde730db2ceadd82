"""The analysis registry: names, option errors, JSON output."""

import json
import math
import types

import numpy as np
import pytest

from sorjax.analysis import runner, traces
from sorjax.analysis.common import (AnalysisError, default_out, jsonable,
                                    write_json)
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


def test_minimal_pairs_progress_goes_to_stderr_when_asked(tmp_path, capsys):
  """analyze passes progress=True: the two runs' four sentences, at the
  end; without it the analysis prints nothing."""
  run, other = _BigramRun(), _BigramRun(seed=3)
  for progress in (False, True):
    runner.run_analyses(run, "minimal_pairs", str(tmp_path / "out"),
                        pairs=(_pairs_file(tmp_path),), compare=other,
                        progress=progress)
    err = capsys.readouterr().err
    assert (err.startswith("minimal_pairs: 4 of 4 sentences (100%), ")
            if progress else err == "")
  # not an input that the analyses named must read
  runner.run_analyses(run, "token_losses", str(tmp_path / "out"),
                      sentence="the cat", progress=True)


def test_a_workdir_given_for_a_run_is_named(tmp_path):
  with pytest.raises(AnalysisError, match="compare must be a run "
                     r"\(sorjax.restore\(workdir\)\), got str '/some/run'"):
    runner.run_analyses(_BigramRun(), "token_losses", str(tmp_path),
                        sentence="the cat", compare="/some/run")
  with pytest.raises(AnalysisError, match="run must be a run"):
    runner.run_analyses("/some/run", "perplexity", str(tmp_path))


def _pairs_file(tmp_path):
  return _write(tmp_path / "p.jsonl", [
      {"sentence_good": "the cat sleeps", "sentence_bad": "the cat sleep",
       "UID": "agr"}])


@pytest.mark.parametrize("tau", [0.0, -1.0, math.nan, math.inf])
def test_a_temperature_that_is_not_finite_and_positive_is_refused(
    tmp_path, tau):
  with pytest.raises(ValueError, match=r"--temperature: temperature must be "
                     r"a finite number > 0"):
    runner.run_analyses(_BigramRun(), ["token_losses"], str(tmp_path / "o"),
                        sentence="the cat", temperature=tau)
  assert not (tmp_path / "o").exists()


def test_the_temperature_applies_to_both_runs_and_is_recorded(tmp_path):
  run, other = _BigramRun(), _BigramRun(seed=3)
  out = runner.run_analyses(run, ["token_losses"], str(tmp_path),
                            sentence="the cat", compare=other,
                            temperature=2.0)
  with open(out["token_losses"][0]) as f:
    res = json.load(f)
  ids = np.array([0, 2, 3])             # <eos> the cat
  for r, got in zip((run, other), res["results"]):
    lp = r.log_probs(ids, temperature=2.0)[np.arange(2), ids[1:]]
    np.testing.assert_allclose(got["log_probs"], lp)
  assert res["source"] == {
      "analysis": "token_losses", "workdir": "/fake/ptb", "step": 7,
      "replica": 0, "checkpoint": None, "temperature": 2.0,
      "sentence": "the cat",
      "compare": {"workdir": "/fake/ptb", "step": 7, "replica": 0,
                  "checkpoint": None, "temperature": 2.0}}


@pytest.mark.parametrize("option", ["max_tokens", "max_sequences",
                                    "max_trees", "num_resamples"])
def test_non_positive_limits_are_refused(tmp_path, option):
  with pytest.raises(AnalysisError, match=f"--{option} must be >= 1, got 0"):
    runner.run_analyses(_BigramRun(), ["perplexity"], str(tmp_path),
                        **{option: 0})


def test_options_no_chosen_analysis_reads_are_refused(tmp_path):
  run = _BigramRun()
  with pytest.raises(AnalysisError, match="--pairs is read by minimal_pairs; "
                     "not by token_losses"):
    runner.run_analyses(run, ["token_losses"], str(tmp_path),
                        sentence="the cat", pairs=(_pairs_file(tmp_path),))
  with pytest.raises(AnalysisError, match="--compare is read by perplexity, "
                     "frequency, minimal_pairs, token_losses; not by ldpa"):
    runner.run_analyses(run, ["ldpa"], str(tmp_path), compare=_BigramRun())
  with pytest.raises(AnalysisError, match="--sentence is read by "
                     "attention_heatmap, token_losses; not by minimal_pairs"):
    runner.run_analyses(run, ["minimal_pairs"], str(tmp_path),
                        pairs=(_pairs_file(tmp_path),), sentence="x")
  with pytest.raises(AnalysisError, match="--compare_step is read by "
                     "perplexity, "):                # a flag's given names
    runner.run_analyses(run, ["word_position"], str(tmp_path),
                        given=["compare_step"])


def test_every_analysis_is_checked_before_any_writes(tmp_path):
  out = tmp_path / "out"
  with pytest.raises(AnalysisError, match="give --sentence"):
    runner.run_analyses(_BigramRun(), "minimal_pairs,token_losses", str(out),
                        pairs=(_pairs_file(tmp_path),))
  assert not out.exists()


def test_runs_of_other_data_cannot_be_compared(tmp_path):
  chars = _BigramRun(["<eos>", "_", "t", "h", "e", "c", "a"],
                     corpus="ptb_char", unk=None)
  with pytest.raises(AnalysisError, match=r"--compare: token_losses cannot "
                     r"compare runs of another task or data: /fake/ptb has "
                     r"task 'lm', data.corpus 'ptb', /fake/ptb_char has task "
                     r"'lm', data.corpus 'ptb_char'"):
    runner.run_analyses(_BigramRun(), ["token_losses"], str(tmp_path / "o"),
                        sentence="the cat", compare=chars)
  assert not (tmp_path / "o").exists()


def test_runs_of_lines_and_of_streams_or_of_other_folds_are_not_compared(
    tmp_path):
  """data.documents and the fold change what a split holds; a run saved
  before those fields existed reads as streams of the corpus's splits."""
  old, streams = _BigramRun(), _BigramRun()
  streams.config.data.documents, streams.config.data.folds = False, None
  lines = _BigramRun()
  lines.config.data.documents = True
  runner.run_analyses(old, ["token_losses"], str(tmp_path / "a"),
                      sentence="the cat", compare=streams)
  with pytest.raises(AnalysisError, match=r"/fake/ptb has task 'lm', "
                     r"data.documents False, /fake/ptb has task 'lm', "
                     r"data.documents True"):
    runner.run_analyses(streams, ["token_losses"], str(tmp_path / "b"),
                        sentence="the cat", compare=lines)
  fold1 = _BigramRun()
  fold1.config.data.folds, fold1.config.data.fold = 5, 1
  with pytest.raises(AnalysisError, match=r"data.folds None, data.fold 0, "
                     r".* data.folds 5, data.fold 1"):
    runner.run_analyses(old, ["perplexity"], str(tmp_path / "c"),
                        compare=fold1)


def test_a_misspelt_category_field_and_an_out_file_are_refused(tmp_path):
  pairs = (_pairs_file(tmp_path),)
  with pytest.raises(ValueError, match="has the category field 'UIDX'; "
                     r"their fields are \['UID', "):
    runner.run_analyses(_BigramRun(), ["minimal_pairs"], str(tmp_path),
                        pairs=pairs, category_field="UIDX")
  (tmp_path / "afile").write_text("")
  with pytest.raises(AnalysisError, match=r"--out .*afile is a file, not a "
                     "directory"):
    runner.run_analyses(_BigramRun(), ["minimal_pairs"],
                        str(tmp_path / "afile"), pairs=pairs)


def test_trace_batches_refuse_non_positive_limits():
  task = types.SimpleNamespace(name="lm")
  with pytest.raises(ValueError, match="--max_tokens must be >= 1, got 0"):
    next(traces.batches(task, "test", max_tokens=0))
  with pytest.raises(ValueError, match="--max_sequences must be >= 1, got -2"):
    next(traces.batches(task, "test", max_sequences=-2))


def test_the_default_out_is_named_for_the_checkpoint_and_replica():
  def run(checkpoint, replica=0, step=300):
    return types.SimpleNamespace(workdir="/w", checkpoint=checkpoint,
                                 replica=replica, step=step)
  assert default_out(run("best")) == "/w/analysis"
  assert default_out(run("latest")) == "/w/analysis/latest"
  assert default_out(run(None)) == "/w/analysis/step_300"
  assert default_out(run("best", 2)) == "/w/analysis/replica_2"
  assert default_out(run("latest", 1)) == (
      "/w/analysis/latest-replica_1")


def test_results_of_other_inputs_are_not_replaced(tmp_path):
  """Another replica, or another compared run, in the same --out would
  replace the results silently: refused before anything runs; the same
  inputs again replace them."""
  run, other = _BigramRun(), _BigramRun(seed=3)
  out = str(tmp_path / "out")
  runner.run_analyses(run, ["token_losses"], out, sentence="the cat")
  first = (tmp_path / "out" / "token_losses.json").read_text()
  runner.run_analyses(run, ["token_losses"], out, sentence="the cat")
  assert (tmp_path / "out" / "token_losses.json").read_text() == first
  seed = _BigramRun(seed=3)
  seed.replica = 1
  with pytest.raises(AnalysisError, match=r"token_losses.json holds "
                     r"token_losses results of other inputs \(replica 0 -> "
                     r"1\): give another --out to keep both, or delete it"):
    runner.run_analyses(seed, ["token_losses"], out, sentence="the cat")
  with pytest.raises(AnalysisError, match=r"compare workdir None -> "
                     r"'/fake/ptb'; compare replica None -> 0"):
    runner.run_analyses(run, ["token_losses"], out, sentence="the cat",
                        compare=other)
  # another sentence, temperature or checkpoint is another input too (they
  # replaced the results silently; QA, session 41)
  with pytest.raises(AnalysisError, match=r"sentence 'the cat' -> 'a dog'"):
    runner.run_analyses(run, ["token_losses"], out, sentence="a dog")
  with pytest.raises(AnalysisError, match=r"temperature 1.0 -> 2.0"):
    runner.run_analyses(run, ["token_losses"], out, sentence="the cat",
                        temperature=2.0)
  latest = _BigramRun()
  latest.checkpoint = "latest"
  with pytest.raises(AnalysisError, match=r"checkpoint None -> 'latest'"):
    runner.run_analyses(latest, ["token_losses"], out, sentence="the cat")
  assert (tmp_path / "out" / "token_losses.json").read_text() == first


def test_an_out_inside_the_runs_checkpoints_is_refused(tmp_path):
  run = _BigramRun()
  run.workdir = str(tmp_path)
  for inside in ("best/8", "checkpoints", "checkpoints/4/x"):
    with pytest.raises(AnalysisError, match=r"is inside the run's "
                       r"(best|checkpoints)/ folder, whose steps training "
                       r"deletes"):
      runner.run_analyses(run, ["token_losses"], str(tmp_path / inside),
                          sentence="the cat")
  assert not (tmp_path / "best").exists()


def test_a_negative_seed_and_limits_no_analysis_reads_are_refused(tmp_path):
  run = _BigramRun()
  with pytest.raises(AnalysisError, match="--seed must be >= 0, got -1"):
    runner.run_analyses(run, ["frequency"], str(tmp_path), seed=-1,
                        compare=_BigramRun(seed=3))
  with pytest.raises(AnalysisError, match=r"--max_sequences: timescales "
                     r"reads this LM run's stream by tokens: give "
                     r"--max_tokens"):
    runner.run_analyses(run, ["timescales"], str(tmp_path), max_sequences=3)
  dyck = types.SimpleNamespace(task=types.SimpleNamespace(name="dyck_pcfg"),
                               workdir="/fake")
  with pytest.raises(AnalysisError, match=r"--max_tokens bounds an LM "
                     r"split's tokens; word_ablation reads this 'dyck_pcfg' "
                     r"run's split by sequences"):
    runner.run_analyses(dyck, ["word_ablation"], str(tmp_path),
                        max_tokens=30)
  assert not list(tmp_path.iterdir())


def test_a_failed_rewrite_keeps_the_earlier_result_and_names_the_file(
    tmp_path, monkeypatch):
  """A full disk while an analysis rewrites its results: the earlier JSON
  and figure stay whole (a figure was written in place, and cut short),
  no temporary file is left, and the error names the file."""
  from tests.disk_full import fill_disk, no_space
  import os
  from matplotlib.figure import Figure
  from sorjax.analysis import common
  js, png = str(tmp_path / "a.json"), str(tmp_path / "a.png")
  write_json(js, {"x": 1})
  fig, ax = common.figure()
  ax[0, 0].plot([0, 1])
  common.save(fig, png)
  before = {p: open(p, "rb").read() for p in (js, png)}

  def torn_savefig(self, fname, **kwargs):
    with open(fname, "wb") as f:
      f.write(b"\x89PNG")
    raise no_space()

  monkeypatch.setattr(Figure, "savefig", torn_savefig)
  with pytest.raises(OSError, match=rf"cannot write {png} \(its earlier "
                     r"version is kept\): No space left on device"):
    common.save(fig, png)

  fill_disk(monkeypatch)
  with pytest.raises(OSError, match=rf"cannot write {js} \(its earlier "
                     r"version is kept\): No space left on device"):
    write_json(js, {"x": 2})
  monkeypatch.undo()
  assert {p: open(p, "rb").read() for p in (js, png)} == before
  assert sorted(os.listdir(tmp_path)) == ["a.json", "a.png"]
