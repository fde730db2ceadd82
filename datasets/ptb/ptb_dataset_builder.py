"""Penn Treebank, Mikolov's language-modelling version, word level.

One example per line of `ptb.{train,valid,test}.txt`, verbatim (words
separated by spaces, `<unk>` for rare words, `N` for numbers). The
vocabulary is built later (sorjax.data.corpora.load_corpus): 929,589
train tokens with one `<eos>` per line, 10,000 symbols.
"""

from etils import epath
import tensorflow_datasets as tfds

from sorjax.data import builders


class Builder(builders.LinesBuilder):
  """PTB (Mikolov) word-level language-modelling corpus."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: one example per line."}
  SUBDIR = "ptb"
  SPLIT_FILES = {"train": "ptb.train.txt", "validation": "ptb.valid.txt",
                 "test": "ptb.test.txt"}
  HOMEPAGE = "https://www.fit.vutbr.cz/~imikolov/rnnlm/"
  MANUAL_DOWNLOAD_INSTRUCTIONS = builders.instructions(SUBDIR,
                                                       SPLIT_FILES.values())
  pkg_dir_path = epath.Path(__file__).parent
