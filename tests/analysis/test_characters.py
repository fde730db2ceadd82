"""Per-position-in-word loss and prediction examples (Maupome & Meurs Fig.
2-3) on a hand-made character stream."""

import math
import types

import numpy as np
import pytest

from sorjax.analysis import characters as ch
from sorjax.analysis.common import AnalysisError
from sorjax.data import batching
from sorjax.training.tasks.lm import ScoredBatch
from sorjax.data.vocab import Vocab

SYMBOLS = ["<eos>", "_", "a", "b", "c", "d"]


def test_word_positions_by_hand():
  s = ["a", "b", "_", "c", "<eos>", "d", "a", "b", "_", "_", "c"]
  assert ch.word_positions(s).tolist() == [1, 2, 0, 1, 0, 1, 2, 3, 0, 0, 1]


class _CharRun:
  """token_losses like the LM task's, with loss = 10 * (position in the
  split) so every mean is checkable; log_probs a fixed bigram table."""

  def __init__(self, text, corpus="ptb_char"):
    self.vocab = Vocab(SYMBOLS, eos="<eos>", unk=None)
    ids = self.vocab.encode(text.split())
    self.table = np.log(np.random.default_rng(0).dirichlet(
        np.ones(len(SYMBOLS)), len(SYMBOLS)))
    self.task = types.SimpleNamespace(name="lm", vocab=self.vocab,
                                      split_ids={"test": ids},
                                      token_losses=self._losses)
    self.config = types.SimpleNamespace(data=types.SimpleNamespace(
        corpus=corpus))
    self.params, self.workdir = None, "/fake"

  def eval_temperature(self):
    return 1.0

  def _losses(self, params, split, temperature):
    ids = self.task.split_ids[split]
    pos = np.arange(ids.size, dtype=np.int32)
    for b, p in zip(batching.StreamBatcher(ids, 2, 3, pad_to=3),
                    batching.StreamBatcher(pos, 2, 3, pad_to=3)):
      where = np.where(np.arange(3)[None] < b.lengths[:, None],
                       p.targets, -1)
      yield ScoredBatch(b.inputs, b.targets, b.lengths, 10.0 * p.targets,
                        where)

  def log_probs(self, tokens, lengths=None, temperature=None):
    return self.table[np.asarray(tokens)]


TEXT = "a b _ c <eos> d a b c d _ a <eos> b a _ c d a <eos>"


def test_position_losses_by_hand(tmp_path):
  run = _CharRun(TEXT)
  res = ch.position_losses(run, "test", max_position=3)
  pos = ch.word_positions(TEXT.split())
  N = len(pos) // 2                       # 2 streams: rows start unscored
  scored = [i for r in range(2) for i in range(r * N + 1, (r + 1) * N)]
  for k in (1, 2):
    at = [i for i in scored if pos[i] == k]
    assert res["count"][k - 1] == len(at)
    assert res["loss"][k - 1] == pytest.approx(10.0 * np.mean(at))
  late = [i for i in scored if pos[i] >= 3]          # pooled: 3 or later
  assert res["loss"][2] == pytest.approx(10.0 * np.mean(late))
  assert res["bits"][0] == pytest.approx(res["loss"][0] / math.log(2))
  assert res["boundary"]["count"] == sum(pos[i] == 0 for i in scored)
  # boundaries (position 0) and all scored characters: means too
  bound = [i for i in scored if pos[i] == 0]
  assert res["boundary"]["loss"] == pytest.approx(10.0 * np.mean(bound))
  assert res["overall"]["count"] == len(scored)
  assert res["overall"]["loss"] == pytest.approx(10.0 * np.mean(scored))
  assert res["overall"]["bits"] == pytest.approx(
      10.0 * np.mean(scored) / math.log(2))
  ch.plot_positions(res, str(tmp_path / "p.png"))
  assert (tmp_path / "p.png").stat().st_size > 0


def test_prediction_examples_are_bigram_argmaxes(tmp_path):
  run = _CharRun(TEXT)
  res = ch.prediction_examples(run, "test", num=2, min_length=4,
                               max_length=10)
  ex = res["examples"]
  assert [e["text"] for e in ex] == ["ab c", "dabcd a"]
  vocab = run.vocab
  for e, line in zip(ex, (["a", "b", "_", "c"],
                          ["d", "a", "b", "c", "d", "_", "a"])):
    prev = ["<eos>"] + line[:-1]
    want = [SYMBOLS[int(np.argmax(run.table[vocab.id(p)]))] for p in prev]
    assert e["predicted"] == "".join(" " if w == "_" else w for w in want)
    assert e["correct"] == pytest.approx(np.mean(
        [w == t for w, t in zip(want, line)]))
    # bits: the mean -log2 p(true character | previous one), from the table
    nll = [-run.table[vocab.id(p), vocab.id(t)] for p, t in zip(prev, line)]
    assert e["bits"] == pytest.approx(np.mean(nll) / math.log(2))
  # both bounds inclusive: "dabcd a" has exactly 7 characters
  tight = ch.prediction_examples(run, "test", num=2, min_length=4,
                                 max_length=7)
  assert [e["text"] for e in tight["examples"]] == ["ab c", "dabcd a"]
  ch.plot_examples(res, str(tmp_path / "e.png"))
  assert (tmp_path / "e.png").stat().st_size > 0
  assert not any(e["cut"] for e in ex)
  # no line of 3..5 characters: the first longer ones, cut to 5 (the
  # bigram predictions of a prefix are the whole line's)
  cut = ch.prediction_examples(run, "test", num=2, min_length=3,
                               max_length=3)
  assert [e["text"] for e in cut["examples"]] == ["ab ", "dab"]
  assert [e["cut"] for e in cut["examples"]] == [True, True]
  assert cut["examples"][1]["predicted"] == ex[1]["predicted"][:3]
  with pytest.raises(AnalysisError, match=r"no line of at least 30 "
                     r"characters in split 'test' \(the longest has 7\)"):
    ch.prediction_examples(run, "test", min_length=30, max_length=40)


def test_word_level_runs_are_an_error():
  run = _CharRun(TEXT, corpus="ptb")
  with pytest.raises(AnalysisError, match="needs a character LM .* corpus "
                     "'ptb' is word-level"):
    ch.position_losses(run, "test")


def test_word_position_needs_a_long_enough_line_before_anything_runs(
    tmp_path):
  """Checked with the other analyses, before any writes a file."""
  from sorjax.analysis import runner
  run = _CharRun("a b <eos> c <eos>")
  with pytest.raises(AnalysisError, match=r"no line of at least 20 "
                     r"characters in split 'test' \(the longest has 2\)"):
    runner.run_analyses(run, ["token_losses", "word_position"],
                        str(tmp_path / "out"), sentence="ab")
  assert not (tmp_path / "out").exists()


def test_a_bigram_run_is_refused_as_bigrams_not_words():
  run = _CharRun(TEXT, corpus="ptb_char_maupome_bigram")
  with pytest.raises(AnalysisError, match="corpus 'ptb_char_maupome_bigram' "
                     "is of character bigrams"):
    ch.position_losses(run, "test")


def test_the_title_says_the_overall_loss_counts_boundaries(tmp_path,
                                                           monkeypatch):
  """res["overall"] averages every scored symbol, spaces and <eos> too;
  only the curve leaves boundaries out (the title said the reverse)."""
  figs = []
  monkeypatch.setattr(ch, "save", lambda fig, path: figs.append(fig))
  res = ch.position_losses(_CharRun(TEXT), "test", max_position=3)
  assert res["overall"]["count"] > sum(res["count"])     # boundaries too
  ch.plot_positions(res, str(tmp_path / "p.png"))
  title = figs[0].axes[0].get_title()
  assert f"overall {res['overall']['bits']:.3f} bits/char (every symbol)" in (
      title) and "curve leaves out boundaries" in title
