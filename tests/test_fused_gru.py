"""sorjax.fused_gru against a NumPy loop of the GRU's equations (values,
final carry, masking by lengths); against JAX's autodiff of the plain scan
(every gradient, with lengths, reverse, unroll and a given carry); its
memory against the generic fused path; and its argument checks. bfloat16,
vmap and routing: tests/test_layers.py."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax.cells.base import HCarry
from sorjax.fused_gru import gru_layer, layer_args, run_layer
from tests import layer_checks as checks
from tests.cells.reference import normal, np_params, random_params
from tests.cells.test_gru import numpy_step

fg = importlib.import_module("sorjax.fused_gru")

B, T, D = 3, 6, 2
H = 4  # tests.cells.test_gru's NumPy step is written for its H


def make(H_=H, seed=0):
  cell = sorjax.cells.make("gru", hidden_size=H_)
  return cell, random_params(cell, D, seed)  # biases off zero too


def layer(cell, params, xs, lengths=None, unroll=None, carry=None):
  B_, T_, _ = xs.shape
  xp = cell.precompute(params, xs.reshape(B_ * T_, -1)).reshape(B_, T_, -1)
  if carry is None:
    carry = cell.initial_carry(params, (B_,))
  return run_layer(layer_args(cell, params), xp, carry, lengths, unroll)


@pytest.mark.parametrize("unroll", [None, 4])
def test_matches_numpy_loop_per_example_length(unroll):
  """Example b runs lengths[b] steps of the GRU's equations from its own
  h_0: its outputs there, zeros after, and the carry of its last step."""
  cell, params = make()
  xs = normal(1, (B, T, D))
  h0 = normal(3, (B, H))
  lengths = np.array([6, 2, 0])
  carry, ys = jax.jit(lambda p, x, h: layer(cell, p, x, lengths, unroll,
                                            HCarry(h)))(params, xs, h0)
  checks.assert_each_example_runs_its_length(
      ys, carry, (h0,), lengths, numpy_step(np_params(params)), xs)


@pytest.mark.parametrize("unroll,reverse,lengths",
                         checks.option_cases(4, (6, 3, 0)))
def test_every_gradient_matches_autodiff_of_the_scan(lengths, reverse,
                                                     unroll):
  """Gradients to every parameter, the inputs and the initial carry equal
  JAX's VJP of the plain scan (fused_grad=False); values too."""
  cell, params = make()
  xs, h0 = normal(2, (B, T, D)), normal(3, (B, H))
  checks.assert_every_gradient_matches_autodiff(
      cell, params, xs, HCarry(h0), normal(5, (B, T, H)),
      lengths=lengths,
      reverse=reverse, unroll=unroll)


def test_needs_less_memory_than_the_generic_fused_scan(monkeypatch):
  """No saved h_{t-1} W_h stack and no time-major copies: the compiled
  training step's temporaries are smaller than the generic fused scan's
  (XLA's own figures, deterministic)."""
  cell = sorjax.cells.make("gru", hidden_size=64)
  params = random_params(cell, 64, 0)
  xs, G = normal(2, (8, 40, 64)), normal(5, (8, 40, 64))
  ours, generic = checks.temp_bytes_vs_generic(fg, cell, params, xs, G,
                                               monkeypatch)
  # 0.70x here and at B=32 T=100 H=256, 0.64x at B=64 T=100 H=512.
  assert ours <= 0.75 * generic, (ours, generic)


def test_argument_checks_name_the_argument():
  cell, params = make()
  W_h, b_hn = layer_args(cell, params)
  xp = jnp.zeros((B, T, 3 * H))
  c = cell.initial_carry(params, (B,))
  with pytest.raises(ValueError, match=r"W_h must be \[H, 3H\], got shape "
                     r"\(4, 8\)"):
    gru_layer(W_h[:, :8], b_hn, xp, c)
  with pytest.raises(ValueError, match=r"b_hn must be \[H\] = \[4\]"):
    gru_layer(W_h, b_hn[:3], xp, c)
  with pytest.raises(ValueError, match=r"xp must be \[B, T, 3H\] with H = 4, "
                     r"got \(3, 6, 11\)"):
    gru_layer(W_h, b_hn, xp[..., :11], c)
  with pytest.raises(ValueError, match=r"carry.h must be \[B, H\] = \[3, 4\]"):
    gru_layer(W_h, b_hn, xp, HCarry(c.h[:2]))
  checks.assert_rejects_lengths_steps_unroll(
      lambda **k: gru_layer(W_h, b_hn, xp, c, **k),
      lambda: gru_layer(W_h, b_hn, xp[:, :0], c), B)
  assert layer_args(sorjax.cells.make("rnn", hidden_size=H), {}) is None
