"""Vocabularies: symbol <-> id, special symbols, JSON round trip.

Special symbols present by default: `<eos>` and `<unk>`; `<pad>` only when
asked for (`pad="<pad>"`), because padded batches carry `lengths` and the
padding id only has to be a valid id. Specials take the first ids, in the
order pad, eos, unk; the other symbols follow by decreasing count, ties in
order of first appearance.

PTB's convention holds with the defaults: its text already contains
`<unk>`, so the vocabulary built from `ptb.train.txt` tokenized with
`Tokenizer("word")` is its 9,999 train words (one of them `<unk>`) plus
`<eos>` = 10,000 symbols.

Unknown symbols are mapped to `<unk>` and counted (`Encoded.unknown`, also
logged), or, when the vocabulary has no unk symbol, raise a `KeyError`
naming the symbol and, when known, the file and line.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
from typing import Iterable, Sequence

from etils import epath
import numpy as np

from sorjax import checks
from sorjax.data.checks import check_int

FILENAME = "vocab.json"
_FORMAT = "sorjax.vocab/1"


class Vocab:
  """An immutable symbol <-> id table with optional pad / eos / unk symbols.

  Attributes:
    symbols: tuple of symbols; a symbol's id is its position.
    counts: tuple of corpus counts aligned with `symbols` (0 for specials
      absent from the corpus), or None when unknown.
    pad, eos, unk: the special symbols (None when absent); `pad_id`,
      `eos_id`, `unk_id` their ids.
  """

  def __init__(self, symbols: Sequence[str], *, eos: str | None = "<eos>",
               unk: str | None = "<unk>", pad: str | None = None,
               counts: Sequence[int] | None = None):
    symbols = tuple(symbols)
    for s in symbols:
      if not isinstance(s, str) or not s:
        raise ValueError(f"Vocab: symbols must be non-empty strings, "
                         f"got {s!r}")
    index = {}
    for i, s in enumerate(symbols):
      if s in index:
        raise ValueError(f"Vocab: symbol {s!r} appears twice "
                         f"(ids {index[s]} and {i})")
      index[s] = i
    for name, special in (("pad", pad), ("eos", eos), ("unk", unk)):
      if special is not None and special not in index:
        raise ValueError(f"Vocab: {name} symbol {special!r} is not among "
                         f"the symbols")
    if counts is not None:
      if isinstance(counts, (str, bytes)) or not isinstance(counts,
                                                            Iterable):
        raise ValueError(f"Vocab: counts must be a sequence of "
                         f"{len(symbols)} ints, got {counts!r:.40}")
      counts = tuple(checks.check_int(f"Vocab: counts[{i}]", c, 0)
                     for i, c in enumerate(counts))
      if len(counts) != len(symbols):
        raise ValueError(f"Vocab: counts must be {len(symbols)} "
                         f"non-negative ints, got {len(counts)}")
    self.symbols, self.counts = symbols, counts
    self.pad, self.eos, self.unk = pad, eos, unk
    self._index = index

  # ------------------------------------------------------------- building

  @classmethod
  def build(cls, lines: Iterable[Iterable[str]], *, min_count: int = 1,
            max_size: int | None = None, eos: str | None = "<eos>",
            unk: str | None = "<unk>", pad: str | None = None,
            source: str = "corpus") -> "Vocab":
    """Counts the symbols of `lines` (lists of symbols, e.g. a Tokenizer's).

    Args:
      lines: iterable of symbol sequences.
      min_count: symbols seen fewer times are left out (they become unk).
      max_size: at most this many symbols in total, specials included; the
        least frequent are left out.
      eos, unk, pad: special symbols to include (None: leave out). A
        special that also occurs in the corpus is kept once, as a special.
      source: names the corpus in error messages.
    Raises:
      ValueError: empty corpus, bad min_count/max_size, or symbols left out
        while there is no unk symbol to stand for them.
    """
    check_int("Vocab.build", "min_count", min_count, 1)
    specials = tuple(s for s in dict.fromkeys((pad, eos, unk)) if s)
    checks.check_int(f"Vocab.build: max_size, with the {len(specials)} "
                     f"special symbols {specials},", max_size,
                     max(1, len(specials)), optional=True)
    counter = collections.Counter()
    for n, line in enumerate(_not_str("Vocab.build", "lines", lines,
                                      "an iterable of symbol lists"), 1):
      counter.update(_not_str("Vocab.build", f"line {n} of {source}", line))
    if not counter:
      raise ValueError(f"Vocab.build: {source} is empty (no symbols)")
    # Counter keeps first-appearance order; a stable sort keeps it for ties.
    ranked = sorted((s for s in counter if s not in specials),
                    key=lambda s: -counter[s])
    kept = [s for s in ranked if counter[s] >= min_count]
    if max_size is not None:
      kept = kept[:max_size - len(specials)]
    left_out = len(ranked) - len(kept)
    if left_out and unk is None:
      raise ValueError(
          f"Vocab.build: min_count={min_count}, max_size={max_size} leave "
          f"out {left_out} symbols of {source} (e.g. {ranked[len(kept)]!r}) "
          f"but unk=None: nothing could stand for them")
    symbols = specials + tuple(kept)
    return cls(symbols, eos=eos, unk=unk, pad=pad,
               counts=[counter[s] for s in symbols])

  # ------------------------------------------------------------ accessors

  def __len__(self) -> int:
    return len(self.symbols)

  def __contains__(self, symbol: str) -> bool:
    return symbol in self._index

  def __eq__(self, other) -> bool:
    return isinstance(other, Vocab) and self._fields() == other._fields()

  def __hash__(self) -> int:
    return hash(self._fields())

  def __repr__(self) -> str:
    return (f"Vocab({len(self)} symbols, pad={self.pad!r}, eos={self.eos!r}, "
            f"unk={self.unk!r})")

  def _fields(self):
    return (self.symbols, self.counts, self.pad, self.eos, self.unk)

  @property
  def pad_id(self) -> int | None:
    return None if self.pad is None else self._index[self.pad]

  @property
  def eos_id(self) -> int | None:
    return None if self.eos is None else self._index[self.eos]

  @property
  def unk_id(self) -> int | None:
    return None if self.unk is None else self._index[self.unk]

  def id(self, symbol: str, where: str | None = None) -> int:
    """The id of `symbol`; unk's id if unknown; KeyError without unk."""
    i = self._index.get(symbol)
    if i is not None:
      return i
    if self.unk is None:
      at = f" at {where}" if where else ""
      raise KeyError(f"unknown symbol {symbol!r}{at}: not in the "
                     f"{len(self)}-symbol vocabulary, which has no unk "
                     f"symbol")
    return self._index[self.unk]

  def encode(self, symbols: Iterable[str], where: str | None = None,
             unknown: collections.Counter | None = None) -> np.ndarray:
    """Ids (int32) of `symbols`.

    Args:
      symbols: the symbols.
      where: location for error messages, e.g. "ptb.valid.txt:12".
      unknown: if given, each symbol mapped to unk is counted in it.
    Raises:
      KeyError: a symbol is unknown and the vocabulary has no unk symbol.
    """
    index = self._index
    ids = []
    for s in _not_str("Vocab.encode", "symbols", symbols):
      i = index.get(s)
      if i is None:
        i = self.id(s, where)  # raises without unk
        if unknown is not None:
          unknown[s] += 1
      ids.append(i)
    return np.asarray(ids, np.int32) if ids else np.zeros((0,), np.int32)

  def decode(self, ids: Iterable[int]) -> list[str]:
    """Symbols of `ids`; IndexError naming the id when out of range."""
    out = []
    ids = np.asarray(ids)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
      raise TypeError(f"Vocab.decode: ids must be integers, got {ids.dtype}")
    for i in ids.reshape(-1).tolist():
      if not 0 <= i < len(self.symbols):
        raise IndexError(f"Vocab.decode: id {i} outside [0, {len(self)})")
      out.append(self.symbols[i])
    return out

  # ------------------------------------------------------------------ I/O

  def save(self, path) -> epath.Path:
    """Writes JSON to `path`: a file, or `<path>/vocab.json` if `path` is a
    directory or a str ending in "/" (created if missing).

    The write is atomic (temporary file, then rename over any existing
    file), so a run killed mid-write never leaves a truncated vocabulary.
    Returns the file path.
    """
    path = _file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": _FORMAT, "pad": self.pad, "eos": self.eos,
               "unk": self.unk, "symbols": list(self.symbols),
               "counts": None if self.counts is None else list(self.counts)}
    tmp = path.parent / f"{path.name}.{os.getpid()}.tmp"  # per writer
    try:
      tmp.write_text(json.dumps(payload, ensure_ascii=False, indent=0))
      tmp.replace(path)  # over an existing file too (a resumed run)
    except OSError as e:  # a full disk: name the file, leave no tmp
      if tmp.exists():
        tmp.unlink()
      raise checks.write_error(
          f"Vocab.save: cannot write {path}: {e.strerror or e}", e) from None
    return path

  @classmethod
  def load(cls, path) -> "Vocab":
    """Reads what `save` wrote; errors name the file and the bad field."""
    path = _file(path)
    if not path.is_file():
      raise FileNotFoundError(f"Vocab.load: no vocabulary file {path}")
    try:
      payload = json.loads(path.read_text())
    except json.JSONDecodeError as e:
      raise ValueError(f"Vocab.load: {path} is not valid JSON: {e}") from e
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
      raise ValueError(f"Vocab.load: {path} is not a {_FORMAT} file "
                       f"(format field: {payload.get('format')!r})"
                       if isinstance(payload, dict) else
                       f"Vocab.load: {path} does not hold a JSON object")
    for key in ("symbols", "pad", "eos", "unk", "counts"):
      if key not in payload:
        raise ValueError(f"Vocab.load: {path} lacks the field {key!r}")
    if not isinstance(payload["symbols"], list):
      raise ValueError(f"Vocab.load: {path}: field 'symbols' must be a list")
    try:
      return cls(payload["symbols"], pad=payload["pad"], eos=payload["eos"],
                 unk=payload["unk"], counts=payload["counts"])
    except (ValueError, TypeError) as e:
      raise ValueError(f"Vocab.load: {path}: {e}") from e


def _not_str(owner: str, name: str, symbols,
             what: str = "a sequence of symbols"):
  """`symbols` unless it is a str, which would read as its characters."""
  if isinstance(symbols, str):
    raise TypeError(f"{owner}: {name} must be {what}, got the str "
                    f"{symbols[:40]!r} (split it first, e.g. with a "
                    "Tokenizer, or wrap a single symbol in a list)")
  return symbols


def _file(path) -> epath.Path:
  # "run/" names a directory even before it exists (Path drops the "/").
  is_dir = isinstance(path, str) and path.endswith("/")
  path = epath.Path(path)
  return path / FILENAME if is_dir or path.is_dir() else path


# -------------------------------------------------------- corpus encoding

@dataclasses.dataclass(frozen=True)
class Encoded:
  """A corpus encoded line by line.

  Attributes:
    sequences: one int32 id array per line.
    unknown: how many times each out-of-vocabulary symbol was mapped to unk.
  """
  sequences: list[np.ndarray]
  unknown: collections.Counter

  @property
  def num_unknown(self) -> int:
    return sum(self.unknown.values())

  @property
  def num_tokens(self) -> int:
    return sum(len(s) for s in self.sequences)

  def stream(self) -> np.ndarray:
    """All lines concatenated into one 1-D int32 array (for TBPTT)."""
    if not self.sequences:
      return np.zeros((0,), np.int32)
    return np.concatenate(self.sequences).astype(np.int32, copy=False)


def encode_lines(vocab: Vocab, lines: Iterable[Iterable[str]],
                 source: str = "<lines>") -> Encoded:
  """Encodes symbol lists (e.g. `Tokenizer.file(path)`) with `vocab`.

  Unknown symbols become unk and are counted (and logged once with the
  most frequent of them); without unk the first one raises a KeyError
  naming it as `source:line`.
  """
  unknown = collections.Counter()
  sequences = [vocab.encode(line, where=f"{source}:{n}", unknown=unknown)
               for n, line in enumerate(lines, start=1)]
  if unknown:
    logging.warning("%s: %d tokens (%d distinct symbols) not in the "
                    "vocabulary were mapped to %r; most frequent: %s",
                    source, sum(unknown.values()), len(unknown), vocab.unk,
                    unknown.most_common(5))
  return Encoded(sequences, unknown)
