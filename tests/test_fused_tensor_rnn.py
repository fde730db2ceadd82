"""sorjax.fused_tensor_rnn against a NumPy loop of eq. 5 for both
activations (values, final carry, masking by lengths); against JAX's
autodiff of the plain scan (every gradient, with lengths, reverse, unroll
and a given carry); unhoisted, unroll's default staying autodiff; its
memory against autodiff, the path it replaced; and its argument checks.
bfloat16, vmap and routing: tests/test_layers.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax.cells.base import HCarry
from sorjax.fused_tensor_rnn import layer_args, run_layer, tensor_rnn_layer
from tests import layer_checks as checks
from tests.cells.reference import normal, np_params, random_params

B, T, D, H = 3, 6, 2, 5
PHI = {"tanh": np.tanh, "identity": lambda z: z}


def make(H_=H, seed=0, activation="tanh", D_=D):
  cell = sorjax.cells.make("tensor_rnn", hidden_size=H_,
                           activation=activation)
  return cell, random_params(cell, D_, seed)  # b off zero too


def numpy_step(p, act):
  def step(h, x):  # eq. 5: h_t[j] = phi(sum_{d,i} x[d] h[i] A[d, i, j] + b[j])
    h = PHI[act](np.einsum("bd,bi,dij->bj", x, h, p["A"]) + p["b"])
    return h, h
  return step


@pytest.mark.parametrize("activation", ["tanh", "identity"])
@pytest.mark.parametrize("unroll", [None, 4])
def test_matches_numpy_loop_per_example_length(activation, unroll):
  """Example b runs lengths[b] steps of eq. 5 from its own h_0: its outputs
  there, zeros after, and the carry of its last step."""
  cell, params = make(activation=activation)
  xs, h0 = normal(1, (B, T, D)), normal(3, (B, H))
  lengths = np.array([6, 2, 0])
  carry, ys = jax.jit(lambda p, x, h: run_layer(
      layer_args(cell, p), x, HCarry(h), jnp.asarray(lengths), unroll))(
          params, xs, h0)
  checks.assert_each_example_runs_its_length(
      ys, carry, (h0,), lengths, numpy_step(np_params(params), activation),
      xs)


@pytest.mark.parametrize("activation", ["tanh", "identity"])
@pytest.mark.parametrize("unroll,reverse,lengths",
                         checks.option_cases(4, (6, 3, 0)))
def test_every_gradient_matches_autodiff_of_the_scan(activation, lengths,
                                                     reverse, unroll):
  """Gradients to A, b, the inputs and the initial carry equal JAX's VJP
  of the plain scan (fused_grad=False); values too."""
  cell, params = make(activation=activation)
  xs, h0 = normal(2, (B, T, D)), normal(3, (B, H))
  checks.assert_every_gradient_matches_autodiff(
      cell, params, xs, HCarry(h0), normal(5, (B, T, H)),
      lengths=lengths,
      reverse=reverse, unroll=unroll)


def test_hoist_false_keeps_autodiff_unless_fused_grad_is_asked_for():
  """Unhoisted, the generic fused path (which stacks dz_t [T, B, D*H]) stays
  opt-in: the default is JAX's autodiff, with no custom VJP."""
  cell, params = make(H_=128)
  xs = jax.ShapeDtypeStruct((B, T, D), jnp.float32)
  for fused_grad, custom in ((None, False), (True, True)):
    eqns = jax.make_jaxpr(lambda p, x: sorjax.unroll(
        cell, p, x, hoist=False, fused_grad=fused_grad))(params, xs).eqns
    assert any(e.primitive.name.startswith("custom_vjp")
               for e in eqns) == custom


def test_needs_less_memory_than_autodiff_of_the_scan():
  """No saved h_{t-1} A [T, B, D*H] and no per-step dA accumulator: the
  compiled training step's temporaries are a fraction of autodiff's
  (XLA's own figures, deterministic)."""
  cell, params = make(H_=64, D_=8)
  xs, G = normal(2, (8, 40, 8)), normal(5, (8, 40, 64))
  ours, autodiff = (checks.train_step_temp_bytes(cell, params, xs, G, f)
                    for f in (None, False))
  # 0.10-0.16x at D = 32 from H = 16 to 1024 (BUILD_NOTES).
  assert ours <= 0.5 * autodiff, (ours, autodiff)


def test_argument_checks_name_the_argument():
  cell, params = make()
  A, b = params["A"], params["b"]
  xs = jnp.zeros((B, T, D))
  c = cell.initial_carry(params, (B,))
  with pytest.raises(ValueError, match=r"A must be \[D, H, H\], got shape "
                     r"\(2, 5, 4\)"):
    tensor_rnn_layer(A[..., :4], b, xs, c)
  with pytest.raises(ValueError, match=r"b must be \[H\] = \[5\], got \(4,\)"):
    tensor_rnn_layer(A, b[:4], xs, c)
  with pytest.raises(ValueError, match=r"xs must be \[B, T, D\] with D = 2, "
                     r"got \(3, 6, 3\)"):
    tensor_rnn_layer(A, b, jnp.zeros((B, T, 3)), c)
  with pytest.raises(ValueError, match=r"carry.h must be \[B, H\] = \[3, 5\]"):
    tensor_rnn_layer(A, b, xs, HCarry(c.h[:2]))
  checks.assert_rejects_lengths_steps_unroll(
      lambda **k: tensor_rnn_layer(A, b, xs, c, **k),
      lambda: tensor_rnn_layer(A, b, xs[:, :0], c), B)
  with pytest.raises(ValueError, match="activation must be one of "
                     r"\['identity', 'tanh'\], got 'relu'"):
    tensor_rnn_layer(A, b, xs, c, activation="relu")
  assert layer_args(sorjax.cells.make("rnn", hidden_size=H), {}) is None
