"""Run directories written by earlier versions: restored and resumed as
they trained, or refused naming what to give."""

import json

import pytest
from absl import logging

from sorjax.runs import load_config
from sorjax.training.loop import config_changes
from sorjax.training.tasks import as_trained
from tests.experiments import tiny_dyck
from tests.training.test_loop import run


def _before_session_41(**data):
  """A Dyck run's config.json as written before session 41: no
  model.head_units / head_init / bias_init, the preset lin_m4 with split
  counts beside it (which that code did not read)."""
  cfg = tiny_dyck.get_config().to_dict()
  cfg["data"].update({"k": 2, "m": 4, "preset": "lin_m4",
                      "max_length": None, **data})
  for k in ("head_units", "head_init", "bias_init"):
    del cfg["model"][k]
  return cfg


def test_counts_beside_a_preset_read_as_the_presets_before_session_41(
    tmp_path, monkeypatch):
  """Until session 41 a count beside data.preset was not read (the
  preset's 10k/4k/10k were sampled); since, it replaces the preset's. An
  older run's config.json restores, analyses and resumes with what it
  trained on, not with the counts written beside the preset."""
  saved = _before_session_41(num_train=240, num_dev=4000, num_test=40)
  (tmp_path / "config.json").write_text(json.dumps(saved))
  warned = []
  monkeypatch.setattr(logging, "warning",
                      lambda msg, *a: warned.append(msg % a))
  cfg = load_config(str(tmp_path))
  assert (cfg.data.num_train, cfg.data.num_dev, cfg.data.num_test) == (
      10_000, 4_000, 10_000)
  assert len(warned) == 2 and "data.num_train reads as 10000" in warned[0]
  assert "before session 41" in warned[0]

  # resuming: the saved counts compare as the preset's
  given = dict(saved, model=dict(saved["model"], head_units=None),
               data=dict(saved["data"], num_train=10_000, num_test=10_000))
  assert config_changes(saved, given) == []
  given["data"]["num_train"] = 240     # the count now read: another run
  (change,) = config_changes(saved, given)
  assert change.startswith("data.num_train: 10000 (config.json's 240 "
                           "beside data.preset, which runs before session "
                           "41 did not read") and change.endswith("-> 240")


def test_counts_beside_a_preset_are_read_in_a_later_run():
  now = tiny_dyck.get_config().to_dict()
  now["data"].update(k=2, m=4, preset="lin_m4", num_train=240)
  assert as_trained(now) == (now, {})
  assert config_changes(now, now) == []
  old_without_preset = _before_session_41(preset=None, num_train=240)
  assert as_trained(old_without_preset)[1] == {}


def test_a_field_added_since_a_run_is_named_with_the_value_it_read(
    tmp_path):
  """Resuming with a field the run predates set (a config that now sets
  model.head_units, say) is refused, and the message says which value
  gives what the run did: None."""
  run(tmp_path, train={"max_steps": 4})
  from sorjax.training.tasks.common import ConfigError
  with pytest.raises(ConfigError, match=r"new_field: '\(absent\)' -> 1 .*"
                     r"Give the saved values \(a field the run predates: "
                     r"--config\.new_field=None\)"):
    run(tmp_path, train={"max_steps": 8}, new_field=1)


def test_a_layer_field_added_since_a_run_reads_as_none():
  """model.layers compares layer by layer: a Mahto run saved before
  bias_init existed resumes with each layer's bias_init None (what it
  did), and with 'uniform' is refused naming the layer's field."""
  saved = {"model": {"layers": [{"cell": "mts_lstm", "hidden_size": 6},
                                {"cell": "lstm", "hidden_size": 8}]}}
  given = {"model": {"layers": (
      {"cell": "mts_lstm", "hidden_size": 6, "bias_init": None},
      {"cell": "lstm", "hidden_size": 8, "bias_init": None})}}
  assert config_changes(saved, given) == []
  given["model"]["layers"][1]["bias_init"] = "uniform"
  assert config_changes(saved, given) == [
      "model.layers[1].bias_init: '(absent)' -> 'uniform'"]
  given["model"]["layers"] = given["model"]["layers"][:1]
  assert config_changes(saved, given) == [
      "model.layers[1].cell: 'lstm' -> '(absent)'",
      "model.layers[1].hidden_size: 8 -> '(absent)'"]


def test_a_layer_field_is_unset_from_the_command_line():
  """`--config.model.layers[1].bias_init=None` gives None, the value the
  resume refusal asks for (ml_collections set the string 'None')."""
  import ml_collections
  from experiments import train as launcher
  c = ml_collections.ConfigDict({"model": {"layers": (
      {"cell": "lstm", "bias_init": "uniform"},
      {"cell": "lstm", "bias_init": "uniform"})}, "seed": 3})
  argv = ["m", "--config.model.layers[1].bias_init=None",
          "--config.seed=None"]
  kept, literal = launcher.literal_overrides(argv)
  assert kept == ["m"]
  for _, path, value in literal:
    launcher.set_override(c, path, value)
  assert c.model.layers[1]["bias_init"] is None and c.seed is None
  assert c.model.layers[0]["bias_init"] == "uniform"


def _set_in_run(workdir, **fields):
  """An older run's files: `fields` ({"section.field": value}) set in its
  config.json and in every checkpoint's copy of its config, as a version
  that wrote (and ignored) them left them."""
  paths = [workdir / "config.json"] + sorted(
      workdir.glob("*/*/meta/metadata"))
  for path in paths:
    raw = json.loads(path.read_text())
    cfg = raw if path.name == "config.json" else raw["config"]
    for dotted, value in fields.items():
      section, key = dotted.split(".")
      cfg[section][key] = value
    path.write_text(json.dumps(raw))


def test_a_field_no_version_read_and_now_refused_restores_and_resumes(
    tmp_path):
  """A Dyck run whose config sets model.tie_embedding (no Dyck task reads
  it) and hidden_dropout on its one layer (dropped between layers): both
  ignored by the versions that trained such runs, refused now. It
  restores as the model it trained, and resumes once the command leaves
  them at their defaults; refused, neither could be mended (config.json
  edited back was refused as not the checkpoints' config)."""
  import numpy as np
  import sorjax
  from sorjax.training.loop import Trainer
  from sorjax.training.tasks import make_task
  cfg = tiny_dyck.get_config()
  cfg.train.max_steps = 2
  Trainer(make_task(cfg), cfg, str(tmp_path)).run()
  before = sorjax.restore(str(tmp_path), "latest")
  _set_in_run(tmp_path, **{"model.tie_embedding": True,
                           "model.hidden_dropout": 0.3})
  run = sorjax.restore(str(tmp_path), "latest")
  assert not run.config.model.tie_embedding
  assert run.config.model.hidden_dropout == 0.0
  tokens = np.array([[0, 1, 2, 3]])
  np.testing.assert_array_equal(run.log_probs(tokens),
                                before.log_probs(tokens))
  cfg.train.max_steps = 4            # the same command, the fields unset
  state = Trainer(make_task(cfg), cfg, str(tmp_path)).run()
  assert int(state.step[0]) == 4


@pytest.mark.parametrize("task, section, field, value, others, default", [
    ("lm", "optim", "decay_rate", 0.1, {"schedule": "constant"}, 0.5),
    ("lm", "optim", "b1", 0.5, {"name": "sgd"}, 0.9),
    ("lm", "data", "pad_to", 40, {"variable_bptt": False}, None),
    ("trees", "model", "embed_size", 7, {"cell": "tree_lstm"}, 32),
    ("trees", "model", "forget_bias", 1.0, {"cell": "tree_lstm"}, None),
    ("trees", "data", "scale", 0.5, {"dataset": "sst"}, 1.0),
    ("trees", "data", "binary", True, {"dataset": "keyword"}, False),
    ("dyck_closing", "model", "tie_projection", True, {}, False),
    ("lm", "model", "forget_bias", 1.0, {"layers": [{"cell": "lstm"}]},
     None)])
def test_a_field_its_settings_never_read_reads_as_its_default(
    task, section, field, value, others, default):
  saved = {"task": task, "optim": {"name": "adam"}, "model": {},
           "data": {}}
  saved[section].update(others)
  saved[section][field] = value
  got, why = as_trained(saved)
  assert got[section][field] == default and saved[section][field] == value
  assert list(why) == [f"{section}.{field}"]
  assert f"config.json's {value!r}" in why[f"{section}.{field}"]
  # read where the settings read it
  read = {"decay_rate": {"schedule": "exponential"}, "b1": {"name": "adam"},
          "pad_to": {"variable_bptt": True},
          "scale": {"dataset": "keyword"},
          "binary": {"dataset": "sst"}}
  if field in read:
    saved[section].update(read[field])
    assert as_trained(saved)[1] == {}
