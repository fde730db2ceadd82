"""WikiText-2 (v1, tokenized), one example per line.

Lines of `wiki.{train,valid,test}.tokens` verbatim, blank lines included
(the usual language-modelling convention gives each its `<eos>`): train has
36,718 lines, 2,088,628 tokens with `<eos>`, 33,278 symbols.
"""

from etils import epath
import tensorflow_datasets as tfds

from sorjax.data import builders


class Builder(builders.LinesBuilder):
  """WikiText-2 v1 (tokenized) language-modelling corpus."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: one example per line."}
  SUBDIR = "wikitext-2"
  SPLIT_FILES = {"train": "wiki.train.tokens",
                 "validation": "wiki.valid.tokens",
                 "test": "wiki.test.tokens"}
  HOMEPAGE = ("https://www.salesforce.com/blog/"
              "the-wikitext-long-term-dependency-language-modeling-dataset/")
  MANUAL_DOWNLOAD_INSTRUCTIONS = builders.instructions(SUBDIR,
                                                       SPLIT_FILES.values())
  pkg_dir_path = epath.Path(__file__).parent
