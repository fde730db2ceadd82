"""LanguageModel and DyckModel: NumPy references, training, tying, frozen
and fixed embeddings, locked dropout masks, carried state, heads, errors.

Models are initialised and applied compiled (`init`, `apply`) where no
check on concrete values is under test: eagerly, every op of a new shape,
each random draw of `init` among them, compiled a program of its own, most
of these tiny tests' time. Tokens are drawn in NumPy for the same reason.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import sorjax
from sorjax.cells import make
from sorjax.models import FROZEN, DyckModel, LanguageModel
from tests.cells.reference import np_params

KEY = jax.random.key(0)
V, E = 7, 4


def tokens_of(B, T, seed=1, vocab=V):
  return jnp.asarray(np.random.default_rng(seed).integers(0, vocab, (B, T)),
                     jnp.int32)


def init(model, *args, **kw):
  """model.init(KEY, *args, **kw), compiled."""
  return _compiled(model, "init", ())(KEY, *args, **kw)


def apply(model, variables, *args, **kw):
  """model.apply(variables, *args, **kw), compiled: keyword flags (bools,
  strings: deterministic, mutable, capture_intermediates) are static, the
  rest (rngs, lengths, aux arrays) traced."""
  static = tuple(sorted((k, v) for k, v in kw.items()
                        if isinstance(v, (bool, str))))
  traced = {k: v for k, v in kw.items() if not isinstance(v, (bool, str))}
  return _compiled(model, "apply", static)(variables, *args, **traced)


@functools.lru_cache(maxsize=None)
def _compiled(model, method, static):
  """One jitted function per model (they hash by value), method and static
  keywords, reused across calls: no retrace."""
  return jax.jit(functools.partial(getattr(model, method), **dict(static)))


def rnn_hidden(p, x):
  """Elman loop in float64: h_t = tanh(x_t U + h_{t-1} W + b), x [B, T, D]."""
  h, hs = np.zeros((x.shape[0], p["W"].shape[0])), []
  for t in range(x.shape[1]):
    h = np.tanh(x[:, t] @ p["U"] + h @ p["W"] + p["b"])
    hs.append(h)
  return np.stack(hs, 1)


def close(a, b, tol=1e-5):
  np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=tol,
                             atol=tol)


# ---------------------------------------------------------------- forward

def test_logits_shape_and_carries_of_a_mixed_stack():
  model = LanguageModel([make("lstm", hidden_size=6),
                         make("mm_rnn", hidden_size=5, num_matrices=3)],
                        vocab_size=V, embed_size=E)
  toks = tokens_of(2, 6)
  variables = init(model, toks)
  logits, carries = apply(model, variables, toks)
  assert logits.shape == (2, 6, V) and logits.dtype == jnp.float32
  assert carries[0]._fields == ("h", "c") and carries[0].h.shape == (2, 6)
  assert carries[1].h.shape == (2, 5) and carries[1].v.shape == (2, 3)
  assert set(variables) == {"params"}
  assert set(variables["params"]) == {"embedding", "layer_0", "layer_1",
                                      "decoder"}


def test_differently_configured_layers_multi_timescale():
  """Mahto et al. 3.1.1 in miniature: layer 1 half T = 3, half T = 4; layer
  2 inverse-gamma timescales; layer 3 a plain LSTM. Each layer reads the
  previous one's size and keeps its own params."""
  layers = [make("mts_lstm", hidden_size=6, timescales=(
                "groups", (("constant", 3.0, 3), ("constant", 4.0, 3)))),
            make("mts_lstm", hidden_size=5, timescales=("inverse_gamma",
                                                        0.56)),
            make("lstm", hidden_size=4)]
  model = LanguageModel(layers, vocab_size=V, embed_size=E)
  toks = tokens_of(2, 6)
  variables = model.init(KEY, toks)
  p = variables["params"]
  assert p["layer_0"]["W_x"].shape == (E, 24)
  assert p["layer_1"]["W_x"].shape == (6, 20) and "b_if" not in p["layer_1"]
  assert p["layer_2"]["W_x"].shape == (5, 16)
  logits, carries = model.apply(variables, toks)
  h = jnp.take(p["embedding"], toks, axis=0)
  for l, cell in enumerate(layers):
    carry, h = sorjax.unroll(cell, p[f"layer_{l}"], h)
    jax.tree_util.tree_map(lambda a, b: close(a, np.asarray(b)), carries[l],
                           carry)
  q = np_params(p["decoder"])
  close(logits, np.asarray(h, np.float64) @ q["kernel"] + q["bias"])


def test_untied_logits_equal_a_numpy_loop():
  model = LanguageModel([make("rnn", hidden_size=5)], vocab_size=V,
                        embed_size=E)
  toks = tokens_of(2, 6)
  variables = model.init(KEY, toks)
  logits, _ = model.apply(variables, toks)
  p = np_params(variables["params"])
  x = p["embedding"][np.asarray(toks)]
  ref = rnn_hidden(p["layer_0"], x) @ p["decoder"]["kernel"] + \
      p["decoder"]["bias"]
  close(logits, ref)


def test_decoder_has_dense_params_and_a_product_for_the_bias_gradient():
  """The untied decoder keeps nn.Dense's parameters (names, initial values,
  dtypes: older checkpoints restore into it) and outputs; its bias
  gradient is a dot over the rows, not a reduction (XLA:CPU ran that
  reduction 70x slower at a WikiText-2 vocabulary), and equals the row
  sum of the cotangent."""
  import flax.linen as nn
  from sorjax.models.lm import Decoder
  for dtype in (jnp.bfloat16, jnp.float32):
    h = jax.random.normal(KEY, (3, 4, 5), dtype)
    ref, dec = nn.Dense(V, param_dtype=dtype), Decoder(V, param_dtype=dtype)
    pr, pd = ref.init(KEY, h), dec.init(KEY, h)
    assert jax.tree_util.tree_structure(pr) == jax.tree_util.tree_structure(pd)
    for a, b in zip(jax.tree_util.tree_leaves(pr), jax.tree_util.tree_leaves(pd)):
      assert a.dtype == b.dtype
      np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ref.apply(pr, h), dec.apply(pd, h))
  G = np.asarray(jax.random.normal(jax.random.key(3), (3, 4, V)))
  p = dec.init(KEY, h)
  step = jax.jit(jax.grad(lambda p: jnp.sum(dec.apply(p, h) * G)))
  g = step(p)["params"]
  np.testing.assert_allclose(g["bias"], G.sum((0, 1)), rtol=1e-5, atol=1e-5)
  hlo = step.lower(p).compile().as_text()
  assert not re.search(rf"f32\[{V}\]\S* reduce\(", hlo), hlo


@pytest.mark.parametrize("tied", [False, True])
def test_decoder_gradient_under_vmap_reads_no_transposed_cotangent(tied):
  """Under the training loop's vmap over replicas (here 1), db as its own
  1^T dy compiled to a transposed copy of the whole [rows, V] cotangent
  (1.97 of 6.9 s in a WikiText-2 step); `base.affine_products` forms dW
  and db in one product from h^T, so no [V, rows] array is made. The
  bias gradient equals the cotangent's row sum."""
  Vb, B, T = 37, 3, 4  # sizes no other array of the step has
  model = LanguageModel([make("rnn", hidden_size=E)], vocab_size=Vb,
                        embed_size=E, tie_embedding=tied)
  toks = tokens_of(B, T, vocab=Vb)
  params = jax.vmap(lambda k: model.init(k, toks))(
      jax.random.split(KEY, 1))
  G = jax.random.normal(jax.random.key(3), (1, B, T, Vb))

  def loss(p, G):
    return jnp.sum(model.apply(p, toks)[0] * G)

  step = jax.jit(jax.vmap(jax.grad(loss)))
  grads = step(params, G)
  hlo = step.lower(params, G).compile().as_text()
  for shape in (f"{Vb},{B * T}", f"{Vb},{B},{T}", f"1,{Vb},{B * T}"):
    assert not re.search(rf"f32\[{shape}\]", hlo), (shape, hlo)
  g = grads["params"]
  db = g["decoder_bias"] if tied else g["decoder"]["bias"]
  np.testing.assert_allclose(db[0], np.asarray(G[0]).sum((0, 1)), rtol=1e-5,
                             atol=1e-5)


def test_affine_products_in_every_autodiff_mode():
  """base.affine_products against xs @ W + b: values, reverse and forward
  mode, second order to each argument, vmap over xs alone and over all
  three, and inputs of mixed dtypes (promoted first)."""
  from sorjax.cells.base import affine_products
  xs = jax.random.normal(KEY, (2, 3, 4))
  W = jax.random.normal(jax.random.key(1), (4, 5))
  b = jnp.linspace(-1.0, 1.0, 5)
  f = lambda xs, W, b: jnp.sum(jnp.tanh(affine_products(xs, W, b)) ** 2)  # noqa: E731
  ref = lambda xs, W, b: jnp.sum(jnp.tanh(  # noqa: E731
      jnp.einsum("...d,dv->...v", xs, W) + b.reshape(
          (1,) * (xs.ndim - 1) + b.shape)) ** 2)
  np.testing.assert_allclose(affine_products(xs, W, b),
                             np.asarray(xs) @ np.asarray(W) + np.asarray(b),
                             rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(affine_products(xs, W, b),
                                xs @ W + b[None, None])  # the same program
  for d in (jax.grad, jax.jacfwd, jax.hessian):
    for arg in (0, 1, 2):
      np.testing.assert_allclose(d(f, arg)(xs, W, b), d(ref, arg)(xs, W, b),
                                 rtol=1e-5, atol=1e-5)
  for axes in ((0, None, None), (0, 0, 0)):
    args = (xs, W, b) if axes[1] is None else (
        xs, jnp.stack([W, 2 * W]), jnp.stack([b, -b]))
    for got, want in zip(jax.vmap(jax.grad(f, (0, 1, 2)), axes)(*args),
                         jax.vmap(jax.grad(ref, (0, 1, 2)), axes)(*args)):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  lo = xs.astype(jnp.bfloat16)  # the tests' strict promotion refuses it
  with jax.numpy_dtype_promotion("standard"):
    assert affine_products(lo, W, b).dtype == jnp.float32
    for got, want in zip(jax.grad(f, (1, 2))(lo, W, b),
                         jax.grad(ref, (1, 2))(lo, W, b)):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_tied_decoder_reads_the_embedding_table():
  model = LanguageModel([make("rnn", hidden_size=E)], vocab_size=V,
                        embed_size=E, tie_embedding=True)
  toks = tokens_of(2, 6, vocab=3)  # ids 3..6 never enter
  variables = model.init(KEY, toks)
  params = variables["params"]
  assert set(params) == {"embedding", "layer_0", "decoder_bias"}
  p = np_params(params)
  h = rnn_hidden(p["layer_0"], p["embedding"][np.asarray(toks)])
  logits, _ = model.apply(variables, toks)
  close(logits, h @ p["embedding"].T + p["decoder_bias"])
  # One array: editing an unused row moves only that row's logit.
  edited = jax.tree_util.tree_map(lambda a: a, params)
  edited["embedding"] = params["embedding"].at[5].add(1.0)
  new, _ = model.apply({"params": edited}, toks)
  close(new[..., 5], h @ (p["embedding"][5] + 1.0) + p["decoder_bias"][5])
  np.testing.assert_array_equal(np.delete(np.asarray(new), 5, -1),
                                np.delete(np.asarray(logits), 5, -1))


def test_tied_decoder_with_a_projection():
  model = LanguageModel([make("rnn", hidden_size=5)], vocab_size=V,
                        embed_size=E, tie_embedding=True, tie_projection=True)
  toks = tokens_of(2, 6)
  variables = model.init(KEY, toks)
  p = np_params(variables["params"])
  assert p["projection"]["kernel"].shape == (5, E)
  assert "bias" not in p["projection"]
  h = rnn_hidden(p["layer_0"], p["embedding"][np.asarray(toks)])
  ref = h @ p["projection"]["kernel"] @ p["embedding"].T + p["decoder_bias"]
  close(model.apply(variables, toks)[0], ref)


def test_one_hot_inputs():
  model = LanguageModel([make("rnn", hidden_size=5)], vocab_size=V,
                        embedding="one_hot")
  toks = tokens_of(2, 6)
  variables = model.init(KEY, toks)
  p = np_params(variables["params"])
  assert "embedding" not in p and p["layer_0"]["U"].shape == (V, 5)
  h = rnn_hidden(p["layer_0"], np.eye(V)[np.asarray(toks)])
  close(model.apply(variables, toks)[0],
        h @ p["decoder"]["kernel"] + p["decoder"]["bias"])


# ---------------------------------------------------------------- training

def xent(model, params, extra, toks, **kw):
  logits, _ = model.apply({"params": params, **extra}, toks[:, :-1], **kw)
  return optax.softmax_cross_entropy_with_integer_labels(
      logits, toks[:, 1:]).mean()


def train(model, variables, toks, steps, lr=0.03, **kw):
  """Adam on variables["params"] only; returns (params, losses)."""
  params = variables["params"]
  extra = {k: v for k, v in variables.items() if k != "params"}
  opt = optax.adam(lr)

  @jax.jit
  def step(params, state, key):
    loss, g = jax.value_and_grad(
        lambda p: xent(model, p, extra, toks, rngs={"dropout": key}, **kw))(
            params)
    with jax.numpy_dtype_promotion("standard"):  # optax's int step count
      updates, state = opt.update(g, state, params)
    return optax.apply_updates(params, updates), state, loss

  state, losses = opt.init(params), []
  for key in jax.random.split(jax.random.key(3), steps):
    params, state, loss = step(params, state, key)
    losses.append(float(loss))
  return params, losses


def test_train_step_changes_params_and_loss_falls():
  model = LanguageModel([make("lstm", hidden_size=12)], vocab_size=4,
                        embed_size=6, input_dropout=0.1, output_dropout=0.1,
                        locked_dropout=True)
  toks = jnp.tile(jnp.arange(4), (2, 6))  # 0 1 2 3 0 1 2 3 ...
  variables = init(model, toks)
  params, losses = train(model, variables, toks, 60, deterministic=False)
  changed = jax.tree_util.tree_map(
      lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))),
      variables["params"], params)
  assert all(jax.tree_util.tree_leaves(changed)), changed
  assert losses[0] > 1.2  # ~ log 4 at init
  assert losses[-1] < 0.25 * losses[0], losses[::10]


def test_frozen_embedding_is_not_a_param_and_stays_put():
  table = np.asarray(jax.random.normal(jax.random.key(5), (V, E)), np.float32)
  model = LanguageModel([make("rnn", hidden_size=5)], vocab_size=V,
                        embedding="frozen", embedding_table=table)
  toks = tokens_of(2, 6)
  variables = model.init(KEY, toks)
  assert "embedding" not in variables["params"]
  np.testing.assert_array_equal(variables[FROZEN]["embedding"], table)
  params, losses = train(model, variables, toks, 5)
  assert losses[-1] < losses[0]
  np.testing.assert_array_equal(variables[FROZEN]["embedding"], table)
  # The model reads the stored table (not the attribute): a new table moves
  # the logits, numerically as the NumPy loop says.
  p = np_params(params)
  for tab in (table, 2.0 * table):
    got, _ = model.apply({"params": params, FROZEN: {"embedding": tab}}, toks)
    h = rnn_hidden(p["layer_0"], np.asarray(tab, np.float64)[np.asarray(toks)])
    close(got, h @ p["decoder"]["kernel"] + p["decoder"]["bias"], 1e-4)


def test_models_hash_by_value_and_are_static_jit_arguments():
  table = np.arange(V * E, dtype=np.float32).reshape(V, E)

  def build(tab):
    return LanguageModel([make("rnn", hidden_size=5)], vocab_size=V,
                         embedding="frozen", embedding_table=tab)

  model = build(table)
  assert hash(model) == hash(build(table.copy())) and model == build(table)
  assert model != build(table + 1)
  table[0, 0] = 99.0  # the model holds its own read-only copy
  assert np.asarray(model.embedding_table)[0, 0] == 0.0
  toks = tokens_of(2, 6)
  variables = model.init(KEY, toks)
  logits = jax.jit(lambda m, v, t: m.apply(v, t)[0], static_argnums=0)(
      model, variables, toks)
  assert logits.shape == (2, 6, V)


def test_fixed_cell_embedding_is_a_constant():
  cell = make("dyck_rnn", hidden_size=4)  # learn_embedding=False: 1-d table
  model = DyckModel([cell], vocab_size=6, embedding="cell", head="closing",
                    num_outputs=2)
  toks = jnp.array([[0, 1, 3, 2, 4, 4], [4, 0, 0, 2, 2, 5]])
  variables = init(model, toks)
  assert set(variables) == {"params"}
  assert set(variables["params"]) == {"layer_0", "head"}
  table = cell.fixed_embedding(2)  # open 1, 2; close -1, -2; START, END 0
  _, state = apply(model, variables, toks, mutable="intermediates")
  close(state["intermediates"]["embedded"][0][..., 0],
        table[np.asarray(toks), 0])
  opt = optax.sgd(0.1)

  def loss(params):
    logits, _ = model.apply({"params": params}, toks)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, jnp.array([0, 1])).mean()

  @jax.jit
  def sgd_step(params, state):
    updates, state = opt.update(jax.grad(loss)(params), state)
    return optax.apply_updates(params, updates), state

  params = variables["params"]
  state = opt.init(params)
  for _ in range(2):
    params, state = sgd_step(params, state)
  _, after = apply(model, {"params": params}, toks, mutable="intermediates")
  close(after["intermediates"]["embedded"][0][..., 0],
        table[np.asarray(toks), 0])


# ---------------------------------------------------------------- dropout

def dropout_outputs(locked, rate=0.5, B=3, T=6, F=16):
  """Outputs of the three dropout sites (captured), and the embedded inputs.
  The params do not depend on the dropout settings: one init serves all."""
  def build(locked):
    return LanguageModel([make("rnn", hidden_size=F)] * 2, vocab_size=V,
                         embed_size=F, input_dropout=rate, hidden_dropout=rate,
                         output_dropout=rate, locked_dropout=locked)
  toks = tokens_of(B, T)
  if F not in _DROPOUT_PARAMS:
    _DROPOUT_PARAMS[F] = build(False).init(KEY, toks)
  _, state = build(locked).apply(
      _DROPOUT_PARAMS[F], toks, deterministic=False,
      rngs={"dropout": jax.random.key(9)}, capture_intermediates=True,
      mutable="intermediates")
  inter = state["intermediates"]
  out = {site: np.asarray(inter[name]["__call__"][0])
         for site, name in (("input", "input_dropout"),
                            ("hidden", "hidden_dropout_0"),
                            ("output", "output_dropout"))}
  return out, np.asarray(inter["embedded"][0])


_DROPOUT_PARAMS = {}


def test_locked_dropout_shares_one_mask_across_time():
  out, embedded = dropout_outputs(True)
  for site, y in out.items():
    kept = y != 0
    # One mask per sequence: every step equals step 0 ...
    assert np.all(kept == kept[:, :1]), site
    # ... but sequences differ, and about half the units survive.
    assert not np.all(kept[0] == kept[1]), site
    assert 0.25 < kept.mean() < 0.75, site
  # Kept units are scaled by 1 / (1 - p).
  kept = out["input"] != 0
  close(out["input"][kept], 2.0 * embedded[kept])


def test_unlocked_dropout_draws_a_mask_per_step():
  out, _ = dropout_outputs(False)
  for site, y in out.items():
    assert not np.all((y != 0) == (y[:, :1] != 0)), site


def test_locked_dropout_per_site():
  out, _ = dropout_outputs(("hidden",))
  assert np.all((out["hidden"] != 0) == (out["hidden"][:, :1] != 0))
  assert not np.all((out["input"] != 0) == (out["input"][:, :1] != 0))
  assert not np.all((out["output"] != 0) == (out["output"][:, :1] != 0))


def test_embedding_dropout_drops_word_types():
  model = LanguageModel([make("rnn", hidden_size=3)], vocab_size=20,
                        embed_size=5, embedding_dropout=0.5)
  toks = tokens_of(4, 10, vocab=20)
  variables = init(model, toks)
  _, state = apply(model, variables, toks, deterministic=False,
                   rngs={"dropout": jax.random.key(2)},
                   mutable="intermediates")
  x = np.asarray(state["intermediates"]["embedded"][0])
  table = np.asarray(variables["params"]["embedding"])
  ids = np.asarray(toks)
  dropped = set()
  for w in np.unique(ids):  # every occurrence of a word: all 0 or all 2 E[w]
    rows = x[ids == w]
    if np.all(rows == 0):
      dropped.add(int(w))
    else:
      close(rows, np.broadcast_to(2.0 * table[w], rows.shape))
  assert 0 < len(dropped) < len(np.unique(ids))
  # Deterministic: no dropout at all.
  _, state = apply(model, variables, toks, mutable="intermediates")
  close(state["intermediates"]["embedded"][0], table[ids])


def test_weight_drop_is_one_dropconnect_mask_on_the_recurrent_matrix():
  """AWD-LSTM's wdrop: the rnn's W (its split's recurrent matrix) is
  masked once per call, kept entries scaled 1/(1-p), the same mask at every
  step and for every example; U and the embedding are untouched."""
  model = LanguageModel([make("rnn", hidden_size=12)], vocab_size=V,
                        embed_size=E, weight_drop=0.5)
  toks = tokens_of(3, 6)
  variables = model.init(KEY, toks)
  p = jax.tree_util.tree_map(np.asarray, variables["params"]["layer_0"])
  rng = jax.random.key(5)
  _, inter = model.apply(variables, toks, deterministic=False,
                         rngs={"dropout": rng}, mutable="intermediates")
  x = np.asarray(inter["intermediates"]["embedded"][0], np.float64)
  h = np.asarray(inter["intermediates"]["last_outputs"][0], np.float64)
  # Recover the mask: the trunk draws it from the "dropout" stream; find
  # the W' with h_t = tanh(x_t U + h_{t-1} W' + b) by least squares, then
  # check W' is W with about half its entries zeroed and the rest doubled.
  pre = np.arctanh(np.clip(h, -1 + 1e-12, 1 - 1e-12)) - x @ p["U"] - p["b"]
  prev = np.concatenate([np.zeros_like(h[:, :1]), h[:, :-1]], 1)
  Wd, *_ = np.linalg.lstsq(prev.reshape(-1, 12), pre.reshape(-1, 12),
                           rcond=None)
  kept = np.abs(Wd) > 1e-4
  assert 0.25 < kept.mean() < 0.75
  close(Wd[kept], 2.0 * p["W"][kept], tol=1e-3)
  close(h, rnn_hidden({**p, "W": np.where(kept, 2.0 * p["W"], 0.0)}, x),
        tol=1e-4)
  # Deterministic: the full W (no other dropout here, so x = E[tokens]).
  _, inter = model.apply(variables, toks, mutable="intermediates")
  close(inter["intermediates"]["last_outputs"][0], rnn_hidden(p, x))


def test_weight_drop_needs_a_single_recurrent_matrix():
  LanguageModel([make("lstm", hidden_size=5), make("gru", hidden_size=5)],
                vocab_size=V, embed_size=E, weight_drop=0.3)   # fine
  with pytest.raises(ValueError, match=r"weight_drop: cells\[1\] \(MMRNN\) "
                     "has no single recurrent matrix"):
    LanguageModel([make("lstm", hidden_size=5),
                   make("mm_rnn", hidden_size=5, num_matrices=2)],
                  vocab_size=V, embed_size=E, weight_drop=0.3)
  with pytest.raises(ValueError, match="weight_drop must be a finite number in"):
    LanguageModel([make("lstm", hidden_size=5)], vocab_size=V,
                  embed_size=E, weight_drop=1.0)


# ---------------------------------------------------------------- state

def test_carry_passthrough_equals_one_long_sequence():
  model = LanguageModel([make("lstm", hidden_size=6),
                         make("mm_rnn", hidden_size=5, num_matrices=3)],
                        vocab_size=V, embed_size=E)
  toks = tokens_of(2, 8)
  variables = init(model, toks)
  run = functools.partial(apply, model, variables)
  head, tail = (jnp.asarray(t) for t in np.split(np.asarray(toks), 2, 1))
  full, full_carries = run(toks)
  first, carries = run(head)
  second, last_carries = run(tail, carries)
  close(jnp.concatenate([first, second], 1), np.asarray(full), 1e-5)
  jax.tree_util.tree_map(lambda a, b: close(a, np.asarray(b)),
                         last_carries, full_carries)
  # Resetting with initial_carries is the same as passing none.
  fresh = model.initial_carries(variables["params"], 2)
  close(run(tail, fresh)[0], np.asarray(run(tail)[0]))


def test_lengths_equal_truncated_sequences():
  model = LanguageModel([make("lstm", hidden_size=6),
                         make("mm_rnn", hidden_size=5, num_matrices=3)],
                        vocab_size=V, embed_size=E)
  toks = tokens_of(3, 6)
  lengths = np.array([6, 2, 4])
  variables = init(model, toks)
  logits, carries = apply(model, variables, toks,
                          lengths=jnp.asarray(lengths))
  for b, L in enumerate(lengths):
    ref, ref_carries = apply(model, variables,
                             jnp.asarray(np.asarray(toks)[b:b + 1, :L]))
    close(logits[b, :L], np.asarray(ref[0]))
    for c, rc in zip(carries, ref_carries):
      jax.tree_util.tree_map(lambda a, r: close(a[b], np.asarray(r[0])), c,
                             rc)


def test_aux_goes_to_the_cells():
  cell = make("attention_lstm", hidden_size=5, num_cells=3)
  model = LanguageModel([cell], vocab_size=V, embed_size=E)
  toks = tokens_of(2, 6)
  variables = model.init(KEY, toks, temperature=jnp.float32(1.0))
  p = variables["params"]
  x = jnp.take(p["embedding"], toks, axis=0)
  outs = []
  for tau in (0.2, 5.0):
    logits, _ = model.apply(variables, toks, temperature=jnp.float32(tau))
    _, h = sorjax.unroll(cell, p["layer_0"], x, temperature=jnp.float32(tau))
    q = np_params(p["decoder"])
    close(logits, np.asarray(h, np.float64) @ q["kernel"] + q["bias"])
    outs.append(logits)
  assert not np.allclose(outs[0], outs[1])
  with pytest.raises(ValueError, match="no layer accepts aux"):
    model.apply(variables, toks, bogus=jnp.float32(1.0))


# ---------------------------------------------------------------- Dyck heads

def test_closing_head_reads_the_last_valid_step():
  model = DyckModel([make("rnn", hidden_size=5)], vocab_size=6, embed_size=3,
                    head="closing", num_outputs=2)
  toks = tokens_of(3, 6, vocab=6)
  lengths = np.array([6, 1, 3])
  variables = model.init(KEY, toks)
  logits, _ = model.apply(variables, toks, lengths=jnp.asarray(lengths))
  p = np_params(variables["params"])
  h = rnn_hidden(p["layer_0"], p["embedding"][np.asarray(toks)])
  last = h[np.arange(3), lengths - 1]
  close(logits, last @ p["head"]["kernel"] + p["head"]["bias"])
  probs = model.probabilities(logits)
  close(probs.sum(-1), np.ones(3))
  # Without lengths: the last step.
  close(model.apply(variables, toks)[0],
        h[:, -1] @ p["head"]["kernel"] + p["head"]["bias"])
  # A length of 0 read step T - 1, padding: the head's bias alone.
  with pytest.raises(ValueError, match=r"DyckModel: head='closing' reads "
                     r"step lengths - 1: lengths must be >= 1, got 0 at "
                     r"lengths\[1\]"):
    model.apply(variables, toks, lengths=jnp.array([6, 0, 3]))
  # No step at all (T = 0): refused, under jit too (the shape is static),
  # where the empty gather gave the head's bias as if it read a state.
  empty = jnp.zeros((3, 0), jnp.int32)
  for f in (model.apply, jax.jit(model.apply)):
    with pytest.raises(ValueError, match=re.escape(
        "DyckModel: head='closing' reads the last step, and tokens (3, 0) "
        "have none (T = 0)")):
      f(variables, empty)


def test_per_step_heads():
  toks = tokens_of(2, 5, vocab=6)
  nxt = DyckModel([make("lstm", hidden_size=4)], vocab_size=6, embed_size=3)
  logits, _ = nxt.apply(nxt.init(KEY, toks), toks)
  assert logits.shape == (2, 5, 6)
  close(nxt.probabilities(logits).sum(-1), np.ones((2, 5)))
  adm = DyckModel([make("lstm", hidden_size=4)], vocab_size=6, embed_size=3,
                  head="admissible", num_outputs=2)
  logits, _ = adm.apply(adm.init(KEY, toks), toks)
  assert logits.shape == (2, 5, 2)
  close(adm.probabilities(logits), 1 / (1 + np.exp(-np.asarray(logits,
                                                              np.float64))))


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("kwargs,match", [
    (dict(embed_size=4, tie_embedding=True), "last hidden size 5 differs"),
    (dict(embed_size=4, tie_projection=True), "only meaningful"),
    (dict(embedding="one_hot", tie_embedding=True), "needs a trainable"),
    (dict(embed_size=4, input_dropout=1.0), "input_dropout must be a finite number in"),
    (dict(embed_size=4, locked_dropout=("inputs",)), "unknown sites"),
    (dict(), "embed_size must be an int >= 1"),
    (dict(embedding="frozen"), "embedding_table is given exactly"),
    (dict(embedding="cell"), "fixed_embedding"),
    (dict(embedding="one_hot", embed_size=3), "contradicts"),
    (dict(embedding="lookup", embed_size=3), "embedding must be one of"),
])
def test_bad_configurations_are_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    LanguageModel([make("rnn", hidden_size=5)], vocab_size=V, **kwargs)


def test_bad_inputs_are_named():
  model = LanguageModel([make("rnn", hidden_size=5)], vocab_size=V,
                        embed_size=E)
  toks = tokens_of(2, 3)
  variables = init(model, toks)
  # eager: the token and lengths checks read concrete values
  with pytest.raises(ValueError, match=r"tokens must be int \[B, T\]"):
    model.apply(variables, toks.astype(jnp.float32))
  with pytest.raises(ValueError, match=r"lengths must have shape \[B\]"):
    model.apply(variables, toks, lengths=jnp.array([1, 2, 3]))
  with pytest.raises(ValueError, match="one carry per layer"):
    model.apply(variables, toks, (None, None))
  with pytest.raises(ValueError, match=r"LanguageModel: initial_carries: "
                     r"params lack layer_0 \(pass variables\['params'\], "
                     r"not the variables\)"):
    model.initial_carries(variables, 2)
  assert len(model.initial_carries(variables["params"], 2)) == 1
  # An id outside [0, V) would embed as NaN (the table's gather fill) or,
  # negative, as another word's row.
  for bad, where in ((V, "tokens[1, 2]"), (-1, "tokens[1, 2]")):
    with pytest.raises(ValueError, match=rf"got {bad} at {re.escape(where)}"):
      model.apply(variables, toks.at[1, 2].set(bad))
  one_hot = LanguageModel([make("rnn", hidden_size=5)], vocab_size=V,
                          embedding="one_hot")
  with pytest.raises(ValueError, match=r"in \[0, vocab_size=7\)"):
    one_hot.init(KEY, toks.at[0, 0].set(V))
  jax.jit(model.apply)(variables, toks)  # traced tokens: nothing to check
  with pytest.raises(ValueError, match=r"shape \[vocab_size=7, E\]"):
    LanguageModel([make("rnn", hidden_size=5)], vocab_size=V,
                  embedding="frozen", embedding_table=np.zeros((6, 3)))
  with pytest.raises(ValueError, match="num_outputs"):
    DyckModel([make("rnn", hidden_size=5)], vocab_size=6, embed_size=3,
              head="closing")


@pytest.mark.parametrize("options", [dict(fused_grad=True),
                                     dict(remat="dots"),
                                     dict(fused_grad=True, remat=True)])
def test_trunk_passes_fused_grad_and_remat_policy_to_unroll(options):
  """Same loss gradient as plain autodiff without remat, float32 tolerance."""
  cells = [make("lstm", hidden_size=5),
           make("mrnn", hidden_size=4, intermediate_size=3)]
  toks = tokens_of(3, 6)
  base = LanguageModel(cells, vocab_size=V, embed_size=E, fused_grad=False)
  variables = init(base, toks)

  def grads(model):
    def loss(p):
      logits, _ = model.apply({"params": p}, toks)
      return optax.softmax_cross_entropy_with_integer_labels(
          logits[:, :-1], toks[:, 1:]).mean()
    return jax.jit(jax.grad(loss))(variables["params"])

  want = grads(base)
  got = grads(LanguageModel(cells, vocab_size=V, embed_size=E, **options))
  jax.tree_util.tree_map(lambda a, b: close(a, np.asarray(b, np.float64)),
                         got, want)
  # dyck_rnn has no split step; with remat its layer does not run either.
  with pytest.raises(ValueError, match="fused_grad"):
    LanguageModel([make("dyck_rnn", hidden_size=3)], vocab_size=V,
                  embed_size=1, fused_grad=True, remat=True).init(KEY, toks)
