"""The keyword task of Le & Zuidema (2016), section 3.

Drawn by `sorjax.data.keyword_trees`: configs `length_1`..`length_10` are
Experiment 1 (`length_experiment(i)`: sentences of 10i-9..10i tokens) and
`depth_1`..`depth_10` Experiment 2 (`depth_experiment(i)`: 21..30 tokens,
keyword at depth i or i+1); 10k train / 1k validation / 1k test each.
Seed 0 in every config, so a config equals `length_experiment(i, seed=0)`
(or `depth_experiment`) with "dev" named "validation".

Features: `tree` (bracketed string "(a b)" of token ids, `to_string`),
`tokens` (int32 leaves left to right), `label` (keyword // 100, 10
classes), `keyword_index` (its leaf index), `keyword_depth` (edges to the
root).
"""

import dataclasses

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from sorjax.data import builders
from sorjax.data import keyword_trees

EXPERIMENTS = {"length": keyword_trees.length_experiment,
               "depth": keyword_trees.depth_experiment}


@dataclasses.dataclass
class Config(builders.GeneratedConfig):
  """`experiment`: 'length' (Le & Zuidema 3.1) or 'depth' (3.2); `i`: the
  dataset's number."""
  experiment: str = "length"
  i: int = 1


class Builder(builders.GeneratedBuilder):
  """Random binary trees over tokens with one keyword; label keyword//100."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: Experiments 1 and 2."}
  BUILDER_CONFIGS = [
      Config(name=f"length_{i}", experiment="length", i=i, seed=0,
             description=f"Experiment 1: lengths {10 * i - 9}..{10 * i}")
      for i in range(1, 11)] + [
      Config(name=f"depth_{i}", experiment="depth", i=i, seed=0,
             description=f"Experiment 2: keyword depth {i} or {i + 1}, "
                         "lengths 21..30")
      for i in range(1, 11)]
  DEFAULT_CONFIG_NAME = "length_1"
  HOMEPAGE = "https://aclanthology.org/W16-1610/"
  pkg_dir_path = epath.Path(__file__).parent

  def features(self):
    return {"tree": tfds.features.Text(),
            "tokens": tfds.features.Tensor(shape=(None,), dtype=np.int32),
            "label": tfds.features.ClassLabel(
                num_classes=keyword_trees.NUM_CLASSES),
            "keyword_index": np.int32,
            "keyword_depth": np.int32}

  def generate(self, config):
    experiment = getattr(config, "experiment", None)
    if experiment not in EXPERIMENTS:
      raise ValueError(f"keyword_trees/{config.name}: experiment must be one "
                       f"of {sorted(EXPERIMENTS)}, got {experiment!r}")
    self.info.metadata.update(experiment=experiment, i=int(config.i))
    return EXPERIMENTS[experiment](config.i, seed=config.seed,
                                   scale=config.scale)

  def encode(self, ex):
    return {"tree": keyword_trees.to_string(ex.tree),
            "tokens": np.asarray(ex.tokens, np.int32),
            "label": ex.label,
            "keyword_index": ex.keyword_index,
            "keyword_depth": ex.keyword_depth}
