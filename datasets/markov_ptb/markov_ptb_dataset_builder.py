"""Markov-PTB, the control corpus of Mahto et al. 3.1.1.

"Using the empirical bigram probabilities from PTB, we sampled tokens
sequentially until a new corpus of the same size had been generated."
Here: the token stream of PTB train (Mikolov's ptb.train.txt, the words of
each line then `<eos>`) gives the bigram chain (`sorjax.data.markov`,
wrap=True); each split is a stream of as many tokens as the same PTB split
(train 929,589, validation 73,760, test 82,430), drawn from that chain with
its own seed derived from seed 0 (`dyck.split_seeds(0, SPLITS)`). Token ids
are the sorted word list's indices (`np.unique`), which fixes the draw.
The stream is cut into lines at `<eos>`: one example per line, words joined
by single spaces, as the `ptb` builder's (`text`, `line`); a last line the
stream ends inside (no `<eos>` after it) is kept. `load_corpus` puts an
`<eos>` after every line, that one too, so it returns one token more than
the stream when the stream ends inside a line, as every split does with
seed 0 (train 929,590, validation 73,761, test 82,431).

Sources: the `ptb` builder's files and checksums (found the same way).
"""

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from sorjax.data import builders
from sorjax.data import dyck
from sorjax.data import markov

EOS = "<eos>"
SEED = 0


class Builder(builders.SourceBuilder):
  """Markov-PTB: PTB-sized streams from PTB train's bigram chain."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: seed 0, PTB train bigrams."}
  SUBDIR = "ptb"
  SPLIT_FILES = {"train": "ptb.train.txt", "validation": "ptb.valid.txt",
                 "test": "ptb.test.txt"}
  HOMEPAGE = "https://www.fit.vutbr.cz/~imikolov/rnnlm/"  # PTB's
  MANUAL_DOWNLOAD_INSTRUCTIONS = builders.instructions(SUBDIR,
                                                       SPLIT_FILES.values())
  pkg_dir_path = epath.Path(__file__).parent

  @classmethod
  def source_files(cls):
    return builders.builder_class("ptb").source_files()

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(builders.LINE_FEATURES),
        homepage=self.HOMEPAGE,
        metadata=tfds.core.MetadataDict(),
        disable_shuffling=True)  # language-model order matters

  def _split_generators(self, dl_manager):
    paths = self.source_paths(dl_manager, list(self.SPLIT_FILES.values()))
    streams = {split: stream(self.read_lines(paths[name], name, split))
               for split, name in self.SPLIT_FILES.items()}
    words, ids = np.unique(streams["train"], return_inverse=True)
    seeds = dyck.split_seeds(SEED, list(self.SPLIT_FILES))
    self.info.metadata.update(seed=SEED, bigrams_from="train")
    return {split: self._generate_examples(
        words, markov.markov_corpus(ids.astype(np.int64), seeds[split],
                                    len(streams[split])))
            for split in self.SPLIT_FILES}

  def _generate_examples(self, words, ids):
    for i, line in enumerate(lines(words[ids].tolist())):
      yield i, {"text": line, "line": i}


def stream(lines: list[str]) -> list[str]:
  """The words of every line, each line followed by `<eos>`."""
  return [w for line in lines for w in line.split() + [EOS]]


def lines(tokens: list[str]) -> list[str]:
  """A token stream cut at `<eos>` into lines of space-joined words."""
  out, line = [], []
  for t in tokens:
    if t == EOS:
      out.append(" ".join(line))
      line = []
    else:
      line.append(t)
  if line:
    out.append(" ".join(line))
  return out
