"""Tokenizers: words, characters and character bigrams, one line at a time.

A `Tokenizer` turns one line of text into a list of string symbols, ending
with an end-of-line symbol (`eos`, "<eos>" by default; None for none):

    >>> Tokenizer("word")("the cat ")
    ['the', 'cat', '<eos>']
    >>> Tokenizer("char", space="_", eos="\\n")("a cat")
    ['a', '_', 'c', 'a', 't', '\\n']
    >>> Tokenizer("char_bigram", eos=None)("the state")
    ['th', 'e', ' ', 'st', 'at', 'e']

Whitespace is normalised for every kind: a line is split into words on any
run of whitespace, so leading/trailing blanks vanish and the char kinds see
exactly one `space` symbol between two words. This is Mikolov's rule for the
PTB character files (words joined by "_"), so
`Tokenizer("char", space="_")` applied to `ptb.valid.txt` yields the symbols
of `ptb.char.valid.txt` line for line.

Character bigrams follow Maupome & Meurs 4.2: non-overlapping pairs that
stay within a word, a leftover odd character kept single ('state' -> 'st',
'at', 'e'). The space between two words is its own single token: the paper
counts the space in its 27-character alphabet and pairs never cross a word
boundary, so the space can only stand alone.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import re
from typing import Iterator

from etils import epath

from sorjax.data.checks import check_bool

KINDS = ("word", "char", "char_bigram")
_NON_LETTERS = re.compile(r"[^a-z]+")


def letters_only(line: str) -> str:
  """Maupome & Meurs 4 preprocessing: lower-case, non-letters -> one space.

  "Replaced all non-alphabetic characters by white spaces, then replaced all
  consecutive white spaces by a single one, [then] all uppercase letters by
  their lower case counterparts": a 27-symbol alphabet (a-z and space).
  Leading and trailing spaces are removed (the tokenizers drop them anyway).
  """
  return _NON_LETTERS.sub(" ", line.lower()).strip()


def _pairs(word: str) -> list[str]:
  # Maupome & Meurs 4.2: 'state' -> 'st', 'at', 'e' (leftover kept single)
  return [word[i:i + 2] for i in range(0, len(word), 2)]


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  """Splits a line into symbols.

  Attributes:
    kind: "word" (whitespace-separated words), "char" (characters) or
      "char_bigram" (Maupome & Meurs 4.2 character pairs within words).
    eos: symbol appended at the end of every line (the end-of-line symbol
      of the char kinds too: "\\n", "<eos>", ...); None appends nothing.
    space: for the char kinds, the symbol emitted between two words
      (" " by default; "_" reproduces the PTB character files).
    letters_only: apply Maupome & Meurs 4's preprocessing (`letters_only`)
      to each line first.
  """
  kind: str = "word"
  eos: str | None = "<eos>"
  space: str = " "
  letters_only: bool = False

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"Tokenizer: kind must be one of {KINDS}, "
                       f"got {self.kind!r}")
    if self.eos is not None and (not isinstance(self.eos, str)
                                 or not self.eos):
      raise ValueError(f"Tokenizer: eos must be a non-empty string or None, "
                       f"got {self.eos!r}")
    if not isinstance(self.space, str) or not self.space:
      raise ValueError(f"Tokenizer: space must be a non-empty string, "
                       f"got {self.space!r}")
    check_bool("Tokenizer", "letters_only", self.letters_only)

  def __call__(self, line: str) -> list[str]:
    if not isinstance(line, str):
      raise TypeError(f"Tokenizer: line must be a str, got "
                      f"{type(line).__name__} {line!r:.40}")
    if self.letters_only:
      line = letters_only(line)
    words = line.split()
    if self.kind == "word":
      symbols = words
    else:
      split = list if self.kind == "char" else _pairs
      symbols = []
      for n, word in enumerate(words):
        if n:
          symbols.append(self.space)
        symbols.extend(split(word))
    if self.eos is not None:
      symbols.append(self.eos)
    return symbols

  def lines(self, lines) -> Iterator[list[str]]:
    """Tokenizes an iterable of lines (not a str), one symbol list per
    line."""
    if isinstance(lines, str):             # would read as its characters
      raise TypeError(f"Tokenizer.lines: lines must be an iterable of "
                      f"lines, got the str {lines[:40]!r} (wrap it in a "
                      "list or split it with str.splitlines)")
    return map(self, lines)

  def file(self, path) -> Iterator[list[str]]:
    """Tokenizes a UTF-8 text file (or .gz), one symbol list per line."""
    yield from self.lines(read_lines(path))


def read_lines(path) -> Iterator[str]:
  """Lines of a UTF-8 text file (gzip-decompressed if it ends in .gz),
  without their line break. Works on any `etils.epath` path (local, GCS)."""
  path = epath.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"read_lines: no such file {path}")
  with path.open("rb") as raw:
    binary = gzip.open(raw, "rb") if path.suffix == ".gz" else raw
    with io.TextIOWrapper(binary, encoding="utf-8", newline="\n") as text:
      for line in text:
        yield line.rstrip("\r\n")
