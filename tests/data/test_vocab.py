"""Vocabularies: ordering, specials, options, unknown symbols, JSON files."""

import collections
import json
import os

import numpy as np
import pytest

from sorjax.data.tokenize import Tokenizer
from sorjax.data.vocab import FILENAME, Encoded, Vocab, encode_lines

LINES = [["b", "a", "c", "a", "<eos>"], ["c", "a", "d", "<eos>"]]
# counts: a 3, c 2, b 1, d 1, <eos> 2 (a special: its count is kept)


def test_build_orders_specials_then_counts_then_first_appearance():
  v = Vocab.build(LINES)
  assert v.symbols == ("<eos>", "<unk>", "a", "c", "b", "d")
  assert v.counts == (2, 0, 3, 2, 1, 1)
  assert (v.eos_id, v.unk_id, v.pad, v.pad_id) == (0, 1, None, None)
  with_pad = Vocab.build(LINES, pad="<pad>")
  assert with_pad.symbols[:3] == ("<pad>", "<eos>", "<unk>")
  assert with_pad.pad_id == 0
  bare = Vocab.build(LINES, eos=None, unk=None)
  assert bare.symbols == ("a", "c", "<eos>", "b", "d")  # <eos> ties with c


def test_min_count_and_max_size():
  assert Vocab.build(LINES, min_count=2).symbols == ("<eos>", "<unk>", "a",
                                                     "c")
  # max_size counts the specials: 4 = <eos>, <unk> + the two most frequent.
  assert Vocab.build(LINES, max_size=4).symbols == ("<eos>", "<unk>", "a",
                                                    "c")
  assert len(Vocab.build(LINES, max_size=100)) == 6


@pytest.mark.parametrize("kwargs, match", [
    ({"min_count": 0}, "min_count"),
    ({"min_count": 1.5}, "min_count"),
    ({"max_size": 1}, "max_size"),
    ({"min_count": 2, "unk": None}, "leave out 2 symbols .* unk=None"),
])
def test_bad_build_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    Vocab.build(LINES, **kwargs)


def test_empty_corpus_is_an_error():
  with pytest.raises(ValueError, match="my.txt is empty"):
    Vocab.build([[], []], source="my.txt")


def test_unknown_symbols_map_to_unk_and_are_counted():
  v = Vocab.build(LINES, min_count=2)  # b and d become unknown
  enc = encode_lines(v, [["a", "b", "x", "<eos>"], ["b", "c"]],
                     source="valid.txt")
  unk, a, c, eos = v.unk_id, v.id("a"), v.id("c"), v.eos_id
  assert [s.tolist() for s in enc.sequences] == [[a, unk, unk, eos],
                                                 [unk, c]]
  assert enc.unknown == collections.Counter({"b": 2, "x": 1})
  assert enc.num_unknown == 3 and enc.num_tokens == 6
  assert enc.stream().tolist() == [a, unk, unk, eos, unk, c]
  assert enc.stream().dtype == np.int32
  assert v.decode([a, c, eos]) == ["a", "c", "<eos>"]


def test_unknown_symbol_without_unk_names_symbol_file_and_line():
  v = Vocab.build(LINES, unk=None)
  with pytest.raises(KeyError, match=r"'zebra' at valid.txt:2"):
    encode_lines(v, [["a"], ["c", "zebra"]], source="valid.txt")
  with pytest.raises(KeyError, match="'q'"):
    v.encode(["q"])
  with pytest.raises(IndexError, match="id 6"):
    v.decode([6])


def test_round_trip_through_a_run_directory(tmp_path):
  v = Vocab.build(LINES, pad="<pad>", min_count=2)
  run_dir = tmp_path / "run"
  run_dir.mkdir()
  path = v.save(run_dir)  # a directory: writes run/vocab.json
  assert os.path.basename(str(path)) == FILENAME
  assert not os.path.exists(str(path) + ".tmp")
  back = Vocab.load(run_dir)
  assert back == v and back is not v
  assert (back.symbols, back.counts, back.pad, back.eos, back.unk) == (
      v.symbols, v.counts, "<pad>", "<eos>", "<unk>")
  line = ["a", "c", "b", "<eos>"]
  np.testing.assert_array_equal(back.encode(line), v.encode(line))
  # An explicit file name, non-ASCII symbols, no unk.
  w = Vocab(["été", "日本", "\n"], eos="\n", unk=None)
  assert Vocab.load(w.save(tmp_path / "w.json")) == w
  # Saving again over an existing file (a resumed run saves its vocabulary
  # at every start) replaces it.
  assert Vocab.load(w.save(run_dir)) == w
  assert not os.path.exists(str(path) + ".tmp")


def test_save_to_a_new_directory_named_with_a_trailing_slash(tmp_path):
  v = Vocab.build(LINES)
  path = v.save(f"{tmp_path}/new/run/")
  assert str(path) == os.path.join(str(tmp_path), "new", "run", FILENAME)
  assert os.path.isfile(path)
  assert Vocab.load(f"{tmp_path}/new/run/") == v
  assert Vocab.load(tmp_path / "new" / "run") == v


@pytest.mark.parametrize("payload, match", [
    ("not json", "not valid JSON"),
    ('{"format": "other"}', "not a sorjax.vocab/1 file"),
    ('{"format": "sorjax.vocab/1", "symbols": ["a"]}', "lacks the field"),
    ('{"format": "sorjax.vocab/1", "symbols": ["a", "a"], "pad": null, '
     '"eos": null, "unk": null, "counts": null}', "'a' appears twice"),
    ('{"format": "sorjax.vocab/1", "symbols": ["a"], "pad": null, '
     '"eos": "<eos>", "unk": null, "counts": null}', "eos symbol '<eos>'"),
    ('{"format": "sorjax.vocab/1", "symbols": ["a"], "pad": null, '
     '"eos": null, "unk": null, "counts": 5}', "counts must be a sequence"),
])
def test_load_errors_name_the_file(tmp_path, payload, match):
  path = tmp_path / "bad.json"
  path.write_text(payload)
  with pytest.raises(ValueError, match=match) as error:
    Vocab.load(path)
  assert "bad.json" in str(error.value)


def test_load_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="nothing.json"):
    Vocab.load(tmp_path / "nothing.json")


def test_a_failed_save_names_the_file_and_keeps_the_earlier_one(
    tmp_path, monkeypatch):
  """A full disk mid-write: an error naming vocab.json (it named none),
  the earlier file as it was and no temporary file left beside it."""
  from etils import epath
  v = Vocab.build(LINES)
  path = v.save(tmp_path / "vocab.json")
  before = path.read_text()

  def full(self, text, *args, **kwargs):
    with open(self, "w") as f:
      f.write(text[:7])
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(type(epath.Path(tmp_path)), "write_text", full)
  with pytest.raises(OSError, match=r"Vocab.save: cannot write .*vocab.json:"
                     r" No space left on device"):
    Vocab.build(LINES[:1]).save(path)
  monkeypatch.undo()
  assert path.read_text() == before
  assert os.listdir(tmp_path) == ["vocab.json"]


def test_saved_file_is_plain_json(tmp_path):
  v = Vocab.build(LINES)
  data = json.loads((v.save(tmp_path / "v.json")).read_text())
  assert data["symbols"] == list(v.symbols) and data["unk"] == "<unk>"


def test_constructor_checks():
  with pytest.raises(ValueError, match="unk symbol '<unk>'"):
    Vocab(["a", "<eos>"])
  with pytest.raises(ValueError, match="counts"):
    Vocab(["a", "<eos>", "<unk>"], counts=[1, 2])
  with pytest.raises(ValueError, match=r"counts\[0\] must be an int >= 0, "
                                       "got 1.7"):
    Vocab(["a", "<eos>", "<unk>"], counts=[1.7, 2, 0])
  with pytest.raises(ValueError, match=r"counts\[2\] must be an int >= 0, "
                                       "got -1"):
    Vocab(["a", "<eos>", "<unk>"], counts=[1, 2, -1])
  assert Vocab(["a", "<eos>", "<unk>"], counts=np.array([3, 1, 0])).counts \
      == (3, 1, 0)
  with pytest.raises(ValueError, match="non-empty strings"):
    Vocab(["a", "", "<eos>", "<unk>"])


def test_ptb_vocabulary_is_train_words_plus_eos(shared_data):
  train = os.path.join(shared_data, "ptb", "ptb.train.txt")
  valid = os.path.join(shared_data, "ptb", "ptb.valid.txt")
  tok = Tokenizer("word")
  v = Vocab.build(tok.file(train), source=train)
  with open(train, encoding="utf-8") as f:
    words = f.read().split()
  assert len(set(words)) == 9999 and "<unk>" in words  # SOURCES.md counts
  assert len(v) == 10000 and set(v.symbols) == set(words) | {"<eos>"}
  assert v.counts[v.unk_id] == words.count("<unk>")
  enc = encode_lines(v, tok.file(valid), source=valid)
  assert isinstance(enc, Encoded)
  assert enc.num_unknown == 0 and enc.num_tokens == 73760  # 70,390 + eos


def test_a_str_is_not_a_sequence_of_symbols():
  v = Vocab.build([["the", "cat"]])
  with pytest.raises(TypeError, match="Vocab.encode: symbols must be a "
                                      "sequence of symbols, got the str"):
    v.encode("the cat")
  with pytest.raises(TypeError, match="Vocab.build: line 2 of corpus must "
                                      "be a sequence of symbols"):
    Vocab.build([["a"], "the cat"])
  with pytest.raises(TypeError, match="Vocab.build: lines must be an "
                                      "iterable of symbol lists"):
    Vocab.build("the cat")
  with pytest.raises(TypeError, match="Vocab.decode: ids must be integers"):
    v.decode([1.0])
