"""BLiMP: 67 phenomena x 1,000 minimal pairs (grammatical, ungrammatical).

One example per line of `<phenomenon>.jsonl` (or `.jsonl.gz`), all in the
split "test" (BLiMP is an evaluation set); `UID` names the phenomenon.
Nothing of the source is dropped:
* per pair: `UID`, `pairID`, `sentence_good`, `sentence_bad`, and `extra`,
  a JSON object of the fields only some phenomena have (the one- and
  two-prefix words, `crucial_item`, `dependency_length`; "{}" if none);
* per phenomenon (the same on all its lines, which is checked):
  `field`, `linguistics_term` and the method flags, in
  `info.metadata["phenomena"][UID]`.
Few features keep the build fast (TFDS encodes each feature in Python). A
line with an unknown, missing or mistyped field, a UID other than its
file's name, or a per-phenomenon field that changes raises an error naming
the file and line.
"""

import json

from etils import epath
import tensorflow_datasets as tfds

from sorjax.data import builders

PAIR = ("UID", "pairID", "sentence_good", "sentence_bad")
PHENOMENON = {"field": str, "linguistics_term": str,
              "simple_LM_method": bool, "one_prefix_method": bool,
              "two_prefix_method": bool, "lexically_identical": bool}
EXTRA = {"one_prefix_prefix": str, "one_prefix_word_good": str,
         "one_prefix_word_bad": str, "two_prefix_prefix_good": str,
         "two_prefix_prefix_bad": str, "two_prefix_word": str,
         "crucial_item": str, "dependency_length": int}
SUFFIX = ".jsonl"


def parse_pair(line: str, where: str) -> tuple[dict, dict]:
  """(example, per-phenomenon fields) of one JSON line; ValueError if bad."""
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    raise ValueError(f"{where}: not valid JSON ({e})") from e
  if not isinstance(record, dict):
    raise ValueError(f"{where}: expected a JSON object")
  unknown = set(record) - set(PAIR) - set(PHENOMENON) - set(EXTRA)
  if unknown:
    raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
  kinds = {**dict.fromkeys(PAIR, str), **PHENOMENON, **EXTRA}
  for key, value in record.items():
    if type(value) is not kinds[key]:  # exact: a bool is also an int
      raise ValueError(f"{where}: field {key!r} should be "
                       f"{kinds[key].__name__}, got {value!r}")
  missing = [k for k in (*PAIR, *PHENOMENON) if k not in record]
  if missing:
    raise ValueError(f"{where}: missing fields {missing}")
  example = {k: record[k] for k in PAIR}
  example["extra"] = json.dumps({k: record[k] for k in EXTRA if k in record},
                                ensure_ascii=False)
  return example, {k: record[k] for k in PHENOMENON}


class Builder(builders.SourceBuilder):
  """BLiMP, the Benchmark of Linguistic Minimal Pairs (Warstadt et al.)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  SUBDIR = "blimp"
  MANUAL_DOWNLOAD_INSTRUCTIONS = builders.instructions(
      SUBDIR, ["the 67 <phenomenon>.jsonl files of "
               "https://github.com/alexwarstadt/blimp/tree/master/data"])
  pkg_dir_path = epath.Path(__file__).parent

  def _info(self):
    features = {k: tfds.features.Text() for k in (*PAIR, "extra")}
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(features),
        homepage="https://github.com/alexwarstadt/blimp",
        metadata=tfds.core.MetadataDict(),
        disable_shuffling=True)

  def _files(self, dl_manager):
    """Local paths of the phenomenon files, by name."""
    if self.verify_checksums:  # exactly the 67 published files
      return self.source_paths(dl_manager, sorted(self.source_files()))

    def present(d):
      return sorted({p.name.removesuffix(".gz") for p in d.iterdir()
                     if p.name.endswith((SUFFIX, SUFFIX + ".gz"))})

    d = self.source_dir(dl_manager, lambda d: None if present(d) else
                        f"no *{SUFFIX} files")
    if d is None:
      return self.download(dl_manager, sorted(self.source_files()))
    return {n: builders.find(d, n) for n in present(d)}

  def _split_generators(self, dl_manager):
    examples, phenomena = [], {}
    for name, path in sorted(self._files(dl_manager).items()):
      uid = name.removesuffix(SUFFIX)
      for i, line in enumerate(self.read_lines(path, name, "test")):
        if not line.strip():
          self.skip("test", "blank lines")
          continue
        where = f"{path}:{i + 1}"
        example, fields = parse_pair(line, where)
        if example["UID"] != uid:
          raise ValueError(f"{where}: UID {example['UID']!r} differs from "
                           f"the file's phenomenon {uid!r}")
        first = phenomena.setdefault(uid, fields)
        if fields != first:
          changed = sorted(k for k in fields if fields[k] != first[k])
          raise ValueError(f"{where}: fields {changed} differ from the "
                           f"phenomenon's first line")
        examples.append(example)
    self.info.metadata["phenomena"] = phenomena
    return {"test": self._generate_examples(examples)}

  def _generate_examples(self, examples):
    yield from enumerate(examples)
