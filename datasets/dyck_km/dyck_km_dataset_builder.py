"""Dyck-(k, m), the bounded Dyck languages of Hewitt et al. (2020).

Drawn by `sorjax.data.dyck.make_splits(preset, seed)`: configs `lin_m4`,
`lin_m6`, `lin_m8` are its PRESETS, the setting of Lin et al. 4.1 (k = 2;
10k train / 4k validation / 10k test; train and validation 1..L brackets,
test L+1..2L, L = 8m(m-2)+60). Seed 0 in every config (each split's seed is
derived from it by `dyck.split_seeds`), so a config equals
`make_splits(name, seed=0)` with "dev" named "validation".

Features: `tokens` (int32 ids START, brackets, END; ids 0..k-1 open, k..2k-1
close, 2k START, 2k+1 END) and `closing_distances` (int32, per position: a
closing bracket's position minus its open's, else 0).
"""

import dataclasses

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from sorjax.data import builders
from sorjax.data import dyck


@dataclasses.dataclass
class Config(builders.GeneratedConfig):
  """`preset`: a name in dyck.PRESETS (default: the config's name)."""
  preset: str = ""


class Builder(builders.GeneratedBuilder):
  """Dyck-(2, m) samples with closing distances."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: Lin et al. 4.1 presets."}
  BUILDER_CONFIGS = [
      Config(
          name=name, preset=name, seed=0,
          description=f"Dyck-({p.language.k},{p.language.m}), "
                      f"{', '.join(f'{s} {v.num}' for s, v in p.splits)}")
      for name, p in dyck.PRESETS.items()]
  DEFAULT_CONFIG_NAME = "lin_m4"
  HOMEPAGE = "https://github.com/john-hewitt/dyckkm-learning"
  pkg_dir_path = epath.Path(__file__).parent
  PRESETS = dyck.PRESETS

  def features(self):
    return {"tokens": tfds.features.Tensor(shape=(None,), dtype=np.int32),
            "closing_distances": tfds.features.Tensor(shape=(None,),
                                                      dtype=np.int32)}

  def generate(self, config):
    preset = self.preset()
    self._language = preset.language
    lang = preset.language
    self.info.metadata.update(
        k=lang.k, m=lang.m, vocab=list(lang.vocab),
        lengths={builders.GENERATED_SPLITS[s]: [v.min_length, v.max_length]
                 for s, v in preset.splits})
    return dyck.make_splits(preset, seed=config.seed, scale=config.scale)

  def encode(self, seq):
    return {"tokens": np.asarray(seq, np.int32),
            "closing_distances":
                self._language.closing_distances(seq).astype(np.int32)}
