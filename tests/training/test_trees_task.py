"""The trees task's batching: one schedule shape per batch size, widening
when a batch does not fit, and evaluation against a float64 NumPy forward
pass of every tree on its own."""

import types

import jax
import numpy as np
import pytest

from sorjax import trees
from sorjax.data import keyword_trees
from sorjax.training.tasks.trees import TreeTask
from tests.experiments import tiny_trees


@pytest.fixture(scope="module")
def task():
  cfg = tiny_trees.get_config()    # 200 / 20 / 20 trees of 1-10 leaves
  cfg.model.cell = "tree_rnn"
  cfg.model.hidden_size = 6
  cfg.data.eval_batch_size = 7     # 7 + 7 + 6: the last batch is padded
  return TreeTask(cfg)


def _shapes(batch):
  return {k: np.shape(v) for k, v in batch.items()}


def test_one_shape_per_batch_size(task):
  B, L, T = task.batch_size, task.max_leaves, task.max_steps
  W = -(-B * (L - 1) // T)     # the narrowest width whose T steps hold B trees
  shapes = {str(_shapes(b)) for epoch in (0, 1)
            for b, _ in task.train_batches(epoch, None)}
  assert len(shapes) == 1
  batch = next(task.train_batches(0, None))[0]
  assert batch["node"].shape == (T, W) and batch["tokens"].shape == (B, L)
  # Every training tree once per epoch (200 = 10 batches of 20): the
  # (leaves, root label) pairs are the split's.
  seen = sorted((int(r) // 2 + 1, int(b["labels"][i, r]))
                for b, _ in task.train_batches(1, None)
                for i, r in enumerate(b["root"]))
  want = sorted((len(keyword_trees.leaves(ex.tree)), ex.label)
                for ex in task.examples["train"])
  assert task.num_train_batches() * B == len(want) == 200
  assert seen == want
  eval_shapes = {str(_shapes(b)) for split in ("dev", "test")
                 for _, b in task._eval_batches_of(split)}
  assert len(eval_shapes) == 1


def test_a_batch_that_needs_more_steps_widens_once(task, caplog):
  B = 3
  ts = task.split_trees["train"][:B]
  arrays = [trees.tree_arrays(t) for t in ts]
  need = trees.encode(arrays, width=1).node.shape[0]
  task._widths[B] = 1
  try:
    if need <= task.max_steps:
      pytest.skip("these trees fit one slot a step")
    with caplog.at_level("INFO"):
      batch = task._batch(ts, B)
    assert task._widths[B] > 1 and "width" in caplog.text
    assert batch["node"].shape == (task.max_steps, task._widths[B])
    # The same trees, the same states' inputs: only the schedule differs.
    level = trees.encode(arrays, schedule="level")
    np.testing.assert_array_equal(batch["tokens"][:, :level.tokens.shape[1]],
                                  level.tokens)
    assert batch["step_mask"].sum() == level.step_mask.sum()
  finally:
    del task._widths[B]


def _numpy_logits(tree, p):
  """p = tanh([x; y] W + b) bottom-up (Le & Zuidema sec. 2), float64, then
  the classifier on the root."""
  f64 = lambda a: np.asarray(a, np.float64)
  E, W, b = f64(p["embedding"]), f64(p["cell"]["W"]), f64(p["cell"]["b"])

  def vec(node):
    if isinstance(node, tuple):
      return np.tanh(np.concatenate([vec(node[0]), vec(node[1])]) @ W + b)
    return E[node]

  return vec(tree) @ f64(p["classifier"]["kernel"]) + f64(
      p["classifier"]["bias"])


def test_evaluate_matches_numpy_per_tree(task):
  params = task.init_params(jax.random.key(3))
  params = jax.tree_util.tree_map(   # big enough for varied predictions
      lambda a: a * 3e3 if a.ndim == 2 and a.shape[0] == 10_000 else a,
      params)
  for split in ("dev", "test"):
    nll, hit = [], []
    for ex in task.examples[split]:
      z = _numpy_logits(ex.tree, params)
      lp = z - z.max() - np.log(np.sum(np.exp(z - z.max())))
      nll.append(-lp[ex.label])
      hit.append(int(np.argmax(z)) == ex.label)
    got = task.evaluate(params, split, 1.0)
    np.testing.assert_allclose(got["loss"], np.mean(nll), rtol=1e-5)
    assert got["accuracy"] == pytest.approx(np.mean(hit))
    assert len(nll) == 20 and keyword_trees.NUM_CLASSES == 10


@pytest.mark.parametrize("field,value,msg", [
    ("batch_size", 0, "data.batch_size must be an int >= 1, got 0"),
    ("eval_batch_size", -1, "data.eval_batch_size must be an int >= 1"),
    ("gradient_trees", -1, "data.gradient_trees must be None or an int >= 0"),
    ("scale", 0.0, r"data.scale must be a finite number in \(0, 1\]"),
    ("per_node", "no", "data.per_node must be a bool"),
    ("batch_size", 500, "data.batch_size=500 exceeds the 200 training trees"),
    ("binary", True, "data.binary=True applies to data.dataset='sst'"),
])
def test_data_fields_are_checked(field, value, msg):
  from sorjax.training.tasks.common import ConfigError
  cfg = tiny_trees.get_config()
  cfg.data = {**cfg.data.to_dict(), field: value}
  with pytest.raises(ConfigError, match=msg):
    TreeTask(cfg)


@pytest.mark.parametrize("field,value", [("scale", 0.1), ("index", 3),
                                         ("experiment", "depth")])
def test_keyword_generator_fields_are_refused_for_sst(field, value):
  """SST is read whole: a scale (or index, experiment) meant to shrink or
  pick a keyword dataset would otherwise be ignored."""
  from sorjax.training.tasks.common import ConfigError
  cfg = tiny_trees.get_config()
  cfg.data = {**cfg.data.to_dict(), "dataset": "sst", "scale": 1.0,
              field: value}
  with pytest.raises(ConfigError, match=f"data.{field}={value!r} applies to "
                     "data.dataset='keyword' only; SST is read whole"):
    TreeTask(cfg)


def test_sst_binary_labels_by_hand():
  """SST's 5 classes to 2 (Le & Zuidema's binary task): 0-1 negative, 3-4
  positive, 2 unlabelled; a neutral root leaves the tree out."""
  from sorjax.training.tasks.trees import _binary_labels
  leaf = lambda lab, w: trees.Tree(label=lab, word=w)
  t = trees.Tree(label="1", children=(
      trees.Tree(label="3", children=(leaf("4", "a"), leaf("2", "b"))),
      trees.Tree(label="0", children=(leaf("1", "c"), leaf(None, "d")))))
  b = _binary_labels(t)
  labels = lambda n: [n.label] + [x for c in (n.children or ())
                                  for x in labels(c)]
  assert labels(b) == ["0", "1", "1", None, "0", "0", None]
  assert [n.word for n in (b.children[0].children + b.children[1].children)
          ] == ["a", "b", "c", "d"]
  assert _binary_labels(trees.Tree(label="2", children=t.children)) is None


def test_each_epoch_shuffles_the_trees_again(task):
  """The batch order is drawn per epoch from (seed, epoch): the same epoch
  gives the same batches, the next epoch another order."""
  def tokens(epoch):
    return [b["tokens"].tolist() for b, _ in task.train_batches(epoch, None)]
  assert tokens(0) == tokens(0)
  assert tokens(0) != tokens(1)
  # the resumed position continues epoch 1's order
  assert [b["tokens"].tolist() for b, _ in task.train_batches(
      1, {"batch": 3})] == tokens(1)[3:]


def test_epoch_metrics_are_median_gradient_ratios_per_depth(monkeypatch):
  """Le & Zuidema 3.3: the median (not the mean) of ||dJ/dx_keyword|| /
  ||dJ/dx_root|| per keyword depth; undefined ratios (0 / 0) left out."""
  from sorjax.analysis import tree_gradients
  depth = np.array([1, 1, 1, 2, 2, 2])
  num = np.array([1.0, 2.0, 10.0, 3.0, 4.0, 0.0])
  den = np.array([1.0, 1.0, 1.0, 1.0, 2.0, 0.0])
  monkeypatch.setattr(tree_gradients, "tree_ratios",
                      lambda task, params, split, n: (depth, num, den))
  fake = types.SimpleNamespace(examples={"train": []}, gradient_trees=6)
  assert TreeTask.epoch_metrics(fake, None, 0) == {
      "grad_ratio_depth_1": 2.0, "grad_ratio_depth_2": 2.5}


@pytest.mark.parametrize("field,value,msg", [
    ("budget", 1000, r"model.budget=1000 is not read by the trees task .* "
                     r"leave it at its default None"),
    ("input_dropout", 0.3, "model.input_dropout=0.3 is not read by the trees "
                           "task"),
    ("embed_size", 50, "model.embed_size=50 is not read by the trees task"),
    ("num_layers", 2, "model.num_layers=2 is not read by the trees task"),
    ("forget_bias", 2.0, "model: cell 'tree_rnn' has no hyperparameter "
                         "'forget_bias'"),
    ("intermediate_size", 8, "model: cell 'tree_rnn' has no hyperparameter "
                             "'intermediate_size'"),
])
def test_model_fields_the_trees_task_does_not_read_are_refused(field, value,
                                                               msg):
  """A token model's field (a budget, dropout, layers) or a hyperparameter
  the tree cell lacks would otherwise be ignored without a word."""
  cfg = tiny_trees.get_config()
  cfg.model.cell = "tree_rnn"
  cfg.model[field] = value
  with pytest.raises(ValueError, match=msg):
    TreeTask(cfg)


def test_the_tree_cells_hyperparameters_reach_the_cell():
  cfg = tiny_trees.get_config()
  cfg.model.cell, cfg.model.activation = "tree_rnn", "relu"
  assert TreeTask(cfg).cell.activation == "relu"
