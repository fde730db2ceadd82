"""The loop: learning, replicas, resume, non-finite losses, sharding."""

import json
import os
import re
import signal
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sorjax import cells
from sorjax.training.loop import NonFiniteLossError, Trainer, map_replicas, \
    replica_batch_for, replica_width
from sorjax.training.metrics import read_metrics
from tests.training.toy_task import ToyTask, toy_config
from tests.xla_env import with_cpu_devices

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def run(workdir, task=None, **cfg):
  config = toy_config(**cfg.pop("train", {}))
  for k, v in cfg.items():
    setattr(config, k, v)
  return Trainer(task or ToyTask(), config, str(workdir)).run()


def test_loss_falls_and_files_are_written(tmp_path):
  state = run(tmp_path)
  recs = read_metrics(str(tmp_path), "valid")
  assert len(recs) == 3 and recs[-1]["loss"] < recs[0]["loss"]
  assert int(state.step[0]) == 18
  assert float(state.carry["seen"][0]) == 18.0       # carry crosses batches
  cfg = json.load(open(tmp_path / "config.json"))
  assert cfg["optim"]["name"] == "sgd"
  assert os.listdir(tmp_path / "checkpoints") and os.listdir(tmp_path / "best")


def test_evaluation_uses_the_temperature_of_the_epoch_just_trained(
    tmp_path):
  """tau = init * decay^epoch per epoch: the evaluation after epoch e reads
  epoch e's value (1, 0.5, 0.25), as Run.eval_temperature does."""
  config = toy_config()
  config.temperature.update({"init": 1.0, "decay": 0.5, "per": "epoch"})
  Trainer(ToyTask(), config, str(tmp_path)).run()
  recs = read_metrics(str(tmp_path), "valid")
  assert [r["temperature"] for r in recs] == [1.0, 0.5, 0.25]


def test_replicas_equal_separate_runs(tmp_path):
  both = run(tmp_path / "r", num_replicas=2, seed=3)
  one = run(tmp_path / "a", seed=3)
  two = run(tmp_path / "b", seed=4)
  np.testing.assert_allclose(both.params["w"][0], one.params["w"][0], rtol=1e-6)
  np.testing.assert_allclose(both.params["w"][1], two.params["w"][0], rtol=1e-6)
  assert not np.allclose(both.params["w"][0], both.params["w"][1])


@pytest.mark.parametrize("R, batch, shards", [
    (6, 1, 1), (6, 4, 1), (6, 6, 1), (6, 9, 1), (6, 2, 2), (6, 1, 3),
    (6, 3, 2)])
def test_map_replicas_equals_a_loop_over_replicas(R, batch, shards):
  """Every grouping (vmap, a loop over groups with a remainder, split over
  shards) gives each replica f of its own slice."""
  k = jax.random.split(jax.random.key(0), 2)
  tree = {"w": jax.random.normal(k[0], (R, 3, 4)),
          "b": (jax.random.normal(k[1], (R, 4)), jnp.arange(R))}

  def f(t):
    y = jnp.tanh(jnp.ones((2, 3)) @ t["w"] + t["b"][0][None])
    return y * t["b"][1].astype(y.dtype), {"sum": jnp.sum(y)}

  got = map_replicas(f, tree, batch, shards)
  for r in range(R):
    want = f(jax.tree_util.tree_map(lambda a: a[r], tree))
    for g, w in zip(jax.tree_util.tree_leaves(got),
                    jax.tree_util.tree_leaves(want)):
      assert g.shape[1:] == w.shape
      np.testing.assert_allclose(g[r], w, rtol=1e-6, atol=1e-6)


def test_logged_tokens_count_valid_positions_only():
  """tokens/s counts a batch's lengths where it has them (a Dyck batch of
  lengths 3 and 5 padded to 8 holds 8 tokens, not 16), else its first
  array's size (a full stream batch)."""
  from sorjax.training.loop import batch_tokens
  padded = {"inputs": np.zeros((2, 8), np.int32),
            "targets": np.zeros((2, 8), np.int32),
            "lengths": np.array([3, 5], np.int32)}
  assert batch_tokens(padded) == 8
  assert batch_tokens({"inputs": np.zeros((4, 35), np.int32),
                       "targets": np.zeros((4, 35), np.int32)}) == 140


def test_replica_batch_for_keeps_groups_within_the_width():
  assert replica_batch_for(20, 10, 12) == 4        # 512 // 120
  assert replica_batch_for(20, 10, 24) == 2
  assert replica_batch_for(20, 128, 256) == 1
  assert replica_batch_for(3, 1, 8) == 3           # no more than there are
  assert replica_batch_for(20, None, 12) == 20     # unknown: all vmapped
  assert replica_batch_for(20, 10, None) == 20


def test_replica_width_sums_the_cells_state_widths():
  lstm = cells.make("lstm", hidden_size=12)
  mix = cells.make("attention_lstm", hidden_size=24, num_cells=2)
  assert replica_width((lstm,)) == 12
  assert replica_width((mix,)) == 48                # 2 cells of 24
  assert replica_width((lstm, mix)) == 60           # layers add up
  assert replica_width(()) is None and replica_width(None) is None


@pytest.mark.parametrize("k", [1, 2])
def test_replica_groups_train_as_vmap_does(tmp_path, k):
  """3 replicas one or two at a time (a loop over groups) end where all
  three vmapped together do."""
  together = run(tmp_path / "all", num_replicas=3, seed=2)
  grouped = run(tmp_path / str(k), num_replicas=3, seed=2,
                replica_batch_size=k)
  np.testing.assert_allclose(grouped.params["w"], together.params["w"],
                             rtol=1e-6)


def test_rerun_resumes_to_the_same_parameters(tmp_path):
  full = run(tmp_path / "full")
  # Interrupt after 7 steps (a checkpoint exists at step 4), then rerun.
  run(tmp_path / "cut", train={"max_steps": 7})
  resumed = run(tmp_path / "cut")
  np.testing.assert_array_equal(resumed.params["w"], full.params["w"])
  steps = [r["step"] for r in read_metrics(str(tmp_path / "cut"), "train")]
  assert steps == sorted(set(steps))          # no duplicated records


def test_a_run_cannot_be_resumed_shorter_than_it_has_trained(tmp_path):
  """num_epochs / max_steps below what the checkpoint holds would leave a
  config.json claiming a shorter run than its weights and metrics: refused
  before anything is written; the same or a longer budget resumes."""
  from sorjax.training.tasks.common import ConfigError
  run(tmp_path / "full")                          # 3 epochs of 6 steps
  saved = (tmp_path / "full" / "config.json").read_text()
  with pytest.raises(ConfigError, match=r"checkpoints/18 has trained beyond "
                     r"train.num_epochs=2 \(it has run 3 epochs\); a run "
                     r"cannot be shortened"):
    run(tmp_path / "full", train={"num_epochs": 2})
  with pytest.raises(ConfigError, match=r"beyond train.max_steps=10 \(it is "
                     r"at step 18\)"):
    run(tmp_path / "full", train={"max_steps": 10})
  assert (tmp_path / "full" / "config.json").read_text() == saved
  assert int(run(tmp_path / "full", train={"max_steps": 18}).step[0]) == 18
  # stopped by max_steps in epoch 1 (1 epoch and part of the next)
  run(tmp_path / "cut", train={"max_steps": 7})
  with pytest.raises(ConfigError, match=r"train.num_epochs=1 \(it has run 1 "
                     r"epochs and part of the next\)"):
    run(tmp_path / "cut", train={"num_epochs": 1})
  assert int(run(tmp_path / "cut", train={"num_epochs": 2}).step[0]) == 12


def test_max_steps_at_an_epochs_last_batch_evaluates_that_epoch(
    tmp_path, caplog):
  """6 batches an epoch: max_steps=12 ends epoch 2, which is evaluated
  (best/ written) as without max_steps; max_steps=7 stops inside epoch 2,
  says so, and leaves it unevaluated."""
  from sorjax.training.checkpoint import Checkpointer
  run(tmp_path / "at", train={"max_steps": 12})
  valid = read_metrics(str(tmp_path / "at"), "valid")
  assert [r["step"] for r in valid] == [6, 12]
  full = run(tmp_path / "full", train={"num_epochs": 2})
  drop = lambda rs: [{k: v for k, v in r.items() if k != "time"}  # noqa
                     for r in rs]
  assert drop(read_metrics(str(tmp_path / "full"), "valid")) == drop(valid)
  ck = Checkpointer(str(tmp_path / "at"), read_only=True)
  assert ck.best_step() in (6, 12)
  ck.close()
  with caplog.at_level("WARNING"):
    run(tmp_path / "in", train={"max_steps": 4})
  assert "stopped by train.max_steps=4 at step 4, inside epoch 1: that " \
         "epoch is not evaluated and no epoch has been" in caplog.text
  with pytest.raises(FileNotFoundError, match=r"no checkpoint 'best' .*has "
                     r"evaluated none \(step 'latest' reads its last "
                     r"state\)"):
    Checkpointer(str(tmp_path / "in"), read_only=True).restore_meta("best")


def test_a_new_run_drops_the_metrics_of_one_killed_before_its_first_save(
    tmp_path):
  """metrics.jsonl records of a run that saved no checkpoint (killed
  early) are not kept beside the new run's; a resume from a checkpoint
  saved at an epoch's last batch, before that epoch's evaluation, drops
  that evaluation (it is made again)."""
  (tmp_path / "metrics.jsonl").write_text(
      json.dumps({"step": 1, "split": "train", "loss": 9.0}) + "\n")
  run(tmp_path)
  assert [r["loss"] for r in read_metrics(str(tmp_path), "train")
          if r["step"] == 1] != [9.0]
  from sorjax.training.loop import _truncate_metrics
  recs = [{"step": 6, "split": "train"}, {"step": 6, "split": "valid"},
          {"step": 7, "split": "train"}, {"step": 5, "split": "valid"}]
  path = tmp_path / "m"
  os.makedirs(path)
  for mid, want in ((True, [recs[0], recs[3]]), (False, recs[:2] + recs[3:])):
    (path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in recs))
    _truncate_metrics(str(path), 6, mid_epoch=mid)
    assert read_metrics(str(path)) == want


class VocabTask(ToyTask):
  """ToyTask reading a corpus whose vocabulary is `symbols`."""

  def __init__(self, symbols):
    super().__init__()
    from sorjax.data.vocab import Vocab
    self.vocab = Vocab(symbols, unk=None)


def test_a_refused_resume_leaves_the_runs_files_as_they_were(tmp_path):
  """A resume refused before training (here: the corpus read now gives
  another vocabulary than the run's vocab.json, as another data_dir's
  build could) rewrites neither config.json nor vocab.json, so
  sorjax.restore still reads the finished run."""
  from sorjax.training.tasks.common import ConfigError
  run(tmp_path, task=VocabTask(["<eos>", "a", "b"]), train={"max_steps": 7})
  files = {n: (tmp_path / n).read_text() for n in ("config.json",
                                                   "vocab.json")}
  with pytest.raises(ConfigError, match=r"vocab.json holds the 3-symbol "
                     r"vocabulary this run was trained with; the corpus read "
                     r"now .* gives 3 symbols, differing from id 1 on"):
    run(tmp_path, task=VocabTask(["<eos>", "b", "a"]))
  with pytest.raises(ConfigError, match=r"gives 4 symbols, differing from "
                     r"id 3 on"):
    run(tmp_path, task=VocabTask(["<eos>", "a", "b", "c"]))
  assert {n: (tmp_path / n).read_text() for n in files} == files
  # a checkpoint that cannot be read: refused by the restore, still before
  # config.json is written
  import shutil
  shutil.copytree(tmp_path, tmp_path.parent / "damaged")
  damaged = tmp_path.parent / "damaged"
  shutil.rmtree(damaged / "checkpoints" / "7" / "state")
  with pytest.raises(ValueError, match=r"checkpoints/7 cannot be read"):
    run(damaged, task=VocabTask(["<eos>", "a", "b"]),
        train={"max_steps": 9})
  assert {n: (damaged / n).read_text() for n in files} == files
  # the same vocabulary resumes
  state = run(tmp_path, task=VocabTask(["<eos>", "a", "b"]))
  assert int(state.step[0]) == 18


class SignalledTask(ToyTask):
  """Sends its own process `signum` as it hands out batch `at` (epoch * 100
  + batch), as Ctrl-C or a scheduler's SIGTERM would arrive mid-run."""

  def __init__(self, signum, at):
    super().__init__()
    self.signum, self.at = signum, at

  def train_batches(self, epoch, position):
    for batch, pos in super().train_batches(epoch, position):
      if epoch * 100 + pos["batch"] - 1 == self.at:
        os.kill(os.getpid(), self.signum)
      yield batch, pos


@pytest.mark.parametrize("signum, at, step", [
    (signal.SIGINT, 102, 9),    # epoch 1's third batch: step 6 + 3
    (signal.SIGTERM, 3, 4)])    # a step that checkpoint_every also saves
def test_a_signal_saves_the_step_and_the_rerun_ends_as_uninterrupted(
    tmp_path, signum, at, step):
  from sorjax.training.checkpoint import Checkpointer
  from sorjax.training.interrupt import Interrupted
  full = run(tmp_path / "full")
  # the handlers of a terminal's process (pytest started with `&` from a
  # script inherits SIGINT ignored, which the loop leaves alone: the next
  # test)
  before = {signal.SIGINT: signal.default_int_handler,
            signal.SIGTERM: signal.SIG_DFL}[signum]
  inherited = signal.signal(signum, before)
  try:
    with pytest.raises(Interrupted, match=rf"{signal.Signals(signum).name} "
                       rf"at step {step}: saved .*checkpoints/{step}") as e:
      run(tmp_path / "cut", task=SignalledTask(signum, at))
    assert e.value.exit_code == 128 + signum
    assert signal.getsignal(signum) is before  # handlers restored
  finally:
    signal.signal(signum, inherited)
  ck = Checkpointer(str(tmp_path / "cut"), read_only=True)
  assert ck.latest_step() == step
  ck.close()
  resumed = run(tmp_path / "cut")
  np.testing.assert_array_equal(resumed.params["w"], full.params["w"])


def test_a_signal_the_process_ignores_leaves_the_run_alone(tmp_path):
  """A run started in the background by a shell without job control has
  SIGINT ignored (Ctrl-C in that terminal must not reach it): the loop
  keeps it ignored, and the run ends as an uninterrupted one."""
  full = run(tmp_path / "full")
  inherited = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    cut = run(tmp_path / "cut", task=SignalledTask(signal.SIGINT, 102))
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGINT, inherited)
  np.testing.assert_array_equal(cut.params["w"], full.params["w"])


def test_resume_with_plateau_state_equals_uninterrupted(tmp_path):
  """The plateau state was saved as JSON floats and restored as float32,
  where optax's counters are int32: the next epoch end failed in its
  lax.cond."""
  def cfg(**train):
    c = toy_config(**train)
    c.plateau.enabled = True
    return c
  full = Trainer(ToyTask(), cfg(), str(tmp_path / "full")).run()
  for steps in (7, 13, None):   # resumed inside epochs 1 and 2
    cut = Trainer(ToyTask(), cfg(max_steps=steps),
                  str(tmp_path / "cut")).run()
  np.testing.assert_array_equal(cut.params["w"], full.params["w"])


def test_rerun_with_another_config_is_refused_before_anything_is_written(
    tmp_path):
  """Resuming checkpoints under changed model or optimiser fields would
  continue the weights as another run: refused, naming the fields, and
  config.json keeps the values they were trained with."""
  from sorjax.training.tasks.common import ConfigError
  run(tmp_path, train={"max_steps": 4})
  saved = (tmp_path / "config.json").read_text()
  config = toy_config(max_steps=4)
  config.optim.learning_rate, config.seed = 0.5, 3
  with pytest.raises(ConfigError, match=re.escape(
      "optim.learning_rate: 0.05 -> 0.5; seed: 0 -> 3 (saved -> given)")):
    Trainer(ToyTask(), config, str(tmp_path)).run()
  assert (tmp_path / "config.json").read_text() == saved
  # A damaged config.json: named, nothing resumed or rewritten.
  for damaged, what in (('{"seed": ', "is not valid JSON (line 1"),
                        ("[1, 2]", "must hold a JSON object, got list")):
    (tmp_path / "config.json").write_text(damaged)
    with pytest.raises(ConfigError, match=re.escape(
        f"cannot read the config this run was trained with: "
        f"{tmp_path / 'config.json'} {what}")):
      Trainer(ToyTask(), toy_config(max_steps=4), str(tmp_path)).run()
    assert (tmp_path / "config.json").read_text() == damaged
  # Without config.json, the latest checkpoint's copy of the config.
  (tmp_path / "config.json").unlink()
  with pytest.raises(ConfigError, match=r"checkpoints/4\): optim"):
    Trainer(ToyTask(), config, str(tmp_path)).run()
  assert not (tmp_path / "config.json").exists()
  # How long it trains, how it logs and the replica grouping may change.
  state = run(tmp_path, train={"max_steps": 6, "log_every": 1},
              replica_batch_size=1)
  assert int(state.step[0]) == 6
  assert json.load(open(tmp_path / "config.json"))["train"]["max_steps"] == 6
  # Before any checkpoint, a config.json is only a record: replaced.
  (tmp_path / "fresh").mkdir()
  (tmp_path / "fresh" / "config.json").write_text('{"seed": 9}')
  run(tmp_path / "fresh", train={"max_steps": 1})
  assert json.load(open(tmp_path / "fresh" / "config.json"))["seed"] == 0


def test_config_changes_lists_each_differing_field():
  from sorjax.training.loop import config_changes
  saved = {"model": {"h": 4, "remat": False}, "train": {"max_steps": 1},
           "sizes": [1, 2], "data": {"data_dir": "/a", "k": 2}}
  given = {"model": {"h": 5, "remat": True, "new": 1},
           "train": {"max_steps": 9}, "sizes": (1, 2),
           "data": {"data_dir": "/b", "k": 2}}
  changes = config_changes(saved, given)
  assert changes == ["model.h: 4 -> 5", "model.new: '(absent)' -> 1"]
  # the parts, for readers that must not parse the text
  (h, new) = changes
  assert (h.path, h.saved, h.given, h.predates) == ("model.h", 4, 5, False)
  assert (new.path, new.given, new.predates) == ("model.new", 1, True)


def test_a_change_names_its_field_whatever_its_text():
  """Readers take a change's path and whether the run predates the field
  from its attributes: a key holding ': ' cut the path short when the
  text was split at its first colon."""
  from sorjax.training.loop import config_changes
  saved = {"model": {"cell": "lstm"}}
  given = {"model": {"cell": "gru", "odd: key": 3}}
  assert [(c.path, c.saved, c.given, c.predates)
          for c in config_changes(saved, given)] == [
              ("model.cell", "lstm", "gru", False),
              ("model.odd: key", "(absent)", 3, True)]


def test_a_run_from_before_selection_existed_resumes(tmp_path):
  run(tmp_path, train={"max_steps": 4})
  path = tmp_path / "config.json"
  cfg = json.load(open(path))
  del cfg["selection"]                       # as runs wrote it before
  path.write_text(json.dumps(cfg))
  state = run(tmp_path, train={"max_steps": 8})
  assert int(state.step[0]) == 8


def test_a_base_field_added_since_a_run_reads_as_its_default():
  """A config.json written before selection.* existed resumes with the
  default selection (what that run did), not with another one."""
  from sorjax.training.loop import config_changes
  old = {"seed": 0}
  assert config_changes(old, {"seed": 0, "selection": {
      "metric": "loss", "mode": "min"}}) == []
  assert config_changes(old, {"seed": 0, "selection": {
      "metric": "accuracy", "mode": "min"}}) == [
          "selection.metric: 'loss' -> 'accuracy'"]
  # a field base_config does not have stays absent, unless given None (an
  # optional field left unset, as data.test_batch_size in an older run)
  assert config_changes(old, {"seed": 0, "extra": 1}) == [
      "extra: '(absent)' -> 1"]
  assert config_changes(old, {"seed": 0, "data": {"extra": None}}) == []
  assert config_changes({"data": {"extra": None}}, {}) == [
      "data.extra: None -> '(absent)'"]


def test_a_task_field_added_since_a_run_reads_as_what_that_run_did():
  """An LM run saved before data.documents / data.folds existed resumes
  with them off, and not with them on."""
  from sorjax.training.loop import config_changes
  from sorjax.training.tasks import added_fields
  added = added_fields("lm")
  assert added["data.documents"] is False and added["data.folds"] is None
  assert added_fields("trees") == {} and added_fields("nope") == {}
  old = {"task": "lm", "data": {"corpus": "ptb"}}
  now = {"task": "lm", "data": {"corpus": "ptb", "documents": False,
                                "num_buckets": 16, "bucket_multiple": 8,
                                "folds": None, "fold": 0,
                                "fold_valid_fraction": 0.1, "fold_seed": 0}}
  assert config_changes(old, now, added) == []
  now["data"].update(documents=True, fold=1)
  assert config_changes(old, now, added) == [
      "data.documents: False -> True", "data.fold: 0 -> 1"]
  assert config_changes(old, now) == [
      "data.bucket_multiple: '(absent)' -> 8",
      "data.documents: '(absent)' -> True", "data.fold: '(absent)' -> 1",
      "data.fold_seed: '(absent)' -> 0",
      "data.fold_valid_fraction: '(absent)' -> 0.1",
      "data.num_buckets: '(absent)' -> 16"]


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  with pytest.raises(NonFiniteLossError, match="non-finite"):
    run(tmp_path, task=ToyTask(nan_at_batch=105))   # epoch 1, batch 5
  from sorjax.training.checkpoint import Checkpointer
  ck = Checkpointer(str(tmp_path), read_only=True)
  step, meta = ck.restore_meta("latest")
  assert step <= 10 and np.isfinite(step)


def _trained_on(tmp_path, n, run_args=""):
  """In a process with n forced CPU devices: `run(workdir, <run_args>)`;
  returns [device count, the spec and device count of w's sharding, w]."""
  code = (
      "import sys, json; sys.path.insert(0, %r);"
      "from tests.training.test_loop import run;"
      "import jax; w = run(%r%s).params['w'];"
      "print(json.dumps([jax.device_count(), list(w.sharding.spec),"
      " len(w.sharding.device_set), w.tolist()]))"
      % (ROOT, str(tmp_path / str(n)), run_args))
  env = with_cpu_devices(n)
  res = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-2000:]
  return json.loads(res.stdout.strip().splitlines()[-1])


def test_four_devices_match_one(tmp_path):
  """Sharded over a forced 4-device CPU host (the batch; the state
  replicated), the parameters equal one device's."""
  one, four = _trained_on(tmp_path, 1), _trained_on(tmp_path, 4)
  assert one[0] == 1 and four[:3] == [4, [], 4]
  np.testing.assert_allclose(four[3], one[3], rtol=1e-5)


def test_replicas_over_four_devices_match_one(tmp_path):
  """4 replicas on a forced 4-device CPU host: each device trains one
  replica on the whole batch (the state's replica axis sharded, the batch
  replicated), and every replica ends as on one device."""
  args = ", num_replicas=4, seed=5"
  one, four = _trained_on(tmp_path, 1, args), _trained_on(tmp_path, 4, args)
  assert one[0] == 1 and four[:3] == [4, ["devices"], 4]
  np.testing.assert_allclose(four[3], one[3], rtol=1e-5)
  assert not np.allclose(four[3][0], four[3][1])    # distinct seeds


def test_replica_groups_over_two_devices_match_one(tmp_path):
  """4 replicas over 2 forced CPU devices, one at a time on each (a loop
  inside each device's shard), end as 4 vmapped on one device."""
  one = _trained_on(tmp_path / "a", 1, ", num_replicas=4, seed=5")
  two = _trained_on(tmp_path / "b", 2, ", num_replicas=4, seed=5, "
                    "replica_batch_size=1")
  assert two[:3] == [2, ["devices"], 2]
  np.testing.assert_allclose(two[3], one[3], rtol=1e-5)
  # and each device keeps to its shard: the compiled step communicates not
  code = (
      "import sys, re, tempfile; sys.path.insert(0, %r);"
      "import numpy as np;"
      "from tests.training.toy_task import ToyTask, toy_config;"
      "from sorjax.training.loop import Trainer;"
      "c = toy_config(); c.num_replicas = 4; c.replica_batch_size = 1;"
      "task = ToyTask(); tr = Trainer(task, c, tempfile.mkdtemp());"
      "st = tr._place_state(tr.init_state());"
      "b = tr._shard_batch(next(iter(task.train_batches(0, None)))[0]);"
      "hlo = tr._step_fn.lower(st, b, np.float32(1)).compile().as_text();"
      "print(tr.replica_parallel, tr.replica_batch, re.findall("
      "r'all-gather|all-reduce|collective-permute|all-to-all|"
      "reduce-scatter', hlo))" % ROOT)
  env = with_cpu_devices(2)
  res = subprocess.run([sys.executable, "-c", code], env=env,
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-2000:]
  assert res.stdout.strip().splitlines()[-1] == "True 1 []"


def test_a_multi_process_run_is_refused(tmp_path):
  # Under jax.distributed (here 2 CPU processes on this host) each process
  # would train the same model alone on its own devices and write the same
  # files; the loop refuses it in every process, before writing anything.
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  code = (
      "import sys; sys.path.insert(0, %r); import jax;"
      "jax.distributed.initialize('localhost:%d', num_processes=2, "
      "process_id=int(sys.argv[1]), initialization_timeout=120);"
      "from tests.training.toy_task import ToyTask, toy_config;"
      "from sorjax.training.loop import Trainer;"
      "Trainer(ToyTask(), toy_config(), %r)") % (ROOT, port, str(tmp_path))
  procs = [subprocess.Popen([sys.executable, "-c", code, str(i)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for i in range(2)]
  for i, p in enumerate(procs):
    _, err = p.communicate(timeout=300)
    assert p.returncode != 0
    assert re.search(f"RuntimeError: .*process {i} of 2.*"
                     f"{re.escape(str(tmp_path))}.*one process per run",
                     err), err[-2000:]
  assert not os.listdir(tmp_path)


def test_stop_below_ends_the_run_once_every_replica_is_under_it(tmp_path):
  run(tmp_path / "f", train={"num_epochs": 6})
  full = [r["loss"] for r in read_metrics(str(tmp_path / "f"), "valid")]
  # A threshold between epoch 2's and epoch 1's loss: stops after epoch 2.
  thr = (full[0] + full[1]) / 2
  assert full[1] < thr < full[0]
  config = toy_config(num_epochs=6)
  config.early_stopping.stop_below = thr
  Trainer(ToyTask(), config, str(tmp_path / "s")).run()
  recs = read_metrics(str(tmp_path / "s"), "valid")
  assert [r["epoch"] for r in recs] == [1, 2]
  # A rerun of a stopped run does nothing more.
  Trainer(ToyTask(), config, str(tmp_path / "s")).run()
  assert len(read_metrics(str(tmp_path / "s"), "valid")) == 2


def test_a_workdir_another_process_trains_into_is_refused(tmp_path):
  """Two runs in one work directory interleaved their metrics.jsonl rows
  and checkpoints (QA, session 41): the second is refused before it writes
  anything, naming the first; the lock goes with the holder."""
  import subprocess
  import sys
  from sorjax.training import workdir_lock
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time\n"
       "from sorjax.training import workdir_lock\n"
       f"with workdir_lock.held({str(tmp_path)!r}):\n"
       "  print('held', flush=True); time.sleep(60)\n"],
      cwd=os.path.dirname(os.path.dirname(os.path.dirname(
          os.path.abspath(__file__)))), stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(workdir_lock.WorkdirInUse, match=rf"{tmp_path} is "
                       rf"being trained into by another process \(pid "
                       rf"{holder.pid} on .*\): two runs"):
      run(tmp_path)
    assert sorted(os.listdir(tmp_path)) == [".lock"]   # nothing written
  finally:
    holder.kill()
    holder.wait()
  state = run(tmp_path)          # the lock died with its holder
  assert int(state.step[0]) == 18


def test_a_metrics_line_cut_short_by_a_full_disk_is_dropped_on_resume(
    tmp_path):
  """A full disk stopped a run mid-line in metrics.jsonl: its resume
  failed on that line as a JSONDecodeError naming no file. The cut line
  (the file's last, unterminated: written after the last checkpoint) is
  dropped and the run ends as an uninterrupted one; a bad line elsewhere
  is named, file and line."""
  full = run(tmp_path / "full")
  cut = tmp_path / "cut"
  run(cut, train={"max_steps": 7})
  with open(cut / "metrics.jsonl", "a") as f:
    f.write('{"step": 8, "split": "train", "time": 17')
  resumed = run(cut)
  np.testing.assert_array_equal(resumed.params["w"], full.params["w"])
  drop = lambda rs: [{k: v for k, v in r.items()  # noqa: E731
                      if k not in ("time", "tokens_per_s")} for r in rs]
  assert drop(read_metrics(str(cut))) == drop(read_metrics(
      str(tmp_path / "full")))
  lines = (cut / "metrics.jsonl").read_text().splitlines(keepends=True)
  lines.insert(1, "{broken\n")
  (cut / "metrics.jsonl").write_text("".join(lines))
  with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON line "
                     r".*; repair or delete that line to resume"):
    run(cut, train={"num_epochs": 4})


def test_a_failed_rewrite_of_config_json_keeps_the_one_trained_with(
    tmp_path, monkeypatch):
  """A resume rewrites config.json; a full disk mid-write left it cut
  short, after which the run could neither resume nor be restored. It is
  written whole or not at all, and the error names it."""
  from tests.disk_full import fill_disk

  full = run(tmp_path / "full")
  wd = tmp_path / "cut"
  run(wd, train={"max_steps": 7})
  saved = (wd / "config.json").read_text()
  fill_disk(monkeypatch, keep=10, only="config.json")
  with pytest.raises(OSError, match=r"cannot write .*config.json \(its "
                     r"earlier version is kept\): No space left on device"):
    run(wd)
  monkeypatch.undo()
  assert (wd / "config.json").read_text() == saved
  assert not [n for n in os.listdir(wd) if n.endswith(".tmp")]
  np.testing.assert_array_equal(run(wd).params["w"], full.params["w"])


def test_a_failed_save_of_a_step_saved_before_keeps_that_step(
    tmp_path, monkeypatch):
  """An epoch ending at a checkpoint_every step saves that step again; the
  earlier save was deleted first, so with keep_checkpoints=1 a full disk
  there left no checkpoint, and the rerun started the run over, dropping
  its metrics. Now the earlier save is kept, and the rerun resumes from it
  and ends as an uninterrupted run."""
  import orbax.checkpoint as ocp
  from sorjax.checks import WriteError
  from sorjax.training.checkpoint import Checkpointer
  train = {"keep_checkpoints": 1, "checkpoint_every": 6}  # 6 steps an epoch
  full = run(tmp_path / "full", train=train)
  real_save, calls = ocp.CheckpointManager.save, []

  def save(self, step, *args, **kwargs):
    if step == 12 and str(self.directory).endswith("checkpoints"):
      calls.append(step)
      if len(calls) == 2:        # the epoch's end, after the periodic save
        raise OSError(28, "No space left on device")
    return real_save(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  wd = tmp_path / "cut"
  with pytest.raises(WriteError, match=rf"saving a checkpoint in {wd}/"
                     rf"checkpoints failed .*No space left on device.*; the "
                     rf"run stops here and {wd}/checkpoints/12 is its last "
                     "complete checkpoint"):
    run(wd, train=train)
  monkeypatch.undo()
  ck = Checkpointer(str(wd), read_only=True)
  assert ck.latest_step() == 12
  ck.close()
  np.testing.assert_array_equal(run(wd, train=train).params["w"],
                                full.params["w"])
  assert [r["step"] for r in read_metrics(str(wd), "valid")] == [6, 12, 18]


def test_a_best_save_that_fails_in_the_background_is_made_again(
    tmp_path, monkeypatch):
  """Orbax saves in the background and reports a failure at the manager's
  next save or wait. A best/ save that failed (a full disk) at the last
  epoch surfaced only at the run's end, after checkpoints/ had recorded
  that epoch as the best (best_mean): the rerun then had nothing to do,
  and best/ kept an older epoch than the metrics select, silently. The
  checkpoint now waits for the best save; the rerun evaluates the epoch
  again and best/ holds it."""
  import orbax.checkpoint as ocp
  from sorjax.checks import WriteError
  from sorjax.training.checkpoint import Checkpointer
  real_save = ocp.CheckpointManager.save
  real_wait = ocp.CheckpointManager.wait_until_finished
  pending = []

  def best(mngr):
    return str(mngr.directory).endswith("best")

  def save(self, step, *args, **kwargs):
    if best(self) and pending:
      raise pending.pop()
    if best(self) and step == 18:          # the last epoch's: it fails later
      pending.append(OSError(28, "No space left on device"))
      return True
    return real_save(self, step, *args, **kwargs)

  def wait(self):
    if best(self) and pending:
      raise pending.pop()
    return real_wait(self)

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  monkeypatch.setattr(ocp.CheckpointManager, "wait_until_finished", wait)
  with pytest.raises(WriteError, match=r"saving a checkpoint in .*best "
                     r"failed \(\[Errno 28\] No space left on device\)"):
    run(tmp_path)
  monkeypatch.undo()
  run(tmp_path)
  valid = read_metrics(str(tmp_path), "valid")
  chosen = min(valid, key=lambda r: r["loss"])["step"]
  ck = Checkpointer(str(tmp_path), read_only=True)
  assert chosen == 18 and ck.best_step() == 18
  ck.close()
