"""sorjax.fused_dyck_rnn against a NumPy loop of eq. 3-5 with the shift
matrices W_1, W_2 built explicitly (values, final carry, masking by
lengths, a given stack h_0); against JAX's autodiff of the plain scan
(every gradient, with lengths, reverse, unroll and a given carry); unroll's
routing to it from hidden size 128 and with fused_grad=True; its memory
against autodiff; its argument checks. bfloat16, vmap and routing:
tests/test_layers.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax.cells.base import HCarry
from sorjax.cells.dyck_rnn import DyckInputs
from sorjax.fused_dyck_rnn import dyck_rnn_layer, layer_args, run_layer
from tests import layer_checks as checks
from tests.cells.reference import normal, np_params, random_params, sigmoid

B, T, D, H = 3, 6, 2, 5


def make(H_=H, seed=0):
  cell = sorjax.cells.make("dyck_rnn", hidden_size=H_, learn_embedding=True)
  return cell, random_params(cell, D, seed)


def numpy_step(p):
  """Eq. 3-5 in row form with W_1 (ones below the diagonal: push) and W_2
  (ones above it: pop) as matrices: h W^T is the column form's W h."""
  W1, W2 = np.zeros((H, H)), np.zeros((H, H))
  for i in range(H - 1):
    W1[i + 1, i] = W2[i, i + 1] = 1.0

  def step(h, x):
    g = sigmoid(x @ p["W_proj"])                                 # eq. 3
    h = g * (h @ W1.T) + (1 - g) * (h @ W2.T) + g * (x @ p["W_hx"])
    return h, h                                                  # eq. 4-5
  return step


@pytest.mark.parametrize("unroll", [None, 4])
def test_matches_numpy_loop_per_example_length(unroll):
  """Example b runs lengths[b] steps of eq. 3-5 from its own stack h_0:
  its outputs there, zeros after, and the carry of its last step."""
  cell, params = make()
  xs, h0 = normal(1, (B, T, D)), normal(3, (B, H))
  lengths = np.array([6, 2, 0])

  def run(p, x, h):
    xp = cell.precompute(p, x.reshape(B * T, D))
    xp = DyckInputs(xp.g.reshape(B, T, 1), xp.u.reshape(B, T, H))
    return run_layer(layer_args(cell, p), xp, HCarry(h),
                     jnp.asarray(lengths), unroll)

  carry, ys = jax.jit(run)(params, xs, h0)
  checks.assert_each_example_runs_its_length(
      ys, carry, (h0,), lengths, numpy_step(np_params(params)), xs)


@pytest.mark.parametrize("unroll,reverse,lengths",
                         checks.option_cases(4, (6, 3, 0)))
def test_every_gradient_matches_autodiff_of_the_scan(lengths, reverse,
                                                     unroll):
  """Gradients to W_proj, W_hx, the inputs and the initial stack equal
  JAX's VJP of the plain scan (fused_grad=False); values too."""
  cell, params = make()
  checks.assert_every_gradient_matches_autodiff(
      cell, params, normal(2, (B, T, D)), HCarry(normal(3, (B, H))),
      normal(5, (B, T, H)),
      lengths=lengths,
      reverse=reverse, unroll=unroll)


def test_needs_less_memory_than_autodiff_of_the_scan():
  """No per-step residuals of the shifts and no time-major copies: the
  compiled training step's temporaries are a fraction of autodiff's (XLA's
  own figures, deterministic)."""
  cell = sorjax.cells.make("dyck_rnn", hidden_size=128, learn_embedding=True)
  params = random_params(cell, 128, 0)
  xs, G = normal(2, (8, 40, 128)), normal(5, (8, 40, 128))
  ours, autodiff = (checks.train_step_temp_bytes(cell, params, xs, G, f)
                    for f in (None, False))
  # 0.42x here; 0.34x from B=32 T=100 H=128 to B=32 T=200 H=1024
  # (BUILD_NOTES).
  assert ours <= 0.6 * autodiff, (ours, autodiff)


def test_argument_checks_name_the_argument():
  xp = DyckInputs(jnp.zeros((B, T, 1)), jnp.zeros((B, T, H)))
  c = HCarry(jnp.zeros((B, H)))
  with pytest.raises(ValueError, match=r"xp.u must be \[B, T, H\] with "
                     r"H = 5, got \(3, 6, 4\)"):
    dyck_rnn_layer(xp._replace(u=xp.u[..., :4]), c)
  with pytest.raises(ValueError, match=r"xp.g must be \[B, T, 1\] = "
                     r"\[3, 6, 1\], got \(3, 6, 2\)"):
    dyck_rnn_layer(xp._replace(g=jnp.zeros((B, T, 2))), c)
  with pytest.raises(ValueError, match=r"carry.h must be \[B, H\] = \[3, 5\]"):
    dyck_rnn_layer(xp, HCarry(c.h[:2]))
  checks.assert_rejects_lengths_steps_unroll(
      lambda **k: dyck_rnn_layer(xp, c, **k),
      lambda: dyck_rnn_layer(DyckInputs(xp.g[:, :0], xp.u[:, :0]), c), B)
  assert layer_args(sorjax.cells.make("rnn", hidden_size=H), {}) is None
