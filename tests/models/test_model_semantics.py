"""Semantics of the models against hand-computed and statistical
expectations: the learned embedding's init scale, the keep rate of every
dropout site (each given a different rate so a swapped rate shows), the
tied decoder's optional projection, and the tree accuracy's masking."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sorjax import trees
from sorjax.cells import make
from sorjax.models import LanguageModel
from sorjax.models.tree_classifier import loss_and_accuracy
from sorjax.training.tasks.trees import TreeTask
from sorjax.trees import Tree

KEY = jax.random.key(0)


# ---------------------------------------------------------------- embedding

def test_learned_embedding_init_std_is_one_over_sqrt_embed_size():
  V, E = 4000, 16                       # 64k entries: std known to ~0.3 %
  model = LanguageModel([make("rnn", hidden_size=4)], vocab_size=V,
                        embed_size=E)
  toks = jnp.zeros((1, 2), jnp.int32)
  table = np.asarray(model.init(KEY, toks)["params"]["embedding"])
  assert table.shape == (V, E)
  assert abs(table.std() - 0.25) < 0.01, table.std()     # 1/sqrt(16)
  assert abs(table.mean()) < 0.01


def test_uniform_embedding_init_is_u_of_minus_to_plus_0_1():
  """Mahto et al. 3.1.1: "embedding weights were uniformly initialized in
  the interval [-0.1, 0.1]": U(-0.1, 0.1) has sd 0.1 / sqrt(3)."""
  V, E = 4000, 16
  model = LanguageModel([make("rnn", hidden_size=4)], vocab_size=V,
                        embed_size=E, embed_init="uniform_0.1")
  toks = jnp.zeros((1, 2), jnp.int32)
  table = np.asarray(model.init(KEY, toks)["params"]["embedding"])
  assert table.min() >= -0.1 and table.max() <= 0.1
  assert table.min() < -0.099 and table.max() > 0.099
  assert abs(table.std() - 0.1 / np.sqrt(3)) < 0.001, table.std()
  assert abs(table.mean()) < 0.002
  with pytest.raises(ValueError, match=r"LanguageModel: embed_init must be "
                     r"one of \('normal', 'uniform_0.1'\), got 'xavier'"):
    LanguageModel([make("rnn", hidden_size=4)], vocab_size=V, embed_size=E,
                  embed_init="xavier")


def test_embedding_dropout_keeps_one_minus_p_of_the_word_types():
  V, E, p = 2000, 4, 0.2
  model = LanguageModel([make("rnn", hidden_size=3)], vocab_size=V,
                        embed_size=E, embedding_dropout=p)
  toks = jnp.arange(V, dtype=jnp.int32)[None, :]     # every word type once
  variables = model.init(KEY, toks)
  table = np.asarray(variables["params"]["embedding"])
  _, state = model.apply(variables, toks, deterministic=False,
                         rngs={"dropout": jax.random.key(3)},
                         mutable="intermediates")
  x = np.asarray(state["intermediates"]["embedded"][0])[0]    # [V, E]
  dropped = np.all(x == 0, axis=1)
  # about 20 % of the types dropped (sd ~0.9 %), not 80 %
  assert 0.16 < dropped.mean() < 0.24, dropped.mean()
  np.testing.assert_allclose(x[~dropped], table[~dropped] / (1.0 - p),
                             rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- dropout

def test_weight_drop_keeps_one_minus_p_of_the_recurrent_matrix():
  H, p = 64, 0.2
  model = LanguageModel([make("rnn", hidden_size=H)], vocab_size=5,
                        embed_size=3, weight_drop=p)
  toks = jnp.zeros((1, 2), jnp.int32)
  variables = model.init(KEY, toks)
  layer = variables["params"]["layer_0"]
  out = model.apply(variables,
                    method=lambda m: m._weight_drop(0, m.cells[0], layer),
                    rngs={"dropout": jax.random.key(4)})
  W, Wd = np.asarray(layer["W"]), np.asarray(out["W"])
  assert np.all(W != 0)
  kept = Wd != 0
  # 4096 entries: keep fraction 0.8 (sd ~0.6 %), not 0.2
  assert 0.77 < kept.mean() < 0.83, kept.mean()
  np.testing.assert_allclose(Wd[kept], W[kept] / (1.0 - p), rtol=1e-5)
  # the input matrix is untouched
  np.testing.assert_array_equal(np.asarray(out["U"]), np.asarray(layer["U"]))


def test_each_dropout_site_uses_its_own_rate():
  rates = {"input": 0.1, "hidden": 0.5, "output": 0.8}
  F, B, T = 32, 8, 16                   # 4096 activations per site
  model = LanguageModel([make("rnn", hidden_size=F)] * 2, vocab_size=11,
                        embed_size=F, input_dropout=rates["input"],
                        hidden_dropout=rates["hidden"],
                        output_dropout=rates["output"])
  toks = jax.random.randint(jax.random.key(1), (B, T), 0, 11)
  variables = model.init(KEY, toks)
  _, state = model.apply(variables, toks, deterministic=False,
                         rngs={"dropout": jax.random.key(9)},
                         capture_intermediates=True, mutable="intermediates")
  inter = state["intermediates"]
  for site, name in (("input", "input_dropout"),
                     ("hidden", "hidden_dropout_0"),
                     ("output", "output_dropout")):
    y = np.asarray(inter[name]["__call__"][0])
    zero = (y == 0).mean()
    assert abs(zero - rates[site]) < 0.04, (site, zero)
  # the sown outputs around output dropout agree with its rate and scale
  before = np.asarray(inter["last_outputs"][0])
  after = np.asarray(inter["last_outputs_dropped"][0])
  kept = after != 0
  assert abs(kept.mean() - 0.2) < 0.04, kept.mean()
  np.testing.assert_allclose(after[kept], before[kept] / 0.2, rtol=1e-5,
                             atol=1e-6)


# ---------------------------------------------------------------- tying

def test_tied_projection_only_when_sizes_differ():
  V, E = 9, 6
  toks = jnp.zeros((2, 3), jnp.int32)
  same = LanguageModel([make("rnn", hidden_size=E)], vocab_size=V,
                       embed_size=E, tie_embedding=True, tie_projection=True)
  params = same.init(KEY, toks)["params"]
  assert set(params) == {"embedding", "layer_0", "decoder_bias"}
  n_layer = sum(a.size for a in jax.tree_util.tree_leaves(params["layer_0"]))
  total = sum(a.size for a in jax.tree_util.tree_leaves(params))
  assert total == V * E + n_layer + V      # table, layer, bias; nothing else
  assert n_layer == E * E + E * E + E      # rnn: U, W, b
  # logits = h E^T + b exactly (no projection in between)
  logits, _ = same.apply({"params": params}, toks)
  _, state = same.apply({"params": params}, toks, mutable="intermediates")
  h = np.asarray(state["intermediates"]["last_outputs"][0], np.float64)
  np.testing.assert_allclose(
      np.asarray(logits), h @ np.asarray(params["embedding"]).T
      + np.asarray(params["decoder_bias"]), rtol=1e-5, atol=1e-5)

  other = LanguageModel([make("rnn", hidden_size=E + 2)], vocab_size=V,
                        embed_size=E, tie_embedding=True, tie_projection=True)
  params = other.init(KEY, toks)["params"]
  assert params["projection"]["kernel"].shape == (E + 2, E)
  assert "bias" not in params["projection"]


# ---------------------------------------------------------------- trees

def labelled_batch():
  """Two per-node schedules labelled only at the root (roots 1 and 0), so
  most node slots are unlabelled (-1) or padding."""
  t1 = Tree("1", (Tree(word=1), Tree(children=(Tree(word=2),
                                                Tree(word=3)))))
  t2 = Tree("0", (Tree(word=4), Tree(word=5)))
  sched = trees.encode([t1, t2])
  labels = np.asarray(sched.labels)
  assert (labels >= 0).sum() == 2 and (labels < 0).sum() >= 6
  return sched


def hand_logits(sched, C=3):
  """Every slot argmaxes to class 0 (logit 2 on class 0, 0 elsewhere)."""
  B, N = np.asarray(sched.labels).shape
  logits = np.zeros((B, N, C), np.float32)
  logits[..., 0] = 2.0
  return jnp.asarray(logits)


def test_tree_accuracy_counts_labelled_slots_only():
  sched = labelled_batch()
  logits = hand_logits(sched)
  loss, acc = loss_and_accuracy(logits, sched)
  # root of t1 (label 1) is wrong, root of t2 (label 0) right: 1 / 2
  assert float(acc) == 0.5
  lse = np.log(np.exp(2.0) + 2.0)
  np.testing.assert_allclose(float(loss), ((lse - 0.0) + (lse - 2.0)) / 2,
                             rtol=1e-5)
  # root logits [B, C] as well
  root_logits = jnp.asarray(np.tile([2.0, 0.0, 0.0], (2, 1)), jnp.float32)
  _, acc = loss_and_accuracy(root_logits, sched)
  assert float(acc) == 0.5


def test_tree_task_eval_sums_count_labelled_slots_only():
  sched = labelled_batch()
  logits = hand_logits(sched)
  fake = types.SimpleNamespace(per_node=True,
                               _logits=lambda params, batch: logits)
  nll, hits, n = TreeTask._eval_sums(fake, None, sched._asdict())
  assert int(hits) == 1 and int(n) == 2
  lse = np.log(np.exp(2.0) + 2.0)
  np.testing.assert_allclose(float(nll), (lse - 0.0) + (lse - 2.0),
                             rtol=1e-5)


def test_hidden_dropout_on_a_one_layer_stack_is_refused():
  """Between-layer dropout on one layer would drop nothing, silently."""
  with pytest.raises(ValueError, match=r"hidden_dropout=0.3 drops the "
                     r"outputs between layers, and this stack has one layer"):
    LanguageModel([make("rnn", hidden_size=4)], vocab_size=5, embed_size=4,
                  hidden_dropout=0.3).init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))


def test_a_dyck_head_of_one_unit_reads_the_stack_top_only():
  """Renganathan & Singh 4.2: "we inspect the top element of the stack
  ... apply an affine transformation" (the head read the whole state):
  logits are an affine map of unit 0 alone."""
  from sorjax.models import DyckModel
  H, k = 4, 2
  cell = make("dyck_rnn", hidden_size=H, learn_embedding=False)
  model = DyckModel(cells=(cell,), vocab_size=2 * k + 2, embedding="cell",
                    num_outputs=k, head_units=1)
  tokens = jnp.array([[4, 0, 1, 3, 0]], jnp.int32)
  params = model.init(jax.random.key(0), tokens)["params"]
  assert params["head"]["kernel"].shape == (1, k)
  logits, _ = model.apply({"params": params}, tokens)
  from sorjax import unroll
  emb = jnp.asarray(cell.fixed_embedding(k))[tokens]
  _, hs = unroll(cell, params["layer_0"], emb)
  top = np.asarray(hs[..., :1])                 # unit 0, the stack top
  want = top @ np.asarray(params["head"]["kernel"]) + np.asarray(
      params["head"]["bias"])
  np.testing.assert_allclose(logits, want, rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="head_units=5 exceeds the last "
                     "layer's hidden size 4"):
    DyckModel(cells=(cell,), vocab_size=6, embedding="cell", num_outputs=k,
              head_units=5)
