"""PTB characters as preprocessed by Maupome & Meurs, section 4.

"We treat each line in the article as a separate document. [...] We replaced
all non-alphabetic characters by white spaces, then replaced all consecutive
white spaces by a single one. Finally, we replaced all uppercase letters by
their lower case counterparts." -> a 27-symbol alphabet (a-z and space).

The paper starts from the raw Wall Street Journal articles of the Penn
Treebank (LDC99T42 `raw/wsj/NN/wsj_NNNN`, 49,689 lines in total) and reports
5-fold cross-validation (the LM task's `data.folds`). Two configs:

* `mikolov` (default): Mikolov's freely distributed PTB text
  (ptb.{train,valid,test}.txt) and its split. That text is already
  lower-cased and stripped of punctuation; its number token `N` stands for
  digits, which the paper's rule blanks out, so `N` is removed; `<unk>`
  (rare words, which the paper keeps spelled out) can only become `unk`.
  Both are counted in the metadata.
* `wsj_raw`: the LDC raw WSJ files (licensed; give their folder as the
  manual_dir). Split by section as for language modelling: 00-20 train,
  21-22 validation, 23-24 test. `.START` marker lines are skipped.

Each document is stripped of leading/trailing spaces (we read the paper's
"did not trim the lines" as "did not truncate"); documents left empty are
skipped and counted.
"""

import dataclasses
import re

from etils import epath
import tensorflow_datasets as tfds

from sorjax.data import builders
from sorjax.data.tokenize import letters_only  # the paper's rule, stripped

_RAW_FILE = re.compile(r"wsj_(\d\d)\d\d")
MIKOLOV_FILES = {"train": "ptb.train.txt", "validation": "ptb.valid.txt",
                 "test": "ptb.test.txt"}
SECTIONS = {"train": range(0, 21), "validation": range(21, 23),
            "test": range(23, 25)}


@dataclasses.dataclass
class Config(tfds.core.BuilderConfig):
  subdir: str = "ptb"


class Builder(builders.SourceBuilder):
  """Maupome & Meurs' 27-character PTB, one document per line."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = [
      Config(name="mikolov", subdir="ptb",
             description="From Mikolov's ptb.{train,valid,test}.txt."),
      Config(name="wsj_raw", subdir="wsj_raw",
             description="From the LDC raw WSJ files wsj_NNNN (manual)."),
  ]
  DEFAULT_CONFIG_NAME = "mikolov"
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      builders.instructions("ptb", MIKOLOV_FILES.values()) +
      " For the wsj_raw config, give the LDC Treebank-3 raw/wsj folder "
      "(files wsj_NNNN in section folders NN/) as the manual_dir.")
  pkg_dir_path = epath.Path(__file__).parent

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            **builders.LINE_FEATURES,
            "source": tfds.features.Text(),  # source file name
        }),
        metadata=tfds.core.MetadataDict(),
        disable_shuffling=True)

  def _split_generators(self, dl_manager):
    if self.builder_config.name == "wsj_raw":
      documents = self._wsj_raw(dl_manager)
    else:
      documents = self._mikolov(dl_manager)
    for split, docs in documents.items():
      self.info.metadata.setdefault("documents", {})[split] = len(docs)
    return {split: self._generate_examples(docs)
            for split, docs in documents.items()}

  def _generate_examples(self, documents):
    for key, (source, line, text) in enumerate(documents):
      yield key, {"text": text, "line": line, "source": source}

  def _mikolov(self, dl_manager):
    paths = self.source_paths(dl_manager, list(MIKOLOV_FILES.values()))
    meta = self.info.metadata
    documents = {}
    for split, name in MIKOLOV_FILES.items():
      docs = []
      for i, line in enumerate(self.read_lines(paths[name], name, split)):
        words = line.split()
        meta["N_removed"] = meta.get("N_removed", 0) + words.count("N")
        meta["unk_kept"] = meta.get("unk_kept", 0) + words.count("<unk>")
        text = letters_only(" ".join(w for w in words if w != "N"))
        if text:
          docs.append((name, i, text))
        else:
          self.skip(split, "lines empty after preprocessing")
      documents[split] = docs
    return documents

  def _wsj_raw(self, dl_manager):
    def raw_files(d):
      return sorted((p for p in d.rglob("wsj_*")
                     if p.is_file() and _RAW_FILE.fullmatch(p.name)),
                    key=lambda p: p.name)

    d = self.source_dir(dl_manager, lambda d: None if raw_files(d) else
                        "no raw WSJ files named wsj_NNNN")
    if d is None:
      raise FileNotFoundError(
          f"{self.name}/wsj_raw: no raw WSJ files (wsj_NNNN) found (searched "
          f"{'; '.join(self._searched)}); they are licensed by the LDC and "
          f"have no download URL. Give the LDC Treebank-3 raw/wsj folder as "
          f"the manual_dir.")
    files = raw_files(d)
    self.info.metadata["unverified"] = (
        f"{len(files)} LDC raw WSJ files (no published checksums)")
    documents = {split: [] for split in SECTIONS}
    for path in files:
      section = int(_RAW_FILE.fullmatch(path.name).group(1))
      split = next((s for s, r in SECTIONS.items() if section in r), None)
      if split is None:
        raise ValueError(f"{path}: section {section:02d} is not a WSJ "
                         f"section of the Penn Treebank (00-24)")
      lines = builders.decode_lines(path, builders.read_bytes(path))
      for i, line in enumerate(lines):
        if line.strip() == ".START":
          self.skip(split, ".START marker lines")
          continue
        text = letters_only(line)
        if text:
          documents[split].append((path.name, i, text))
        else:
          self.skip(split, "lines empty after preprocessing")
    for split, docs in documents.items():
      if not docs:
        sections = SECTIONS[split]
        raise FileNotFoundError(
            f"{self.name}/wsj_raw: no documents for split {split!r} (sections "
            f"{sections[0]:02d}-{sections[-1]:02d}) among the {len(files)} raw "
            f"WSJ files under {d}")
    return documents
