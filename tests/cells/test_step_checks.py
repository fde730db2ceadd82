"""Trace-time checks of a cell's own methods, outside `sorjax.unroll`: init's
key and dtype, precompute's params and xs, step's params, carry and xp
(as a hand-written `lax.scan` over step meets them), attention_lstm's
temperature. Each is a ValueError or TypeError naming the cell, the method
and the entry; correct calls give what they gave. Shapes only, mostly
(`jax.eval_shape`): nothing compiles but the scans compared with unroll."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax import cells
from sorjax.cells import base
from tests.cells.configs import SMALL

B, T = 2, 4
SEQ = sorted(SMALL)
SPLIT = [n for n in SEQ if n != "dyck_rnn"]  # dyck_rnn's step reads no params
AUX = {"attention_lstm": {"temperature": 0.7},  # NumPy: nothing to compile
       "assignment_lstm": {"assignment": np.arange(B) % 3}}
MUST = r"\.step: xp must be one step's input terms .*for the carry's batch "


def make(name, dtype=jnp.float32):
  """cell, abstract params, D, aux of one step."""
  kwargs, D, _ = SMALL[name]
  cell = cells.make(name, **kwargs)
  params = jax.eval_shape(lambda k: cell.init(k, D, dtype), jax.random.key(0))
  return cell, params, D, AUX.get(name, {})


def terms(cell, params, shape, aux, dtype=jnp.float32):
  """Abstract cell.precompute(params, xs) of xs of the given shape."""
  return jax.eval_shape(lambda p, x: cell.precompute(p, x, **aux), params,
                        jax.ShapeDtypeStruct(shape, dtype))


def step(cell, params, carry, xp):
  return jax.eval_shape(cell.step, params, carry, xp)


# --------------------------------------------------------------------- init

@pytest.mark.parametrize("name", cells.names())
def test_init_names_a_key_that_is_not_one_prng_key(name):
  cell = cells.make(name, **(SMALL[name][0] if name in SMALL
                             else {"hidden_size": 3}))
  D = SMALL[name][1] if name in SMALL else 3
  must = rf"{name}.init: key must be a jax PRNG key \(jax.random.key\(0\)\)"
  for bad, got in ((0, "int 0"), (np.zeros(2, np.float32),
                                  r"an array float32\[2\]")):
    with pytest.raises(TypeError, match=rf"{must}, got {got}"):
      cell.init(bad, D)
  keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0)))
  with pytest.raises(TypeError, match=rf"{must}, got an array key<fry>\[2\]"):
    jax.eval_shape(lambda k: cell.init(k, D), keys)  # two keys, not one
  for bad, got in ((jnp.int32, "int32"), (bool, "bool"), ("int8", "int8"),
                   (None, "None")):
    with pytest.raises(TypeError, match=rf"{name}.init: dtype must be a "
                       rf"floating dtype \(e.g. jnp.float32\), got {got}"):
      cell.init(jax.random.key(0), D, bad)
  # typed keys (either implementation) and legacy uint32[2] ones still work
  want = jax.eval_shape(lambda k: cell.init(k, D), jax.random.key(0))
  for key in (jax.random.PRNGKey(0), jax.random.key(0, impl="rbg")):
    got = jax.eval_shape(lambda k: cell.init(k, D, jnp.bfloat16), key)
    assert jax.tree_util.tree_map(jnp.shape, got) == (
        jax.tree_util.tree_map(jnp.shape, want))
    assert {a.dtype for a in jax.tree_util.tree_leaves(got)} == {jnp.dtype(jnp.bfloat16)}


def test_init_checks_concrete_keys_of_either_kind():
  """Concrete keys as well as traced ones (the helper alone: no draw)."""
  cell = cells.make("rnn", hidden_size=3)
  for key in (jax.random.key(0), jax.random.PRNGKey(0),
              np.asarray(jax.random.PRNGKey(0))):
    base.check_init(cell, key, jnp.float32)
  with pytest.raises(TypeError, match=r"rnn.init: key must be a jax PRNG key "
                     r"\(jax.random.key\(0\)\), got an array int32\[2\]"):
    base.check_init(cell, np.zeros(2, np.int32), jnp.float32)


# --------------------------------------------------------------- precompute

@pytest.mark.parametrize("name", SEQ)
def test_precompute_names_params_and_xs(name):
  cell, params, D, aux = make(name)
  first = next(iter(params))
  where = rf"{name}.precompute: "
  with pytest.raises(ValueError, match=rf"{where}params lack "
                     rf"\['{first}'\] \(as {type(cell).__name__}.init makes "
                     rf"them for input size {D}, the last axis of xs"):
    terms(cell, {k: v for k, v in params.items() if k != first}, (B, D), aux)
  with pytest.raises(ValueError, match=rf"{where}inputs must have last axis "
                     rf"= the input size {D} .*got last axis {D + 1}"):
    terms(cell, params, (B, D + 1), aux)
  half = jax.tree_util.tree_map(
      lambda a: jax.ShapeDtypeStruct(a.shape, jnp.bfloat16), params)
  with pytest.raises(ValueError, match=rf"{where}xs are float32 but the "
                     r"params bfloat16"):
    terms(cell, half, (B, D), aux)
  with pytest.raises(ValueError, match=rf"{where}xs must be an array "
                     r"\[\.\.\., D\], got list"):
    cell.precompute(params, [[0.0] * D] * B, **aux)


# --------------------------------------------------------------------- step

@pytest.mark.parametrize("name", SEQ)
def test_step_names_an_xp_of_batch_one_against_a_larger_carry(name):
  """xp of batch 1 broadcast silently against a carry of batch 2 into a
  carry of batch 2."""
  cell, params, D, aux = make(name)
  carry = cell.initial_carry(params, (B,))
  one = {k: v[:1] if jnp.ndim(v) else v for k, v in aux.items()}
  with pytest.raises(ValueError, match=rf"{name}{MUST}shape \({B},\): "
                     rf"xp\S* has shape \(1, [\d, ]+\); cell.precompute "
                     rf"makes \({B}, [\d, ]+\)"):
    step(cell, params, carry, terms(cell, params, (1, D), one))
  new, y = step(cell, params, carry, terms(cell, params, (B, D), aux))
  assert y.shape == (B, cell.hidden_size)
  assert jax.tree_util.tree_map(jnp.shape, new) == (
      jax.tree_util.tree_map(jnp.shape, carry))


def test_tensor_rnn_step_names_an_input_of_width_d_times_h():
  """tensor_rnn's xp is x itself: x of width D*H read h A as [D*H, 1]
  blocks and broadcast the result over H."""
  cell, params, D, _ = make("tensor_rnn")
  H = cell.hidden_size
  carry = cell.initial_carry(params, (B,))
  x = jax.ShapeDtypeStruct((B, D * H), jnp.float32)
  with pytest.raises(ValueError, match=rf"tensor_rnn{MUST}shape \({B},\): "
                     rf"xp has shape \({B}, {D * H}\); cell.precompute makes "
                     rf"\({B}, {D}\)"):
    step(cell, params, carry, x)


@pytest.mark.parametrize("name", SEQ)
def test_step_names_a_carry_of_a_narrower_dtype(name):
  """A bfloat16 carry with float32 params (or, for dyck_rnn, float32 xp)
  was computed in float32: the state changed dtype silently."""
  cell, params, D, aux = make(name)
  half = jax.tree_util.tree_map(
      lambda a: jax.ShapeDtypeStruct(a.shape, jnp.bfloat16),
      cell.initial_carry(params, (B,)))
  xp = terms(cell, params, (B, D), aux)
  if name == "dyck_rnn":
    match = (r"dyck_rnn.step: xp.g is float32 but the carry is bfloat16: "
             r"the state would not stay bfloat16")
  else:
    match = (rf"{name}.step: carry.h is bfloat16, but cell.initial_carry "
             r"makes it float32 for these params")
  with jax.numpy_dtype_promotion("standard"), pytest.raises(ValueError,
                                                            match=match):
    step(cell, params, half, xp)


@pytest.mark.parametrize("name", SPLIT)
def test_step_names_params_that_lack_an_entry(name):
  cell, params, D, aux = make(name)
  carry = cell.initial_carry(params, (B,))
  xp = terms(cell, params, (B, D), aux)
  last = list(params)[-1]
  with pytest.raises(ValueError, match=rf"{name}.step: params \(.*\) do not "
                     rf"have the shapes {type(cell).__name__}.init makes for "
                     rf"hidden_size 5 at any input size \(they lack "
                     rf"\['{last}'\]\)"):
    step(cell, {k: v for k, v in params.items() if k != last}, carry, xp)
  other = {**params, "bogus": params[last]}
  with pytest.raises(ValueError, match=r"\(they hold \['bogus'\], which "):
    step(cell, other, carry, xp)


@pytest.mark.parametrize("name", SEQ)
def test_step_names_a_carry_or_xp_of_another_structure(name):
  cell, params, D, aux = make(name)
  carry = cell.initial_carry(params, (B,))
  xp = terms(cell, params, (B, D), aux)
  kind = type(carry).__name__
  with pytest.raises(ValueError, match=rf"{name}.step: carry must be a "
                     rf"{kind} with entries .h.*; got a tuple with \[0\]"):
    step(cell, params, tuple(carry), xp)
  with pytest.raises(ValueError, match=rf"{name}{MUST}.*: xp is a dict with "
                     r"entries \['wrapped'\].*; cell.precompute makes "):
    step(cell, params, carry, {"wrapped": xp})


@pytest.mark.parametrize("name", ["mrnn", "tensor_rnn", "dyck_rnn"])
def test_step_under_lax_scan_equals_unroll(name):
  """Correct calls give what they gave: a hand-written scan of precompute +
  step is unroll (the checks change nothing but errors). NumPy inputs and
  one jit for both: one compilation."""
  cell, abstract, D, _ = make(name)
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map(
      lambda a: rng.uniform(-0.5, 0.5, a.shape).astype(np.float32), abstract)
  xs = rng.normal(size=(B, T, D)).astype(np.float32)

  def both(params, xs):
    def body(carry, x):
      return cell.step(params, carry, cell.precompute(params, x))
    carry, ys = jax.lax.scan(body, cell.initial_carry(params, (B,)),
                             jnp.swapaxes(xs, 0, 1))
    return ((carry, jnp.swapaxes(ys, 0, 1)),
            sorjax.unroll(cell, params, xs, fused_grad=False))
  scanned, unrolled = jax.jit(both)(params, xs)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=1e-5, atol=1e-6), scanned, unrolled)


@pytest.mark.parametrize("name", SPLIT)
def test_step_and_precompute_checks_add_no_operation(name):
  """The checks read static shapes and dtypes only: step's program is its
  split step's, equation for equation, also on the trace that first works
  out the expected shapes (nothing cached)."""
  cell, params, D, aux = make(name)
  base._step_structs_of.cache_clear()
  base._init_shapes_of.cache_clear()
  carry = cell.initial_carry(params, (B,))
  xp = terms(cell, params, (B, D), aux)

  def plain(p, c, x):
    W, q = cell.split(p)
    return cell.post(q, c, x, cell.recurrent_input(c) @ W)
  assert str(jax.make_jaxpr(cell.step)(params, carry, xp)) == str(
      jax.make_jaxpr(plain)(params, carry, xp))


def test_precompute_checks_add_no_operation():
  cell, params, D, _ = make("rnn")
  base._init_shapes_of.cache_clear()  # the trace that works shapes out too
  x = jax.ShapeDtypeStruct((B, D), jnp.float32)
  assert str(jax.make_jaxpr(cell.precompute)(params, x)) == str(
      jax.make_jaxpr(lambda p, x: base.affine(x, p["U"], p["b"]))(params, x))


def test_a_scan_over_step_checks_once_per_trace(monkeypatch):
  cell, params, D, aux = make("mrnn")
  calls = []
  check = base._check_carry_like
  monkeypatch.setattr(base, "_check_carry_like",
                      lambda *a: calls.append(1) or check(*a))
  xp = terms(cell, params, (T, B, D), aux)
  jax.eval_shape(lambda p, x: jax.lax.scan(
      lambda c, x_t: cell.step(p, c, x_t), cell.initial_carry(p, (B,)), x),
      params, xp)
  assert len(calls) == 1


# -------------------------------------------------------------- temperature

def test_attention_lstm_names_a_temperature_that_is_not_a_number():
  cell, params, D, _ = make("attention_lstm")
  must = (r"attention_lstm: temperature must be a number > 0 or an array of "
          r"them \(one per token\), got ")
  for bad, got in (("0.5", "'0.5'"), (True, "True"),
                   (jnp.array([True, False]), "an array of bool"),
                   (np.array(["a", "b"]), "an array of <U1"),
                   (1j, re.escape("1j"))):
    with pytest.raises(ValueError, match=must + got + ""):
      terms(cell, params, (B, D), {"temperature": bad})
  for ok in (2, np.float32(0.5), jnp.full((B,), 0.5, jnp.bfloat16)):
    assert terms(cell, params, (B, D), {"temperature": ok}).alpha.shape == (
        B, 3)


def test_attention_lstm_cannot_check_a_traced_temperature():
  """Documented: under jit a temperature is not refused. 0 runs as the
  smallest normal number, a one-hot alpha (the tau -> 0 limit); a negative
  one gives NaN (the training loop stops on it), not that argmax."""
  cell, abstract, D, _ = make("attention_lstm")
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map(
      lambda a: rng.uniform(-1, 1, a.shape).astype(np.float32), abstract)
  x = rng.normal(size=(B, D)).astype(np.float32)
  with pytest.raises(ValueError, match="temperature must be finite and > 0"):
    cell.attention(params, x, -1.0)
  alpha = jax.jit(cell.attention)(params, x, 0.0)
  np.testing.assert_array_equal(np.sort(alpha, -1)[:, -1], 1.0)
  assert np.isnan(jax.jit(cell.attention)(params, x, -1.0)).all()
  per_token = np.array([0.5, -0.5] + [1.0] * (B - 2), np.float32)
  alpha = np.asarray(jax.jit(cell.attention)(params, x, per_token))
  assert np.isnan(alpha[1]).all() and np.isfinite(np.delete(alpha, 1, 0)).all()
