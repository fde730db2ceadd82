"""Language-modelling corpora as streams of token ids: `load_corpus`.

    ids, vocab = load_corpus("ptb", "train")   # 929,589 int32 ids
    len(vocab)                                 # 10,000 (with <eos>)

Each corpus is built once by its TFDS builder (sorjax.data.builders; from
the local copy, see there for where it is looked for) into `data_dir`
(default: TFDS's, ~/tensorflow_datasets or $TFDS_DATA_DIR). Its lines are
then tokenized, one `<eos>` after each line (the usual convention, e.g.
PyTorch's word_language_model), and encoded with a vocabulary built from
the train split (sorjax.data.vocab.Vocab: `<eos>` first, then by decreasing
count). The ids and the vocabulary are cached next to the prepared dataset,
so later calls only read two small files.

| corpus | symbols of a line | vocabulary (train) |
|---|---|---|
| ptb | words | 10,000 (incl. `<unk>`, `<eos>`) |
| wikitext2 | words | 33,278 |
| ptb_char | Mikolov's space-separated characters (`_` between words) | 50 |
| ptb_char_maupome | characters (a-z, space) | 28 |
| tinyshakespeare | characters (the newline is `<eos>`) | 65 |

Word corpora map a symbol unseen in train to `<unk>` (counted and logged);
character corpora have no `<unk>`, so an unseen character raises a KeyError
naming it, the split and the line.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
from typing import Callable

import numpy as np

from sorjax.data import builders
from sorjax.data import vocab as vocab_lib
from sorjax.data.tokenize import Tokenizer

EOS = "<eos>"
SPLITS = builders.SPLITS
SPLIT_ALIASES = {"valid": "validation", "dev": "validation"}
_CACHE = "sorjax_lm_v1"  # bump when tokenization or the vocabulary changes

log = logging.getLogger(__name__)


def _words(line: str) -> list[str]:
  return line.split()


def _chars(line: str) -> list[str]:
  return list(line)


def _char_bigrams(line: str) -> list[str]:
  # Maupome & Meurs 4.2: pairs within a word, the space its own symbol.
  return Tokenizer("char_bigram", eos=None)(line)


@dataclasses.dataclass(frozen=True)
class Corpus:
  """How a language-modelling corpus turns a line into symbols."""
  symbols: Callable[[str], list[str]]
  unk: str | None  # None: closed vocabulary, an unseen symbol is an error
  builder: str | None = None  # the dataset it reads; None: its own name


LM_CORPORA = {
    "ptb": Corpus(_words, unk="<unk>"),
    "wikitext2": Corpus(_words, unk="<unk>"),
    "ptb_char": Corpus(_words, unk=None),  # "a e r _ b a n k": symbols
    "ptb_char_maupome": Corpus(_chars, unk=None),
    # The same text in character bigrams (Maupome & Meurs 4.2).
    "ptb_char_maupome_bigram": Corpus(_char_bigrams, unk="<unk>",
                                      builder="ptb_char_maupome"),
    "tinyshakespeare": Corpus(_chars, unk=None),
    "markov_ptb": Corpus(_words, unk="<unk>"),  # Mahto 3.1.1 control corpus
}


def corpus(name: str) -> Corpus:
  """The LM corpus named `name` ('name' or 'name/config')."""
  base = name.partition("/")[0]
  if base not in LM_CORPORA:
    kind = (" is not a language-modelling corpus"
            if base in builders.NAMES else " is unknown")
    raise ValueError(f"corpus {name!r}{kind}; language-modelling corpora: "
                     f"{', '.join(LM_CORPORA)}")
  spec = LM_CORPORA[base]
  builders.split_name(_source(name, spec))  # config syntax
  return spec


def canonical_split(split: str) -> str:
  """'train' | 'validation' (alias 'valid', 'dev') | 'test'."""
  s = SPLIT_ALIASES.get(split, split)
  if s not in SPLITS:
    raise ValueError(f"unknown split {split!r}; use one of {SPLITS} "
                     f"(or {', '.join(SPLIT_ALIASES)})")
  return s


def load_corpus(name: str, split: str, data_dir=None, *, manual_dir=None
                ) -> tuple[np.ndarray, vocab_lib.Vocab]:
  """Token ids of one split of a language-modelling corpus, and its vocab.

  Args:
    name: a key of `LM_CORPORA`: "ptb", "ptb_char", "ptb_char_maupome"
      (or "ptb_char_maupome/wsj_raw"), "ptb_char_maupome_bigram" (the
      same text in character bigrams), "wikitext2", "tinyshakespeare" or
      "markov_ptb" (Mahto et al.'s control corpus).
    split: "train", "validation" ("valid", "dev") or "test".
    data_dir: where the prepared dataset and the id cache live (default:
      TFDS's data dir).
    manual_dir: where to read the source files from when the dataset is
      not prepared yet (see sorjax.data.builders for the default search).
  Returns:
    (ids, vocab): 1-D int32 ids with `vocab.eos_id` after every line, and
    the vocabulary of the train split.
  Raises:
    ValueError: unknown corpus or split. FileNotFoundError: no source files.
    KeyError: a character corpus' split has a symbol unseen in train.
  """
  spec = corpus(name)
  split = canonical_split(split)
  base = name.partition("/")[0]
  b = builders.prepare(_source(name, spec), data_dir, manual_dir)
  cache = pathlib.Path(b.data_dir) / (
      _CACHE if spec.builder is None else f"{_CACHE}_{base}")
  vocab = _vocab(name, cache, b)
  path = cache / f"{split}.npy"
  if path.is_file():
    ids = np.load(path)
  else:
    lines = _read_lines(b, split)
    encoded = vocab_lib.encode_lines(
        vocab, ([*spec.symbols(l), EOS] for l in lines),
        source=f"{name}/{split}")
    ids = encoded.stream()
    _save(path, ids)
  skipped = b.info.metadata.get("skipped", {}).get(split)
  if skipped:
    log.info("%s/%s: the builder skipped %s (info.metadata['skipped'])",
             name, split, skipped)
  return ids, vocab


def corpus_metadata(name: str, data_dir=None, *, manual_dir=None) -> dict:
  """The builder's metadata: source, verified files, skipped counts, ..."""
  source = _source(name, corpus(name))
  return dict(builders.prepare(source, data_dir, manual_dir).info.metadata)


def _source(name: str, spec: Corpus) -> str:
  """The dataset (and config) a corpus name reads."""
  if spec.builder is None:
    return name
  config = name.partition("/")[2]
  return spec.builder + (f"/{config}" if config else "")


def _read_lines(b, split: str) -> list[str]:
  """Every line of a prepared split, in order."""
  source = b.as_data_source(split=split)
  records = source.__getitems__(range(len(source)))  # one batched read
  return [r["text"].decode("utf-8") for r in records]


def _vocab(name: str, cache: pathlib.Path, b) -> vocab_lib.Vocab:
  """The train vocabulary, read from or written to the cache folder."""
  path = cache / vocab_lib.FILENAME
  if path.is_file():
    return vocab_lib.Vocab.load(path)
  spec = LM_CORPORA[name.partition("/")[0]]
  lines = _read_lines(b, "train")
  symbols = [[*spec.symbols(l), EOS] for l in lines]
  vocab = vocab_lib.Vocab.build(symbols, eos=EOS, unk=spec.unk,
                                source=f"{name}/train")
  vocab.save(path)
  ids = vocab_lib.encode_lines(vocab, symbols, f"{name}/train").stream()
  _save(path.parent / "train.npy", ids)
  return vocab


def _save(path, ids: np.ndarray) -> None:
  """Atomic np.save (a killed run never leaves a truncated file)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.parent / f"{path.name}.{os.getpid()}.tmp"
  with open(tmp, "wb") as f:
    np.save(f, ids)
  os.replace(tmp, path)
