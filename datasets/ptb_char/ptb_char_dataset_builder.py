"""Penn Treebank, Mikolov's character files.

One example per line of `ptb.char.{train,valid,test}.txt`, verbatim: each
character followed by a space, `_` between words, `<unk>` spelled out as
five characters, `N` (a number) one character. Symbols are the
space-separated items: 49 in train, 4,975,414 of them (5,017,482 with one
`<eos>` per line).
"""

from etils import epath
import tensorflow_datasets as tfds

from sorjax.data import builders


class Builder(builders.LinesBuilder):
  """PTB (Mikolov) character-level language-modelling corpus."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: one example per line."}
  SUBDIR = "ptb"
  SPLIT_FILES = {"train": "ptb.char.train.txt",
                 "validation": "ptb.char.valid.txt",
                 "test": "ptb.char.test.txt"}
  HOMEPAGE = "https://www.fit.vutbr.cz/~imikolov/rnnlm/"
  MANUAL_DOWNLOAD_INSTRUCTIONS = builders.instructions(SUBDIR,
                                                       SPLIT_FILES.values())
  pkg_dir_path = epath.Path(__file__).parent
