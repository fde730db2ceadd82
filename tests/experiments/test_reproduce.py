"""experiments.reproduce: per-seed selection and spread against hand-written
metrics, named errors, and a micro-scale run of item 1 so the command
cannot rot."""

import json
import os

import numpy as np
import pytest

from experiments import reproduce


def _write_metrics(path, records):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")


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
  rows = reproduce.per_replica(str(tmp_path))
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
  assert reproduce.per_replica(str(tmp_path))[0]["step"] == 30  # no config
  (tmp_path / "config.json").write_text(
      '{"selection": {"metric": "accuracy", "mode": "max"}}')
  (row,) = reproduce.per_replica(str(tmp_path))
  assert (row["step"], row["accuracy"], row["best_epoch"]) == (20, 0.2, 2)
  (tmp_path / "config.json").write_text(
      '{"selection": {"metric": "wcpa", "mode": "max"}}')
  with pytest.raises(reproduce.ReproduceError,
                     match="the 'dev' records lack 'wcpa', the run's "
                     "selection.metric"):
    reproduce.per_replica(str(tmp_path))


def test_per_replica_names_a_missing_test_record(tmp_path):
  _write_metrics(str(tmp_path), [
      {"step": 10, "split": "dev", "replica": 0, "epoch": 1, "loss": 1.0}])
  with pytest.raises(reproduce.ReproduceError,
                     match=r"metrics.jsonl: no 'test' record at step 10"):
    reproduce.per_replica(str(tmp_path))


def test_per_replica_selects_on_valid_for_language_models(tmp_path):
  recs = []
  for step, valid, test in ((10, 2.0, 5.0), (20, 1.5, 4.0), (30, 1.7, 3.0)):
    recs.append({"step": step, "split": "valid", "replica": 0,
                 "epoch": step // 10, "loss": valid})
    recs.append({"step": step, "split": "test", "replica": 0,
                 "epoch": step // 10, "loss": test, "perplexity": 2 * test})
  _write_metrics(str(tmp_path), recs)
  (row,) = reproduce.per_replica(str(tmp_path))
  assert (row["step"], row["loss"], row["perplexity"]) == (20, 4.0, 8.0)
  with pytest.raises(reproduce.ReproduceError, match="no 'dev' records"):
    reproduce.per_replica(str(tmp_path), select="dev")


def test_stats_are_mean_and_sample_sd():
  s = reproduce.stats([1.0, 2.0, 4.0])
  assert s["mean"] == pytest.approx(7 / 3)
  assert s["std"] == pytest.approx(np.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3)
                                            ** 2 + (4 - 7 / 3) ** 2) / 2))
  assert (s["min"], s["max"], s["n"]) == (1.0, 4.0, 3)
  assert reproduce.stats([3.0])["std"] == 0.0


def test_bad_items_and_options_are_named(tmp_path):
  with pytest.raises(reproduce.ReproduceError, match="unknown item 'nine'"):
    reproduce.reproduce("nine", str(tmp_path))
  with pytest.raises(reproduce.ReproduceError, match="--scale must be"):
    reproduce.reproduce("1", str(tmp_path), scale="gpu")
  with pytest.raises(reproduce.ReproduceError, match="--replicas must be"):
    reproduce.reproduce("1", str(tmp_path), replicas=0)
  assert reproduce.resolve("5") == "keyword_trees"
  assert reproduce.resolve("multi_timescale") == "multi_timescale"
  assert sorted(n for n, _ in reproduce.ITEMS.values()) == list(range(1, 10))
  ctx = reproduce.Context(str(tmp_path), "micro", 3)
  with pytest.raises(reproduce.ReproduceError,
                     match="override data.nope: the config has no 'nope'"):
    reproduce.train(ctx, "x", "renganathan_dyck", "m4", {"data.nope": 1})


def test_bad_folders_are_named_before_training(tmp_path, monkeypatch):
  """A --figures file failed after all the training and analyses; a
  --workdir below a file in os.makedirs; ~ after --workdir= (which no shell
  expands) made a folder named '~'."""
  afile = tmp_path / "afile"
  afile.write_text("")
  monkeypatch.setenv("HOME", str(tmp_path))
  with pytest.raises(reproduce.ReproduceError, match=(
      f"^--workdir={tmp_path}/afile/runs: {tmp_path}/afile is a file, not "
      f"a directory$")):
    reproduce.reproduce("1", "~/afile/runs", scale="micro")
  with pytest.raises(reproduce.ReproduceError, match=(
      f"^--figures={afile}: {afile} is a file, not a directory$")):
    reproduce.reproduce("1", str(tmp_path / "w"), scale="micro",
                        figures="~/afile")
  assert not (tmp_path / "w").exists()


def test_item_1_runs_at_micro_scale(tmp_path):
  figs = tmp_path / "figs"
  s = reproduce.reproduce("1", str(tmp_path / "runs"), scale="micro",
                          replicas=3, figures=str(figs))
  with open(tmp_path / "runs" / "dyck_rnn" / "summary.json") as f:
    on_disk = json.load(f)
  assert on_disk["name"] == s["name"] == "dyck_rnn"
  (run,) = on_disk["runs"]
  assert run["config"] == "renganathan_dyck.py:m4"
  assert "--config.num_replicas=3" in run["command"]
  assert run["wall_s"] > 0
  res = on_disk["results"]["m4"]
  assert len(res["per_replica"]) == 3
  vals = [r["wcpa"] for r in res["per_replica"]]
  assert res["wcpa"]["mean"] == pytest.approx(np.mean(vals))
  assert all(0.0 <= v <= 1.0 for v in vals)
  assert (figs / "dyck_rnn_wcpa.png").stat().st_size > 1000
  # A finished run is not retrained: the recorded wall time is reused.
  again = reproduce.reproduce("1", str(tmp_path / "runs"), scale="micro")
  assert again["runs"][0]["wall_s"] == run["wall_s"]
  # ... and a run directory trained with other overrides is refused.
  with pytest.raises(reproduce.ReproduceError,
                     match="was trained with other overrides"):
    reproduce.reproduce("1", str(tmp_path / "runs"), scale="micro",
                        replicas=2)


def test_items_7_and_8_share_the_wikitext2_runs(tmp_path, monkeypatch):
  trained = []

  def fake_train(cfg, wd):
    os.makedirs(wd)
    trained.append(os.path.relpath(wd, tmp_path))

  monkeypatch.setattr("experiments.train.train_and_evaluate", fake_train)
  ctx7 = reproduce.Context(str(tmp_path / "wikitext2"), "cpu", 3)
  runs7 = reproduce._wikitext2_runs(ctx7)
  ctx8 = reproduce.Context(str(tmp_path / "blimp"), "cpu", 3)
  runs8 = reproduce._wikitext2_runs(ctx8, ("lstm", "attention,2"))
  # Item 8 reads item 7's run directories; nothing is trained twice.
  assert runs8 == {k: runs7[k] for k in ("lstm", "attention,2")}
  assert trained == [os.path.join("wikitext2", n)
                     for n in ("lstm", "attention2", "attention5")]
  assert [r["name"] for r in ctx8.runs] == ["lstm", "attention2"]


def test_item_8_scores_each_seed_of_both_models_with_progress(
    tmp_path, monkeypatch, capsys):
  """BLiMP at 100 pairs per phenomenon, every replica of both models
  (a bigram LM per seed here), one progress count over all of them."""
  from sorjax.analysis import minimal_pairs
  from tests.analysis.test_minimal_pairs import _BigramRun
  pairs = ([minimal_pairs.Pair("the cat sleeps", "the cat sleep", "agr")]
           * 101 + [minimal_pairs.Pair("the cats sleep", "the cats sleeps",
                                       "npi")] * 3)
  monkeypatch.setattr(minimal_pairs, "blimp_pairs", lambda: pairs)
  monkeypatch.setattr(reproduce, "_wikitext2_runs", lambda ctx, names: {
      n: os.path.join(ctx.root, n) for n in names})
  monkeypatch.setattr(reproduce, "restore", lambda wd, r: _BigramRun(
      seed=r + (10 if wd.endswith("attention,2") else 0)))
  res = reproduce.item_blimp(reproduce.Context(str(tmp_path), "cpu", 2))
  for seeds, label in (((0, 1), "lstm"), ((10, 11), "attention,2")):
    want = [_BigramRun(seed=s) for s in seeds]
    acc = [np.mean([r.score(["the", "cat", "sleeps"]) > r.score(
        ["the", "cat", "sleep"])] * 100 + [r.score(["the", "cats", "sleep"])
                                           > r.score(["the", "cats",
                                                      "sleeps"])] * 3)
           for r in want]
    assert res["results"][label]["pairs"] == 103
    assert res["results"][label]["accuracy"]["mean"] == pytest.approx(
        np.mean(acc))
  # 4 evaluations x 206 sentences, in one count
  assert capsys.readouterr().err.splitlines()[-1].startswith(
      "blimp: 824 of 824 sentences (100%), ")


def test_item_9_trains_and_fits_the_ptb_and_markov_baselines(tmp_path,
                                                           monkeypatch):
  """The Markov control trains the baseline on each corpus with the same
  overrides (the whole training split) and fits every replica's
  timescales."""
  trained, fitted = [], []

  def fake_train(ctx, name, config, string, overrides):
    trained.append((name, config, string, overrides))
    return os.path.join(ctx.root, name)

  def fake_analyse(wd, names, out, replica=0, **options):
    fitted.append((os.path.basename(wd), replica, names))
    os.makedirs(out)
    open(os.path.join(out, "timescales_ks.png"), "wb").close()
    best = 0.1 * (replica + 1)
    return {"timescales": {"ks": {
        "units": 8, "non_finite": 0, "best_family": "inverse_gamma",
        "inverse_gamma": {"best_alpha": 1.4, "best_ks": best},
        "narrow_gaussian": {"best_mu": 0.5, "best_ks": 2 * best}}}}

  monkeypatch.setattr(reproduce, "train", fake_train)
  monkeypatch.setattr(reproduce, "analyse", fake_analyse)
  monkeypatch.setattr(reproduce, "per_replica", lambda wd: [
      {"perplexity": 50.0 + r, "loss": 3.9, "best_epoch": 1}
      for r in range(2)])
  ctx = reproduce.Context(str(tmp_path / "markov_control"), "cpu", 2)
  os.makedirs(ctx.root)
  out = reproduce.item_markov_control(ctx)
  ov = {"data.max_eval_tokens": 10_000, "train.num_epochs": 1}
  assert trained == [
      (f"lm_{c}_baseline", "mahto_lm", f"baseline,{c},sizes=64-64-32", ov)
      for c in ("ptb", "markov_ptb")]
  assert fitted == [(f"lm_{c}_baseline", r, ["timescales"])
                    for c in ("ptb", "markov_ptb") for r in range(2)]
  res = out["results"]["markov_ptb"]
  assert [f["inverse_gamma"]["best_ks"] for f in res["ks_fits"]] == [0.1,
                                                                     0.2]
  assert res["inverse_gamma_best_ks"]["mean"] == pytest.approx(0.15)
  assert res["narrow_gaussian_best_ks"]["mean"] == pytest.approx(0.3)
  assert res["perplexity"]["mean"] == 50.5
  assert [os.path.basename(f) for f in out["figures"]] == [
      "timescales_ks_ptb.png", "timescales_ks_markov_ptb.png"]
