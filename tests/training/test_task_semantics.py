"""What the tasks' losses and batches mean, against NumPy / hand references:
the closing-bracket loss scores closing brackets only, the LM task carries
its TBPTT state across the windows of an epoch, and the loop scales SGD's
step by a batch's lr_scale."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import common
from sorjax.data import corpora
from sorjax.data.vocab import Vocab
from sorjax.training.loop import Trainer
from sorjax.training.tasks import make_task
from tests.experiments import tiny_dyck
from tests.training.toy_task import toy_config


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


# ------------------------------------------------------------ dyck_closing
@pytest.fixture(scope="module")
def closing_task():
  cfg = tiny_dyck.get_config()
  cfg.task = "dyck_closing"
  cfg.data.num_train, cfg.data.num_dev, cfg.data.num_test = 32, 8, 8
  return make_task(cfg)


def test_dyck_closing_loss_is_the_mean_ce_over_closing_targets_only(
    closing_task):
  task = closing_task
  assert task.k == 2   # ids: opens 0, 1; closes 2, 3; START 4; END 5
  targets = np.array([[0, 2, 1, 3, 5],      # closes at t=1 (0), t=3 (1)
                      [1, 3, 2, 3, 3]],     # closes at t=1, 2; t>=3 padding
                     np.int32)
  lengths = np.array([5, 3], np.int32)
  batch = {"inputs": np.zeros_like(targets), "targets": targets,
           "lengths": lengths}
  scored = [(0, 1, 0), (0, 3, 1), (1, 1, 1), (1, 2, 0)]  # (row, t, class)
  logits = np.random.RandomState(0).randn(2, 5, 2).astype(np.float32) * 2.0

  def loss_of(lg):
    task.apply = lambda *a, **kw: (jnp.asarray(lg), None)
    try:
      loss, (carry, m) = task.loss(None, (), batch, None, 1.0, False)
    finally:
      del task.apply
    assert carry == () and int(m["closes"]) == len(scored)
    return float(loss)

  lp = _log_softmax(logits)
  want = -np.mean([lp[r, t, c] for r, t, c in scored])
  np.testing.assert_allclose(loss_of(logits), want, rtol=1e-5)

  # Logits at opens, END and padded steps do not count...
  other = logits.copy()
  for r, t in [(0, 0), (0, 2), (0, 4), (1, 0), (1, 3), (1, 4)]:
    other[r, t] = np.array([9.0, -7.0], np.float32)
  np.testing.assert_allclose(loss_of(other), want, rtol=1e-5)
  # ...and those at a closing bracket do.
  moved = logits.copy()
  moved[0, 3] = np.array([9.0, -7.0], np.float32)
  assert abs(loss_of(moved) - want) > 1e-2


# ------------------------------------------------------------ lm (TBPTT)
B, BPTT, WINDOWS, V = 2, 4, 5, 7


@pytest.fixture
def lm_task(monkeypatch):
  """The LM task on a tiny synthetic corpus (load_corpus replaced)."""
  vocab = Vocab(["<unk>", "<eos>", "a", "b", "c", "d", "e"])
  rs = np.random.RandomState(1)
  ids = {s: rs.randint(0, V, B * (BPTT * WINDOWS + 1)).astype(np.int32)
         for s in ("train", "valid", "test")}
  monkeypatch.setattr(corpora, "load_corpus",
                      lambda name, split, *a, **kw: (ids[split], vocab))
  cfg = common.config(
      "lm", common.lm_data(corpus="ptb", batch_size=B, bptt=BPTT,
                           eval_batch_size=B, eval_bptt=BPTT),
      cell="lstm", hidden_size=8, embed_size=8)
  return make_task(cfg)


def test_lm_epoch_resets_the_carry_at_its_first_batch_only(lm_task):
  for epoch in (0, 1):
    got = list(lm_task.train_batches(epoch, None))
    assert len(got) == WINDOWS
    assert [bool(b["reset"]) for b, _ in got] == [True] + [False] * (
        WINDOWS - 1)
  # Resuming mid-epoch continues the saved carry: no reset at all.
  _, pos = got[1]
  rest = list(lm_task.train_batches(1, pos))
  assert len(rest) == WINDOWS - 2
  assert not any(bool(b["reset"]) for b, _ in rest)


def test_lm_second_window_continues_the_first_windows_state(lm_task):
  """The loss of window 2, with the carry window 1 leaves, equals the
  cross-entropy (NumPy) of those targets in one pass over both windows."""
  task = lm_task
  params = task.init_params(jax.random.key(0))
  (b1, _), (b2, _) = list(task.train_batches(0, None))[:2]
  np.testing.assert_array_equal(b2["inputs"][:, 0], b1["targets"][:, -1])
  carry = task.init_carry(params)
  _, (carry, _) = task.loss(params, carry, b1, None, 1.0, False)
  loss2, _ = task.loss(params, carry, b2, None, 1.0, False)

  inputs = np.concatenate([b1["inputs"], b2["inputs"]], 1)
  logits, _ = task.apply(params, jnp.asarray(inputs),
                         jnp.full((B,), 2 * BPTT, jnp.int32),
                         task.init_carry(params))
  lp = _log_softmax(logits)[:, BPTT:]
  want = -np.mean(np.take_along_axis(lp, b2["targets"][..., None], -1))
  np.testing.assert_allclose(float(loss2), want, rtol=1e-5)
  # The carry matters: from a fresh state window 2 scores differently.
  fresh = -np.mean(np.take_along_axis(
      _log_softmax(task.apply(params, jnp.asarray(b2["inputs"]),
                              jnp.full((B,), BPTT, jnp.int32),
                              task.init_carry(params))[0]),
      b2["targets"][..., None], -1))
  assert abs(fresh - want) > 1e-4


def test_lm_evaluate_is_the_mean_nll_of_one_pass_over_each_stream(
    monkeypatch):
  """Evaluation in windows of eval_bptt with the carry passed on, the last
  window partial (padded to eval_bptt), equals one pass over each whole
  stream: the mean NLL of every target and no padding (NumPy)."""
  vocab = Vocab(["<unk>", "<eos>", "a", "b", "c", "d", "e"])
  rs = np.random.RandomState(2)
  stream = 2 * BPTT + 3                  # 10 targets a stream: 4, 4, 2
  ids = {s: rs.randint(0, V, B * stream).astype(np.int32)
         for s in ("train", "valid", "test")}
  monkeypatch.setattr(corpora, "load_corpus",
                      lambda name, split, *a, **kw: (ids[split], vocab))
  task = make_task(common.config(
      "lm", common.lm_data(corpus="ptb", batch_size=B, bptt=BPTT,
                           eval_batch_size=B, eval_bptt=BPTT),
      cell="lstm", hidden_size=8, embed_size=8))
  params = task.init_params(jax.random.key(1))
  # away from the initial near-uniform predictions, where every token's
  # loss is about log V and any mask gives the same mean
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(2), len(leaves))
  params = jax.tree.unflatten(tree, [
      w + jax.random.normal(k, w.shape, w.dtype) for w, k in zip(leaves, keys)])
  rows = ids["valid"].reshape(B, stream)
  logits, _ = task.apply(params, jnp.asarray(rows[:, :-1]),
                         jnp.full((B,), stream - 1, jnp.int32),
                         task.init_carry(params))
  lp = _log_softmax(logits)
  want = -np.mean(np.take_along_axis(lp, rows[:, 1:, None], -1))
  got = task.evaluate(params, "valid", 1.0)
  np.testing.assert_allclose(got["loss"], want, rtol=1e-5)


def test_lm_test_split_streams_in_test_batch_size(monkeypatch):
  """data.test_batch_size=1 (AWD-LSTM's test batch): the test split is one
  stream whose state runs through all of it, its loss the mean NLL of one
  pass over the whole split; valid keeps eval_batch_size streams."""
  vocab = Vocab(["<unk>", "<eos>", "a", "b", "c", "d", "e"])
  rs = np.random.RandomState(4)
  n = B * (2 * BPTT + 3)                         # 22 tokens a split
  ids = {s: rs.randint(0, V, n).astype(np.int32)
         for s in ("train", "valid", "test")}
  monkeypatch.setattr(corpora, "load_corpus",
                      lambda name, split, *a, **kw: (ids[split], vocab))
  task = make_task(common.config(
      "lm", common.lm_data(corpus="ptb", batch_size=B, bptt=BPTT,
                           eval_batch_size=B, eval_bptt=BPTT,
                           test_batch_size=1),
      cell="lstm", hidden_size=8, embed_size=8))
  assert (task.eval_streams("test"), task.eval_streams("valid")) == (1, B)
  params = task.init_params(jax.random.key(1))
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(2), len(leaves))
  params = jax.tree.unflatten(tree, [
      w + jax.random.normal(k, w.shape, w.dtype) for w, k in zip(leaves, keys)])

  def one_pass(rows):
    logits, _ = task.apply(params, jnp.asarray(rows[:, :-1]),
                           jnp.full((rows.shape[0],), rows.shape[1] - 1,
                                    jnp.int32),
                           task.model.initial_carries(params, rows.shape[0]))
    lp = _log_softmax(logits)
    return -np.mean(np.take_along_axis(lp, rows[:, 1:, None], -1))

  np.testing.assert_allclose(task.evaluate(params, "test", 1.0)["loss"],
                             one_pass(ids["test"][None, :]), rtol=1e-5)
  np.testing.assert_allclose(task.evaluate(params, "valid", 1.0)["loss"],
                             one_pass(ids["valid"].reshape(B, -1)), rtol=1e-5)
  windows = list(task.token_losses(params, "test", 1.0))
  assert {w[1].shape[0] for w in windows} == {1}
  assert sum(int(w[2][0]) for w in windows) == n - 1


def test_lm_bits_per_char_counts_the_characters_of_bigram_symbols(
    monkeypatch):
  """On the character-bigram corpus a symbol stands for its characters
  (<eos> and <unk> for one): bits per char = total nll / characters."""
  vocab = Vocab(["<unk>", "<eos>", "ab", "c", "de", "f", "gh"])
  width = {0: 1, 1: 1, 2: 2, 3: 1, 4: 2, 5: 1, 6: 2}
  rs = np.random.RandomState(3)
  stream = 2 * BPTT + 1
  ids = {s: rs.randint(0, V, B * stream).astype(np.int32)
         for s in ("train", "valid", "test")}
  monkeypatch.setattr(corpora, "load_corpus",
                      lambda name, split, *a, **kw: (ids[split], vocab))
  task = make_task(common.config(
      "lm", common.lm_data(corpus="ptb_char_maupome_bigram", batch_size=B,
                           bptt=BPTT, eval_batch_size=B, eval_bptt=BPTT),
      cell="lstm", hidden_size=8, embed_size=8))
  params = task.init_params(jax.random.key(1))
  got = task.evaluate(params, "valid", 1.0)
  targets = ids["valid"].reshape(B, stream)[:, 1:]
  chars = sum(width[int(t)] for t in targets.ravel())
  nll = got["loss"] * targets.size
  np.testing.assert_allclose(got["bits_per_char"],
                             nll / chars / np.log(2), rtol=1e-6)


# ------------------------------------------------------------ loop lr_scale
class ScaledLinearTask:
  """One batch an epoch of least squares, with a fixed start and an
  lr_scale field in the batch (as the LM task's variable BPTT gives)."""
  name, vocab = "scaled_linear", None
  w0 = np.array([0.3, -0.2, 0.1], np.float32)

  def __init__(self, lr_scale):
    rs = np.random.RandomState(0)
    self.x = rs.randn(8, 3).astype(np.float32)
    self.y = rs.randn(8).astype(np.float32)
    self.lr_scale = lr_scale

  def init_params(self, rng):
    del rng
    return {"w": jnp.asarray(self.w0)}

  def init_carry(self, params):
    return ()

  def num_train_batches(self):
    return 1

  def train_batches(self, epoch, position):
    yield ({"x": self.x, "y": self.y,
            "lr_scale": np.float32(self.lr_scale)}, {"batch": 1})

  def loss(self, params, carry, batch, rng, temperature, train):
    pred = batch["x"] @ params["w"]
    return jnp.mean((pred - batch["y"]) ** 2), (carry, {})

  def evaluate(self, params, split, temperature):
    return {"loss": float(np.mean((self.x @ np.asarray(params["w"])
                                   - self.y) ** 2))}

  def eval_splits(self):
    return ("valid",)


def test_sgd_step_is_scaled_by_the_batch_lr_scale(tmp_path):
  cfg = toy_config(num_epochs=1)
  lr = float(cfg.optim.learning_rate)
  updates = {}
  for s in (1.0, 0.5):
    task = ScaledLinearTask(s)
    state = Trainer(task, cfg, str(tmp_path / str(s))).run()
    updates[s] = np.asarray(state.params["w"][0], np.float64) - task.w0
  x, y, w0 = (a.astype(np.float64) for a in (task.x, task.y, task.w0))
  grad = 2.0 / len(y) * x.T @ (x @ w0 - y)
  np.testing.assert_allclose(updates[1.0], -lr * grad, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(updates[0.5], -0.5 * lr * grad, rtol=1e-4,
                             atol=1e-7)
  np.testing.assert_allclose(updates[0.5], 0.5 * updates[1.0], rtol=1e-4,
                             atol=1e-7)


def test_lm_pad_to_without_variable_windows_is_refused(monkeypatch):
  """data.pad_to only pads variable-length windows; with fixed ones it
  would be ignored."""
  from sorjax.training.tasks.common import ConfigError
  vocab = Vocab(["<unk>", "<eos>", "a", "b", "c", "d", "e"])
  ids = np.arange(200, dtype=np.int32) % V
  monkeypatch.setattr(corpora, "load_corpus",
                      lambda name, split, *a, **kw: (ids, vocab))
  cfg = common.config(
      "lm", common.lm_data(corpus="ptb", batch_size=B, bptt=BPTT,
                           eval_batch_size=B, eval_bptt=BPTT, pad_to=16),
      cell="lstm", hidden_size=8, embed_size=8)
  with pytest.raises(ConfigError, match="data.pad_to=16 pads AWD-LSTM's "
                     "variable windows"):
    make_task(cfg)
  cfg.data.variable_bptt = True
  assert make_task(cfg).batcher.pad_to == 16
