"""TFDS builders of the real corpora, built offline without TensorFlow.

Each builder is built from the tiny fixtures in tests/data/fixtures (laid
out like the shared data folder) and compared with the fixture files read
naively; errors must name the bad file, line, flag or directory. The real
corpora are checked against the counts of shared/data/SOURCES.md when the
shared data folder is present.
"""

import gzip
import hashlib
import json
import os
import pathlib
import shutil
import sys

import pytest
import tensorflow_datasets as tfds

from sorjax.data import build as build_lib
from sorjax.data import builders

# one worker builds the module's fixtures (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("data.test_builders")

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
tfds.disable_progress_bar()


@pytest.fixture(autouse=True)
def _no_shared_data(monkeypatch):
  """Fixture builds must not fall back on the real data or the network."""
  monkeypatch.delenv(builders.DATA_ENV, raising=False)
  monkeypatch.setattr(builders, "shared_data_dir", lambda: None)

  def no_network(self, *args, **kwargs):
    raise ConnectionError("no network in tests")
  monkeypatch.setattr(tfds.download.DownloadManager, "download", no_network)
  monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract",
                      no_network)


def build(name, tmp_path, manual_dir=FIXTURES, verify=False):
  return builders.prepare(name, tmp_path / "tfds", manual_dir,
                          verify_checksums=verify)


def records(b, split):
  source = b.as_data_source()[split]
  return [source[i] for i in range(len(source))]


def naive_lines(path):
  with open(path, encoding="utf-8", newline="") as f:
    return f.read().split("\n")[:-1]


# ------------------------------------------------------------ line corpora

@pytest.mark.parametrize("name, files", [
    ("ptb", {"train": "ptb/ptb.train.txt",
             "validation": "ptb/ptb.valid.txt", "test": "ptb/ptb.test.txt"}),
    ("wikitext2", {"train": "wikitext-2/wiki.train.tokens",
                   "validation": "wikitext-2/wiki.valid.tokens",
                   "test": "wikitext-2/wiki.test.tokens"}),
])
def test_line_builders_keep_every_line_in_order(name, files, tmp_path):
  b = build(name, tmp_path)
  assert set(b.info.splits) == set(files)
  for split, rel in files.items():
    expected = naive_lines(FIXTURES / rel)
    got = records(b, split)
    assert [r["text"].decode() for r in got] == expected
    assert [int(r["line"]) for r in got] == list(range(len(expected)))
  assert "skipped" not in b.info.metadata
  folder = files["train"].split("/")[0]
  assert b.info.metadata["source"] == str(FIXTURES / folder)
  assert "tensorflow" not in sys.modules


def test_ptb_char_skips_and_counts_the_trailing_blank(tmp_path):
  b = build("ptb_char", tmp_path)
  got = [r["text"].decode() for r in records(b, "train")]
  # Mikolov's rule: chars of "the_cat_sat_on_the_mat\n..." each followed by " "
  assert got[0] == "t h e _ c a t _ s a t _ o n _ t h e _ m a t "
  assert got[1] == " a _ < u n k > _ o f _ N _ d o g s "
  assert len(got) == 4  # the file's final "\n " is not a fifth line
  skipped = b.info.metadata["skipped"]
  assert skipped == {s: {"whitespace after the last newline": 1}
                     for s in ("train", "validation", "test")}
  assert "tensorflow" not in sys.modules


def test_gzipped_source_reads_like_plain(tmp_path):
  src = tmp_path / "src" / "ptb"
  src.mkdir(parents=True)
  for f in ("ptb.char.valid.txt", "ptb.char.test.txt"):
    shutil.copy(FIXTURES / "ptb" / f, src / f)
  with open(FIXTURES / "ptb" / "ptb.char.train.txt", "rb") as f:
    (src / "ptb.char.train.txt.gz").write_bytes(gzip.compress(f.read()))
  b = build("ptb_char", tmp_path, manual_dir=tmp_path / "src")
  plain = build("ptb_char", tmp_path / "plain")
  assert records(b, "train") == records(plain, "train")


def test_tinyshakespeare_splits_lines_90_5_5_in_order(tmp_path):
  b = build("tinyshakespeare", tmp_path)
  lines = naive_lines(FIXTURES / "tinyshakespeare" / "input.txt")
  assert len(lines) == 20
  expected = {"train": lines[:18], "validation": lines[18:19],
              "test": lines[19:]}
  start = {"train": 0, "validation": 18, "test": 19}
  for split, want in expected.items():
    got = records(b, split)
    assert [r["text"].decode() for r in got] == want
    assert [int(r["line"]) for r in got] == list(
        range(start[split], start[split] + len(want)))
  assert "" in expected["train"]  # blank lines are kept


# ------------------------------------------------------ Maupome & Meurs PTB

def test_maupome_mikolov_config(tmp_path):
  b = build("ptb_char_maupome", tmp_path)
  got = {s: [(r["source"].decode(), int(r["line"]), r["text"].decode())
             for r in records(b, s)] for s in ("train", "validation", "test")}
  # Hand-applied: drop N, non-letters -> space, collapse, lower, strip.
  assert got["train"] == [
      ("ptb.train.txt", 0, "the cat sat on the mat"),
      ("ptb.train.txt", 1, "a unk of dogs"),
      ("ptb.train.txt", 3, "the dog s bone")]
  assert got["validation"] == [("ptb.valid.txt", 0, "the cat"),
                               ("ptb.valid.txt", 1, "a zebra sat")]
  assert got["test"] == [("ptb.test.txt", 0, "the mat s")]
  meta = b.info.metadata
  assert meta["skipped"] == {"train": {"lines empty after preprocessing": 1}}
  assert meta["N_removed"] == 4 and meta["unk_kept"] == 1
  assert meta["documents"] == {"train": 3, "validation": 2, "test": 1}


def _raw_wsj(root, sections):
  for section, text in sections.items():
    d = root / "raw" / "wsj" / section
    d.mkdir(parents=True)
    (d / f"wsj_{section}01").write_text(text)


def test_maupome_wsj_raw_config(tmp_path):
  raw = tmp_path / "ldc"
  _raw_wsj(raw, {
      "00": ".START \n\nPierre Vinken, 61 years old, will join the board.\n"
            "Mr. Vinken is chairman of Elsevier N.V.\n",
      "21": ".START \n\nRudolph Agnew, 55 years old...\n--\n",
      "23": ".START \n\nThe U.S. dollar's $1.5 rise.\n"})
  b = build("ptb_char_maupome/wsj_raw", tmp_path, manual_dir=raw)
  text = {s: [r["text"].decode() for r in records(b, s)]
          for s in ("train", "validation", "test")}
  assert text == {
      "train": ["pierre vinken years old will join the board",
                "mr vinken is chairman of elsevier n v"],
      "validation": ["rudolph agnew years old"],
      "test": ["the u s dollar s rise"]}
  assert b.info.metadata["skipped"] == {
      "train": {".START marker lines": 1,
                "lines empty after preprocessing": 1},
      "validation": {".START marker lines": 1,
                     "lines empty after preprocessing": 2},
      "test": {".START marker lines": 1,
               "lines empty after preprocessing": 1}}


def test_maupome_wsj_raw_missing_sections_and_files(tmp_path):
  raw = tmp_path / "ldc"
  _raw_wsj(raw, {"00": "A b.\n", "23": "C d.\n"})
  with pytest.raises(FileNotFoundError,
                     match=r"'validation' \(sections 21-22\)"):
    build("ptb_char_maupome/wsj_raw", tmp_path, manual_dir=raw)
  empty = tmp_path / "empty"
  empty.mkdir()
  (empty / "x.txt").write_text("x")
  with pytest.raises(FileNotFoundError,
                     match="no raw WSJ files named wsj_NNNN"):
    build("ptb_char_maupome/wsj_raw", tmp_path / "b", manual_dir=empty)


# --------------------------------------------------------------------- SST

def test_sst_trees_labels_and_sentences(tmp_path):
  b = build("sst", tmp_path)
  train = records(b, "train")
  assert [r["tree"].decode() for r in train] == naive_lines(
      FIXTURES / "sst" / "train.txt")
  assert [int(r["label"]) for r in train] == [3, 1, 2]
  assert [int(r["binary_label"]) for r in train] == [1, 0, -1]
  assert train[0]["sentence"].decode() == "The Rock is great fun"
  # A leaf holding a no-break space stays one word.
  assert train[1]["sentence"].decode() == "Contempt 8\u00a01\\/2"
  assert [int(r["label"]) for r in records(b, "validation")] == [0]
  assert [int(r["binary_label"]) for r in records(b, "test")] == [1]


@pytest.mark.parametrize("tree, message", [
    ("(3 (2 a) (2 b)", "1 unclosed"),
    ("(3 (2 a) (2 b)))", "unbalanced"),
    ("(7 (2 a) (2 b))", "expected a label 0-4 after '\\(', got '7'"),
    ("(3 (2 a) (2 b) (2 c))", "a node labelled 3 has 3 children"),
    ("(3 (2 a b))", "unexpected word 'b'"),
    ("(3 (2 a) (2 b)) (2 c)", "text after the end of the tree"),
])
def test_sst_malformed_tree_names_file_and_line(tree, message, tmp_path):
  src = tmp_path / "src" / "sst"
  shutil.copytree(FIXTURES / "sst", src)
  (src / "dev.txt").write_text("(2 (2 ok) (2 .))\n" + tree + "\n")
  with pytest.raises(ValueError, match=f"dev.txt:2: {message}"):
    build("sst", tmp_path, manual_dir=tmp_path / "src")


# ------------------------------------------------------------------- BLiMP

def test_blimp_pairs_extra_fields_and_phenomena(tmp_path):
  b = build("blimp", tmp_path)
  got = records(b, "test")
  source = [json.loads(l) for f in ("adjunct_island", "only_npi_scope")
            for l in naive_lines(FIXTURES / "blimp" / f"{f}.jsonl")]
  assert len(got) == len(source) == 4
  for r, s in zip(got, source):
    for key in ("UID", "pairID", "sentence_good", "sentence_bad"):
      assert r[key].decode() == s[key]
  assert json.loads(got[0]["extra"]) == {}
  assert json.loads(got[2]["extra"]) == {
      "one_prefix_prefix": "Only", "one_prefix_word_good": "the",
      "one_prefix_word_bad": "The", "crucial_item": "only"}
  assert json.loads(got[3]["extra"]) == {"dependency_length": 3}
  phenomena = b.info.metadata["phenomena"]
  assert phenomena["only_npi_scope"] == {
      "field": "semantics", "linguistics_term": "npi_licensing",
      "simple_LM_method": True, "one_prefix_method": True,
      "two_prefix_method": False, "lexically_identical": False}
  assert set(phenomena) == {"adjunct_island", "only_npi_scope"}


@pytest.mark.parametrize("change, message", [
    ({"surprise": 1}, r"unknown fields \['surprise'\]"),
    ({"UID": "wh_island"}, "UID 'wh_island' differs"),
    ({"simple_LM_method": "yes"}, "field 'simple_LM_method' should be bool"),
    ({"field": "morphology"}, r"fields \['field'\] differ"),
    ({"dependency_length": True}, "field 'dependency_length' should be int"),
])
def test_blimp_bad_line_names_file_and_line(change, message, tmp_path):
  src = tmp_path / "src" / "blimp"
  shutil.copytree(FIXTURES / "blimp", src)
  lines = naive_lines(src / "adjunct_island.jsonl")
  record = {**json.loads(lines[1]), **change}
  (src / "adjunct_island.jsonl").write_text(
      lines[0] + "\n" + json.dumps(record) + "\n")
  with pytest.raises(ValueError, match=f"adjunct_island.jsonl:2: {message}"):
    build("blimp", tmp_path, manual_dir=tmp_path / "src")


def test_blimp_missing_field_and_bad_json(tmp_path):
  src = tmp_path / "src" / "blimp"
  src.mkdir(parents=True)
  (src / "wh_island.jsonl").write_text('{"UID": "wh_island"}\n')
  with pytest.raises(ValueError, match="wh_island.jsonl:1: missing fields"):
    build("blimp", tmp_path, manual_dir=tmp_path / "src")
  (src / "wh_island.jsonl").write_text("{not json\n")
  with pytest.raises(ValueError, match="wh_island.jsonl:1: not valid JSON"):
    build("blimp", tmp_path / "b", manual_dir=tmp_path / "src")


# ------------------------------------------- checksums, locations, errors

def test_checksum_mismatch_names_the_file(tmp_path):
  with pytest.raises(builders.ChecksumError) as e:
    build("ptb", tmp_path, verify=True)
  assert str(FIXTURES / "ptb" / "ptb.train.txt") in str(e.value)
  assert "fcea919f6cf83f35" in str(e.value)  # the published sha256


def test_a_build_of_unchecked_files_is_named_when_reused(tmp_path, capsys,
                                                       caplog):
  """A dataset built with --noverify_checksums (the fixtures differ from
  the published files) is refused by a checked build and reused with a
  warning naming its files by a checked load; an unchecked build keeps
  it."""
  build("ptb", tmp_path)                       # unchecked
  data_dir = str(tmp_path / "tfds")
  rc = build_lib.main(["ptb", "--data_dir", data_dir, "--manual_dir",
                       str(FIXTURES)])
  err = capsys.readouterr().err
  assert rc == 1
  assert ("was built from ptb.test.txt, ptb.train.txt, ptb.valid.txt "
          "without checking their checksums") in err
  assert "Delete " in err and "--noverify_checksums to keep it" in err
  with caplog.at_level("WARNING", logger=builders.__name__):
    b = builders.prepare("ptb", data_dir, FIXTURES)
  assert b.info.splits["train"].num_examples == 4
  assert "without checking their checksums" in caplog.text
  assert build_lib.main(["ptb", "--data_dir", data_dir, "--manual_dir",
                         str(FIXTURES), "--noverify_checksums"]) == 0
  assert builders.unverified_sources(b) == ["ptb.test.txt", "ptb.train.txt",
                                            "ptb.valid.txt"]


def test_an_empty_or_file_data_dir_is_named(tmp_path, capsys):
  with pytest.raises(ValueError, match=r"data_dir is empty \(''\)"):
    builders.builder("ptb", "")
  (tmp_path / "f").write_text("")
  with pytest.raises(ValueError, match=r"data_dir .*/f is not a directory"):
    builders.builder("ptb", tmp_path / "f")
  assert build_lib.main(["ptb", "--data_dir", str(tmp_path / "f")]) == 1
  assert "is not a directory" in capsys.readouterr().err
  assert not os.path.exists("ptb") and not os.path.exists("downloads")


def test_a_build_finished_first_by_another_process_is_reused(
    tmp_path, monkeypatch):
  """TFDS renames its incomplete.* folder at the end; when another build
  of the same dataset renamed first, the rename fails (FileExistsError)
  and that dataset is reused. With nothing there the error stands."""
  build("ptb", tmp_path)
  real = builders.SourceBuilder.download_and_prepare
  calls = []

  def racing(self, **kwargs):
    calls.append(self.data_dir)
    if len(calls) == 1:
      raise FileExistsError("Cannot rename incomplete.x: already exists")
    return real(self, **kwargs)

  monkeypatch.setattr(builders.SourceBuilder, "download_and_prepare", racing)
  b = build("ptb", tmp_path)
  assert b.is_prepared() and len(records(b, "train")) == 4
  calls.clear()
  with pytest.raises(FileExistsError, match="Cannot rename"):
    build("ptb", tmp_path / "other")


def test_gzip_checksum_is_of_the_decompressed_content(tmp_path):
  table = builders.builder_class("ptb_char").source_files()
  entry = table["ptb.char.train.txt"]
  assert entry.size == 10034964 and entry.sha256.startswith("e313d914")
  data = b"a b c \n"
  path = tmp_path / "x.txt.gz"
  with pytest.raises(builders.ChecksumError, match="decompressed content"):
    builders.verify(path, data, entry)
  good = builders.SourceFile("x.txt", len(data), hashlib.sha256(
      data).hexdigest(), "url")
  builders.verify(path, data, good)  # no error


def test_a_copy_of_the_right_size_but_other_bytes_is_refused(tmp_path):
  """Size and sha256 are both checked: one flipped byte keeps the size."""
  data = b"the cat sat on the mat \n"
  entry = builders.SourceFile("x.txt", len(data), hashlib.sha256(
      data).hexdigest(), "url")
  corrupted = data.replace(b"cat", b"cot")
  assert len(corrupted) == len(data)
  with pytest.raises(builders.ChecksumError, match=(
      rf"x.txt: checksum mismatch .* the content has {len(data)} bytes "
      rf"with sha256 {hashlib.sha256(corrupted).hexdigest()}")):
    builders.verify(tmp_path / "x.txt", corrupted, entry)


def test_decode_lines_splits_at_newline_and_drops_a_trailing_cr(tmp_path):
  """Windows line ends lose their '\\r'; other separators stay inside a
  line; no line after the final newline."""
  path = tmp_path / "f.txt"
  assert builders.decode_lines(path, b"a b\r\nc\r\n\r\nd\n") == [
      "a b", "c", "", "d"]
  assert builders.decode_lines(path, b"x\ry\x0cz\nlast") == [
      "x\ry\x0cz", "last"]
  assert builders.decode_lines(path, "\u2028a\n".encode()) == ["\u2028a"]


def test_manual_dir_given_but_missing_is_an_error(tmp_path):
  with pytest.raises(FileNotFoundError,
                     match=f"manual_dir given.*{tmp_path / 'nowhere'}"):
    build("ptb", tmp_path, manual_dir=tmp_path / "nowhere")
  partial = tmp_path / "partial" / "ptb"
  partial.mkdir(parents=True)
  shutil.copy(FIXTURES / "ptb" / "ptb.train.txt", partial)
  with pytest.raises(FileNotFoundError,
                     match="missing ptb.valid.txt, ptb.test.txt"):
    build("ptb", tmp_path, manual_dir=tmp_path / "partial")


def test_env_data_dir(tmp_path, monkeypatch):
  monkeypatch.setenv(builders.DATA_ENV, str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match="SORJAX_DATA_DIR=.*nowhere"):
    build("ptb", tmp_path, manual_dir=None)
  monkeypatch.setenv(builders.DATA_ENV, str(FIXTURES))
  b = build("ptb", tmp_path, manual_dir=None)
  assert b.info.metadata["source"] == str(FIXTURES / "ptb")


def test_shared_data_dir_is_found_automatically(tmp_path, monkeypatch):
  monkeypatch.setattr(builders, "shared_data_dir", lambda: FIXTURES)
  b = build("wikitext2", tmp_path, manual_dir=None)
  assert b.info.metadata["source"] == str(FIXTURES / "wikitext-2")


def test_no_source_anywhere_tries_download_and_says_where_it_looked(tmp_path):
  with pytest.raises(FileNotFoundError) as e:
    build("tinyshakespeare", tmp_path, manual_dir=None)
  message = str(e.value)
  assert "default manual_dir" in message and "download failed" in message
  assert "no network in tests" in message


def test_download_uses_pinned_urls_and_verifies(tmp_path, monkeypatch):
  asked = {}

  def fake_download(self, urls):
    asked.update(urls)
    return {n: FIXTURES / "ptb" / n for n in urls}
  monkeypatch.setattr(tfds.download.DownloadManager, "download",
                      fake_download)
  b = build("ptb", tmp_path, manual_dir=None)
  assert b.info.metadata["source"] == "downloaded"
  assert asked["ptb.train.txt"] == (
      "https://raw.githubusercontent.com/townie/PTB-dataset-from-Tomas-"
      "Mikolov-s-webpage/06529ac968955ffc29a4668d68b93dadcfe55f2e/data/"
      "ptb.train.txt")
  with pytest.raises(builders.ChecksumError, match="ptb.train.txt"):
    build("ptb", tmp_path / "v", manual_dir=None, verify=True)


def test_empty_and_undecodable_files_are_named(tmp_path):
  src = tmp_path / "src" / "ptb"
  shutil.copytree(FIXTURES / "ptb", src)
  (src / "ptb.valid.txt").write_text("")
  with pytest.raises(ValueError, match=r"ptb.valid.txt: the file is empty"):
    build("ptb", tmp_path, manual_dir=tmp_path / "src")
  (src / "ptb.valid.txt").write_bytes(b" ok \n bad \xff byte \n")
  with pytest.raises(ValueError, match=r"ptb.valid.txt:2: not valid UTF-8"):
    build("ptb", tmp_path / "b", manual_dir=tmp_path / "src")
  (src / "ptb.valid.txt.gz").write_bytes(b"not gzip")
  (src / "ptb.valid.txt").unlink()
  with pytest.raises(ValueError, match=r"ptb.valid.txt.gz: not a valid gzip"):
    build("ptb", tmp_path / "c", manual_dir=tmp_path / "src")


def test_unknown_names_and_configs():
  with pytest.raises(ValueError, match="unknown corpus 'ptb2'"):
    builders.builder("ptb2")
  with pytest.raises(ValueError, match="ptb_char_maupome: unknown config 'x'"):
    builders.builder("ptb_char_maupome/x")


# ---------------------------------------------------------------- build CLI

def test_build_cli(tmp_path, capsys):
  rc = build_lib.main(["ptb", "ptb_char", "--data_dir", str(tmp_path),
                       "--manual_dir", str(FIXTURES), "--noverify_checksums"])
  out = capsys.readouterr().out
  assert rc == 0
  assert "ptb: train 4, validation 2, test 1 examples" in out
  assert "train: skipped 1 whitespace after the last newline" in out
  assert (tmp_path / "ptb" / "1.0.0" / "dataset_info.json").is_file()
  rc = build_lib.main(["ptb", "--data_dir", str(tmp_path / "b"),
                       "--manual_dir", str(tmp_path / "nowhere")])
  assert rc == 1
  assert str(tmp_path / "nowhere") in capsys.readouterr().err
  with pytest.raises(SystemExit):
    build_lib.main(["ptb9"])
  assert "NAME: unknown corpus 'ptb9'" in capsys.readouterr().err
  assert "tensorflow" not in sys.modules


# ------------------------------------------------------- real corpora

@pytest.fixture(scope="module")
def real(shared_data, tmp_path_factory):
  """Prepares real corpora (checksums verified) once for this module."""
  data_dir = tmp_path_factory.mktemp("real_tfds")
  cache = {}

  def get(name):
    if name not in cache:
      cache[name] = builders.prepare(name, data_dir, shared_data)
    return cache[name]
  return get


def test_real_sst(real, shared_data):
  b = real("sst")
  sizes = {s: b.info.splits[s].num_examples for s in b.info.splits}
  assert sizes == {"train": 8544, "validation": 1101, "test": 2210}
  assert sorted(b.info.metadata["verified"]) == ["dev.txt", "test.txt",
                                                 "train.txt"]
  # Root labels against a naive read: the digit after the first "(".
  lines = naive_lines(os.path.join(shared_data, "sst", "dev.txt"))
  got = records(b, "validation")
  assert [int(r["label"]) for r in got] == [int(l[1]) for l in lines]
  assert sum(len(r["sentence"].split()) for r in got) == 21274  # leaves
  assert "tensorflow" not in sys.modules


def test_real_blimp(real):
  b = real("blimp")
  assert b.info.splits["test"].num_examples == 67000
  assert len(b.info.metadata["phenomena"]) == 67
  assert len(b.info.metadata["verified"]) == 67
  assert "skipped" not in b.info.metadata
