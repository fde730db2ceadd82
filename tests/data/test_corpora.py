"""load_corpus: token ids with <eos> per line and the train vocabulary.

Fixture corpora are prepared (checksums off) in a temporary data_dir, then
loaded; the ids are decoded and compared with the fixture files tokenized
naively. With the shared data folder, the real counts of SOURCES.md are
checked (PTB 929,589 train tokens and 10,000 symbols, WikiText-2 2,088,628
and 33,278, ...).
"""

import os
import pathlib
import re
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds

from sorjax.data import builders
from sorjax.data import corpora
from sorjax.data.corpora import load_corpus

# one worker builds the module's fixtures (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("data.test_corpora")

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
tfds.disable_progress_bar()


@pytest.fixture(autouse=True)
def _no_shared_data(monkeypatch):
  monkeypatch.delenv(builders.DATA_ENV, raising=False)
  monkeypatch.setattr(builders, "shared_data_dir", lambda: None)


def prepared(name, tmp_path):
  """Builds the fixture corpus (its checksums differ from the real ones)."""
  data_dir = tmp_path / "tfds"
  builders.prepare(name, data_dir, FIXTURES, verify_checksums=False)
  return data_dir


def naive_lines(path, start=0, stop=None):
  with open(path, encoding="utf-8", newline="") as f:
    return f.read().split("\n")[:-1][start:stop]


def with_eos(lines, symbols):
  return [s for line in lines for s in [*symbols(line), "<eos>"]]


def test_ptb_ids_decode_to_the_words_of_each_line(tmp_path):
  data_dir = prepared("ptb", tmp_path)
  ids, vocab = load_corpus("ptb", "train", data_dir)
  lines = naive_lines(FIXTURES / "ptb" / "ptb.train.txt")
  expected = with_eos(lines, str.split)
  assert ids.dtype == np.int32 and ids.ndim == 1
  assert vocab.decode(ids) == expected
  assert len(vocab) == len(set(expected))  # <unk> occurs in the text
  assert int((ids == vocab.eos_id).sum()) == len(lines) == 4
  test, test_vocab = load_corpus("ptb", "test", data_dir)
  assert test_vocab == vocab
  assert vocab.decode(test) == with_eos(
      naive_lines(FIXTURES / "ptb" / "ptb.test.txt"), str.split)
  assert "tensorflow" not in sys.modules


def test_unseen_word_becomes_unk_and_aliases_name_validation(tmp_path):
  data_dir = prepared("ptb", tmp_path)
  ids, vocab = load_corpus("ptb", "validation", data_dir)
  # " a zebra sat ": "zebra" is not in train
  assert vocab.decode(ids) == ["the", "cat", "<eos>",
                               "a", "<unk>", "sat", "<eos>"]
  for alias in ("valid", "dev"):
    np.testing.assert_array_equal(load_corpus("ptb", alias, data_dir)[0],
                                  ids)


def test_wikitext2_blank_lines_get_their_eos(tmp_path):
  data_dir = prepared("wikitext2", tmp_path)
  ids, vocab = load_corpus("wikitext2", "train", data_dir)
  lines = naive_lines(FIXTURES / "wikitext-2" / "wiki.train.tokens")
  assert vocab.decode(ids) == with_eos(lines, str.split)
  assert vocab.decode(ids[:2]) == ["<eos>", "="]  # the first line is " "
  test, _ = load_corpus("wikitext2", "test", data_dir)
  assert vocab.decode(test) == ["<eos>", "The", "<unk>", "sat", ".",
                                "<eos>"]


def test_ptb_char_symbols_and_closed_vocabulary(tmp_path):
  data_dir = prepared("ptb_char", tmp_path)
  ids, vocab = load_corpus("ptb_char", "train", data_dir)
  lines = naive_lines(FIXTURES / "ptb" / "ptb.char.train.txt")
  expected = with_eos(lines, str.split)
  assert vocab.decode(ids) == expected
  assert "<" in vocab and "<unk>" not in vocab  # <unk> is spelled out
  assert len(vocab) == len(set(expected))
  # validation has "zebra": 'z' never occurs in train, and there is no unk
  with pytest.raises(KeyError, match=r"'z' at ptb_char/validation:2"):
    load_corpus("ptb_char", "validation", data_dir)


def test_maupome_characters(tmp_path):
  data_dir = prepared("ptb_char_maupome", tmp_path)
  ids, vocab = load_corpus("ptb_char_maupome", "train", data_dir)
  docs = ["the cat sat on the mat", "a unk of dogs", "the dog s bone"]
  assert vocab.decode(ids) == with_eos(docs, list)
  assert set(vocab.symbols) == set("the cat sat on the mat a unk of dogs "
                                   "bone") | {"<eos>"}
  test, _ = load_corpus("ptb_char_maupome", "test", data_dir)
  assert "".join(vocab.decode(test)) == "the mat s<eos>"


def test_tinyshakespeare_characters_newline_is_eos(tmp_path):
  data_dir = prepared("tinyshakespeare", tmp_path)
  path = FIXTURES / "tinyshakespeare" / "input.txt"
  ids, vocab = load_corpus("tinyshakespeare", "train", data_dir)
  train = naive_lines(path, 0, 18)
  assert vocab.decode(ids) == with_eos(train, list)
  assert len(vocab) == len(set("".join(train))) + 1  # + <eos>
  test, _ = load_corpus("tinyshakespeare", "test", data_dir)
  assert "".join(vocab.decode(test)) == "Speak.<eos>"


def test_ids_and_vocabulary_are_cached_in_the_data_dir(tmp_path, monkeypatch):
  data_dir = prepared("ptb", tmp_path)
  first = {s: load_corpus("ptb", s, data_dir) for s in corpora.SPLITS}
  cache = data_dir / "ptb" / "1.0.0" / "sorjax_lm_v1"
  assert sorted(p.name for p in cache.iterdir()) == [
      "test.npy", "train.npy", "validation.npy", "vocab.json"]

  def no_reading(*args):
    raise AssertionError("read the dataset again instead of the cache")
  monkeypatch.setattr(corpora, "_read_lines", no_reading)
  for split, (ids, vocab) in first.items():
    again, again_vocab = load_corpus("ptb", split, data_dir)
    np.testing.assert_array_equal(again, ids)
    assert again.dtype == np.int32 and again_vocab == vocab


def test_metadata_reports_what_was_skipped(tmp_path):
  data_dir = prepared("ptb_char_maupome", tmp_path)
  meta = corpora.corpus_metadata("ptb_char_maupome", data_dir)
  assert meta["skipped"] == {"train": {"lines empty after preprocessing": 1}}
  assert meta["unverified"] == ["ptb.train.txt", "ptb.valid.txt",
                                "ptb.test.txt"]
  # the bigram corpus reads the same dataset
  assert corpora.corpus_metadata("ptb_char_maupome_bigram", data_dir) == meta


@pytest.mark.parametrize("name, split, error, message", [
    ("ptb2", "train", ValueError, "corpus 'ptb2' is unknown"),
    ("sst", "train", ValueError,
     "corpus 'sst' is not a language-modelling corpus"),
    ("ptb", "training", ValueError, "unknown split 'training'"),
])
def test_bad_names_are_named(name, split, error, message, tmp_path):
  with pytest.raises(error, match=re.escape(message)):
    load_corpus(name, split, tmp_path)


def test_missing_source_directory_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
    load_corpus("ptb", "train", tmp_path / "tfds",
                manual_dir=tmp_path / "nowhere")


# ------------------------------------------------------- real corpora

@pytest.fixture(scope="module")
def real_dir(shared_data, tmp_path_factory):
  return tmp_path_factory.mktemp("real_corpora")


def real(name, split, shared_data, real_dir):
  return load_corpus(name, split, real_dir, manual_dir=shared_data)


def test_real_ptb(shared_data, real_dir):
  ids, vocab = real("ptb", "train", shared_data, real_dir)
  assert ids.shape == (929589,) and len(vocab) == 10000
  assert int((ids == vocab.eos_id).sum()) == 42068
  assert real("ptb", "validation", shared_data, real_dir)[0].shape == (73760,)
  assert real("ptb", "test", shared_data, real_dir)[0].shape == (82430,)
  meta = corpora.corpus_metadata("ptb", real_dir)
  assert meta["verified"] == ["ptb.train.txt", "ptb.valid.txt",
                              "ptb.test.txt"]
  assert "tensorflow" not in sys.modules


def test_real_wikitext2(shared_data, real_dir):
  ids, vocab = real("wikitext2", "train", shared_data, real_dir)
  assert ids.shape == (2088628,) and len(vocab) == 33278
  assert real("wikitext2", "valid", shared_data, real_dir)[0].shape == (
      217646,)
  assert real("wikitext2", "test", shared_data, real_dir)[0].shape == (
      245569,)


def test_real_ptb_char(shared_data, real_dir):
  ids, vocab = real("ptb_char", "train", shared_data, real_dir)
  assert ids.shape == (5017482,) and len(vocab) == 49 + 1  # + <eos>
  assert real("ptb_char", "test", shared_data, real_dir)[0].shape == (442423,)


def test_real_ptb_char_maupome(shared_data, real_dir):
  ids, vocab = real("ptb_char_maupome", "train", shared_data, real_dir)
  # Naive reference: drop N, non-letters -> space, collapse, lower, strip.
  docs = []
  for line in naive_lines(os.path.join(shared_data, "ptb", "ptb.train.txt")):
    text = "".join(c if "a" <= c <= "z" else " "
                   for c in " ".join(w for w in line.split() if w != "N")
                   .lower())
    text = " ".join(text.split())
    if text:
      docs.append(text)
  assert ids.shape == (sum(len(d) + 1 for d in docs),)
  assert sorted(vocab.symbols) == sorted(
      ["<eos>", " "] + [chr(c) for c in range(ord("a"), ord("z") + 1)])
  assert vocab.decode(ids[:len(docs[0]) + 1]) == [*docs[0], "<eos>"]


def test_real_tinyshakespeare(shared_data, real_dir):
  ids, vocab = real("tinyshakespeare", "train", shared_data, real_dir)
  lines = naive_lines(os.path.join(shared_data, "tinyshakespeare",
                                   "input.txt"))
  assert len(lines) == 40000
  assert ids.shape == (sum(len(l) + 1 for l in lines[:36000]),)
  assert len(vocab) == 65  # 64 characters besides the newline, + <eos>
  test, _ = real("tinyshakespeare", "test", shared_data, real_dir)
  assert test.shape == (sum(len(l) + 1 for l in lines[38000:]),)
