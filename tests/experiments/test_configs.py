"""Every paper config: its full-size values are the paper's (checked
without training), and it starts and trains a few steps at CPU scale.

Smoke runs shrink a config only through overrides, as a user would on the
command line (`--config.data.scale=...`); one variant per config module
runs to the end of its epoch, so evaluation (and figures) run too.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex

import jax
import numpy as np
import pytest
import scipy.stats

from experiments import train
from experiments.configs import (demo, le_zuidema_keyword, lin_dyck,
                                 lin_wikitext2, mahto_dyck, mahto_lm,
                                 maupome_ablation, maupome_ratio,
                                 renganathan_dyck, renganathan_ptb)
from sorjax import budget
from sorjax.data import dyck
from sorjax.models import LanguageModel
from sorjax.training.loop import Trainer
from sorjax.training.metrics import read_metrics
from sorjax.training.tasks import dyck as dyck_task, make_task
from sorjax.training.tasks.common import ConfigError, build_model, \
    make_cells, trunk_kwargs
from tests.lowering import assert_lowers_for_accelerators, train_step_args

# one worker builds the module's fixtures (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("experiments.test_configs")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIG_DIR = os.path.join(ROOT, "experiments", "configs")
NOT_PAPER_CONFIGS = {"__init__", "common", "demo", "_options"}

# ---------------------------------------------------------------- overrides

RUN = {"train.num_epochs": 1, "train.log_every": 1,
       "train.checkpoint_every": 1000, "train.tensorboard": False,
       "num_replicas": 1}
DYCK = {"data.max_length": 12, "data.scale": 0.003, "data.batch_size": 10,
        "data.eval_batch_size": 20, "data.num_buckets": 1}
# 4 streams of 2 full windows of 8 (+1 for the last target): one shape, so
# the train step compiles once.
LM = {"data.batch_size": 4, "data.bptt": 8, "data.eval_batch_size": 2,
      "data.eval_bptt": 8, "data.max_train_tokens": 4 * (2 * 8 + 1),
      "data.max_eval_tokens": 2 * (2 * 8 + 1)}
TREES = {"data.scale": 0.004, "data.eval_batch_size": 4,
         "model.hidden_size": 8}
PCFG = {"data.scale": 0.002, "data.batch_size": 8, "data.eval_batch_size": 8,
        "data.num_buckets": 1, "model.hidden_size": 8}
# Budgets large enough that one step of H moves the count by < 2%, so the
# solver finds a size within its 1% tolerance.
# Maupome & Meurs read whole lines (data.documents): the lines of a prefix
# of 400 training characters (3-4 lines, so 2 batches of 2), one length
# bucket, so each step compiles once.
MAUPOME = {"data.batch_size": 2, "data.eval_batch_size": 2,
           "data.max_train_tokens": 400, "data.max_eval_tokens": 34,
           "data.num_buckets": 1, "model.budget": 20_000}
CHAR = {**LM, "model.budget": 60_000, "model.embed_size": 8}
CHAR2 = {**LM, "model.budget": 300_000, "model.embed_size": 8}
WORD = {**LM, "model.budget": 600_000, "model.embed_size": 4}


@dataclasses.dataclass(frozen=True)
class Case:
  module: object
  string: str
  overrides: dict
  corpus: bool = False       # needs the real corpora (shared_data)
  full_epoch: bool = False   # run to the epoch's end: evaluation, figures

  @property
  def id(self):
    return f"{self.module.__name__.rsplit('.', 1)[1]}:{self.string}"


LIN = {**DYCK, "model.hidden_size": 6, "model.embed_size": 4}
LIN_LM = {**LM, "model.hidden_size": 6, "model.embed_size": 4}
MAHTO_LM = {**LM, "data.pad_to": 16}

# One case per config-string branch of each config; per config one case
# runs a whole epoch.
CASES = [
    Case(lin_dyck, "lstm,m4", {**LIN, "figures": ()}),
    Case(lin_dyck, "attention,m6", LIN, full_epoch=True),
    Case(lin_dyck, "assignment,m8", {**LIN, "figures": ()}),
    Case(lin_wikitext2, "lstm", LIN_LM, corpus=True),
    Case(lin_wikitext2, "attention,2", LIN_LM, corpus=True, full_epoch=True),
    Case(maupome_ablation, "DE,tanh", MAUPOME, corpus=True, full_epoch=True),
    Case(maupome_ablation, "rnn", MAUPOME, corpus=True),
    Case(maupome_ablation, "mi_rnn,identity", MAUPOME, corpus=True),
    Case(maupome_ratio, "0.5", MAUPOME, corpus=True, full_epoch=True),
    Case(renganathan_dyck, "m4", DYCK, full_epoch=True),
    Case(renganathan_dyck, "m6,learn_embedding", DYCK),
    Case(renganathan_ptb, "char,mrnn", CHAR, corpus=True),
    Case(renganathan_ptb, "char,mm_lstm,2", CHAR2, corpus=True,
         full_epoch=True),
    Case(renganathan_ptb, "word,lstm", WORD, corpus=True),
    Case(le_zuidema_keyword, "tree_rnn,length,2", {**TREES, "num_replicas": 2},
         full_epoch=True),
    Case(le_zuidema_keyword, "tree_lstm,depth,3", TREES),
    Case(mahto_lm, "mts,ptb,sizes=8-8-4", MAHTO_LM, corpus=True,
         full_epoch=True),
    Case(mahto_lm, "baseline,wikitext2,sizes=6-6-4", MAHTO_LM, corpus=True),
    Case(mahto_lm, "baseline,markov_ptb,sizes=6-6-4", MAHTO_LM, corpus=True),
    Case(mahto_dyck, "mts", {**PCFG, "num_replicas": 2}, full_epoch=True),
    Case(mahto_dyck, "baseline", PCFG),
]


def small(case: Case):
  c = case.module.get_config(case.string)
  c.update_from_flattened_dict({
      **RUN, "train.max_steps": None if case.full_epoch else 2,
      **case.overrides})
  return c


def small_with_data(case: Case, request, monkeypatch):
  """`small(case)`, reading the real corpora (skipped without them) and
  preparing them in the session's TFDS directory when the case needs them."""
  c = small(case)
  if case.corpus:
    monkeypatch.setenv("SORJAX_DATA_DIR", request.getfixturevalue(
        "shared_data"))
    c.data.data_dir = request.getfixturevalue("tfds_dir")
  return c


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory):
  """Where the real corpora are prepared: $TFDS_DATA_DIR (reused across
  runs) or a fresh directory for this session."""
  return os.environ.get("TFDS_DATA_DIR") or str(
      tmp_path_factory.mktemp("tfds"))


# ---------------------------------------------------------------- smoke runs

# None fields whose command-line form is a string spec (typed on reading)
SPEC_FIELDS = {"model.layers", "model.num_matrices", "model.timescales"}


@pytest.mark.parametrize("make", [lambda: demo.get_config()] + [
    (lambda c=c: c.module.get_config(c.string)) for c in CASES],
    ids=["demo"] + [c.id for c in CASES])
def test_every_unset_field_of_a_config_can_be_set_from_the_command_line(
    make):
  """ml_collections refuses to override a None field without a type
  ("Type NoneType ... is not supported for overriding"): every None field
  of the demo and paper configs is a typed placeholder
  (_options.OPTIONAL)."""
  from ml_collections.config_dict import FieldReference

  def untyped(node, prefix=""):
    for k in node.keys():
      path, v = prefix + k, node[k]
      if hasattr(v, "keys"):
        yield from untyped(v, path + ".")
      elif v is None and path not in SPEC_FIELDS:
        ref = node._fields[k]
        if not (isinstance(ref, FieldReference) and ref.get_type()
                not in (None, type(None))):
          yield path

  assert list(untyped(make())) == []


def test_every_paper_config_has_a_smoke_run():
  modules = {f[:-3] for f in os.listdir(CONFIG_DIR) if f.endswith(".py")}
  covered = {c.module.__name__.rsplit(".", 1)[1] for c in CASES}
  assert modules - NOT_PAPER_CONFIGS == covered
  ends = {c.module for c in CASES if c.full_epoch}
  assert ends == {c.module for c in CASES}, "one full epoch per config"


@pytest.fixture
def quick_compiles():
  """XLA's optimisation passes dominate these runs' cost (every step and
  init is compiled once and run twice); without them a run takes ~40%
  less CPU and computes the same functions."""
  before = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", before)


@pytest.fixture(scope="module")
def _tasks():
  return {}


def small_task(case: Case, request, monkeypatch):
  """(`small_with_data(case)`, its task): the task (corpora, model) built
  once per case with `make_task` and shared by the case's smoke run and
  lowering test. A task keeps no state across runs: each epoch sets its
  batcher's position."""
  cfg = small_with_data(case, request, monkeypatch)
  tasks = request.getfixturevalue("_tasks")
  if case.id not in tasks:
    tasks[case.id] = (cfg.to_dict(), make_task(cfg))
  built_from, task = tasks[case.id]
  assert cfg.to_dict() == built_from
  return cfg, task


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_config_trains_a_few_steps_at_cpu_scale(case, tmp_path, request,
                                                monkeypatch, quick_compiles):
  cfg, task = small_task(case, request, monkeypatch)
  made = []

  def make_task_once(config):  # train_and_evaluate's, for this config
    assert config is cfg and not made
    made.append(config)
    return task
  monkeypatch.setattr(train, "make_task", make_task_once)
  state = train.train_and_evaluate(cfg, str(tmp_path))
  assert made
  R = cfg.num_replicas
  steps = np.asarray(state.step)
  assert steps.shape == (R,) and np.all(steps == steps[0]) and steps[0] >= 2
  if not case.full_epoch:
    assert steps[0] == 2
  for leaf in jax.tree_util.tree_leaves(state.params):
    assert leaf.shape[0] == R and np.all(np.isfinite(leaf))
  logged = read_metrics(str(tmp_path), "train")
  assert len(logged) == steps[0] * R
  assert all(math.isfinite(m["loss"]) for m in logged)
  assert os.path.isdir(tmp_path / "checkpoints")
  if case.full_epoch:
    split = "valid" if cfg.task == "lm" else "dev"
    evals = read_metrics(str(tmp_path), split)
    assert len(evals) == R and all(math.isfinite(m["loss"]) for m in evals)
    # what the task declares it evaluates (selection.metric's check)
    booked = {"step", "split", "time", "replica", "epoch", "temperature"}
    assert set(task.metric_names()) == set(evals[0]) - booked
    for name in cfg.get("figures", ()):
      assert os.path.getsize(tmp_path / "figures" / f"{name}.png") > 0
  if case.module is mahto_lm and case.full_epoch:
    _check_restored_timescales(str(tmp_path))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_config_train_step_lowers_for_gpu_and_tpu(case, tmp_path, request,
                                                  monkeypatch):
  """The whole train step the loop jits (vmapped replicas, optimiser,
  non-finite guard), and one replica's loss in evaluation mode, lower
  for cuda and tpu (tests/lowering.py), at the smoke run's shapes."""
  cfg, task = small_task(case, request, monkeypatch)
  trainer = Trainer(task, cfg, str(tmp_path))
  state, batch, temperature = train_step_args(task, trainer)
  assert_lowers_for_accelerators(trainer._step_fn, state, batch, temperature)

  one = jax.tree_util.tree_map(
      lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype),
      (state.params, state.carry))
  rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  assert_lowers_for_accelerators(
      lambda p, c, b, r, t: task.loss(p, c, b, r, t, False)[0],
      *one, batch, rng, temperature)


def _check_restored_timescales(workdir):
  """The nested timescale specs survive the run's JSON config: restoring
  rebuilds layer 1's T = 3 / T = 4 halves (eq. 2 from the fixed b_f)."""
  import sorjax
  run = sorjax.restore(workdir, "latest")
  cells = run.model.cells
  assert [c.hidden_size for c in cells] == [8, 8, 4]
  T = 1.0 / np.log1p(np.exp(-cells[0].fixed_arrays()["b_f"]))     # eq. 2
  np.testing.assert_allclose(T, [3.0] * 4 + [4.0] * 4, rtol=1e-9)
  assert "b_go" in run.params["layer_0"] and "b" in run.params["layer_2"]


# ---------------------------------------------------------------- full size

@pytest.mark.parametrize("model", ["lstm", "attention", "assignment"])
@pytest.mark.parametrize("m", [4, 6, 8])
def test_lin_dyck_is_section_4_3(model, m):
  c = lin_dyck.get_config(f"{model},m{m}")
  assert (c.task, c.data.preset, c.data.k, c.data.m) == ("dyck_lm",
                                                         f"lin_m{m}", 2, m)
  assert c.data.max_length is None and c.data.scale == 1.0
  assert (c.model.embed_size, c.model.hidden_size, c.data.batch_size) == (
      30, 3 * m, 10)
  assert (c.optim.name, c.optim.learning_rate) == ("adam", 1e-4)
  assert c.plateau.enabled and (c.plateau.factor, c.plateau.patience) == (
      0.5, 3)
  assert c.early_stopping.patience == 6
  assert all(c.model[k] == 0.0 for k in ("embedding_dropout", "input_dropout",
                                          "hidden_dropout", "output_dropout"))
  cell = make_cells(c.model)[0]
  if model == "lstm":
    assert type(cell).__name__ == "LSTM"
  else:
    assert cell.num_cells == 2
  assert c.model.assignment == ("bracket_type" if model == "assignment"
                                else None)
  t = c.temperature
  if model == "attention":   # tau: 1, x0.9 per epoch, low at test
    assert (t.init, t.decay, t.per) == (1.0, 0.9, "epoch")
    assert t.eval_value <= 0.1
  else:
    assert (t.decay, t.eval_value) == (1.0, None)


@pytest.mark.parametrize("string,cells,paper_params", [
    ("lstm", 1, 2.2e6), ("attention,2", 2, 4.4e6), ("attention,5", 5, 11e6)])
def test_lin_wikitext2_is_section_4_3_and_table_2(string, cells,
                                                   paper_params):
  c = lin_wikitext2.get_config(string)
  d = c.data
  assert (d.corpus, d.batch_size, d.bptt, d.variable_bptt) == (
      "wikitext2", 64, 70, False)
  assert (c.model.embed_size, c.model.hidden_size) == (300, 600)
  assert (c.model.input_dropout, c.model.output_dropout) == (0.5, 0.5)
  assert (c.optim.name, c.optim.learning_rate) == ("adam", 1e-4)
  assert c.early_stopping.patience == 6 and c.plateau.enabled
  cell = make_cells(c.model)[0]
  assert getattr(cell, "num_cells", 1) == cells
  # Table 2's "Params" are the recurrent layer's: 4 x 600 x (300 + 600)
  # per cell, rounded to 2 significant digits.
  n = budget.count_params(cell, 300)
  assert abs(n - paper_params) <= 0.05 * paper_params


def _lm_model(c, V):
  return build_model(c.model, lambda cells: LanguageModel(
      cells=cells, vocab_size=V, tie_embedding=c.model.tie_embedding,
      tie_projection=c.model.tie_projection, **trunk_kwargs(c.model)))


MAUPOME_V = 28   # 27 characters (sec. 4) and the end of line


@pytest.mark.parametrize("terms,flags", [
    ("DE", (True, True)), ("D", (True, False)), ("E", (False, True)),
    ("none", (False, False))])
@pytest.mark.parametrize("activation", ["tanh", "identity"])
def test_maupome_ablation_is_section_4_1(terms, flags, activation):
  c = maupome_ablation.get_config(f"{terms},{activation}")
  assert (c.data.corpus, c.data.batch_size, c.train.num_epochs) == (
      "ptb_char_maupome", 64, 25)
  # each line a document; 5-fold cross-validation, 10% of training held out
  assert (c.data.documents, c.data.folds, c.data.fold,
          c.data.fold_valid_fraction) == (True, 5, 0, 0.1)
  assert c.data.bptt is None and c.data.eval_bptt is None
  assert c.model.embedding == "one_hot" and c.optim.name == "adam"
  model = _lm_model(c, MAUPOME_V)
  cell = model.cells[0]
  assert type(cell).__name__ == "General2"
  assert (cell.use_D, cell.use_E, cell.activation) == (*flags, activation)
  assert cell.intermediate_size == cell.hidden_size           # |m| = |h|
  assert abs(budget.count(model) - 500_000) <= 5_000


@pytest.mark.parametrize("reference,cls", [("rnn", "RNN"),
                                           ("mi_rnn", "MIRNN")])
def test_maupome_ablation_references_have_the_same_budget(reference, cls):
  model = _lm_model(maupome_ablation.get_config(reference), MAUPOME_V)
  cell = model.cells[0]
  assert type(cell).__name__ == cls
  if reference == "mi_rnn":
    assert cell.general                                       # eq. 8
  assert abs(budget.count(model) - 500_000) <= 5_000


@pytest.mark.parametrize("ratio", maupome_ratio.RATIOS)
def test_maupome_ratio_sweep_is_section_4_2(ratio):
  c = maupome_ratio.get_config(f"{ratio:g}")
  model = _lm_model(c, MAUPOME_V)
  cell = model.cells[0]
  assert not cell.use_D and not cell.use_E
  assert abs(budget.count(model) - 500_000) <= 5_000
  assert abs(cell.intermediate_size / cell.hidden_size / ratio - 1) <= (
      0.05 + 0.5 / (ratio * cell.hidden_size))


# Renganathan & Singh, Table 1: (level, cell, layers) -> h.
TABLE1 = {
    ("char", "rnn", 1): 2032, ("char", "rnn", 2): 1194,
    ("char", "lstm", 1): 991, ("char", "lstm", 2): 589,
    ("char", "mm_rnn", 1): 1038, ("char", "mm_rnn", 2): 696,
    ("char", "mm_lstm", 1): 512, ("char", "mm_lstm", 2): 345,
    ("word", "rnn", 1): 133, ("word", "lstm", 1): 125,
    ("word", "lstm", 2): 115, ("word", "mm_rnn", 1): 128,
    ("word", "mm_lstm", 1): 112, ("word", "mm_lstm", 2): 97,
}
PTB_V = {"char": 50, "word": 10_000}   # Mikolov's 49 symbols + eol; 10k


@pytest.mark.parametrize("key", sorted(TABLE1), ids=lambda k: "%s,%s,%d" % k)
def test_renganathan_ptb_meets_table_1(key):
  level, cell, layers = key
  c = renganathan_ptb.get_config(f"{level},{cell},{layers}")
  assert (c.optim.name, c.optim.learning_rate, c.optim.clip_norm) == (
      "adam", 1e-3, 3.5)
  assert (c.early_stopping.patience, c.train.num_epochs) == (5, 200)
  assert (c.data.batch_size, c.model.output_dropout) == (128, 0.25)
  assert c.model.embed_size == {"char": 128, "word": 64}[level]
  model = _lm_model(c, PTB_V[level])
  target = {"char": 4.5e6, "word": 2e6}[level]
  assert abs(budget.count(model) - target) <= 0.01 * target
  assert len(model.cells) == layers
  assert abs(model.cells[0].hidden_size - TABLE1[key]) <= 0.011 * TABLE1[key]


@pytest.mark.parametrize("string, layers, cut", [
    ("char,lstm", 1, None), ("char,lstm,cut=25", 1, 25),
    ("char,mm_lstm,2,cut=75", 2, 75)])
def test_renganathan_ptb_table_3_sentence_cutoff(string, layers, cut):
  c = renganathan_ptb.get_config(string)
  assert c.model.num_layers == layers
  assert c.data.train_sentence_cutoff == cut
  assert c.early_stopping.patience == 5    # sec. 6.1: patience 5


def test_budget_tolerance_is_a_model_field():
  """model.budget_tol: at 50k parameters one unit of a two-layer mmRNN
  moves the count by ~2.7%, so only a 2% tolerance finds a size."""
  c = renganathan_ptb.get_config("char,mm_rnn,2")
  c.model.budget, c.model.embed_size = 50_000, 16
  with pytest.raises(ConfigError, match=r"within 1.0%: H=69 gives 49,315"):
    _lm_model(c, 50)
  c.model.budget_tol = 0.02
  model = _lm_model(c, 50)
  assert model.cells[0].hidden_size == 70      # 50,646: the closer one
  assert budget.count(model) == 50_646
  for bad in (0.0, 1.5, -0.01):  # ConfigDict itself refuses non-floats
    c.model.budget_tol = bad
    with pytest.raises(ConfigError, match="model.budget_tol must be"):
      _lm_model(c, 50)


@pytest.mark.parametrize("cell", ["mrnn", "mlstm"])
def test_renganathan_ptb_second_order_baselines_have_h_equal_m(cell):
  model = _lm_model(renganathan_ptb.get_config(f"char,{cell}"), 50)
  c = model.cells[0]
  assert c.intermediate_size == c.hidden_size
  assert abs(budget.count(model) - 4.5e6) <= 0.01 * 4.5e6


@pytest.mark.parametrize("m", [4, 6, 8])
def test_renganathan_dyck_is_sections_4_2_and_6_2(m):
  c = renganathan_dyck.get_config(f"m{m}")
  assert (c.task, c.data.preset, c.data.batch_size) == (
      "dyck_closing", f"lin_m{m}", 512)
  assert (c.optim.name, c.optim.learning_rate) == ("adam", 0.01)
  cell = make_cells(c.model)[0]
  assert (type(cell).__name__, cell.hidden_size) == ("DyckRNN", m)
  assert not cell.learn_embedding and c.model.embedding == "cell"
  # "we inspect the top element of the stack ... apply an affine
  # transformation": a head of 4 parameters (it read the whole state)
  assert c.model.head_units == 1
  c.data.scale = 0.001
  params = jax.eval_shape(make_task(c).init_params, jax.random.key(0))
  assert params["head"]["kernel"].shape == (1, 2)
  c = renganathan_dyck.get_config(f"m{m},learn_embedding")
  cell = make_cells(c.model)[0]
  assert cell.hidden_size == 2 * m and cell.learn_embedding
  assert (c.model.embedding, c.model.embed_size) == ("learned", 2)


@pytest.mark.parametrize("field, value", [("head_units", 1),
                                          ("head_init", "uniform")])
def test_head_fields_are_refused_where_no_head_reads_them(field, value):
  c = mahto_lm.get_config("baseline,ptb")
  c.model[field] = value
  with pytest.raises(ConfigError, match=rf"model.{field}={value!r} is read "
                     r"by the Dyck tasks' heads only"):
    make_task(c)


@pytest.mark.parametrize("cell,batch", [("tree_rnn", 20), ("tree_lstm", 5)])
@pytest.mark.parametrize("experiment", ["length", "depth"])
def test_le_zuidema_keyword_is_section_3(cell, batch, experiment):
  c = le_zuidema_keyword.get_config(f"{cell},{experiment},4")
  assert (c.task, c.data.dataset, c.data.experiment, c.data.index) == (
      "trees", "keyword", experiment, 4)
  assert c.data.scale == 1.0 and c.data.batch_size == batch
  assert (c.model.cell, c.model.hidden_size) == (cell, 50)
  assert c.model.embedding_init == "le_zuidema"        # U(-1e-4, 1e-4)
  assert (c.optim.name, c.optim.learning_rate) == ("adagrad", 0.05)
  assert c.early_stopping.patience == 5 and c.num_replicas == 5
  # "halted when the accuracy on the development set is not improved"
  assert (c.selection.metric, c.selection.mode) == ("accuracy", "max")


@pytest.mark.parametrize("corpus,batch,dropouti,dropouth", [
    ("ptb", 20, 0.4, 0.25), ("wikitext2", 80, 0.65, 0.2),
    ("markov_ptb", 20, 0.4, 0.25)])  # the control: PTB's settings
@pytest.mark.parametrize("model", ["baseline", "mts"])
def test_mahto_lm_is_section_3_1_1(model, corpus, batch, dropouti, dropouth):
  c = mahto_lm.get_config(f"{model},{corpus}")
  cells = make_cells(c.model)
  assert [x.hidden_size for x in cells] == [1150, 1150, 400]
  assert c.model.embed_size == 400 and c.model.tie_embedding
  d = c.data
  assert (d.corpus, d.batch_size, d.bptt, d.variable_bptt, d.eval_bptt) == (
      corpus, batch, 70, True, 70)
  assert (c.optim.name, c.nt_asgd.nonmono) == ("nt_asgd", 5)
  assert (c.optim.learning_rate, c.optim.clip_norm) == (30.0, 0.25)
  assert (c.model.input_dropout, c.model.hidden_dropout) == (dropouti,
                                                             dropouth)
  assert c.model.locked_dropout is True and c.train.num_epochs == 1000
  assert (c.model.weight_drop, c.model.activation_reg,
          c.model.temporal_activation_reg) == (0.5, 2.0, 1.0)  # AWD-LSTM
  assert c.model.embedding_init == "uniform_0.1"   # "in [-0.1, 0.1]"
  assert (d.eval_batch_size, d.test_batch_size) == (10, 1)  # AWD-LSTM's
  # "All weights and biases ... uniformly initialized" (they were 0)
  assert [x.bias_init for x in cells] == ["uniform"] * 3
  names = [type(x).__name__ for x in cells]
  if model == "baseline":
    assert names == ["LSTM"] * 3
    return
  assert names == ["MTSLSTM", "MTSLSTM", "LSTM"]     # layer 3 is trained
  T1 = 1.0 / np.log1p(np.exp(-cells[0].fixed_arrays()["b_f"]))     # eq. 2
  np.testing.assert_allclose(np.sort(T1), [3.0] * 575 + [4.0] * 575,
                             rtol=1e-9)
  fixed = cells[1].fixed_arrays()
  np.testing.assert_allclose(fixed["b_i"], -fixed["b_f"])
  T2 = 1.0 / np.log1p(np.exp(-fixed["b_f"]))
  # "80% of the units below 20, and the rest ranging up to the thousands"
  assert 0.75 <= np.mean(T2 < 20) <= 0.85 and T2.max() > 1000
  np.testing.assert_allclose(np.median(T2),
                             scipy.stats.invgamma(0.56).median(), rtol=0.01)


@pytest.mark.parametrize("model", ["baseline", "mts"])
def test_mahto_dyck_is_section_3_1_2(model):
  c = mahto_dyck.get_config(model)
  assert (c.task, c.data.preset, c.data.loss) == ("dyck_pcfg", "mahto", "mse")
  assert c.model.embedding == "one_hot" and c.num_replicas == 20
  o = c.optim
  assert (o.name, o.learning_rate, o.b1, o.b2, o.eps) == (
      "adam", 1e-4, 0.9, 0.999, 1e-8)
  assert c.train.num_epochs == 2000
  cell = make_cells(c.model)[0]
  assert cell.hidden_size == 256 and cell.bias_init == "uniform"
  assert c.model.head_init == "uniform"     # the head's U(+-1/sqrt(256))
  c.data.scale, c.num_replicas = 0.002, 1
  head = make_task(c).init_params(jax.random.key(0))["head"]
  for w in (head["kernel"], head["bias"]):
    assert 0 < float(np.abs(w).max()) <= 1 / 16 and float(np.std(w)) > 0
  if model == "mts":
    T = 1.0 / np.log1p(np.exp(-cell.fixed_arrays()["b_f"]))
    np.testing.assert_allclose(np.median(T), scipy.stats.invgamma(1.5)
                               .median(), rtol=0.01)
  else:
    assert type(cell).__name__ == "LSTM"


# ---------------------------------------------------------------- strings

@pytest.mark.parametrize("module,string,match", [
    (lin_dyck, "lstm", "missing bound"),
    (lin_dyck, "lstm,m5", "bound must be one of m4, m6, m8; got 'm5'"),
    (lin_dyck, "gru,m4", "model must be one of lstm, attention, assignment"),
    (lin_dyck, "lstm,m4,extra", "unexpected 'extra'"),
    (lin_wikitext2, "attention", "missing number of cells S"),
    (lin_wikitext2, "attention,two", "must be an integer, got 'two'"),
    (lin_wikitext2, "attention,0", "must be > 0"),
    (maupome_ablation, "DE,relu", "activation must be one of tanh, identity"),
    (maupome_ratio, "2,trigram", "tokenization must be one of"),
    (maupome_ratio, "-2", "ratio must be > 0"),
    (maupome_ratio, "half", "ratio must be a number, got 'half'"),
    (renganathan_dyck, "m4,learned", "unexpected 'learned'"),
    (renganathan_ptb, "char,gru", "cell must be one of"),
    (renganathan_ptb, "char,lstm,3", "layers must be one of 1, 2"),
    (renganathan_ptb, "char,lstm,cut=0", "cut=: the training sentence "
                                         "cutoff must be > 0"),
    (renganathan_ptb, "char,lstm,2,cut=x", "must be an integer, got 'x'"),
    (renganathan_ptb, "char,lstm,cut=25,2", "unexpected '2'"),
    (le_zuidema_keyword, "tree_lstm,width,1", "experiment must be one of"),
    (mahto_lm, "mts,ptb,sizes=8-8", "sizes must be three ints"),
    (mahto_lm, "mts,enwik8", "corpus must be one of ptb, wikitext2"),
    (mahto_dyck, "mts,ptb", "unexpected 'ptb'"),
])
def test_bad_config_strings_name_the_file_and_the_usage(module, string,
                                                        match):
  name = module.__name__.rsplit(".", 1)[1]
  with pytest.raises(ConfigError, match=re.escape(match)) as e:
    module.get_config(string)
  assert f"{name}.py:{string!r}" in str(e.value) and "usage:" in str(e.value)


def _parse_flags(argv):
  from absl import flags
  from ml_collections import config_flags
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                  lock_config=True, sys_argv=argv)
  values(argv)
  return values.config


def _documented_commands():
  """The `python -m experiments.main ...` lines of docs/EXPERIMENTS.md's
  shell blocks (continuations joined; loop variables given a value; the
  `<name>` template skipped)."""
  with open(os.path.join(ROOT, "docs", "EXPERIMENTS.md"),
            encoding="utf-8") as f:
    text = f.read()
  for block in re.findall(r"```sh\n(.*?)```", text, re.S):
    for line in block.replace("\\\n", " ").splitlines():
      if "experiments.main" in line and "<name>" not in line:
        yield line.strip().replace("$r", "2").replace("$i", "3")


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
def test_documented_commands_parse_as_the_binary_would(monkeypatch):
  """Every documented command's --config (file and string) and overrides
  are accepted by ml_collections' config flag, as experiments.main reads
  them; every paper config is documented."""
  monkeypatch.chdir(ROOT)
  documented = set()
  commands = list(_documented_commands())
  assert len(commands) >= 30
  for line in commands:
    args = shlex.split(line)
    args = [a for a in args[args.index("experiments.main") + 1:]
            if not a.startswith("--workdir")]
    cfg = _parse_flags(["main", *args])
    for a in args[1:]:                 # the overrides took effect
      key, value = a[len("--config."):].split("=", 1)
      node = cfg
      for part in key.split("."):
        node = node[part]
      assert str(node) == value, a
    name = re.match(r"--config=experiments/configs/(\w+)\.py", args[0])
    documented.add(name.group(1))
  modules = {f[:-3] for f in os.listdir(CONFIG_DIR) if f.endswith(".py")}
  assert documented == modules - NOT_PAPER_CONFIGS


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
@pytest.mark.parametrize("name", sorted(
    {c.module.__name__.rsplit(".", 1)[1] for c in CASES}))
def test_optional_fields_can_be_set_on_the_command_line(name, monkeypatch):
  """None-valued fields (max_steps, eval tau, data caps) are typed
  placeholders, so `--config.x=v` works; a wrong type is refused."""
  monkeypatch.chdir(ROOT)
  path = f"--config=experiments/configs/{name}.py"
  cfg = _parse_flags(["main", path, "--config.train.max_steps=3",
                      "--config.temperature.eval_value=0.05",
                      "--config.model.budget=1000",
                      "--config.model.unroll=2"])
  assert (cfg.train.max_steps, cfg.temperature.eval_value,
          cfg.model.budget, cfg.model.unroll) == (3, 0.05, 1000, 2)
  assert _parse_flags(["main", path]).train.max_steps is None
  with pytest.raises(Exception, match="max_steps"):
    _parse_flags(["main", path, "--config.train.max_steps=three"])


@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
def test_the_demo_config_takes_the_optional_fields_too(monkeypatch):
  monkeypatch.chdir(ROOT)
  cfg = _parse_flags(["main", "--config=experiments/configs/demo.py",
                      "--config.train.max_steps=3",
                      "--config.model.unroll=2"])
  assert (cfg.train.max_steps, cfg.model.unroll) == (3, 2)
  assert _parse_flags(["main", "--config=experiments/configs/demo.py"]
                      ).model.unroll is None


def test_split_counts_beside_a_dyck_preset_replace_its_counts():
  # they were silently ignored with a preset (QA, session 41)
  c = lin_dyck.get_config("lstm,m4")
  assert (c.data.num_train, c.data.num_dev, c.data.num_test) == (
      10_000, 4_000, 10_000)    # the preset's own, as older runs recorded
  c.data.num_train, c.data.num_dev, c.data.num_test = 50, 7, 9
  _, splits = dyck_task._dyck_splits(c.data)
  preset = dict(dyck.PRESETS["lin_m4"].splits)
  assert {s: len(v[0]) for s, v in splits.items()} == {
      "train": 50, "dev": 7, "test": 9}
  for s, (samples, lo, hi) in splits.items():
    assert (lo, hi) == (preset[s].min_length, preset[s].max_length)
    assert all(lo <= len(x) - 2 <= hi for x in samples)   # START .. END
  c.data.num_dev = 0
  with pytest.raises(ConfigError, match="data.num_dev"):
    dyck_task._dyck_splits(c.data)
