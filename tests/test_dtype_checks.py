"""Dtypes a careless notebook gives (QA, session 41): params of mixed
dtypes, float64 asked for without 64-bit types, integer inputs, an
adapter's param_dtype other than its params', tree leaves narrower than
the params. Each was a silent wrong result or an error blaming another
input; each is now refused naming the one at fault, or computed as
`sorjax.unroll` computes it."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax import cells, trees
from sorjax.linen import CellAdapter
from sorjax.models import LanguageModel
from sorjax.models.tree_classifier import TreeClassifier

B, T, D, H = 2, 3, 4, 5


def _mrnn(dtype=jnp.float32):
  cell = cells.make("mrnn", hidden_size=H, intermediate_size=H)
  return cell, cell.init(jax.random.key(0), D, dtype)


def test_params_of_mixed_dtypes_name_the_one_that_differs():
  cell, p = _mrnn(jnp.bfloat16)
  mixed = {**p, "f": p["f"].astype(jnp.float32)}   # a bias kept in f32
  xs = jnp.ones((B, T, D), jnp.bfloat16)
  msg = (r"params\['f'\] is float32, params\['A'\] bfloat16: a cell's "
         r"params share one dtype")
  with pytest.raises(ValueError, match="unroll: mrnn: " + msg):
    sorjax.unroll(cell, mixed, xs)
  with pytest.raises(ValueError, match="mrnn.precompute: " + msg):
    cell.precompute(mixed, xs[:, 0])
  carry = cell.initial_carry(p, (B,))
  with pytest.raises(ValueError, match="mrnn.step: " + msg):
    cell.step(mixed, carry, cell.precompute(p, xs[:, 0]))
  # only A in bf16: the params are named, not xs
  f32 = cell.init(jax.random.key(0), D)
  with pytest.raises(ValueError, match=r"params\['B'\] is float32, "
                     r"params\['A'\] bfloat16"):
    sorjax.unroll(cell, {**f32, "A": f32["A"].astype(jnp.bfloat16)},
                  jnp.ones((B, T, D)))


def test_a_step_whose_carry_changes_dtype_is_refused():
  # params one dtype, xp of the step's dtype; a carry made in another
  # dtype is caught on the way in, and one changed inside on the way out
  cell, p = _mrnn(jnp.bfloat16)
  carry = cell.initial_carry(p, (B,))
  xp = cell.precompute(p, jnp.ones((B, D), jnp.bfloat16))
  new, _ = cell.step(p, carry, xp)
  assert new.h.dtype == jnp.bfloat16
  with pytest.raises(ValueError, match=r"mrnn.step: carry.h is float32, but "
                     r"cell.initial_carry makes it bfloat16"):
    cell.step(p, carry._replace(h=carry.h.astype(jnp.float32)), xp)


def test_float64_without_x64_is_refused_naming_the_argument():
  if jax.config.jax_enable_x64:
    pytest.skip("64-bit types are on in this process")
  cell = cells.make("mrnn", hidden_size=H, intermediate_size=H)
  msg = (r"is float64, which JAX makes as float32 unless 64-bit types are "
         r"on: jax.config.update\('jax_enable_x64', True\) first")
  with pytest.raises(TypeError, match=r"mrnn.init: dtype " + msg):
    cell.init(jax.random.key(0), D, jnp.float64)
  with pytest.raises(TypeError, match=r"CellAdapter: param_dtype " + msg):
    CellAdapter(cell, param_dtype=jnp.float64)
  with pytest.raises(TypeError, match=r"LanguageModel: param_dtype " + msg):
    LanguageModel([cell], vocab_size=7, embed_size=D,
                  param_dtype=jnp.float64)
  with jax.enable_x64(True):
    assert cell.init(jax.random.key(0), D, jnp.float64)["A"].dtype == \
        jnp.float64


@pytest.mark.parametrize("bad", ["bf16", "float8", jnp.int32, None])
def test_a_models_param_dtype_is_checked_by_name(bad):
  cell = cells.make("rnn", hidden_size=H)
  with pytest.raises(TypeError, match=r"LanguageModel: param_dtype must be "
                     r"a floating dtype"):
    LanguageModel([cell], vocab_size=7, embed_size=D, param_dtype=bad)
  tree = cells.make("tree_rnn", hidden_size=H)
  with pytest.raises(TypeError, match=r"TreeClassifier: param_dtype must "
                     r"be a floating dtype"):
    TreeClassifier(vocab_size=7, num_classes=2, cell=tree, param_dtype=bad)


def test_integer_inputs_are_refused():
  # ids 256 and 257 are one bfloat16: they were cast without a word
  cell, p = _mrnn(jnp.bfloat16)
  ids = jnp.arange(B * T * D, dtype=jnp.int32).reshape(B, T, D) + 256
  for call in (lambda: sorjax.unroll(cell, p, ids),
               lambda: cell.precompute(p, ids[:, 0])):
    with pytest.raises(ValueError, match=r"xs are int32; cells read "
                       r"floating vectors"):
      call()


def test_an_adapter_whose_params_are_not_its_param_dtype_says_so():
  cell, p32 = _mrnn()
  rnn = nn.RNN(CellAdapter(cell, param_dtype=jnp.bfloat16))
  xs = jnp.ones((B, T, D), jnp.bfloat16)
  with pytest.raises(ValueError, match=r"CellAdapter\(MRNN\): params are "
                     r"float32 but param_dtype is bfloat16"):
    rnn.apply({"params": {"cell": p32}}, xs)


def test_tree_leaves_narrower_than_the_params_compute_in_the_params_dtype():
  # node states were scattered into the leaves' float32, truncating them
  with jax.enable_x64(True):
    cell = cells.make("tree_rnn", hidden_size=H)
    p64 = cell.init(jax.random.key(0), H, jnp.float64)
    s = trees.encode([((1, 2), 3)])
    x32 = jax.random.normal(jax.random.key(1), s.tokens.shape + (H,))
    got = trees.run(cell, p64, x32, s)
    want = trees.run(cell, p64, x32.astype(jnp.float64), s)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      assert a.dtype == b.dtype == jnp.float64
      np.testing.assert_array_equal(a, b)


def test_narrower_inputs_under_strict_promotion_name_the_promotion():
  # the message said "the state would not stay float32", which was wrong
  # (QA, session 41): the state stays; strict promotion refuses the pair
  cell, p = _mrnn()
  xs = jnp.ones((B, T, D), jnp.bfloat16)
  with jax.numpy_dtype_promotion("strict"), pytest.raises(
      ValueError, match=r"xs are bfloat16 and the params float32, a pair "
      r"that strict dtype promotion .* refuses to mix"):
    sorjax.unroll(cell, p, xs)
  with jax.numpy_dtype_promotion("standard"):
    assert sorjax.unroll(cell, p, xs)[1].dtype == jnp.float32
  with jax.numpy_dtype_promotion("strict"), pytest.raises(
      ValueError, match=r"xs are float32 but the params bfloat16: the state "
      r"would not stay bfloat16"):
    sorjax.unroll(cell, jax.tree.map(lambda a: a.astype(jnp.bfloat16), p),
                  xs.astype(jnp.float32))
