"""TFDS builders of the real corpora: finding, verifying and reading sources.

The builders live in `datasets/<name>/<name>_dataset_builder.py` (the
`tfds build` layout) and subclass `SourceBuilder` (or `LinesBuilder`) from
here. They are built from Python, without TensorFlow:

    b = builder("ptb", data_dir="~/tensorflow_datasets")
    b.download_and_prepare()                  # or: prepare("ptb", ...)
    b.as_data_source()["train"][0]            # {"text": b" aer ...", "line": 0}

Source files are looked for, in order, in
  1. the manual_dir (`DownloadConfig(manual_dir=...)`, `--manual_dir`;
     TFDS's default is `<data_dir>/downloads/manual`);
  2. `$SORJAX_DATA_DIR`, a copy of the shared data folder;
  3. `../shared/data` next to the repository, when present;
and in each of these directories as `<dir>/<SUBDIR>/` (e.g. `ptb/`) or
directly in `<dir>/`. A file may be gzipped (`name.gz`). Only when none
holds the files does a builder download them from its URLs (pinned commits;
needs the internet). A manual_dir that is given but lacks the files, or a
`$SORJAX_DATA_DIR` that does not exist, is an error, never skipped.

Checksums: `checksums.tsv` next to each builder (the TFDS format: url, size,
sha256, file name) gives the size and sha256 of each file's content; a
gzipped copy is checked by its decompressed content. A mismatch raises
`ChecksumError` naming the file, unless the builder is made with
`verify_checksums=False` (e.g. for a fixture or a patched copy).

Whatever a builder skips (blank documents, marker lines) is counted in
`builder.info.metadata["skipped"]` (saved with the dataset) and logged.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import importlib.util
import logging
import os
import pathlib
import sys
import zlib
from typing import Callable, ClassVar, Iterable, Mapping, Sequence

import numpy as np
import tensorflow_datasets as tfds

DATA_ENV = "SORJAX_DATA_DIR"
DATASETS_ENV = "SORJAX_DATASETS_DIR"
NAMES = ("ptb", "ptb_char", "ptb_char_maupome", "wikitext2",
         "tinyshakespeare", "sst", "blimp",
         # Generated from sorjax.data's synthetic languages (no sources).
         "dyck_km", "dyck_pcfg", "keyword_trees")
SPLITS = ("train", "validation", "test")

_REPO = pathlib.Path(__file__).resolve().parents[2]

log = logging.getLogger(__name__)


class ChecksumError(ValueError):
  """A source file's size or sha256 differs from the builder's table."""


# ------------------------------------------------------------- locations

def shared_data_dir() -> pathlib.Path | None:
  """`../shared/data` next to the repository root, if it exists."""
  path = _REPO.parent / "shared" / "data"
  return path if path.is_dir() else None


def datasets_dir() -> pathlib.Path:
  """The `datasets/` folder of builders (`$SORJAX_DATASETS_DIR` overrides)."""
  env = os.environ.get(DATASETS_ENV)
  path = pathlib.Path(env).expanduser() if env else _REPO / "datasets"
  if not path.is_dir():
    where = f"${DATASETS_ENV}={env}" if env else "the repository"
    raise FileNotFoundError(
        f"no datasets/ folder of builders at {path} (from {where}); set "
        f"${DATASETS_ENV} to the sorjax repository's datasets/ folder")
  return path


def split_name(name: str) -> tuple[str, str | None]:
  """'ptb_char_maupome/wsj_raw' -> ('ptb_char_maupome', 'wsj_raw')."""
  base, _, config = name.partition("/")
  if base not in NAMES:
    raise ValueError(f"unknown corpus {base!r}; known: {', '.join(NAMES)}")
  return base, config or None


def builder_class(name: str) -> type["SourceBuilder"]:
  """Imports `datasets/<name>/<name>_dataset_builder.py` (once) by path.

  The class is not entered in TFDS's global registry (so importing the same
  folder another way cannot clash); use this function to get it.
  """
  name, _ = split_name(name)
  module_name = f"{name}_dataset_builder"
  module = sys.modules.get(module_name)
  if module is None:
    path = datasets_dir() / name / f"{module_name}.py"
    if not path.is_file():
      raise FileNotFoundError(f"builder of {name!r} not found: {path}")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
      with tfds.core.registered.skip_registration():
        spec.loader.exec_module(module)
    except BaseException:
      del sys.modules[module_name]
      raise
  return module.Builder


def builder(name: str, data_dir=None, *, verify_checksums: bool = True,
            **kwargs) -> "SourceBuilder":
  """A builder writing array_record files ('name' or 'name/config')."""
  base, config = split_name(name)
  cls = builder_class(base)
  if config is not None:
    known = [c.name for c in cls.BUILDER_CONFIGS]
    if config not in known:
      raise ValueError(f"{base}: unknown config {config!r}; known: {known}")
    kwargs["config"] = config
  if data_dir is not None:
    data_dir = os.fspath(pathlib.Path(data_dir).expanduser())
  return cls(data_dir=data_dir, file_format="array_record",
             verify_checksums=verify_checksums, **kwargs)


def prepare(name: str, data_dir=None, manual_dir=None, *,
            verify_checksums: bool = True) -> "SourceBuilder":
  """Builds (or reuses) `name` in `data_dir` and returns its builder."""
  b = builder(name, data_dir, verify_checksums=verify_checksums)
  if manual_dir is not None:
    manual_dir = os.fspath(pathlib.Path(manual_dir).expanduser())
  b.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  return b


def instructions(subdir: str, files: Iterable[str]) -> str:
  """MANUAL_DOWNLOAD_INSTRUCTIONS for a corpus folder."""
  return (f"Put {', '.join(files)} (optionally gzipped, name + '.gz') in "
          f"<manual_dir>/{subdir}/ or <manual_dir>/, or set ${DATA_ENV} to a "
          f"copy of the shared data folder holding {subdir}/.")


# ----------------------------------------------------------------- files

@dataclasses.dataclass(frozen=True)
class SourceFile:
  """A source file: name, size and sha256 of its content, URL to fetch it.

  `member` is the path inside the archive at `url`, when `url` is one.
  """
  name: str
  size: int
  sha256: str
  url: str
  member: str | None = None


def find(directory: pathlib.Path, name: str) -> pathlib.Path | None:
  """`directory/name`, else `directory/name.gz`, else None."""
  for candidate in (directory / name, directory / f"{name}.gz"):
    if candidate.is_file():
      return candidate
  return None


def read_bytes(path: pathlib.Path) -> bytes:
  """The content of `path`, decompressed when it ends in .gz."""
  data = path.read_bytes()
  if path.suffix == ".gz":
    try:
      data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
      raise ValueError(f"{path}: not a valid gzip file ({e})") from e
  return data


def verify(path: pathlib.Path, data: bytes, expected: SourceFile) -> None:
  """Raises ChecksumError naming `path` if `data` is not `expected`."""
  digest = hashlib.sha256(data).hexdigest()
  if len(data) != expected.size or digest != expected.sha256:
    content = "decompressed content" if path.suffix == ".gz" else "content"
    raise ChecksumError(
        f"{path}: checksum mismatch for {expected.name}: expected "
        f"{expected.size} bytes with sha256 {expected.sha256}, the {content} "
        f"has {len(data)} bytes with sha256 {digest}. It is a different or "
        f"corrupted copy; build with verify_checksums=False "
        f"(--noverify_checksums) to use it anyway.")


def decode_lines(path: pathlib.Path, data: bytes) -> list[str]:
  """UTF-8 lines of `data` split at '\\n' only, a trailing '\\r' removed.

  Splitting at '\\n' only (not str.splitlines) keeps form feeds and Unicode
  line separators inside a line, as the corpora's token counts assume.
  """
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b"\n") + 1
    raise ValueError(f"{path}:{line}: not valid UTF-8 ({e.reason} at byte "
                     f"{e.start})") from e
  if not text.strip():
    raise ValueError(f"{path}: the file is empty (no text)")
  lines = text.split("\n")
  if lines[-1] == "":
    lines.pop()
  return [l[:-1] if l.endswith("\r") else l for l in lines]


# -------------------------------------------------------------- builders

class SourceBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base of sorjax's corpus builders: finds, verifies and reads sources.

  Subclasses set `SUBDIR` (the corpus folder in a shared-data layout) and
  implement `_info`, `_split_generators` and `_generate_examples` with the
  helpers `source_paths`, `read_lines` and `skip`.
  """

  SUBDIR: ClassVar[str] = ""
  # Expected files by name; None reads them from checksums.tsv.
  FILES: ClassVar[Mapping[str, SourceFile] | None] = None

  def __init__(self, *, verify_checksums: bool = True, **kwargs):
    self.verify_checksums = bool(verify_checksums)
    self._manual_dir_arg = None
    super().__init__(**kwargs)

  def download_and_prepare(self, **kwargs):
    # Remember whether manual_dir was given (TFDS fills in a default).
    self._manual_dir_arg = getattr(kwargs.get("download_config"),
                                   "manual_dir", None)
    return super().download_and_prepare(**kwargs)

  @property
  def subdir(self) -> str:
    """Corpus folder under a shared-data root (the config may override)."""
    return getattr(self.builder_config, "subdir", None) or self.SUBDIR

  @classmethod
  def source_files(cls) -> dict[str, SourceFile]:
    """Expected source files by name (from FILES or checksums.tsv)."""
    if cls.FILES is not None:
      return dict(cls.FILES)
    return {info.filename: SourceFile(info.filename, int(info.size),
                                      info.checksum, url)
            for url, info in (cls.url_infos or {}).items()}

  # --- locating

  def _candidates(self, dl_manager):
    """(directory, must_hold_the_files, description) to search, in order."""
    if self._manual_dir_arg is not None:
      yield pathlib.Path(os.fspath(self._manual_dir_arg)), True, "manual_dir"
    else:
      yield (pathlib.Path(os.fspath(dl_manager.download_dir)) / "manual",
             False, "default manual_dir")
    env = os.environ.get(DATA_ENV)
    if env:
      path = pathlib.Path(env).expanduser()
      if not path.is_dir():
        raise FileNotFoundError(f"{self.name}: ${DATA_ENV}={env} is not a "
                                f"directory")
      yield path, False, f"${DATA_ENV}"
    shared = shared_data_dir()
    if shared is not None:
      yield shared, False, "shared data dir"

  def source_dir(self, dl_manager,
                 missing_in: Callable[[pathlib.Path], str | None]
                 ) -> pathlib.Path | None:
    """First directory holding the sources, or None (then download).

    Args:
      dl_manager: the TFDS download manager.
      missing_in: `missing_in(d)` is None when `d` holds every source file,
        else a description of what `d` lacks.
    Raises:
      FileNotFoundError: a given manual_dir lacks the files.
    """
    searched = []
    for root, required, what in self._candidates(dl_manager):
      dirs = [root / self.subdir, root] if self.subdir else [root]
      for d in dirs:
        if d.is_dir() and missing_in(d) is None:
          self.info.metadata["source"] = str(d)
          return d
      if required:
        lack = "; ".join(
            f"{d}: {missing_in(d) if d.is_dir() else 'no such directory'}"
            for d in dirs)
        raise FileNotFoundError(
            f"{self.name}: the {what} given does not hold the source files "
            f"({lack}). {self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
      searched.append(f"{what} {root}")
    self._searched = searched
    return None

  def source_paths(self, dl_manager,
                   names: Sequence[str]) -> dict[str, pathlib.Path]:
    """Local or downloaded paths of the named source files."""
    def missing_in(d):
      lacking = [n for n in names if find(d, n) is None]
      return f"missing {', '.join(lacking)}" if lacking else None
    d = self.source_dir(dl_manager, missing_in)
    if d is not None:
      return {n: find(d, n) for n in names}
    return self.download(dl_manager, names)

  def download(self, dl_manager,
               names: Sequence[str]) -> dict[str, pathlib.Path]:
    """Fetches the named files from their URLs (needs the internet)."""
    files = self.source_files()
    searched = "; ".join(getattr(self, "_searched", [])) or "nowhere"
    unknown = [n for n in names if n not in files]
    if unknown:
      raise FileNotFoundError(
          f"{self.name}: source files {unknown} not found (searched "
          f"{searched}) and they have no download URL. "
          f"{self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
    try:
      paths = dl_manager.download({n: files[n].url for n in names})
    except Exception as e:  # no internet, HTTP error, checksum
      raise FileNotFoundError(
          f"{self.name}: source files not found locally (searched "
          f"{searched}) and the download failed: {e}. "
          f"{self.MANUAL_DOWNLOAD_INSTRUCTIONS}") from e
    self.info.metadata["source"] = "downloaded"
    return {n: pathlib.Path(os.fspath(p)) for n, p in paths.items()}

  # --- reading

  def read_lines(self, path: pathlib.Path, name: str | None = None,
                 split: str | None = None) -> list[str]:
    """Lines of a source file, its checksum verified against the table.

    Args:
      path: the local file (gzipped if it ends in .gz).
      name: its name in the checksum table (default: `path`'s, minus .gz);
        a name absent from the table is read unverified (as noted in the
        metadata).
      split: the split it feeds, to count what is skipped under it.
    Whitespace after the last newline (Mikolov's char files end in "\n ")
    is not a line: it is skipped and counted.
    """
    name = name or path.name.removesuffix(".gz")
    data = read_bytes(path)
    expected = self.source_files().get(name)
    meta = self.info.metadata
    if self.verify_checksums and expected is not None:
      verify(path, data, expected)
      meta.setdefault("verified", []).append(name)
    else:
      meta.setdefault("unverified", []).append(name)
    lines = decode_lines(path, data)
    if not data.endswith(b"\n") and not lines[-1].strip():
      lines.pop()
      self.skip(split or name, "whitespace after the last newline")
    return lines

  def skip(self, split: str, reason: str, count: int = 1) -> None:
    """Counts `count` skipped items of `split` in the metadata."""
    if count:
      skipped = self.info.metadata.setdefault("skipped", {})
      per_split = skipped.setdefault(split, {})
      per_split[reason] = per_split.get(reason, 0) + int(count)

  def _download_and_prepare(self, dl_manager, download_config=None):
    result = super()._download_and_prepare(dl_manager, download_config)
    for split, reasons in self.info.metadata.get("skipped", {}).items():
      for reason, count in reasons.items():
        log.warning("%s/%s: skipped %d (%s)", self.name, split, count,
                    reason)
    return result


LINE_FEATURES = {
    "text": tfds.features.Text(),
    "line": np.int32,  # 0-based line number in the source file
}


class LinesBuilder(SourceBuilder, skip_registration=True):
  """One example per line of one file per split, lines kept verbatim.

  Subclasses set `SPLIT_FILES` = {split: file name}, `SUBDIR`, `VERSION`.
  """

  SPLIT_FILES: ClassVar[Mapping[str, str]] = {}
  HOMEPAGE: ClassVar[str] = ""

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(LINE_FEATURES),
        homepage=self.HOMEPAGE,
        metadata=tfds.core.MetadataDict(),
        disable_shuffling=True)  # language-model order matters

  def _split_generators(self, dl_manager):
    paths = self.source_paths(dl_manager, list(self.SPLIT_FILES.values()))
    return {split: self._generate_examples(
        self.read_lines(paths[name], name, split))
            for split, name in self.SPLIT_FILES.items()}

  def _generate_examples(self, lines):
    for i, line in enumerate(lines):
      yield i, {"text": line, "line": i}


# ------------------------------------------------- generated (synthetic)

# The generators' split names -> TFDS split names.
GENERATED_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


@dataclasses.dataclass
class GeneratedConfig(tfds.core.BuilderConfig):
  """A config of a generated dataset: the generator's seed and a scale in
  (0, 1] of its split sizes (1 in every published config; smaller for tests
  and smoke runs, as a config of another name)."""
  seed: int = 0
  scale: float = 1.0


class GeneratedBuilder(SourceBuilder, skip_registration=True):
  """Base of the synthetic datasets: examples drawn by a seeded generator,
  no source files. Subclasses implement `features()` and
  `generate(config) -> {generator split: list of examples}` and
  `encode(example) -> feature dict`."""

  def features(self) -> dict:
    raise NotImplementedError

  def generate(self, config) -> dict:
    raise NotImplementedError

  def encode(self, example) -> dict:
    raise NotImplementedError

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(self.features()),
        homepage=getattr(self, "HOMEPAGE", ""),
        metadata=tfds.core.MetadataDict(),
        disable_shuffling=True)  # examples in the generator's order

  def _split_generators(self, dl_manager):
    config = self.builder_config
    scale = config.scale
    if not 0 < scale <= 1:
      raise ValueError(f"{self.name}/{config.name}: scale must be in (0, 1], "
                       f"got {scale}")
    splits = self.generate(config)
    self.info.metadata["source"] = f"generated (seed {config.seed})"
    self.info.metadata["seed"] = int(config.seed)
    self.info.metadata["scale"] = float(scale)
    unknown = sorted(set(splits) - set(GENERATED_SPLITS))
    if unknown:
      raise ValueError(f"{self.name}: generator split(s) {unknown} have no "
                       f"TFDS name; known: {sorted(GENERATED_SPLITS)}")
    return {GENERATED_SPLITS[s]: self._generate_examples(examples)
            for s, examples in splits.items()}

  def _generate_examples(self, examples):
    for i, example in enumerate(examples):
      yield i, self.encode(example)
