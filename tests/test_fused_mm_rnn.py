"""sorjax.fused_mm_rnn against NumPy loops of Renganathan & Singh eq. 6-8
(mm_rnn) and eq. 9-22 (mm_lstm): values, final carry, masking by lengths;
against JAX's autodiff of the plain scan: every gradient, with lengths,
reverse, unroll and a given carry; its memory against the generic fused
path; and its argument checks. bfloat16, vmap and routing:
tests/test_layers.py."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax.cells.mm_lstm import GATES, MMLSTMCarry
from sorjax.cells.mm_rnn import MMRNNCarry, MMRNNInputs
from sorjax.fused_mm_rnn import layer_args, mm_lstm_layer, mm_rnn_layer, run_layer
from tests.cells.reference import normal, np_params, random_params
from tests.cells.test_mm_lstm import numpy_mm_lstm
from tests.cells.test_mm_rnn import numpy_mm_rnn
from tests import layer_checks as checks

fm = importlib.import_module("sorjax.fused_mm_rnn")

B, T, D, H = 3, 6, 2, 5
CELLS = {"mm_rnn": dict(num_matrices=4),
         "mm_lstm": dict(num_matrices=(3, 1, 2, 4))}  # every K different


def make(name, H_=H, seed=0):
  cell = sorjax.cells.make(name, hidden_size=H_, **CELLS[name])
  return cell, random_params(cell, D, seed)


def precompute(cell, params, xs):
  """`precompute` on [B*T, D] rows, back to [B, T, .], as unroll runs it."""
  B_, T_, _ = xs.shape
  return jax.tree_util.tree_map(lambda a: a.reshape(B_, T_, *a.shape[1:]),
                                cell.precompute(params, xs.reshape(B_ * T_, -1)))


def layer(cell, params, xs, lengths=None, unroll=None):
  carry = cell.initial_carry(params, (xs.shape[0],))
  return run_layer(layer_args(cell, params), precompute(cell, params, xs),
                   carry, lengths, unroll)


def numpy_run(name, params, xs):
  """(final h, c or None, keys [K_total], ys) of the paper's equations for
  ONE example xs [1, T, D]."""
  p = np_params(params)
  if name == "mm_rnn":
    h, v, ys, _ = numpy_mm_rnn(p, xs)
    return h[0], None, v[0], ys[0]
  final, ys, _ = numpy_mm_lstm(p, xs)
  h, c, v = final[0]
  return h, c, np.concatenate([v[g] for g in GATES]), ys[0]


def keys(name, carry):
  return carry.v if name == "mm_rnn" else jnp.concatenate(
      [carry.v_c, carry.v_i, carry.v_f, carry.v_o], -1)


@pytest.mark.parametrize("name", sorted(CELLS))
@pytest.mark.parametrize("unroll", [None, 4])
def test_matches_numpy_loop_per_example_length(name, unroll):
  """Example b runs lengths[b] steps of the paper's equations (the NumPy
  loop on its prefix): its outputs there, zeros after, and the carry of its
  last step."""
  cell, params = make(name)
  xs = normal(1, (B, T, D))
  lengths = np.array([6, 2, 0])
  carry, ys = jax.jit(lambda p, x: layer(cell, p, x, lengths, unroll))(
      params, xs)
  x64 = np.asarray(xs, np.float64)
  v_all = keys(name, carry)
  K = v_all.shape[-1]
  for b, L in enumerate(lengths):
    np.testing.assert_array_equal(ys[b, L:], 0)
    if L == 0:
      np.testing.assert_array_equal(carry.h[b], 0)
      np.testing.assert_allclose(v_all[b], keys(name, cell.initial_carry(
          params, (1,)))[0], rtol=1e-6)
      continue
    h, c, v, ref = numpy_run(name, params, x64[b:b + 1, :L])
    np.testing.assert_allclose(ys[b, :L], ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(carry.h[b], h, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v_all[b], v, rtol=1e-5, atol=1e-6)
    assert v.shape == (K,)
    if c is not None:
      np.testing.assert_allclose(carry.c[b], c, rtol=1e-5, atol=1e-6)


def random_carry(name, cell, params):
  c0 = cell.initial_carry(params, (B,))
  if name == "mm_rnn":
    return MMRNNCarry(normal(3, (B, H)),
                      jax.nn.softmax(normal(4, c0.v.shape), -1))
  vs = [jax.nn.softmax(normal(10 + n, v.shape), -1)
        for n, v in enumerate(c0[2:])]
  return MMLSTMCarry(normal(3, (B, H)), normal(4, (B, H)), *vs)


@pytest.mark.parametrize("name", sorted(CELLS))
@pytest.mark.parametrize("unroll,reverse,lengths",
                         checks.option_cases(4, (6, 3, 0)))
def test_every_gradient_matches_autodiff_of_the_scan(name, lengths, reverse,
                                                     unroll):
  """Gradients to every parameter, the inputs and the initial carry equal
  JAX's VJP of the plain scan (fused_grad=False); values too."""
  cell, params = make(name)
  checks.assert_every_gradient_matches_autodiff(
      cell, params, normal(2, (B, T, D)), random_carry(name, cell, params),
      normal(5, (B, T, H)),
      lengths=lengths,
      reverse=reverse, unroll=unroll)


@pytest.mark.parametrize("name", sorted(CELLS))
def test_needs_less_memory_than_the_generic_fused_scan(name,
                                                       monkeypatch):
  """No saved z_t stack ([T, B, sum K*H + sum K]) and no time-major copies
  of the inputs: the compiled training step's temporaries are smaller than
  those of the generic fused scan (XLA's own figures, deterministic)."""
  cell, params = make(name, H_=64)
  xs, G = normal(2, (8, 40, D)), normal(5, (8, 40, 64))
  ours, generic = checks.temp_bytes_vs_generic(fm, cell, params, xs, G,
                                               monkeypatch)
  # 0.63x (mm_rnn), 0.71x (mm_lstm) here; 0.48-0.50x at the benchmark
  # shapes (BUILD_NOTES).
  assert ours <= 0.8 * generic, (ours, generic)


def test_argument_checks_name_the_argument():
  cell, params = make("mm_rnn")
  W, P_h, P_v = layer_args(cell, params)
  xp = precompute(cell, params, normal(2, (B, T, D)))
  c = cell.initial_carry(params, (B,))
  with pytest.raises(ValueError, match=r"every W must be \[K, H, H\] with "
                     r"one H; W 0 is \(4, 5, 6\)"):
    mm_rnn_layer(jnp.zeros((4, H, H + 1)), P_h, P_v, xp, c)
  with pytest.raises(ValueError, match=r"P_h must be \[H, sum K\] = \[5, 4\]"):
    mm_rnn_layer(W, P_h.T, P_v, xp, c)
  with pytest.raises(ValueError, match=r"P_v 0 must be \[K, K\] = \[4, 4\]"):
    mm_rnn_layer(W, P_h, P_v[:3], xp, c)
  with pytest.raises(ValueError, match=r"xp's input terms must be "
                     r"\[B, T, 5\] \(1 x H, H = 5\)"):
    mm_rnn_layer(W, P_h, P_v, MMRNNInputs(xp.hx[..., :4], xp.vx), c)
  with pytest.raises(ValueError,
                     match=r"xp.vx must be \[B, T, sum K\] = \[3, 6, 4\]"):
    mm_rnn_layer(W, P_h, P_v, MMRNNInputs(xp.hx, xp.vx[:, :5]), c)
  with pytest.raises(ValueError, match=r"carry must hold h \[B, H\] = "
                     r"\[3, 5\] and keys \[B, K\] for K in \(4,\)"):
    mm_rnn_layer(W, P_h, P_v, xp, MMRNNCarry(c.h[:2], c.v))
  checks.assert_rejects_lengths_steps_unroll(
      lambda **k: mm_rnn_layer(W, P_h, P_v, xp, c, **k),
      lambda: mm_rnn_layer(W, P_h, P_v, MMRNNInputs(xp.hx[:, :0],
                                                    xp.vx[:, :0]), c), B)
  assert layer_args(sorjax.cells.make("rnn", hidden_size=H), {}) is None

  cell, params = make("mm_lstm")
  Ws, P_h, P_vs = layer_args(cell, params)
  xp = precompute(cell, params, normal(2, (B, T, D)))
  c = cell.initial_carry(params, (B,))
  with pytest.raises(ValueError, match="Ws and P_vs must hold the 4 gates "
                     "c, i, f, o; got 3 and 4"):
    mm_lstm_layer(Ws[:3], P_h, P_vs, xp, c)
  with pytest.raises(ValueError, match=r"xp's input terms must be "
                     r"\[B, T, 20\] \(4 x H, H = 5\)"):
    mm_lstm_layer(Ws, P_h, P_vs, xp._replace(gx=xp.gx[..., :5]), c)
  with pytest.raises(ValueError, match=r"carry.c must be \[B, H\] = \[3, 5\]"):
    mm_lstm_layer(Ws, P_h, P_vs, xp, c._replace(c=c.c[:, :4]))
  with pytest.raises(ValueError, match=r"keys \[B, K\] for K in "
                     r"\(3, 1, 2, 4\)"):
    mm_lstm_layer(Ws, P_h, P_vs, xp, c._replace(v_f=c.v_c))
