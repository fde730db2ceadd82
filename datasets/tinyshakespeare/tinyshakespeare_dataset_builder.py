"""Tiny Shakespeare (Karpathy's char-rnn `input.txt`), one example per line.

The file has no official split; the lines are split in order, 90% / 5% / 5%
(train / validation / test: 36,000 / 2,000 / 2,000 of the 40,000 lines),
the proportions of TFDS's `tiny_shakespeare` but at line boundaries so that
every example is a whole line. Blank lines are kept: at character level
they are the newlines between speeches.
"""

from etils import epath
import tensorflow_datasets as tfds

from sorjax.data import builders

FILE = "input.txt"
FRACTIONS = (0.9, 0.05, 0.05)  # train, validation, test


def split_bounds(n: int) -> tuple[int, int]:
  """Line indices where validation and test begin (90% / 5% / 5%)."""
  return int(n * FRACTIONS[0]), int(n * (FRACTIONS[0] + FRACTIONS[1]))


class Builder(builders.SourceBuilder):
  """Tiny Shakespeare character-level corpus."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: lines split 90/5/5 in order."}
  SUBDIR = "tinyshakespeare"
  HOMEPAGE = "https://github.com/karpathy/char-rnn"
  MANUAL_DOWNLOAD_INSTRUCTIONS = builders.instructions(SUBDIR, [FILE])
  pkg_dir_path = epath.Path(__file__).parent

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(builders.LINE_FEATURES),
        homepage=self.HOMEPAGE,
        metadata=tfds.core.MetadataDict(),
        disable_shuffling=True)

  def _split_generators(self, dl_manager):
    path = self.source_paths(dl_manager, [FILE])[FILE]
    lines = self.read_lines(path, FILE)
    a, b = split_bounds(len(lines))
    return {"train": self._generate_examples(lines, 0, a),
            "validation": self._generate_examples(lines, a, b),
            "test": self._generate_examples(lines, b, len(lines))}

  def _generate_examples(self, lines, start, stop):
    for i in range(start, stop):
      yield i, {"text": lines[i], "line": i}
