"""experiments.reproduce: named errors, and micro-scale runs of its items
so the command cannot rot (per-seed selection: test_results.py)."""

import json
import os

import numpy as np
import pytest

from experiments import reproduce


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
  # docs/RESULTS.md's closing-accuracy figure comes from the item too
  assert (figs / "dyck_rnn_close_accuracy.png").stat().st_size > 1000
  # A finished run is not retrained: the recorded wall time is reused.
  again = reproduce.reproduce("1", str(tmp_path / "runs"), scale="micro")
  assert again["runs"][0]["wall_s"] == run["wall_s"]
  # ... and a run directory trained with other overrides is refused.
  with pytest.raises(reproduce.ReproduceError,
                     match="was trained with other overrides"):
    reproduce.reproduce("1", str(tmp_path / "runs"), scale="micro",
                        replicas=2)
  # ... as is one whose config the shipped one no longer makes (a field
  # added or changed since; it reported the old model's numbers: QA,
  # session 41)
  path = tmp_path / "runs" / "dyck_rnn" / "m4" / "config.json"
  saved = json.loads(path.read_text())
  del saved["model"]["head_units"]
  path.write_text(json.dumps(saved))
  with pytest.raises(reproduce.ReproduceError, match=r"was trained with "
                     r"another config than renganathan_dyck.py:m4 and the "
                     r"overrides make now: model.head_units: '\(absent\)' "
                     r"-> 1 \(trained -> now\); remove it"):
    reproduce.reproduce("1", str(tmp_path / "runs"), scale="micro")


def test_items_7_and_8_share_the_wikitext2_runs(tmp_path, monkeypatch):
  trained = []

  def fake_train(cfg, wd):
    os.makedirs(wd)
    with open(os.path.join(wd, "config.json"), "w") as f:
      f.write(cfg.to_json())              # as the trainer writes it
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


def test_item_3_trains_every_fold_and_averages_them(tmp_path, monkeypatch):
  """Maupome & Meurs' cross-validation: each model on the 5 folds (fold 0
  keeps the run directory of one-fold runs), a fold's BPC the mean over
  its seeds, the models' BPC the mean and sd over folds, and differences
  paired by fold."""
  trained = []

  def fake_train(ctx, name, config, string, overrides):
    trained.append((name, config, string, overrides))
    return os.path.join(ctx.root, name)

  def bpc(wd, r):        # a made-up test BPC per run directory and seed
    name = os.path.basename(wd)
    fold = int(name.rsplit("_fold", 1)[1]) if "_fold" in name else 0
    return 3.0 + 0.01 * len(name) + 0.1 * fold + 0.001 * r

  monkeypatch.setattr(reproduce, "train", fake_train)
  monkeypatch.setattr(reproduce, "per_replica", lambda wd: [
      {"loss": bpc(wd, r) * np.log(2), "bits_per_char": bpc(wd, r),
       "best_epoch": 2} for r in range(3)])
  ctx = reproduce.Context(str(tmp_path / "maupome"), "cpu", 3)
  os.makedirs(ctx.root)
  out = reproduce.item_maupome(ctx)["results"]
  assert len(trained) == 17 * 5
  runs = {name: (config, string, ov) for name, config, string, ov in trained}
  assert "data.fold" not in runs["none_tanh"][2]
  assert runs["none_tanh_fold3"][2] == {**runs["none_tanh"][2],
                                        "data.fold": 3}
  assert runs["ratio_0.5_fold4"][:2] == ("maupome_ratio", "0.5")
  assert not any("bptt" in k for _, _, _, ov in trained for k in ov)
  r = out["DE_identity"]
  want = [np.mean([bpc(f"DE_identity{s}", k) for k in range(3)])
          for s in ["", "_fold1", "_fold2", "_fold3", "_fold4"]]
  assert [f["fold"] for f in r["per_fold"]] == [0, 1, 2, 3, 4]
  np.testing.assert_allclose([f["bpc_from_loss"] for f in r["per_fold"]],
                             want)
  assert r["bpc_from_loss"]["mean"] == pytest.approx(np.mean(want))
  assert r["bpc_from_loss"]["std"] == pytest.approx(np.std(want, ddof=1))
  # paired by fold: the per-fold offsets cancel
  none = [np.mean([bpc(f"none_identity{s}", k) for k in range(3)])
          for s in ["", "_fold1", "_fold2", "_fold3", "_fold4"]]
  np.testing.assert_allclose(r["minus_none_identity"]["values"],
                             np.subtract(want, none))
  assert r["minus_none_identity"]["std"] == pytest.approx(0.0, abs=1e-9)
  assert "minus_none_identity" not in out["none_identity"]
  assert out["ratio_sweep"]["1"] == out["none_tanh"]["bpc_from_loss"]
  assert out["ratio_sweep"]["20"]["n"] == 5


def test_an_interrupted_run_counts_every_invocations_time(tmp_path,
                                                          monkeypatch):
  import time
  calls = []

  def fake_train(cfg, wd):
    os.makedirs(wd, exist_ok=True)
    calls.append(wd)
    if len(calls) == 1:
      time.sleep(0.3)
      raise KeyboardInterrupt

  monkeypatch.setattr("experiments.train.train_and_evaluate", fake_train)
  ctx = reproduce.Context(str(tmp_path), "micro", 2)
  with pytest.raises(KeyboardInterrupt):
    reproduce.train(ctx, "run", "lin_dyck", "lstm,m4", {})
  wd = reproduce.train(ctx, "run", "lin_dyck", "lstm,m4", {})
  record = json.load(open(os.path.join(wd, "reproduce_run.json")))
  assert record["wall_s"] >= 0.3 and len(calls) == 2
  assert not os.path.exists(os.path.join(wd, "reproduce_partial.json"))


def test_a_run_started_with_other_flags_names_them(tmp_path, monkeypatch):
  from sorjax.training.tasks.common import ConfigError

  def refused(cfg, wd):
    os.makedirs(wd, exist_ok=True)
    with open(os.path.join(wd, "config.json"), "w") as f:
      json.dump({"num_replicas": 3}, f)
    raise ConfigError("holds checkpoints trained with another config")

  monkeypatch.setattr("experiments.train.train_and_evaluate", refused)
  ctx = reproduce.Context(str(tmp_path), "micro", 2)
  with pytest.raises(reproduce.ReproduceError, match=r"run was started by "
                     r"an earlier invocation with other flags \(holds .*\); "
                     r"rerun with --replicas=3, or remove"):
    reproduce.train(ctx, "run", "lin_dyck", "lstm,m4", {})


def test_item_4_trains_table_2s_word_rows_at_the_papers_budget(
    tmp_path, monkeypatch):
  """Table 2's word-level rows (rnn 1, lstm 1-2, mm_rnn 1, mm_lstm 1-2) run
  at the paper's 2M parameters, 64-d embeddings and 35-word windows; the
  character rows keep their 50k budget and their 2-layer tolerance, and
  only they get a BPC."""
  trained = []

  def fake_train(ctx, name, config, string, overrides):
    trained.append((name, config, string, overrides))
    return os.path.join(ctx.root, name)

  monkeypatch.setattr(reproduce, "train", fake_train)
  monkeypatch.setattr(reproduce, "per_replica", lambda wd: [
      {"loss": 4.8 + 0.01 * r, "perplexity": 121.5, "best_epoch": 2}
      for r in range(3)])
  ctx = reproduce.Context(str(tmp_path / "renganathan_ptb"), "cpu", 3)
  os.makedirs(ctx.root)
  out = reproduce.item_renganathan(ctx)
  runs = {name: (config, string, ov) for name, config, string, ov in trained}
  words = [n for n in runs if n.startswith("word_")]
  assert words == ["word_rnn", "word_lstm", "word_mm_rnn", "word_mm_lstm",
                   "word_lstm_2layers", "word_mm_lstm_2layers"]
  assert runs["word_mm_lstm_2layers"][:2] == ("renganathan_ptb",
                                              "word,mm_lstm,2")
  w = runs["word_lstm"][2]
  assert (w["model.budget"], w["model.embed_size"], w["data.bptt"],
          w["data.eval_bptt"], w["data.max_train_tokens"]) == (
              2_000_000, 64, 35, 35, 150_000)
  assert "model.budget_tol" not in runs["word_mm_lstm_2layers"][2]
  c = runs["mm_lstm_2layers"][2]
  assert (c["model.budget"], c["model.embed_size"], c["data.bptt"],
          c["model.budget_tol"]) == (50_000, 16, 50, 0.03)
  assert len(runs) == 22 + 6
  res = out["results"]
  assert "bpc_from_loss" not in res["word_rnn"]
  assert res["word_rnn"]["loss"]["mean"] == pytest.approx(4.81)
  assert res["rnn"]["bpc_from_loss"]["mean"] == pytest.approx(
      4.81 / np.log(2))
  assert out["paper"]["ce_2M_2layers"] == {"lstm": 4.770, "mm_lstm": 4.818}
  assert [os.path.basename(f) for f in out["figures"]] == [
      "bpc.png", "cutoff_bpc.png", "word_loss.png"]


def test_a_damaged_finished_run_record_is_named(tmp_path):
  """A reproduce_run.json cut short (a full disk, before it was written
  whole) made every rerun fail with a bare JSON error naming no file."""
  ctx = reproduce.Context(str(tmp_path), "micro", 2)
  os.makedirs(tmp_path / "run")
  (tmp_path / "run" / "reproduce_run.json").write_text('{"name": "ru')
  with pytest.raises(reproduce.ReproduceError, match=r"run/reproduce_run"
                     r"\.json cannot be read .*delete it to check the run"):
    reproduce.train(ctx, "run", "lin_dyck", "lstm,m4", {})


def test_a_failed_figure_copy_keeps_the_earlier_figure(tmp_path,
                                                       monkeypatch):
  """--figures copies over committed figures (docs/figures): a copy that
  fails midway (a full disk) keeps the earlier file whole and names the
  new one."""
  src, dst = tmp_path / "new.png", tmp_path / "docs_fig.png"
  src.write_bytes(b"new figure" * 100)
  dst.write_bytes(b"earlier figure")

  def full(a, b):
    with open(b, "wb") as f:
      f.write(b"new")
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(reproduce.shutil, "copyfile", full)
  with pytest.raises(OSError, match=r"cannot write .*docs_fig\.png \(its "
                     r"earlier version is kept\): No space left"):
    reproduce._copy(str(src), str(dst))
  assert dst.read_bytes() == b"earlier figure"
  assert sorted(os.listdir(tmp_path)) == ["docs_fig.png", "new.png"]
  monkeypatch.undo()
  assert reproduce._copy(str(src), str(dst)) == str(dst)
  assert dst.read_bytes() == src.read_bytes()
