"""Stanford Sentiment Treebank: binary parse trees with 5-way labels.

One example per tree (one line of the official `trees/{train,dev,test}.txt`):
the bracketed tree string kept verbatim (every node labelled 0-4, for
`sorjax.trees.parse`), its words, the root's 5-way label and the binary
label of the root (0-1 negative -> 0, 3-4 positive -> 1, 2 neutral -> -1,
left out of the binary task). Trees are checked to be well formed and
binary; a bad one raises an error naming the file and line.
"""

import pathlib
import re

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from sorjax.data import builders

ZIP_URL = "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip"
SPLIT_FILES = {"train": "train.txt", "validation": "dev.txt",
               "test": "test.txt"}
LABELS = ("very negative", "negative", "neutral", "positive", "very positive")
BINARY = (0, 0, -1, 1, 1)  # root label -> binary label (-1: neutral)
# Split at ASCII blanks only: a leaf may hold U+00A0 ("8\u00a01\\/2").
_TOKENS = re.compile(r"\(|\)|[^ \t\n\r\f\v()]+")


def parse_tree(line: str, where: str) -> tuple[int, list[str]]:
  """(root label, words) of a bracketed binary tree; ValueError if bad.

  Every node is `(label word)` or `(label left right)`, label in 0-4.
  """
  tokens = _TOKENS.findall(line)
  stack, words, root = [], [], None  # stack items: [label, children, word?]
  i = 0
  while i < len(tokens):
    t = tokens[i]
    if t == "(":
      if root is not None:
        raise ValueError(f"{where}: text after the end of the tree")
      label = tokens[i + 1] if i + 1 < len(tokens) else ""
      if label not in ("0", "1", "2", "3", "4"):
        raise ValueError(f"{where}: expected a label 0-4 after '(', got "
                         f"{label!r}")
      stack.append([int(label), 0, False])
      i += 2
      continue
    if t == ")":
      if not stack:
        raise ValueError(f"{where}: unbalanced ')'")
      label, children, word = stack.pop()
      if not (word and children == 0) and not (children == 2 and not word):
        raise ValueError(f"{where}: a node labelled {label} has {children} "
                         f"children{' and a word' if word else ''}; the "
                         f"tree is not binary")
      if stack:
        stack[-1][1] += 1
      else:
        root = label
    else:
      if not stack or stack[-1][1] or stack[-1][2]:
        raise ValueError(f"{where}: unexpected word {t!r} (a word must be "
                         f"the only child of its node)")
      stack[-1][2] = True
      words.append(t)
    i += 1
  if stack:
    raise ValueError(f"{where}: {len(stack)} unclosed '('")
  if root is None:
    raise ValueError(f"{where}: no tree")
  return root, words


class Builder(builders.SourceBuilder):
  """Stanford Sentiment Treebank (Socher et al., 2013)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  SUBDIR = "sst"
  FILES = {
      "train.txt": builders.SourceFile(
          "train.txt", 2160058,
          "e2f3f41b0b1e6d4dddc0effe3bfc2d27ed8928079aa9a03d652311614fc5feb7",
          ZIP_URL, "trees/train.txt"),
      "dev.txt": builders.SourceFile(
          "dev.txt", 280825,
          "0e9336aed6e4730e19f58d00a77b3f0297efdb755f7b5e598c98a05e3f97ea40",
          ZIP_URL, "trees/dev.txt"),
      "test.txt": builders.SourceFile(
          "test.txt", 559614,
          "6e54806dee95cf80cd918e7dfb3f6770f6df24bf826f289a4d1f709e1c8f6761",
          ZIP_URL, "trees/test.txt"),
  }
  MANUAL_DOWNLOAD_INSTRUCTIONS = builders.instructions(
      SUBDIR, SPLIT_FILES.values()) + f" (the trees/ folder of {ZIP_URL})."
  pkg_dir_path = epath.Path(__file__).parent

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            "tree": tfds.features.Text(),  # bracketed, every node labelled
            "sentence": tfds.features.Text(),  # the leaves, space-joined
            "label": tfds.features.ClassLabel(names=LABELS),  # root, 5-way
            "binary_label": np.int32,  # root: 0 neg, 1 pos, -1 neutral
            "line": np.int32,
        }),
        supervised_keys=("sentence", "label"),
        homepage="https://nlp.stanford.edu/sentiment/",
        metadata=tfds.core.MetadataDict(),
        disable_shuffling=True)

  def download(self, dl_manager, names):
    try:
      root = dl_manager.download_and_extract(ZIP_URL)
    except Exception as e:  # no internet, HTTP error
      raise FileNotFoundError(
          f"{self.name}: source files not found locally (searched "
          f"{'; '.join(self._searched)}) and the download of {ZIP_URL} "
          f"failed: {e}. {self.MANUAL_DOWNLOAD_INSTRUCTIONS}") from e
    self.info.metadata["source"] = "downloaded"
    return {n: pathlib.Path(root) / self.FILES[n].member
            for n in names}

  def _split_generators(self, dl_manager):
    paths = self.source_paths(dl_manager, list(SPLIT_FILES.values()))
    examples = {}
    for split, name in SPLIT_FILES.items():
      examples[split] = []
      for i, line in enumerate(self.read_lines(paths[name], name, split)):
        if not line.strip():
          self.skip(split, "blank lines")
          continue
        label, words = parse_tree(line, f"{paths[name]}:{i + 1}")
        examples[split].append({
            "tree": line.strip(), "sentence": " ".join(words),
            "label": label, "binary_label": BINARY[label], "line": i})
    return {split: self._generate_examples(ex)
            for split, ex in examples.items()}

  def _generate_examples(self, examples):
    yield from enumerate(examples)
