"""Minimal pairs: JSONL reading with located errors, text -> symbols with
<unk> counting, scores and per-category accuracy under a hand-set bigram
LM, per-token log-probabilities, BLiMP through its builder."""

import gzip
import json
import os
import shutil
import types

import numpy as np
import pytest
import scipy.special

from sorjax.analysis import minimal_pairs as mp
from sorjax.analysis.common import AnalysisError
from sorjax.data.vocab import Vocab

WORDS = ["<eos>", "<unk>", "the", "cat", "cats", "sleeps", "sleep", "does",
         "n't", "'s", "do"]


class _BigramRun:
  """A 'run' whose LM is a fixed bigram table: log p(w_t+1 | w_t)."""

  def __init__(self, symbols=WORDS, corpus="ptb", unk="<unk>", seed=0):
    self.vocab = Vocab(symbols, eos="<eos>", unk=unk)
    V = len(symbols)
    p = np.random.default_rng(seed).dirichlet(np.ones(V), V)
    self.table = np.log(p)
    self.task = types.SimpleNamespace(name="lm", vocab=self.vocab)
    self.config = types.SimpleNamespace(data=types.SimpleNamespace(
        corpus=corpus))
    self.workdir, self.step, self.replica = f"/fake/{corpus}", 7, 0

  def eval_temperature(self):
    return 1.0

  def log_probs(self, tokens, lengths=None, temperature=None):
    lp = self.table[np.asarray(tokens)] / (temperature or 1.0)
    return lp - scipy.special.logsumexp(lp, -1, keepdims=True)

  def score(self, symbols):
    ids = [self.vocab.id(s) for s in ["<eos>"] + symbols]
    return sum(self.table[a, b] for a, b in zip(ids, ids[1:]))


def _write(path, records, gz=False):
  opener = gzip.open if gz else open
  with opener(path, "wt", encoding="utf-8") as f:
    for r in records:
      f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
  return str(path)


def test_read_pairs_files_directories_and_located_errors(tmp_path):
  _write(tmp_path / "agr.jsonl", [
      {"sentence_good": "a b", "sentence_bad": "b a", "UID": "x"},
      {"sentence_good": "c", "sentence_bad": "d"}])
  _write(tmp_path / "npi.jsonl.gz", [
      {"sentence_good": "e", "sentence_bad": "f", "UID": "y"}], gz=True)
  pairs = mp.read_pairs(str(tmp_path))
  assert [p[:3] for p in pairs] == [("a b", "b a", "x"), ("c", "d", "agr"),
                                    ("e", "f", "y")]
  assert pairs[1].where == f"{tmp_path / 'agr.jsonl'}:2"
  assert mp.read_pairs(str(tmp_path / "agr.jsonl"), None)[0].category == "agr"
  os.makedirs(tmp_path / "bad")
  bad = _write(tmp_path / "bad" / "b.jsonl", [
      {"sentence_good": "a", "sentence_bad": "b"}, "{not json"])
  with pytest.raises(ValueError, match=r"b\.jsonl:2: not a JSON line"):
    mp.read_pairs(bad)
  _write(tmp_path / "bad" / "b.jsonl", [{"sentence_good": "a"}])
  with pytest.raises(ValueError, match=r"b\.jsonl:1: field 'sentence_bad' "
                     "must be a non-empty string"):
    mp.read_pairs(bad)
  with pytest.raises(FileNotFoundError, match="no such file"):
    mp.read_pairs(str(tmp_path / "nope.jsonl"))


def test_unreadable_pair_files_and_a_misspelt_category_field(tmp_path):
  path = tmp_path / "b.jsonl"
  good = json.dumps({"sentence_good": "a", "sentence_bad": "b", "UID": "u"})
  path.write_bytes(good.encode() + b"\n\xff\xfe\n")
  with pytest.raises(ValueError, match=r"b\.jsonl:2: not UTF-8 text"):
    mp.read_pairs(str(path))
  fake = tmp_path / "f.jsonl.gz"
  fake.write_text(good + "\n")
  with pytest.raises(ValueError, match=r"f\.jsonl\.gz: not a readable gzip "
                     "file"):
    mp.read_pairs(str(fake))
  path.write_text(good + "\n")
  assert mp.read_pairs(str(path), "UIDX")[0].category == "b"   # file's name
  with pytest.raises(ValueError, match=r"no line of .* has the category "
                     r"field 'UIDX'; their fields are \['UID', "
                     r"'sentence_bad', 'sentence_good'\]"):
    mp.read_pairs(str(path), "UIDX", require_category=True)


def test_text_to_symbols_with_unk_and_dropped_punctuation():
  run = _BigramRun()
  norm = mp.normalisation(run)
  assert norm == {"lowercase": True, "punctuation": "drop"}
  enc = mp.encode_sentence(run, "The dog doesn't sleep, the cat's.")
  assert enc.words == ["the", "dog", "does", "n't", "sleep", "the", "cat",
                       "'s"]
  assert enc.symbols == ["the", "<unk>", "does", "n't", "sleep", "the", "cat",
                         "'s"]
  assert enc.oov == ["dog"] and enc.dropped == [",", "."]
  kept = mp.encode_sentence(run, "The cat.", {"lowercase": False,
                                              "punctuation": "keep"})
  assert kept.symbols == ["<unk>", "cat", "<unk>"] and kept.oov == ["The",
                                                                     "."]


def test_character_corpora_join_words_their_way():
  chars = ["<eos>", "_", " ", "t", "h", "e", "c", "a"]
  run = _BigramRun(chars, corpus="ptb_char", unk=None)
  assert mp.encode_sentence(run, "The  cat").symbols == list("the_cat")
  run = _BigramRun(chars, corpus="ptb_char_maupome", unk=None)
  assert mp.encode_sentence(run, "The, cat!").symbols == list("the cat")
  with pytest.raises(ValueError, match="character 'z' is not in the "
                     "ptb_char_maupome vocabulary"):
    mp.encode_sentence(run, "the zebra")


def test_a_sentence_the_vocabulary_cannot_encode_names_its_line(tmp_path):
  run = _BigramRun(["<eos>", "_", "t", "h", "e", "c", "a"],
                   corpus="ptb_char", unk=None)
  path = _write(tmp_path / "p.jsonl", [
      {"sentence_good": "the cat", "sentence_bad": "the act"},
      {"sentence_good": "the cat", "sentence_bad": "th\u00e9 cat"}])
  with pytest.raises(ValueError, match=r"p\.jsonl:2: sentence 'th\u00e9 "
                     "cat': character '\u00e9' is not in the ptb_char"):
    mp.evaluate(run, mp.read_pairs(path))


def test_scores_and_category_accuracy_under_a_bigram_lm(tmp_path):
  run = _BigramRun()
  pairs = [mp.Pair("The cat sleeps.", "The cat sleep.", "agreement"),
           mp.Pair("The cats sleep.", "The cats sleeps.", "agreement"),
           mp.Pair("The dog doesn't sleep", "The dog don't sleep", "npi")]
  sym = [(["the", "cat", "sleeps"], ["the", "cat", "sleep"]),
         (["the", "cats", "sleep"], ["the", "cats", "sleeps"]),
         (["the", "<unk>", "does", "n't", "sleep"],
          ["the", "<unk>", "do", "n't", "sleep"])]
  want = np.array([[run.score(g), run.score(b)] for g, b in sym])
  res = mp.evaluate(run, pairs, batch_size=2)
  np.testing.assert_allclose(res["scores"], want, rtol=1e-12)
  ok = want[:, 0] > want[:, 1]
  assert res["accuracy"] == pytest.approx(ok.mean())
  assert res["categories"]["agreement"] == {
      "pairs": 2, "correct": int(ok[:2].sum()),
      "accuracy": pytest.approx(ok[:2].mean()), "identical": 0}
  assert res["identical"] == 0
  assert res["accuracy_distinguishable"] == res["accuracy"]
  assert res["oov"]["tokens"] == 2 and res["oov"]["types"] == 1
  assert res["oov"]["sentences"] == 2 and res["oov"]["pairs"] == 1
  assert res["oov"]["most_common"] == [("dog", 2)]
  assert res["dropped_punctuation"] == {".": 4}
  eos = mp.evaluate(run, pairs[:1], score_eos=True)["scores"][0, 0]
  assert eos == pytest.approx(want[0, 0] + run.table[
      run.vocab.id("sleeps"), 0])
  other = _BigramRun(seed=1)
  both = mp.compare([run, other], pairs)
  assert both["runs"] == ["/fake/ptb", "/fake/ptb"]
  mp.plot_categories(both["results"], ["a", "b"], str(tmp_path / "c.png"))
  assert (tmp_path / "c.png").stat().st_size > 0


def test_pairs_that_encode_alike_tie_and_are_counted():
  """Sentences differing only in words mapped to <unk> (or in dropped
  punctuation) are the same symbols: a tie, incorrect under the strict
  comparison, counted as identical and left out of the distinguishable
  accuracy."""
  run = _BigramRun()
  pairs = [mp.Pair("The dog sleeps.", "The cow sleeps", "unk"),  # identical
           mp.Pair("The cat sleeps.", "The cat sleep.", "agreement"),
           mp.Pair("The cats sleep.", "The cats sleeps.", "agreement")]
  res = mp.evaluate(run, pairs)
  tie = res["scores"][0]
  assert tie[0] == tie[1]
  ok = res["scores"][1:, 0] > res["scores"][1:, 1]
  assert res["identical"] == 1 and res["categories"]["unk"] == {
      "pairs": 1, "correct": 0, "accuracy": 0.0, "identical": 1}
  assert res["categories"]["agreement"]["identical"] == 0
  assert res["accuracy"] == pytest.approx(ok.sum() / 3)
  assert res["accuracy_distinguishable"] == pytest.approx(ok.mean())
  only = mp.evaluate(run, pairs[:1])
  assert only["accuracy"] == 0.0 and only["accuracy_distinguishable"] is None


def test_per_token_log_probs_of_one_sentence(tmp_path):
  run = _BigramRun()
  res = mp.sentence_log_probs(run, "The dog sleeps")
  ids = [run.vocab.id(s) for s in ["<eos>", "the", "<unk>", "sleeps"]]
  np.testing.assert_allclose(res["log_probs"], [
      run.table[a, b] for a, b in zip(ids, ids[1:])])
  assert res["words"] == ["the", "dog", "sleeps"] and res["oov"] == ["dog"]
  assert res["total"] == pytest.approx(run.score(["the", "<unk>", "sleeps"]))
  mp.plot_sentence([res, mp.sentence_log_probs(_BigramRun(seed=2),
                                               "The dog sleeps")],
                   ["a", "b"], str(tmp_path / "s.png"))
  assert (tmp_path / "s.png").stat().st_size > 0
  hot = mp.sentence_log_probs(run, "The dog sleeps", tau=2.0)["log_probs"]
  np.testing.assert_allclose(hot, run.log_probs(ids, temperature=2.0)[
      np.arange(3), ids[1:]])
  assert not np.allclose(hot, res["log_probs"])


def test_minimal_pairs_need_an_lm_run():
  run = _BigramRun()
  run.task.name = "dyck_lm"
  with pytest.raises(AnalysisError, match="needs a 'lm' run"):
    mp.evaluate(run, [mp.Pair("a", "b", "c")])


def test_blimp_through_its_builder_equals_the_jsonl_files(tmp_path,
                                                          shared_data):
  src = os.path.join(shared_data, "blimp")
  names = ["anaphor_gender_agreement", "determiner_noun_agreement_1"]
  manual = tmp_path / "blimp"
  manual.mkdir()
  for n in names:
    shutil.copy(os.path.join(src, f"{n}.jsonl.gz"), manual)
  pairs = mp.blimp_pairs(data_dir=str(tmp_path / "tfds"),
                         manual_dir=str(manual), verify_checksums=False)
  direct = mp.read_pairs(str(manual))
  assert len(pairs) == 2000 and sorted(p[:3] for p in pairs) == sorted(
      p[:3] for p in direct)
  assert {p.category for p in pairs} == set(names)
  field = mp.blimp_pairs(data_dir=str(tmp_path / "tfds"),
                         manual_dir=str(manual), verify_checksums=False,
                         category="field", phenomena=names[:1])
  assert len(field) == 1000 and {p.category for p in field} == {"morphology"}
  with pytest.raises(ValueError, match="unknown phenomena"):
    mp.blimp_pairs(data_dir=str(tmp_path / "tfds"), manual_dir=str(manual),
                   verify_checksums=False, phenomena=["nope"])


def test_progress_counts_every_sentence_of_every_run():
  """evaluate reports the sentences scored after each batch (two a pair);
  compare counts the runs' sentences as one job."""
  run = _BigramRun()
  pairs = [mp.Pair("The cat sleeps.", "The cat sleep.", "a")] * 5
  calls = []
  mp.evaluate(run, pairs, batch_size=4,
              progress=lambda done, total: calls.append((done, total)))
  assert calls == [(4, 10), (8, 10), (10, 10)]
  calls.clear()
  mp.compare([run, _BigramRun(seed=1)], pairs, batch_size=8,
             progress=lambda done, total: calls.append((done, total)))
  assert calls == [(8, 20), (10, 20), (18, 20), (20, 20)]


def test_progress_line_every_interval_and_at_the_end():
  """common.Progress prints at most once per interval, always at the end,
  with the time left at the rate so far (hand-computed)."""
  import io

  from sorjax.analysis.common import Progress
  now, out = [0.0], io.StringIO()
  p = Progress("blimp", "sentences", stream=out, every=30,
               clock=lambda: now[0])
  for t, done in [(10, 100), (40, 400), (50, 500), (300, 3000),
                  (400, 4000)]:
    now[0] = t
    p(done, 4000)
  assert out.getvalue().splitlines() == [
      "blimp: 400 of 4,000 sentences (10%), 40 s, ~6.0 min left",
      "blimp: 3,000 of 4,000 sentences (75%), 5.0 min, ~1.7 min left",
      "blimp: 4,000 of 4,000 sentences (100%), 6.7 min"]


def test_a_wikitext_vocabulary_reads_its_own_clitics_and_hyphens():
  """WikiText writes "didn 't" (no "n't") and in-word hyphens as "@-@":
  PTB's "did n't" and a whole "well-known" were <unk> there."""
  run = _BigramRun(["<eos>", "<unk>", "The", "actor", "didn", "'t", "can",
                    "@-@", "well", "known", "laugh", "."], corpus="wikitext2")
  enc = mp.encode_sentence(run, "The well-known actor didn't laugh.")
  assert enc.symbols == ["The", "well", "@-@", "known", "actor", "didn",
                         "'t", "laugh", "."]
  assert enc.oov == [] and enc.words == enc.symbols
  assert mp.encode_sentence(run, "can't").symbols == ["can", "'t"]
  res = mp.evaluate(run, [mp.Pair("The actor didn't laugh.",
                                  "The well-known actor laugh.", "x")])
  np.testing.assert_allclose(res["scores"][0], [
      run.score(["The", "actor", "didn", "'t", "laugh", "."]),
      run.score(["The", "well", "@-@", "known", "actor", "laugh", "."])],
      rtol=1e-12)
  assert res["oov"]["tokens"] == 0


def test_the_bigram_corpus_scores_its_bigrams():
  """ptb_char_maupome_bigram: letters only, each word cut in bigrams, the
  space its own symbol (it was read as words: every word <unk>)."""
  run = _BigramRun(["<eos>", "<unk>", " ", "th", "e", "st", "at"],
                   corpus="ptb_char_maupome_bigram")
  enc = mp.encode_sentence(run, "The state!")
  assert enc.symbols == ["th", "e", " ", "st", "at", "e"] and enc.oov == []
  unseen = mp.encode_sentence(run, "the stare")
  assert unseen.symbols == ["th", "e", " ", "st", "<unk>", "e"]
  assert unseen.oov == ["ar"]
  res = mp.sentence_log_probs(run, "The state!")
  assert res["total"] == pytest.approx(run.score(enc.symbols))
