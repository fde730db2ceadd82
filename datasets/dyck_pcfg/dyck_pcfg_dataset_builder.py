"""The Dyck-2 PCFG of Suzgun et al. (2019) as used by Mahto et al. (A.10).

Drawn by `sorjax.data.pcfg.make_splits(preset, seed)`: config `mahto`
(p1 = p2 = q = 0.25; 2..200 brackets; 10k train / 2k validation / 5k test,
drawn independently) and `suzgun` (distinct sequences: 10k train of 2..50
brackets, 5k test of 52..100; no validation split). Seed 0 in every config
(each split's seed is derived from it), so a config equals
`make_splits(name, seed=0)` with "dev" named "validation".

Features: `tokens` (int32; 0..k-1 open, k..2k-1 close; no START/END) and
`max_timescale` (the longest closing minus opening position, Mahto 3.1.2).
The admissible-next-symbol targets are a function of the tokens
(`DyckPCFG.targets`).
"""

import dataclasses

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from sorjax.data import builders
from sorjax.data import pcfg


@dataclasses.dataclass
class Config(builders.GeneratedConfig):
  """`preset`: a name in pcfg.PRESETS (default: the config's name)."""
  preset: str = ""


class Builder(builders.GeneratedBuilder):
  """Dyck-2 PCFG sequences with their maximum timescale."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: Mahto and Suzgun presets."}
  BUILDER_CONFIGS = [
      Config(name=name, preset=name, seed=0,
             description=", ".join(
                 f"{s} {v.num} of {v.min_length}..{v.max_length}"
                 for s, v in p.splits) + (", distinct" if p.unique else ""))
      for name, p in pcfg.PRESETS.items()]
  DEFAULT_CONFIG_NAME = "mahto"
  HOMEPAGE = "https://arxiv.org/abs/1911.03329"
  pkg_dir_path = epath.Path(__file__).parent
  PRESETS = pcfg.PRESETS

  def features(self):
    return {"tokens": tfds.features.Tensor(shape=(None,), dtype=np.int32),
            "max_timescale": np.int32}

  def generate(self, config):
    preset = self.preset()
    self._grammar = g = preset.grammar
    self.info.metadata.update(
        p=list(g.p), q=g.q, vocab=list(g.vocab), unique=preset.unique,
        lengths={builders.GENERATED_SPLITS[s]: [v.min_length, v.max_length]
                 for s, v in preset.splits})
    return pcfg.make_splits(preset, seed=config.seed, scale=config.scale)

  def encode(self, seq):
    return {"tokens": np.asarray(seq, np.int32),
            "max_timescale": self._grammar.max_timescale(seq)}
