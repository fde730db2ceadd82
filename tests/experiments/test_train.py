"""End-to-end: the absl binary, resume after a kill, restore, config errors."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import sorjax
from experiments import train
from sorjax import host_memory
from sorjax.training.metrics import read_metrics
from sorjax.training.tasks.common import ConfigError
from tests.experiments import tiny_dyck

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "tests", "experiments", "tiny_dyck.py")
# tiny_dyck with train.max_steps settable, and the overrides that make it a
# run of one step on one bucket (it ends before the epoch's evaluation):
# for tests of the binary that need a run to start and compile, not learn
OVERRIDABLE = os.path.join(ROOT, "tests", "experiments",
                           "tiny_dyck_overridable.py")
ONE_STEP = ["--config.data.num_buckets=1", "--config.train.num_epochs=1",
            "--config.train.max_steps=1"]


def main_cmd(workdir, *overrides, config=CONFIG):
  return [sys.executable, "-m", "experiments.main", f"--config={config}",
          f"--workdir={workdir}", *overrides]


# the tests of dyck_run share it: one worker trains it (--dist loadgroup)
dyck_group = pytest.mark.xdist_group("experiments.test_train.dyck")


@pytest.fixture(scope="session")
def dyck_run(tmp_path_factory):
  """(workdir, final step) of one uninterrupted tiny_dyck run, trained
  here (the binary's runs of the same config then compile nothing new: the
  session's compilation cache), keeping every checkpoint. Read, never
  written, by the loss test, the fresh-process restore, and as the
  parameters that a killed and resumed run (at the end) and the
  --host_malloc modes' one-epoch runs (at epoch 1) must end with."""
  workdir = tmp_path_factory.mktemp("dyck_run")
  cfg = tiny_dyck.get_config()
  cfg.train.keep_checkpoints = 100   # train.*: the same training
  # standard dtype promotion, as _dtype_promotion_for_optax sets for the
  # tests (this fixture is set up before that function-scoped one)
  with jax.numpy_dtype_promotion("standard"):
    state = train.train_and_evaluate(cfg, str(workdir))
  return workdir, int(state.step[0])


@dyck_group
def test_loss_falls_on_a_tiny_dyck_task(dyck_run):
  workdir, step = dyck_run
  dev = read_metrics(str(workdir), "dev")
  assert len(dev) == 3
  assert dev[-1]["loss"] < dev[0]["loss"]
  assert dev[-1]["oracle_perplexity"] < dev[-1]["perplexity"]
  assert 0.0 <= dev[-1]["wcpa"] <= 1.0
  assert step > 0


def test_config_errors_stop_before_training(tmp_path):
  cfg = tiny_dyck.get_config()
  cfg.model.cell = "mrn"
  with pytest.raises(ConfigError, match="model.cell: unknown cell 'mrn'"):
    train.train_and_evaluate(cfg, str(tmp_path))
  cfg = tiny_dyck.get_config()
  cfg.model.num_cells = 3
  with pytest.raises(ConfigError, match="has no hyperparameter 'num_cells'"):
    train.train_and_evaluate(cfg, str(tmp_path))
  cfg = tiny_dyck.get_config()
  cfg.model.budget = 10
  with pytest.raises(ConfigError, match="model.budget=10"):
    train.train_and_evaluate(cfg, str(tmp_path))
  cfg = tiny_dyck.get_config()
  cfg.train.num_epochs = 0
  with pytest.raises(ConfigError, match="train.num_epochs"):
    train.train_and_evaluate(cfg, str(tmp_path))
  for bad in (0, 1.5, True):
    cfg = tiny_dyck.get_config()
    cfg.replica_batch_size = bad
    with pytest.raises(ConfigError, match=re.escape(
        f"replica_batch_size must be None or an int >= 1, got {bad!r}")):
      train.train_and_evaluate(cfg, str(tmp_path))
  assert not os.path.exists(tmp_path / "checkpoints")
  res = subprocess.run(main_cmd(tmp_path / "x", "--config.task=nope"),
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert res.returncode != 0
  assert "config error: config.task: unknown task 'nope'" in res.stderr
  # an override of a field the config lacks: a flag error, not a traceback
  res = subprocess.run(main_cmd(tmp_path / "x", "--config.train.epochs=2"),
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert res.returncode == 1 and "Traceback" not in res.stderr
  assert ("FATAL Flags parsing error: flag --config.train.epochs=2: train has "
          "no field 'epochs'") in res.stderr


@pytest.mark.parametrize("path,value,msg", [
    ("optim.clip_norm", -1.0, "optim.clip_norm must be None or a finite number > 0, "
                              "got -1.0"),
    ("optim.learning_rate", 0.0, "optim.learning_rate must be a finite number > 0"),
    ("plateau.factor", 1.0, r"plateau.factor must be a finite number in \(0, 1\)"),
    ("plateau.patience", -1, "plateau.patience must be an int >= 0"),
    ("plateau.enabled", "no", "plateau.enabled must be a bool"),
    ("early_stopping.patience", -1, "early_stopping.patience must be None "
                                    r"or an int >= 0 \(0: no early "
                                    r"stopping\), got -1"),
    ("early_stopping.patience", 1.5, "early_stopping.patience must be None "
                                     "or an int"),
    ("early_stopping.stop_below", float("nan"),
     "early_stopping.stop_below must be None or a finite number"),
    ("nt_asgd.nonmono", 0, "nt_asgd.nonmono must be an int >= 1"),
    ("selection.mode", "up", "selection.mode must be 'min' or 'max', got "
                             "'up'"),
    ("selection.metric", "", "selection.metric must be the name of an "
                             "evaluation metric"),
    ("train.max_steps", 0, "train.max_steps must be None or an int >= 1"),
    ("train.max_steps", -5, "train.max_steps must be None or an int >= 1"),
    ("train.max_steps", 2.5, "train.max_steps must be None or an int >= 1"),
    # True passed as 1 before the checks shared sorjax.checks' rule
    ("train.num_epochs", True, "train.num_epochs must be an int >= 1, got "
                               "True"),
    ("train.keep_checkpoints", 0, "train.keep_checkpoints must be an int "
                                  ">= 1, got 0"),
])
def test_validate_checks_the_loop_fields(path, value, msg):
  cfg = tiny_dyck.get_config()
  section, field = path.split(".")
  cfg[section] = {**cfg[section].to_dict(), field: value}  # any type
  with pytest.raises(ConfigError, match=msg):
    train.validate(cfg)


@pytest.mark.parametrize("task, figures, msg", [
    ("dyck_lm", ("ldpa", "foo"), r"figures: unknown figure 'foo'; known: "
                                 r"ldpa"),
    ("dyck_pcfg", ("ldpa",), r"figures: 'ldpa' is drawn for the dyck_lm and "
                             r"dyck_closing tasks, not 'dyck_pcfg'"),
    ("dyck_lm", "ldpa", r"figures='ldpa' must be a tuple of names"),
])
def test_figures_are_checked_before_training(task, figures, msg):
  cfg = tiny_dyck.get_config()
  cfg.task, cfg.figures = task, figures
  with pytest.raises(ConfigError, match=msg):
    train.validate(cfg)


@pytest.mark.parametrize("field, value, msg", [
    ("cell", "gru", r"model.cell='gru' is read for a uniform stack, and "
                    r"model.layers sets each of its 2 layers: give "
                    r"model.layers\[i\].cell"),
    ("hidden_size", 6, r"model.hidden_size=6 is read for a uniform stack"),
    ("forget_bias", 2.0, r"model.forget_bias=2.0 is read for a uniform"),
    ("num_layers", 5, r"model.num_layers=5: model.layers holds 2 layers"),
])
def test_uniform_stack_fields_beside_layers_are_refused(field, value, msg):
  from experiments.configs import common
  cfg = common.config("dyck_lm", tiny_dyck.get_config().data,
                      layers=({"cell": "lstm", "hidden_size": 6},
                              {"cell": "mrnn", "hidden_size": 4}))
  train.validate(cfg)     # cell and hidden_size left None by the layers
  cfg.model[field] = value
  with pytest.raises(ConfigError, match=msg):
    train.validate(cfg)


def test_a_workdir_nothing_can_be_made_in_is_named(monkeypatch, tmp_path):
  """os.access says yes to root, also in /proc: a folder is made and
  removed to be sure."""
  from sorjax.checks import output_dir_problem
  monkeypatch.setattr(os, "access", lambda *a: True)
  assert output_dir_problem("/proc/sorjax_qa").startswith(
      "cannot make a folder in /proc (")
  assert output_dir_problem(str(tmp_path / "a" / "b")) is None
  assert os.listdir(tmp_path) == []


def test_launcher_flag_errors_exit_with_a_message(monkeypatch):
  def refuse(*a):
    raise ValueError("--cpu_devices=2: XLA_FLAGS sets 3 devices")
  monkeypatch.setattr(train, "prepare_process", refuse)
  with pytest.raises(SystemExit, match=r"flag error: --cpu_devices=2: "
                     r"XLA_FLAGS sets 3"):
    train.prepare_or_exit("default", False, 2)


def test_seconds_an_interrupted_run_keeps_hide_no_error(tmp_path,
                                                      monkeypatch):
  """time_kept writes an interrupted run's seconds on its way out; on a
  full disk that write raised its own OSError in place of the run's error
  (an Interrupted then left a traceback, not the launcher's exit) and left
  the file cut short, read back as 0 s. Now the error passes unchanged
  and the earlier seconds stay."""
  from tests.disk_full import fill_disk

  partial = str(tmp_path / "reproduce_partial.json")
  with open(partial, "w") as f:
    json.dump({"wall_s": 5.0}, f)
  fill_disk(monkeypatch)
  with pytest.raises(KeyboardInterrupt):
    with train.time_kept(partial, train.recorded_wall_s(partial)):
      raise KeyboardInterrupt
  monkeypatch.undo()
  assert train.recorded_wall_s(partial) == 5.0
  assert os.listdir(tmp_path) == ["reproduce_partial.json"]


def test_a_selection_metric_the_task_lacks_fails_before_training(tmp_path):
  cfg = tiny_dyck.get_config()
  cfg.selection.metric, cfg.selection.mode = "accuracy", "max"
  with pytest.raises(ConfigError, match=r"selection.metric='accuracy' is not "
                     r"among the metrics dyck_lm evaluates: \['close_accuracy'"
                     r", 'loss', 'oracle_perplexity', 'perplexity', "
                     r"'perplexity_ratio', 'wcpa'\]"):
    train.train_and_evaluate(cfg, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("field,value", [("num_replicas", True),
                                         ("num_replicas", 0),
                                         ("replica_batch_size", 1.0)])
def test_validate_checks_the_replica_fields(field, value):
  cfg = tiny_dyck.get_config()
  cfg[field] = value
  with pytest.raises(ConfigError, match=f"^{field} must be .*an int >= 1, "
                                        f"got {value!r}$"):
    train.validate(cfg)


@pytest.mark.parametrize("patience", [None, 0, 3])
def test_early_stopping_off_by_none_or_zero(patience):
  """0 is "off" as reproduce item 4 and docs/RESULTS.md use it."""
  cfg = tiny_dyck.get_config()
  cfg.early_stopping = {**cfg.early_stopping.to_dict(), "patience": patience}
  train.validate(cfg)


def test_validate_checks_the_batch_splits_over_the_devices(monkeypatch):
  cfg = tiny_dyck.get_config()
  cfg.data.batch_size = 5
  monkeypatch.setattr(jax, "local_device_count", lambda: 2)
  with pytest.raises(ConfigError, match="data.batch_size=5 must be a "
                                        "multiple of the 2 local devices"):
    train.validate(cfg)
  cfg.num_replicas = 2    # the replicas are sharded, not the batch
  train.validate(cfg)
  cfg.num_replicas, cfg.data.batch_size = 1, 6
  train.validate(cfg)


def _with_data(cfg, **fields):
  cfg.data = {**cfg.data.to_dict(), **fields}   # any type
  return cfg


@pytest.mark.parametrize("field,value,msg", [
    ("num_train", 0, "data.num_train must be an int >= 1, got 0"),
    ("num_dev", -3, "data.num_dev must be an int >= 1, got -3"),
    ("num_test", 0, "data.num_test must be an int >= 1"),
    ("m", 0, "data.m must be an int >= 1"),
    ("k", 0, "data.k must be an int >= 1"),
    ("max_length", 0, "data.max_length must be None or an int >= 2"),
    ("max_length", -4, "data.max_length must be None or an int >= 2"),
    ("max_length", 1, "data.max_length must be None or an int >= 2"),
    ("scale", -1.0, r"data.scale must be a finite number in \(0, 1\]"),
    ("scale", 0.0, r"data.scale must be a finite number in \(0, 1\]"),
    ("num_buckets", 0, "data.num_buckets must be an int >= 1"),
    ("bucket_multiple", 0, "data.bucket_multiple must be an int >= 1"),
    ("batch_size", 0, "data.batch_size must be an int >= 1"),
    ("eval_batch_size", 0, "data.eval_batch_size must be an int >= 1"),
    ("seed", -1, "data.seed must be an int >= 0"),
])
def test_dyck_data_fields_are_checked_when_the_task_is_built(field, value,
                                                             msg):
  from sorjax.training.tasks import make_task
  with pytest.raises(ConfigError, match=msg):
    make_task(_with_data(tiny_dyck.get_config(), **{field: value}))


@pytest.mark.parametrize("field,value,msg", [
    ("scale", 2.0, r"data.scale must be a finite number in \(0, 1\]"),
    ("num_buckets", 0, "data.num_buckets must be an int >= 1"),
    ("eval_batch_size", 0, "data.eval_batch_size must be an int >= 1"),
    ("scale", 1e-5, "too few to hold out a dev split"),
])
def test_pcfg_data_fields_are_checked(field, value, msg):
  from experiments.configs import common
  from sorjax.training.tasks import make_task
  cfg = common.config("dyck_pcfg", common.pcfg_data(preset="suzgun"),
                      cell="lstm", hidden_size=4, embed_size=4)
  with pytest.raises(ConfigError, match=msg):
    make_task(_with_data(cfg, **{field: value}))


def test_unknown_override_names_the_flag_and_the_fields_there():
  cfg = tiny_dyck.get_config()
  argv = ["main", f"--config={CONFIG}", "--workdir=/tmp/w",
          "--config.model.cell=lstm", "--config.seed", "3",
          "--jax_platforms=cpu"]
  assert train.unknown_override(cfg, argv) is None
  # an indexed path is checked too (this config has no figures field)
  assert train.unknown_override(cfg, argv + ["--config.figures[0]=ldpa"]
                                ).startswith(
      "flag --config.figures[0]=ldpa: the config has no field 'figures'")
  fields = ", ".join(sorted(cfg.model.keys()))
  assert train.unknown_override(cfg, argv + ["--config.model.hiden_size=8"]) \
      == ("flag --config.model.hiden_size=8: model has no field 'hiden_size'; "
          f"did you mean 'hidden_size'? (its fields: {fields})")
  # the first bad one, in the form it was given
  msg = train.unknown_override(cfg, argv + ["--config.zzz", "1",
                                            "--config.model.qqq=2"])
  assert msg.startswith("flag --config.zzz: the config has no field 'zzz' "
                        "(its fields: data, ")
  assert train.unknown_override(cfg, argv + ["--config.model.cell.x=1"]) == (
      "flag --config.model.cell.x=1: model.cell is a str, not a group of "
      "fields, so it has no field 'x'")
  assert train.unknown_override(cfg, ["main", "--other.zzz=1"]) is None
  assert train.unknown_override(cfg, ["main", "--other.zzz=1"],
                                name="other") is not None


def test_jax_flags_reach_jax(tmp_path):
  # The launchers register JAX's options as absl flags: here a cache
  # directory of the run's own (overriding the test session's), filled by
  # its compiles (a run of one step: the model's initialisation alone
  # compiles dozens of programs, each into this empty cache).
  cache = tmp_path / "xla_cache"
  subprocess.run(main_cmd(tmp_path / "run",
                          f"--jax_compilation_cache_dir={cache}",
                          "--jax_persistent_cache_min_compile_time_secs=0",
                          *ONE_STEP, config=OVERRIDABLE),
                 cwd=ROOT, check=True, capture_output=True, timeout=600)
  assert len(os.listdir(cache)) > 10
  res = subprocess.run([sys.executable, "-m", "experiments.analyze",
                        "--helpfull"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
  assert "--jax_compilation_cache_dir" in res.stdout
  res = subprocess.run([sys.executable, "-m", "experiments.reproduce",
                        "--list", "--jax_platforms=nope"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 0 and "dyck_rnn" in res.stdout


@dyck_group
def test_killed_run_resumes_to_the_uninterrupted_parameters(tmp_path,
                                                             dyck_run):
  (full, last), cut = dyck_run, tmp_path / "cut"
  proc = subprocess.Popen(main_cmd(cut), cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  ckpts = cut / "checkpoints"
  while time.time() < deadline:     # kill once the second checkpoint lands
    if ckpts.exists() and len([d for d in os.listdir(ckpts)
                               if d.isdigit()]) >= 2:
      break
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  steps = sorted(int(d) for d in os.listdir(ckpts) if d.isdigit())
  assert steps and steps[-1] < 45 < last, (
      f"the run finished before the kill: {steps} of {last}")
  # The rerun, in this process (the kill was the process boundary): the
  # loop resumes from what the killed one left (its config.json must
  # match: the resume check).
  train.train_and_evaluate(tiny_dyck.get_config(), str(cut))
  a = sorjax.restore(str(full), "latest")
  b = sorjax.restore(str(cut), "latest")
  assert a.step == b.step
  jax.tree_util.tree_map(np.testing.assert_array_equal, a.params, b.params)


@dyck_group
def test_restore_in_a_fresh_process(tmp_path, dyck_run):
  code = ("import sorjax, numpy as np, json;"
          f"run = sorjax.restore({str(dyck_run[0])!r}, 'best');"
          "lp = run.log_probs(np.array([4, 0, 1, 3, 2, 5]));"
          "print(json.dumps([run.step, list(lp.shape), "
          "np.exp(lp).sum(-1).tolist(), run.config.model.cell]))")
  res = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  step, shape, sums, cell = json.loads(res.stdout.strip().splitlines()[-1])
  assert shape == [6, 6] and cell == "mrnn" and step > 0
  np.testing.assert_allclose(sums, 1.0, rtol=1e-5)
  with pytest.raises(FileNotFoundError, match="not a sorjax run directory"):
    sorjax.restore(str(tmp_path / "nothing"))


@pytest.fixture(scope="session")
def ptb_dir(tmp_path_factory, shared_data):
  """The LM tests' TFDS data_dir: PTB (words) prepared there by the first
  of them and read by the others (preparing it takes 15-20 s)."""
  del shared_data   # skips the tests without the corpora
  return str(tmp_path_factory.mktemp("tfds"))


# the LM tests share ptb_dir: one worker prepares it (--dist loadgroup)
lm_group = pytest.mark.xdist_group("experiments.test_train.lm")


@lm_group
def test_lm_task_trains_with_tbptt_and_restores(tmp_path, shared_data,
                                                ptb_dir, monkeypatch):
  monkeypatch.setenv("SORJAX_DATA_DIR", shared_data)
  from tests.experiments import tiny_lm
  cfg = tiny_lm.get_config()
  cfg.data.data_dir = ptb_dir
  # half the tokens (the loss still falls by 0.5 nats), a quarter of the
  # evaluation: the 10k-word softmax is most of each step's time
  cfg.data.max_train_tokens, cfg.data.max_eval_tokens = 2000, 400
  state = train.train_and_evaluate(cfg, str(tmp_path / "run"))
  valid = read_metrics(str(tmp_path / "run"), "valid")
  assert valid[-1]["loss"] < valid[0]["loss"]
  # The TBPTT carry is in the train state: B streams of the last layer.
  assert state.carry[0].h.shape == (1, 8, 16)
  run = sorjax.restore(str(tmp_path / "run"), "latest")
  lp = run.log_probs("the company said")
  assert lp.shape == (3, 10_000)
  np.testing.assert_allclose(np.exp(lp).sum(-1), 1.0, rtol=1e-5)


@lm_group
def test_lm_task_cuts_training_sentences_only(shared_data, ptb_dir,
                                              monkeypatch):
  """data.train_sentence_cutoff (Renganathan & Singh 6.1): every training
  line keeps its first N symbols (the paper's characters; here PTB's words,
  the corpus the other LM tests prepare) and its end of line; valid and
  test stay whole."""
  monkeypatch.setenv("SORJAX_DATA_DIR", shared_data)
  from experiments.configs import renganathan_ptb
  from sorjax.training.tasks import make_task
  cfg = renganathan_ptb.get_config("word,lstm,cut=25")
  cfg.data.data_dir = ptb_dir
  cfg.model.budget, cfg.model.hidden_size, cfg.model.embed_size = None, 4, 4
  whole = renganathan_ptb.get_config("word,lstm")
  whole.data.data_dir = cfg.data.data_dir
  whole.model.budget, whole.model.hidden_size = None, 4
  whole.model.embed_size = 4
  cut, full = make_task(cfg), make_task(whole)
  eos = cut.vocab.eos_id

  def lines(ids):
    ends = np.flatnonzero(ids == eos)
    return np.split(ids, ends + 1)[:len(ends)]  # each with its eos
  full_lines, cut_lines = lines(full.split_ids["train"]), lines(
      cut.split_ids["train"])
  assert len(cut_lines) == len(full_lines) > 40_000
  # every line, compared at once (2.5 s line by line): each expected line
  # holds one eos, at its end, so equal streams split into equal lines
  np.testing.assert_array_equal(
      np.concatenate(cut_lines),
      np.concatenate([np.append(f[:-1][:25], eos) for f in full_lines]))
  assert cut.num_cut == sum(len(f) - 1 > 25 for f in full_lines) > 0
  for split in ("valid", "test"):
    np.testing.assert_array_equal(cut.split_ids[split],
                                  full.split_ids[split])
  bad = renganathan_ptb.get_config("word,lstm")
  bad.data.data_dir, bad.data.train_sentence_cutoff = cfg.data.data_dir, 0
  with pytest.raises(ConfigError, match="data.train_sentence_cutoff"):
    make_task(bad)


def test_lm_token_limits_apply_to_their_splits_and_are_checked():
  import ml_collections
  from sorjax.training.tasks.lm import _token_prefixes
  ids = {s: np.arange(100) for s in ("train", "valid", "test")}

  def lengths(train, evals):
    d = ml_collections.ConfigDict(dict(max_train_tokens=train,
                                       max_eval_tokens=evals))
    return {s: len(v) for s, v in _token_prefixes(ids, d).items()}
  assert lengths(10, None) == {"train": 10, "valid": 100, "test": 100}
  assert lengths(None, 7) == {"train": 100, "valid": 7, "test": 7}
  assert lengths(None, None) == {"train": 100, "valid": 100, "test": 100}
  for name, bad in (("max_train_tokens", -10), ("max_train_tokens", 0),
                    ("max_eval_tokens", 0), ("max_eval_tokens", 2.5)):
    with pytest.raises(ConfigError, match=re.escape(
        f"data.{name} must be None or an int >= 1, got {bad!r}")):
      lengths(*((bad, None) if name == "max_train_tokens" else (None, bad)))


@lm_group
def test_lm_loss_adds_ar_and_tar_when_training(shared_data, ptb_dir,
                                               monkeypatch):
  """model.activation_reg / temporal_activation_reg (AWD-LSTM's alpha,
  beta) add alpha AR + beta TAR to the training loss, not to evaluation;
  model.weight_drop trains through a dropped W_h."""
  monkeypatch.setenv("SORJAX_DATA_DIR", shared_data)
  from tests.experiments import tiny_lm
  from sorjax.training.tasks import make_task
  cfg = tiny_lm.get_config()
  cfg.data.data_dir = ptb_dir
  cfg.model.weight_drop, cfg.model.output_dropout = 0.5, 0.3
  cfg.model.activation_reg, cfg.model.temporal_activation_reg = 2.0, 1.0
  task = make_task(cfg)
  params = task.init_params(jax.random.key(0))
  batch, _ = next(task.train_batches(0, None))
  carry = task.init_carry(params)
  rng = jax.random.key(3)
  loss, (_, m) = task.loss(params, carry, batch, rng, 1.0, True)
  assert float(m["ar"]) > 0 and float(m["tar"]) > 0
  task.ar = task.tar = 0.0     # the same draw without the penalties
  plain, _ = task.loss(params, carry, batch, rng, 1.0, True)
  np.testing.assert_allclose(loss, plain + 2.0 * m["ar"] + m["tar"],
                             rtol=1e-5)
  task.ar, task.tar = 2.0, 1.0
  _, (_, m_eval) = task.loss(params, carry, batch, None, 1.0, False)
  assert m_eval == {}


def test_trees_task_runs_a_keyword_experiment(tmp_path):
  from tests.experiments import tiny_trees
  cfg = tiny_trees.get_config()
  # test_analyze's tree run's data and batches: its programs (the session's
  # compilation cache)
  cfg.data.scale, cfg.data.batch_size = 0.01, 10
  state = train.train_and_evaluate(cfg, str(tmp_path))
  dev = read_metrics(str(tmp_path), "dev")
  assert len(dev) == 2 and 0.0 <= dev[-1]["accuracy"] <= 1.0
  assert np.isfinite(dev[-1]["loss"])
  assert int(state.step[0]) == 2 * (100 // 10)
  # Le & Zuidema's gradient ratios, recorded after every epoch.
  grads = read_metrics(str(tmp_path), "epoch_metrics")
  assert [r["epoch"] for r in grads] == [1, 2]
  assert any(k.startswith("grad_ratio_depth_") for k in grads[0])
  assert all(v > 0 for k, v in grads[0].items() if k.startswith("grad_"))


@dyck_group
@pytest.mark.skipif(not host_memory.on_glibc(),
                    reason="glibc malloc settings (Linux with glibc only)")
def test_host_malloc_modes_train_the_same_parameters(tmp_path, dyck_run):
  # --host_malloc changes where host buffers come from, nothing else: each
  # mode's run logs it (hugepages: after restarting itself with
  # GLIBC_TUNABLES, where the kernel offers transparent huge pages) and
  # ends with bitwise the parameters of a default run: here one epoch of
  # tiny_dyck, against the default run's (dyck_run's, glibc's malloc as
  # is) checkpoint after its first epoch (train.* change nothing else).
  thp = host_memory.huge_pages_possible()
  workdir, _ = dyck_run
  epoch1 = read_metrics(str(workdir), "dev")[0]["step"]
  a = sorjax.restore(str(workdir), epoch1)
  for mode in ("reuse", "hugepages"):
    res = subprocess.run(main_cmd(tmp_path / mode, f"--host_malloc={mode}",
                                  "--config.train.num_epochs=1",
                                  "--config.train.checkpoint_every=1000"),
                         cwd=ROOT, check=True, capture_output=True,
                         text=True, timeout=600)
    logged = f"host_malloc: {host_memory.APPLIED[mode]}" in res.stderr
    assert logged == (mode == "reuse" or thp), res.stderr
    b = sorjax.restore(str(tmp_path / mode), "latest")
    assert a.step == b.step == epoch1
    jax.tree_util.tree_map(np.testing.assert_array_equal, a.params, b.params)


@pytest.mark.parametrize("cell", ["mrnn", "lstm"])
def test_replica_groups_train_a_dyck_model_as_vmap_does(tmp_path, cell):
  """The fused layers under the loop's lax.map over replica groups: 3
  replicas one at a time end with the parameters of 3 vmapped together."""
  params = {}
  for k in (1, 3):
    cfg = tiny_dyck.get_config()
    cfg.model.cell = cell
    if cell == "lstm":
      cfg.model.intermediate_size = None
    cfg.num_replicas, cfg.replica_batch_size = 3, k
    cfg.train.num_epochs, cfg.train.max_steps = 1, 6
    cfg.data.num_buckets = 1   # one batch shape: one step to compile
    state = train.train_and_evaluate(cfg, str(tmp_path / str(k)))
    params[k] = jax.tree_util.tree_leaves(state.params)
  for a, b in zip(params[1], params[3]):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_a_config_without_the_loops_fields_is_named():
  import ml_collections
  with pytest.raises(ConfigError, match="the config has no group "
                     "'early_stopping': build it on "
                     r"sorjax.training.config.base_config\(\)"):
    train.validate(ml_collections.ConfigDict({"task": "dyck_lm"}))
  cfg = tiny_dyck.get_config()
  cfg.train = {k: v for k, v in cfg.train.to_dict().items()
               if k != "num_epochs"}
  with pytest.raises(ConfigError, match=r"train lacks the fields "
                     r"\['num_epochs'\]"):
    train.validate(cfg)
  train.validate(tiny_dyck.get_config())


def test_a_temperature_for_a_model_without_one_is_refused(tmp_path):
  """tiny_dyck's mRNN takes no temperature: a schedule would do nothing."""
  cfg = tiny_dyck.get_config()
  cfg.temperature.decay, cfg.temperature.eval_value = 0.9, 0.01
  with pytest.raises(ConfigError, match=r"temperature.decay, "
                     r"temperature.eval_value set, but no cell of this "
                     r"dyck_lm model takes a temperature"):
    train.train_and_evaluate(cfg, str(tmp_path / "w"))
  saved = tmp_path / "w" / "checkpoints"
  assert not saved.exists() or not any(saved.iterdir())   # nothing trained


@pytest.mark.parametrize("fields,msg", [
    ({"plateau.patience": 5}, "plateau.patience set with plateau.enabled "
                              "False"),
    ({"plateau.factor": 0.1, "plateau.patience": 2},
     "plateau.factor, plateau.patience set with plateau.enabled False"),
    ({"nt_asgd.nonmono": 10}, "nt_asgd.nonmono=10 is read by "
                              "optim.name='nt_asgd' only .optim.name is "
                              "'adam'."),
])
def test_schedules_set_but_not_in_use_are_refused(tmp_path, fields, msg):
  cfg = tiny_dyck.get_config()
  for path, v in fields.items():
    group, field = path.split(".")
    cfg[group][field] = v
  with pytest.raises(ConfigError, match=msg):
    train.train_and_evaluate(cfg, str(tmp_path / "w"))
  cfg.plateau.enabled = True                # in use: accepted
  if "nt_asgd.nonmono" not in fields:
    train.validate(cfg)
