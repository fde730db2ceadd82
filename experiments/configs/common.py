"""Building blocks of the experiment configs."""

import ml_collections

from sorjax.training.config import base_config
from sorjax.training.tasks.common import model_config


def dyck_data(**kw) -> ml_collections.ConfigDict:
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
      max_train_tokens=None, max_eval_tokens=None, seed=0))
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
