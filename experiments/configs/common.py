"""Building blocks of the experiment configs."""

import ml_collections

from sorjax.data import dyck

from sorjax.training.config import base_config
from sorjax.training.tasks import lm as lm_task
from sorjax.training.tasks.common import model_config


def dyck_data(**kw) -> ml_collections.ConfigDict:
  """With a `preset`, the split counts default to the preset's own (as
  runs before session 41 recorded them; a count given replaces the
  preset's, its lengths stay)."""
  if kw.get("preset") in dyck.PRESETS:
    counts = {f"num_{s}": spec.num
              for s, spec in dyck.PRESETS[kw["preset"]].splits}
    kw = {**counts, **kw}
  d = ml_collections.ConfigDict(dict(
      k=2, m=4, preset=None, num_train=10_000, num_dev=4_000,
      num_test=10_000, scale=1.0, max_length=None, seed=0, batch_size=10,
      eval_batch_size=100, num_buckets=8, bucket_multiple=8))
  d.update(kw)
  return d


def pcfg_data(**kw) -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict(dict(
      preset="mahto", loss="mse", scale=1.0, seed=0, batch_size=32,
      eval_batch_size=100, num_buckets=8, bucket_multiple=8))
  d.update(kw)
  return d


def lm_data(**kw) -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict(dict(
      corpus="ptb", data_dir=None, manual_dir=None, batch_size=20, bptt=35,
      variable_bptt=False, pad_to=None, eval_batch_size=10, eval_bptt=35,
      test_batch_size=None, max_train_tokens=None, max_eval_tokens=None,
      train_sentence_cutoff=None, seed=0,
      # one line per document (Maupome & Meurs 4), k-fold splits
      **lm_task.ADDED_FIELDS))
  d.update(kw)
  return d


def tree_data(**kw) -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict(dict(
      dataset="keyword", experiment="length", index=1, scale=1.0, seed=0,
      binary=False, per_node=False, data_dir=None, manual_dir=None,
      batch_size=20, eval_batch_size=100, gradient_trees=200))
  d.update(kw)
  return d


def config(task: str, data: ml_collections.ConfigDict, **model):
  c = base_config()
  c.task = task
  c.data = data
  c.model = model_config(**model)
  c.model.assignment = None
  return c


def lin_training(c: ml_collections.ConfigDict, temperature: bool
                 ) -> ml_collections.ConfigDict:
  """Lin et al.'s training setup (sec. 4, shared by their Dyck and WikiText-2
  runs): Adam 1e-4, learning rate x0.5 after 3 epochs without improvement,
  early stopping after 6, at most 100 epochs; with `temperature`, the
  attention softmax's tau starts at 1, decays x0.9 per epoch and is 0.01
  at evaluation (sec. 3.2.2)."""
  c.optim.name = "adam"
  c.optim.learning_rate = 1e-4
  c.plateau.enabled = True
  c.plateau.factor = 0.5
  c.plateau.patience = 3
  c.early_stopping.patience = 6
  if temperature:
    c.temperature.init = 1.0
    c.temperature.decay = 0.9
    c.temperature.per = "epoch"
    c.temperature.eval_value = 0.01
  c.train.num_epochs = 100   # a cap: early stopping ends the run
  c.train.log_every = 100
  c.train.checkpoint_every = 1000
  return c
