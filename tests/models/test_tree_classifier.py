"""TreeClassifier: wiring against trees.run, the loss against NumPy, the
paper's initialisation, and training on a toy keyword task (Le & Zuidema
sec. 3 in miniature: the root's class is the one keyword's)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import sorjax
from sorjax import trees
from sorjax.models.tree_classifier import TreeClassifier, loss_and_accuracy
from sorjax.trees import Tree


def key(seed):
  """PRNG keys of the "rbg" implementation: on CPU their random ops compile
  several times faster than threefry's, which dominates these tests."""
  return jax.random.key(seed, impl="rbg")


KEYWORDS, VOCAB = 4, 16   # words 0..3 are keywords (class = the word), 4..15 noise


def random_tree(rng, words):
  if len(words) == 1:
    return Tree(word=words[0])
  k = int(rng.integers(1, len(words)))
  return Tree(children=(random_tree(rng, words[:k]),
                        random_tree(rng, words[k:])))


def keyword_batch(seed, B=32):
  """Random binary trees over 2-6 noise words with one keyword somewhere."""
  rng = np.random.default_rng(seed)
  batch = []
  for _ in range(B):
    n = int(rng.integers(2, 7))
    words = [int(w) for w in rng.integers(KEYWORDS, VOCAB, size=n)]
    keyword = int(rng.integers(KEYWORDS))
    words[int(rng.integers(n))] = keyword
    t = random_tree(rng, words)
    batch.append(Tree(str(keyword), t.children))
  return trees.encode(batch)


@pytest.fixture(scope="module")
def schedule():
  return keyword_batch(0, B=256)


def test_params_and_paper_initialisation(schedule):
  model = TreeClassifier(vocab_size=VOCAB, num_classes=KEYWORDS)
  shapes = jax.eval_shape(model.init, key(0), schedule)["params"]
  assert shapes["embedding"].shape == (VOCAB, 50)     # n = 50 (sec. 3)
  assert shapes["classifier"]["kernel"].shape == (50, KEYWORDS)
  assert set(shapes["cell"]) == {"W_if", "b_if", "W_c", "b_c", "W_o", "W_co",
                                 "b_o"}               # tree_lstm by default
  cell = sorjax.cells.make("tree_rnn", hidden_size=8)
  for embed_init, lo, hi in (("le_zuidema", 3e-5, 1e-4), ("normal", 0.7, 1.3)):
    model = TreeClassifier(vocab_size=VOCAB, num_classes=KEYWORDS, cell=cell,
                           embed_init=embed_init)
    e = np.asarray(jax.jit(model.init)(key(0), schedule)[
        "params"]["embedding"])
    assert lo < e.std() < hi, (embed_init, e.std())
    if embed_init == "le_zuidema":                    # U(-1e-4, 1e-4)
      assert np.abs(e).max() <= 1e-4


@pytest.mark.parametrize("per_node", [False, True])
def test_logits_are_the_classifier_on_run_states(schedule, per_node):
  cell = sorjax.cells.make("tree_rnn", hidden_size=6)
  model = TreeClassifier(vocab_size=VOCAB, num_classes=KEYWORDS, cell=cell,
                         per_node=per_node, embed_init="normal")
  params = jax.jit(model.init)(key(1), schedule)["params"]
  logits = jax.jit(model.apply)({"params": params}, schedule)
  x = params["embedding"][schedule.tokens]
  states, roots = jax.jit(trees.run, static_argnums=0)(
      cell, params["cell"], x, schedule)
  h = np.asarray(states.h if per_node else roots.h, np.float64)
  k = np.asarray(params["classifier"]["kernel"], np.float64)
  b = np.asarray(params["classifier"]["bias"], np.float64)
  B, N = schedule.node_mask.shape
  assert logits.shape == ((B, N, KEYWORDS) if per_node else (B, KEYWORDS))
  np.testing.assert_allclose(logits, h @ k + b, rtol=1e-5, atol=1e-5)


def _np_cross_entropy(logits, labels):
  logits = np.asarray(logits, np.float64)
  losses, hits = [], []
  for idx in np.ndindex(labels.shape):
    if labels[idx] < 0:
      continue
    z = logits[idx]
    losses.append(math.log(np.exp(z - z.max()).sum()) + z.max() - z[labels[idx]])
    hits.append(z.argmax() == labels[idx])
  return np.mean(losses), np.mean(hits)


def test_loss_and_accuracy_against_numpy():
  s = trees.encode([trees.parse("(3 (2 a) (4 (0 b) (3 c)))"),
                    Tree("1", (Tree(None, word="a"), Tree("1", word="b"))),
                    Tree(None, (Tree("2", word="a"), Tree("1", word="b")))],
                   lambda w: 0)
  rng = np.random.default_rng(0)
  per_node = jnp.asarray(rng.normal(size=s.labels.shape + (5,)), jnp.float32)
  loss_acc = jax.jit(loss_and_accuracy)
  loss, acc = loss_acc(per_node, s)
  ref_loss, ref_acc = _np_cross_entropy(per_node, s.labels)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  np.testing.assert_allclose(acc, ref_acc)
  roots = per_node[:, 0]
  root_labels = np.array([3, 1, -1])   # the third root has no label
  loss, acc = loss_acc(roots, s)
  ref_loss, ref_acc = _np_cross_entropy(roots, root_labels)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  np.testing.assert_allclose(acc, ref_acc)
  with pytest.raises(ValueError, match=r"logits \(3, 4, 5\) do not match"):
    loss_and_accuracy(per_node[:, :4], s)
  # a label >= C (here 4 with 4 classes) made the loss NaN
  with pytest.raises(ValueError, match=r"loss_and_accuracy: schedule.labels "
                     r"must be in \[0, the logits' classes=4\), got 4 at "
                     r"\[0, 3\]"):
    loss_and_accuracy(per_node[..., :4], s)
  with pytest.raises(ValueError, match=r"got 3 at \[0\]"):
    loss_and_accuracy(roots[:, :3], s)


def test_word_ids_outside_the_vocabulary_are_refused(schedule):
  """An id >= vocab_size embedded as NaN (a clamped gather's fill)."""
  model = TreeClassifier(vocab_size=5, num_classes=3,
                         cell=sorjax.cells.make("tree_rnn", hidden_size=4))
  s = trees.encode([((1, 2), (3, 12))])
  with pytest.raises(ValueError, match=r"TreeClassifier: schedule.tokens "
                     r"\(word ids\) must be in \[0, vocab_size=5\), got 12 "
                     r"at \[0, 3\]"):
    model.init(key(0), s)
  ok = trees.encode([((1, 2), (3, 4))])
  v = model.init(key(0), ok)
  assert np.isfinite(np.asarray(model.apply(v, ok))).all()


def test_bad_configuration_is_reported(schedule):
  with pytest.raises(ValueError, match="TreeClassifier: vocab_size must be an "
                     "int >= 1, got 0"):
    TreeClassifier(vocab_size=0, num_classes=3)
  with pytest.raises(ValueError, match="TreeClassifier: num_classes"):
    TreeClassifier(vocab_size=3, num_classes=-1)
  with pytest.raises(ValueError, match="TreeClassifier: embed_init must be "
                     "one of"):
    TreeClassifier(vocab_size=3, num_classes=3, embed_init="xavier")
  with pytest.raises(ValueError, match="TreeClassifier: cell must be a tree "
                     "cell"):
    TreeClassifier(vocab_size=3, num_classes=3,
                   cell=sorjax.cells.make("lstm", hidden_size=4))


@pytest.mark.parametrize("name", ["tree_rnn", "tree_lstm"])
def test_learns_the_keyword_task(schedule, name):
  model = TreeClassifier(vocab_size=VOCAB, num_classes=KEYWORDS,
                         cell=sorjax.cells.make(name, hidden_size=12))
  params = jax.jit(model.init)(key(0), schedule)["params"]
  opt = optax.adam(0.05)

  @jax.jit
  def step(params, state):
    def loss(p):
      return loss_and_accuracy(model.apply({"params": p}, schedule), schedule)
    (l, acc), g = jax.value_and_grad(loss, has_aux=True)(params)
    with jax.numpy_dtype_promotion("standard"):  # optax's step count is int32
      updates, state = opt.update(g, state, params)
    return optax.apply_updates(params, updates), state, l, acc

  state = opt.init(params)
  losses = []
  for _ in range(30):
    params, state, l, acc = step(params, state)
    losses.append(float(l))
  # Word vectors of size ~1e-4 make every root ~0: the first loss is log C.
  assert abs(losses[0] - math.log(KEYWORDS)) < 1e-3
  assert losses[-1] < 0.3 * losses[0], losses
  test = keyword_batch(1, B=64)  # unseen trees; chance is 0.25
  _, acc = jax.jit(lambda p: loss_and_accuracy(model.apply({"params": p},
                                                            test), test))(params)
  assert acc > 0.8, float(acc)
