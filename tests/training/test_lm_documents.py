"""The LM task's documents (one line each, from h_0; Maupome & Meurs 4) and
k-fold splits, against NumPy references on a tiny synthetic corpus."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import common
from sorjax.analysis.perplexity import perplexity, token_nll
from sorjax.data import batching, corpora
from sorjax.data.vocab import Vocab
from sorjax.training.tasks import make_task
from sorjax.training.tasks.common import ConfigError

EOS = 1
VOCAB = Vocab(["<unk>", "<eos>", "a", "b", "c", "de", "f"])
WIDTH = np.array([1, 1, 1, 1, 1, 2, 1])     # characters per symbol


def _lines(seed, n, longest=9):
  rs = np.random.RandomState(seed)
  return [rs.randint(2, 7, rs.randint(0, longest + 1)) for _ in range(n)]


def _stream(lines):
  return np.concatenate([np.append(l, EOS) for l in lines]).astype(np.int32)


LINES = {"train": _lines(0, 23), "valid": _lines(1, 7), "test": _lines(2, 6)}


@pytest.fixture
def corpus(monkeypatch):
  ids = {s: _stream(v) for s, v in LINES.items()}
  monkeypatch.setattr(corpora, "load_corpus",
                      lambda name, split, *a, **kw: (ids[split], VOCAB))
  return ids


def _config(**data):
  kw = dict(corpus="ptb_char_maupome_bigram", batch_size=4, bptt=None,
            eval_batch_size=3, eval_bptt=None, documents=True,
            num_buckets=3, bucket_multiple=2)
  kw.update(data)
  return common.config("lm", common.lm_data(**kw), cell="lstm",
                       hidden_size=8, embed_size=8)


def _perturbed(task, seed=1):
  """Parameters away from the near-uniform start, where any mask of the
  loss would give about log V."""
  params = task.init_params(jax.random.key(seed))
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return jax.tree.unflatten(tree, [w + jax.random.normal(k, w.shape, w.dtype)
                                   for w, k in zip(leaves, keys)])


def _line_nll(task, params, line):
  """NumPy reference: one line read alone from the zero state, <eos> first
  in, each symbol and then <eos> out; per-target NLL."""
  x = np.concatenate([[EOS], line]).astype(np.int32)
  y = np.append(line, EOS)
  logits, _ = task.apply(params, jnp.asarray(x[None]),
                         jnp.asarray([x.size], jnp.int32),
                         task.model.initial_carries(params, 1))
  z = np.asarray(logits[0], np.float64)
  lp = z - z.max(-1, keepdims=True)
  lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
  return -lp[np.arange(y.size), y], y


def test_train_batches_hold_whole_lines_each_once_from_the_zero_state(
    corpus):
  task = make_task(_config())
  seen = []
  for batch, pos in task.train_batches(0, None):
    assert bool(batch["reset"]) and "lr_scale" not in batch
    B, T = batch["inputs"].shape
    assert B == 4 and T in task.boundaries
    for r in range(B):
      n = int(batch["lengths"][r])
      if n == 0:                                   # a filler row
        continue
      x, y = batch["inputs"][r, :n], batch["targets"][r, :n]
      assert x[0] == EOS and y[-1] == EOS
      np.testing.assert_array_equal(x[1:], y[:-1])
      assert not batch["inputs"][r, n:].any()
      seen.append(tuple(y[:-1]))
  assert sorted(seen) == sorted(tuple(l) for l in LINES["train"])
  # resuming after the second batch gives the rest of the same epoch
  again = list(task.train_batches(1, None))
  rest = list(task.train_batches(1, again[1][1]))
  assert len(rest) == len(again) - 2
  for (a, _), (b, _) in zip(again[2:], rest):
    np.testing.assert_array_equal(a["inputs"], b["inputs"])


def test_loss_is_the_mean_nll_of_the_batchs_lines_each_read_alone(corpus):
  task = make_task(_config())
  params = _perturbed(task)
  batch, _ = next(task.train_batches(0, None))
  stale = jax.tree.map(jnp.ones_like, task.init_carry(params))
  loss, _ = task.loss(params, stale, batch, None, 1.0, False)
  nll = [_line_nll(task, params, batch["targets"][r, :n - 1])[0]
         for r, n in enumerate(batch["lengths"]) if n]
  np.testing.assert_allclose(float(loss), np.concatenate(nll).mean(),
                             rtol=1e-5)


def test_evaluate_scores_every_line_and_its_eos_from_the_zero_state(corpus):
  task = make_task(_config())
  params = _perturbed(task)
  got = task.evaluate(params, "test", 1.0)
  per_line = [_line_nll(task, params, l) for l in LINES["test"]]
  nll = np.concatenate([p[0] for p in per_line])
  chars = sum(WIDTH[p[1]].sum() for p in per_line)
  np.testing.assert_allclose(got["loss"], nll.mean(), rtol=1e-5)
  np.testing.assert_allclose(got["bits_per_char"], nll.sum() / chars
                             / np.log(2), rtol=1e-5)
  np.testing.assert_allclose(
      got["document_loss"], np.mean([p[0].mean() for p in per_line]),
      rtol=1e-5)
  np.testing.assert_allclose(
      got["document_bits_per_char"],
      np.mean([p[0].sum() / WIDTH[p[1]].sum() for p in per_line])
      / np.log(2), rtol=1e-5)
  assert set(task.metric_names()) == set(got)
  # the perplexity analysis reports the documents' metrics too

  class Run:
    pass

  run = Run()
  run.task, run.params = task, params
  ppl = perplexity(run, "test", 1.0)
  for k in ("loss", "bits_per_char", "document_loss",
            "document_bits_per_char"):
    assert ppl["cross_entropy" if k == "loss" else k] == pytest.approx(
        got[k], rel=1e-12)


def test_token_nll_covers_the_split_stream_in_order(corpus):
  """Every token of a documents split is scored once, at its own index;
  streams leave each row's first token out."""

  class Run:
    pass

  run = Run()
  run.task = make_task(_config())
  run.params, run.config = _perturbed(run.task), run.task.data_cfg
  out = token_nll(run, "valid", 1.0)
  np.testing.assert_array_equal(out.index, np.arange(corpus["valid"].size))
  np.testing.assert_array_equal(out.targets, corpus["valid"])
  first, y = _line_nll(run.task, run.params, LINES["valid"][0])
  np.testing.assert_allclose(out.nll[:y.size], first, rtol=1e-5)

  run.task = make_task(_config(documents=False, bptt=3, eval_bptt=3,
                               num_buckets=16, bucket_multiple=8,
                               eval_batch_size=2))
  out = token_nll(run, "valid", 1.0)
  N = corpus["valid"].size // 2
  np.testing.assert_array_equal(
      out.index, np.concatenate([np.arange(1, N), N + np.arange(1, N)]))
  np.testing.assert_array_equal(out.targets, corpus["valid"][out.index])


def test_folds_pool_the_lines_and_test_each_in_exactly_one_fold(corpus):
  lines = [tuple(l) for s in ("train", "valid", "test") for l in LINES[s]]
  tested = []
  for f in range(3):
    task = make_task(_config(folds=3, fold=f, fold_valid_fraction=0.25))
    want = batching.kfold(len(lines), 3, seed=0, valid_fraction=0.25)[f]
    for s, idx in (("train", want.train), ("valid", want.valid),
                   ("test", want.test)):
      docs = batching.split_documents(task.split_ids[s], EOS)
      assert [tuple(d[:-1]) for d in docs] == [lines[i] for i in idx]
    assert task.fold_lines == {"train": want.train.size,
                               "valid": want.valid.size,
                               "test": want.test.size}
    tested += [lines[i] for i in want.test]
  assert sorted(tested) == sorted(lines)
  # streams read the same fold's lines
  task = make_task(_config(folds=3, fold=1, documents=False, bptt=3,
                           eval_bptt=3, num_buckets=16, bucket_multiple=8,
                           eval_batch_size=2))
  docs = batching.split_documents(task.split_ids["test"], EOS)
  assert [tuple(d[:-1]) for d in docs] == [
      lines[i] for i in batching.kfold(len(lines), 3, valid_fraction=0.1)[1]
      .test]


@pytest.mark.parametrize("data, match", [
    (dict(bptt=50), r"data.bptt=50 cuts streams into windows; "
                    r"data.documents reads whole lines"),
    (dict(eval_bptt=50), r"data.eval_bptt=50 cuts streams"),
    (dict(variable_bptt=True), r"data.variable_bptt varies"),
    (dict(documents=False, bptt=5, eval_bptt=5),
     r"data.bucket_multiple=2 buckets the lines of data.documents=True"),
    (dict(fold=2), r"data.fold=2 is read with data.folds"),
    (dict(fold_seed=3), r"data.fold_seed=3 is read with data.folds"),
    (dict(folds=3, fold=3), r"data.fold=3: data.folds=3 numbers the folds "
                            r"0..2"),
    (dict(folds=1), r"data.folds must be an int >= 2"),
    (dict(folds=3, fold_valid_fraction=0.0),
     r"data.fold_valid_fraction must be a finite number in \(0, 1\)"),
    (dict(folds=3, fold_valid_fraction=0.01),
     r"data.fold_valid_fraction=0.01 holds out no line"),
    (dict(folds=3, fold_valid_fraction=0.99),
     r"data.fold_valid_fraction=0.99 holds out all \d+ non-test lines of "
     r"fold 0, leaving no line to train on"),
    (dict(folds=50), r"data.folds=50: kfold: num_examples"),
    (dict(num_buckets=0), r"data.num_buckets must be an int >= 1"),
])
def test_unread_or_bad_document_and_fold_fields_are_refused(corpus, data,
                                                            match):
  with pytest.raises(ConfigError, match=match):
    make_task(_config(**data))


def test_the_trace_analyses_read_lines_from_the_zero_state(corpus):
  from sorjax.analysis import traces
  task = make_task(_config())
  tokens, lengths = traces.sample(task, "valid", 2)
  for r, line in enumerate(LINES["valid"][:2]):
    assert lengths[r] == line.size + 1
    np.testing.assert_array_equal(tokens[r, :lengths[r]],
                                  np.concatenate([[EOS], line]))
  seen = []
  for x, n, carry_over in traces.batches(task, "valid"):
    assert not carry_over
    seen += [tuple(x[r, 1:n[r]]) for r in range(len(n)) if n[r]]
  assert sorted(seen) == sorted(tuple(l) for l in LINES["valid"])
  first = [tuple(x[r, 1:n[r]]) for x, n, _ in traces.batches(
      task, "valid", max_sequences=3) for r in range(len(n)) if n[r]]
  assert sorted(first) == sorted(tuple(l) for l in LINES["valid"][:3])
