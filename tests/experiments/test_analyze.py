"""End to end: tiny trained runs, restored from their work directories,
through every analysis (files exist and are non-empty) and the absl binary;
analyses of the wrong run type fail with a clear error."""

import gzip
import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import sorjax
from experiments import train
from experiments.configs import common
from sorjax.analysis import perplexity, runner, traces
from sorjax.analysis.common import AnalysisError
from tests.experiments import tiny_dyck, tiny_trees

# four tiny trainings, about 2 CPU-minutes, on one worker (--dist loadgroup)
pytestmark = [pytest.mark.slow,
              pytest.mark.xdist_group("experiments.test_analyze")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _train(cfg, workdir):
  with jax.numpy_dtype_promotion("standard"):
    train.train_and_evaluate(cfg, str(workdir))
  return str(workdir)


def _quick(cfg, epochs=1):
  cfg.train.num_epochs = epochs
  cfg.train.log_every = 100
  cfg.train.checkpoint_every = 1000
  cfg.train.tensorboard = False
  return cfg


def _files_ok(written):
  for paths in written.values():
    for p in paths:
      assert os.path.getsize(p) > 0, p


@pytest.fixture(scope="module")
def dyck_run(tmp_path_factory):
  cfg = tiny_dyck.get_config()
  cfg.model.cell = "attention_lstm"
  cfg.model.num_cells = 2
  cfg.model.intermediate_size = None
  cfg.temperature.decay = 0.5
  cfg.data.num_buckets = 1  # one batch shape: one train step to compile
  cfg.num_replicas = 2      # the command line compares them
  return _train(_quick(cfg), tmp_path_factory.mktemp("dyck"))


@pytest.fixture(scope="module")
def dyck_cli(dyck_run):
  """One run of the analysis binary over the Dyck run's replica 0, with
  --compare of its replica 1 (read by perplexity): its output serves the
  command-line test and the --compare_replica test (each process costs
  seconds of imports and restores)."""
  return subprocess.run(
      [sys.executable, "-m", "experiments.analyze", f"--workdir={dyck_run}",
       "--analyses=perplexity,ldpa,principal_angles,attention_heatmap",
       f"--compare={dyck_run}", "--compare_replica=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def pcfg_run(tmp_path_factory):
  cfg = common.config(
      "dyck_pcfg", common.pcfg_data(preset="suzgun", scale=0.005,
                                    batch_size=16, eval_batch_size=32,
                                    num_buckets=1),   # one step to compile
      layers=({"cell": "mts_lstm", "hidden_size": 8,
               "timescales": ("inverse_gamma", 1.5)},
              {"cell": "lstm", "hidden_size": 6}), embed_size=6)
  cfg.optim.learning_rate = 1e-2
  return _train(_quick(cfg), tmp_path_factory.mktemp("pcfg"))


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory, shared_data):
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("SORJAX_DATA_DIR", shared_data)
    yield str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory, tfds_dir):
  """A character LM of one mts_lstm layer and two replicas: one run
  serves every LM analysis (the PCFG run has the two-layer model). Its
  corpus is Tiny Shakespeare, a fifth of Maupome & Meurs' PTB (which
  tests/data/test_corpora reads) and quicker to prepare. Its train tokens
  make 8 streams of 12 whole windows of 20 (8 x (12 x 20 + 1)): no shorter
  last window, so one train step to compile."""
  cfg = common.config(
      "lm", common.lm_data(corpus="tinyshakespeare", data_dir=tfds_dir,
                           batch_size=8, bptt=20, eval_batch_size=4,
                           eval_bptt=40, max_train_tokens=8 * 241,
                           max_eval_tokens=2000),
      layers=({"cell": "mts_lstm", "hidden_size": 12,
               "timescales": ("groups", (("constant", 3.0, 6),
                                         ("inverse_gamma", 0.56, 6)))},),
      embed_size=8)
  cfg.num_replicas = 2
  cfg.optim.learning_rate = 1e-2
  return _train(_quick(cfg), tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="module")
def tree_run(tmp_path_factory):
  cfg = tiny_trees.get_config()
  cfg.data.scale = 0.01
  cfg.data.batch_size = 10
  cfg.train.keep_checkpoints = 10
  return _train(_quick(cfg, epochs=2), tmp_path_factory.mktemp("trees"))


def test_dyck_analyses_from_the_command_line(dyck_run, dyck_cli):
  res = dyck_cli
  assert res.returncode == 0, res.stderr[-3000:]
  out = os.path.join(dyck_run, "analysis")
  for name in ("perplexity.json", "ldpa.json", "ldpa.png",
               "principal_angles.json", "principal_angles.png",
               "attention_heatmap.json", "attention_heatmap.html",
               "attention_heatmap.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0, name
    assert os.path.join(out, name) in res.stdout
  with open(os.path.join(out, "perplexity.json")) as f:
    ppl = json.load(f)["run"]
  assert ppl["perplexity_ratio"] == pytest.approx(
      ppl["perplexity"] / ppl["oracle_perplexity"])
  # by definition from the cross-entropy in nats
  assert ppl["perplexity"] == pytest.approx(math.exp(ppl["cross_entropy"]))
  assert ppl["bits_per_symbol"] == pytest.approx(
      ppl["cross_entropy"] / math.log(2))
  with open(os.path.join(out, "principal_angles.json")) as f:
    angles = json.load(f)["layers"]["0"]["degrees"]["0-1"]
  assert len(angles) == 12 and 0 < min(angles) <= max(angles) <= 90


def test_wrong_run_types_are_clear_errors(dyck_run, tmp_path):
  run = sorjax.restore(dyck_run)
  for name, msg in (("timescales", r"timescales: needs a layer of lstm or "
                     r"mts_lstm for its forget gates; this model's cells are "
                     r"\['attention_lstm'\]"),
                    ("gradient_ratio", "needs a 'trees' run; this run's "
                     "task is 'dyck_lm'"),
                    ("frequency", "needs a 'lm' run"),
                    ("pcfg_timescales", "needs a 'dyck_pcfg' run"),
                    ("word_position", "needs a 'lm' run"),
                    ("minimal_pairs", "needs a 'lm' run")):
    with pytest.raises(AnalysisError, match=msg):
      runner.run_analyses(run, [name], str(tmp_path), pairs=())


def test_a_config_json_edited_after_training_is_refused(dyck_run, tmp_path):
  """restore rebuilds the model from config.json: an edit that keeps the
  arrays' shapes loaded the weights into another model silently (QA,
  session 41). Fields a resume may change may differ."""
  import shutil
  copy = str(tmp_path / "run")
  shutil.copytree(dyck_run, copy)
  path = os.path.join(copy, "config.json")
  with open(path) as f:
    original = json.load(f)

  def restore_with(edit):
    cfg = json.loads(json.dumps(original))
    edit(cfg)
    with open(path, "w") as f:
      json.dump(cfg, f)
    return sorjax.restore(copy)

  with pytest.raises(ValueError, match=r"config.json differs from the config "
                     r"checkpoint \d+ was trained with: model.embedding_"
                     r"dropout: 0.0 -> 0.5; model.hiden_size: '\(absent\)' "
                     r"-> 4 \(trained -> config.json\)"):
    restore_with(lambda c: c["model"].update(embedding_dropout=0.5,
                                             hiden_size=4))
  run = restore_with(lambda c: c["train"].update(num_epochs=99))
  assert run.config.train.num_epochs == 99


def test_pcfg_and_timescale_analyses(pcfg_run):
  run = sorjax.restore(pcfg_run)
  written = runner.run_analyses(
      run, "pcfg_timescales,timescales,forget_heatmap,word_ablation")
  _files_ok(written)
  with open(written["timescales"][0]) as f:
    res = json.load(f)
  assert set(res["layers"]) == {"0", "1"}
  mts = res["layers"]["0"]
  assert mts["cell"] == "mts_lstm" and mts["reference"] == "assigned"
  assert len(mts["T_est"]) == 8 and res["ks"]["units"] > 0
  with pytest.raises(AnalysisError, match="needs a layer of attention_lstm"):
    runner.run_analyses(run, ["principal_angles"])


def test_lm_analyses(lm_run, shared_data, tmp_path):
  run = sorjax.restore(lm_run)
  pairs = tmp_path / "pairs.jsonl"
  with gzip.open(os.path.join(shared_data, "blimp",
                              "anaphor_gender_agreement.jsonl.gz"), "rt") as f:
    pairs.write_text("".join(next(f) for _ in range(20)))
  written = runner.run_analyses(
      run, "perplexity,frequency,timescales,forget_heatmap,minimal_pairs,"
      "token_losses,word_position", compare=run.with_replica(1),
      labels=("replica 0", "replica 1"), pairs=(str(pairs),),
      num_resamples=300, max_tokens=400,
      sentence="The authors that no security guards like will ever be famous")
  _files_ok(written)
  with open(written["perplexity"][0]) as f:
    ppl = json.load(f)
  assert ppl["run"]["bits_per_char"] == pytest.approx(
      ppl["run"]["cross_entropy"] / np.log(2))
  assert ppl["other"]["perplexity"] != ppl["run"]["perplexity"]
  with open(written["frequency"][0]) as f:
    freq = json.load(f)
  assert freq["a"]["all tokens"]["tokens"] == 1996    # 4 streams x 499
  assert freq["bootstrap"]["num_chunks"] == 20
  assert freq["bootstrap"]["bins"]["all tokens"]["ci"][0] is not None
  with open(written["minimal_pairs"][0]) as f:
    mp = json.load(f)["results"]
  assert [r["pairs"] for r in mp] == [20, 20]
  assert set(mp[0]["categories"]) == {"anaphor_gender_agreement"}
  with open(written["timescales"][0]) as f:
    ts = json.load(f)
  assert ts["steps"] == 4 * 99          # max_tokens=400: 4 streams of 100
  assert ts["layers"]["0"]["reference"] == "assigned"
  with open(written["word_position"][0]) as f:
    pos = json.load(f)
  assert pos["overall"]["count"] == 1996 and pos["count"][0] > 0
  # The jitted batch scorer equals Run.log_probs of the sentence alone.
  with open(written["token_losses"][0]) as f:
    got = json.load(f)["results"][0]
  ids = np.concatenate([[run.vocab.eos_id],
                        [run.vocab.id(s) for s in got["symbols"]]])
  lp = run.log_probs(ids.astype(np.int32))
  np.testing.assert_allclose(got["log_probs"], lp[np.arange(len(ids) - 1),
                                                  ids[1:]], rtol=1e-5)


def test_tree_gradient_ratio_per_epoch(tree_run):
  run = sorjax.restore(tree_run)
  written = runner.run_analyses(run, ["gradient_ratio"], max_trees=40)
  _files_ok(written)
  with open(written["gradient_ratio"][0]) as f:
    res = json.load(f)
  assert [e["epoch"] for e in res["epochs"]] == [0, 1, 2]
  assert all(e["trees"] == 40 for e in res["epochs"])
  assert set(res["dev_accuracy"]) == {"1", "2"}
  with pytest.raises(AnalysisError, match="needs a 'lm' or 'dyck_lm' run"):
    runner.run_analyses(run, ["perplexity"])


def test_the_cli_checks_every_analysis_before_writing(lm_run, tmp_path):
  out = tmp_path / "out"
  res = subprocess.run(
      [sys.executable, "-m", "experiments.analyze", f"--workdir={lm_run}",
       "--analyses=perplexity,ldpa", f"--out={out}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert res.returncode == 1
  assert "ldpa: needs a 'dyck_lm' or 'dyck_closing' run" in res.stderr
  assert not out.exists()


def test_the_cli_names_analyses_and_compare_before_restoring(dyck_run,
                                                            tmp_path):
  """Unknown analyses were named only after a restore (or hidden by its
  error); --compare's missing checkpoint was blamed on the run, not on
  --compare / --compare_step."""
  def analyze(*args):
    return subprocess.run([sys.executable, "-m", "experiments.analyze",
                           *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
  res = analyze(f"--workdir={tmp_path}", "--analyses=foo,ldpa")
  assert res.returncode == 1
  assert "analysis error: unknown analyses ['foo']; known: " in res.stderr
  res = analyze(f"--workdir={tmp_path}", "--analyses=,")
  assert "analysis error: analyses: none given; known: " in res.stderr
  none = tmp_path / "none"
  res = analyze(f"--workdir={dyck_run}", "--analyses=perplexity",
                f"--compare={none}", "--compare_step=latest")
  assert res.returncode == 1
  assert (f"analysis error: --compare={none} (--compare_step=latest, "
          "--compare_replica=0): " in res.stderr), res.stderr[-2000:]


def test_the_cli_compares_another_replica_of_the_same_run(dyck_run,
                                                         dyck_cli, tmp_path):
  """--compare_replica picks the compared run's seed (it was always 0);
  its errors name it, and without --compare it is a usage error."""
  def analyze(*args):
    return subprocess.run([sys.executable, "-m", "experiments.analyze",
                           f"--workdir={dyck_run}", "--analyses=perplexity",
                           *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
  res = dyck_cli   # --compare={dyck_run} --compare_replica=1
  assert res.returncode == 0, res.stderr[-2000:]
  with open(os.path.join(dyck_run, "analysis", "perplexity.json")) as f:
    ppl = json.load(f)
  assert ppl["source"]["replica"] == 0
  assert ppl["source"]["compare"]["replica"] == 1
  other = sorjax.restore(dyck_run, replica=1)
  assert ppl["other"]["cross_entropy"] == pytest.approx(
      perplexity.perplexity(other)["cross_entropy"])
  res = analyze(f"--compare={dyck_run}", "--compare_replica=2",
                f"--out={tmp_path}")
  assert res.returncode == 1
  assert (f"analysis error: --compare={dyck_run} (--compare_step=best, "
          "--compare_replica=2): replica 2 out of range: the run has 2"
          in res.stderr), res.stderr[-2000:]
  res = analyze("--compare_replica=1")
  assert res.returncode == 1
  assert "--compare_replica needs --compare" in res.stderr


def test_compare_gets_the_same_temperature_and_the_source_is_recorded(
    lm_run, tmp_path):
  run = sorjax.restore(lm_run)
  other = run.with_replica(1)
  # an mts_lstm has no attention softmax: --temperature would be ignored
  with pytest.raises(AnalysisError, match=r"--temperature is the attention "
                     r"LSTM's softmax tau; this run's cells \(MTSLSTM\) "
                     r"have none"):
    runner.run_analyses(run, "perplexity", str(tmp_path), compare=other,
                        temperature=2.0)
  with pytest.raises(ValueError, match="this run's cells \\(MTSLSTM\\) do "
                     "not have; it is not a sampling temperature"):
    run.log_probs(np.array([1, 2], np.int32), temperature=2.0)
  tau = run.eval_temperature()
  written = runner.run_analyses(run, "perplexity,frequency", str(tmp_path),
                                compare=other, num_resamples=20)
  with open(written["perplexity"][0]) as f:
    ppl = json.load(f)
  assert ppl["other"]["cross_entropy"] == pytest.approx(
      perplexity.perplexity(other, None, tau)["cross_entropy"])
  assert ppl["source"] == {
      "analysis": "perplexity", "workdir": run.workdir, "step": run.step,
      "replica": 0, "checkpoint": "best", "temperature": tau,
      "split": None,   # its default
      "compare": {"workdir": run.workdir, "step": run.step, "replica": 1,
                  "checkpoint": "best", "temperature": tau}}
  with open(written["frequency"][0]) as f:
    freq = json.load(f)
  assert freq["b"]["all tokens"]["cross_entropy"] == pytest.approx(
      perplexity.frequency(other, None, tau)["bins"]["all tokens"][
          "cross_entropy"])
  # restore(..., replica=1) is that replica, as with_replica(1) is
  direct = sorjax.restore(lm_run, replica=1)
  assert direct.replica == 1
  for a, b in zip(jax.tree.leaves(direct.params), jax.tree.leaves(
      other.params)):
    np.testing.assert_array_equal(a, b)
  assert not all(np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(direct.params), jax.tree.leaves(run.params)))
  # an LM split's sample: its first consecutive windows of eval_bptt
  tokens, lengths = traces.sample(run.task, "test", 2)
  L = run.task.data_cfg.eval_bptt
  np.testing.assert_array_equal(tokens.ravel(),
                                run.task.split_ids["test"][:2 * L])
  assert lengths.tolist() == [L, L]


def test_runs_of_other_tasks_and_text_for_a_dyck_run_are_refused(
    lm_run, dyck_run, tmp_path):
  lm, dyck = sorjax.restore(lm_run), sorjax.restore(dyck_run)
  with pytest.raises(AnalysisError, match=r"--compare: perplexity cannot "
                     r"compare runs of another task or data: .* has task "
                     r"'lm', data.corpus 'tinyshakespeare', .* has task "
                     r"'dyck_lm', data.k 2, data.m 3"):
    runner.run_analyses(lm, ["perplexity"], str(tmp_path / "o"),
                        compare=dyck)
  with pytest.raises(AnalysisError, match="attention_heatmap: --sentence "
                     r"needs a run of a text task \(lm\); this run's task is "
                     "'dyck_lm'"):
    runner.run_analyses(dyck, ["attention_heatmap"], str(tmp_path / "o"),
                        sentence="(()")
  assert not (tmp_path / "o").exists()
  written = runner.run_analyses(dyck, ["perplexity"], str(tmp_path / "o"))
  with open(written["perplexity"][0]) as f:
    src = json.load(f)["source"]
  assert src["step"] == dyck.step and src["temperature"] == pytest.approx(
      dyck.eval_temperature()) and "compare" not in src
