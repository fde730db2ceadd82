"""sorjax.fused_mlstm against a NumPy loop of Krause et al.'s equations for
both candidate activations (values, final carry, masking by lengths, a
given (h_0, c_0)); against JAX's autodiff of the plain scan (every
gradient, with lengths, reverse, unroll and a given carry); the bias
added in the layer's step (against b inside gx, and left out of the
compiled step's hoisted product); its memory against the generic fused
path; its argument checks. bfloat16, vmap, routing and the transposed
per-step products: tests/test_layers.py."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax.cells.base import LSTMCarry
from sorjax.cells.mlstm import MLSTMInputs
from sorjax.fused_mlstm import layer_args, mlstm_layer, run_layer
from tests import layer_checks as checks
from tests.cells.reference import normal, np_params, random_params, sigmoid

fm = importlib.import_module("sorjax.fused_mlstm")

B, T, D, H, M = 3, 6, 2, 5, 7
ACTS = ["identity", "tanh"]
ACT = {"identity": lambda z: z, "tanh": np.tanh}


def make(H_=H, M_=M, seed=0, act="identity"):
  cell = sorjax.cells.make("mlstm", hidden_size=H_, intermediate_size=M_,
                           candidate_activation=act)
  return cell, random_params(cell, D, seed)  # b off zero too


def numpy_step(p, act):
  """Row form: m = (x W_mx) * (h W_mh); i, f, g, o = x W_x + m W_m + b;
  c = sigma(f) c + sigma(i) act(g); h = sigma(o) tanh(c)."""
  def step(state, x):
    h, c = state
    m = (x @ p["W_mx"]) * (h @ p["W_mh"])
    i, f, g, o = np.split(x @ p["W_x"] + m @ p["W_m"] + p["b"], 4, axis=-1)
    c = sigmoid(f) * c + sigmoid(i) * ACT[act](g)
    h = sigmoid(o) * np.tanh(c)
    return (h, c), h
  return step


def precompute(cell, params, xs):
  return jax.tree_util.tree_map(
      lambda a: a.reshape(B, T, -1),
      cell.precompute(params, xs.reshape(B * T, -1)))


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("unroll", [None, 4])
def test_matches_numpy_loop_per_example_length(act, unroll):
  """Example b runs lengths[b] steps of the equations from its own
  (h_0, c_0): its outputs there, zeros after, and the carry of its last
  step."""
  cell, params = make(act=act)
  xs = normal(1, (B, T, D))
  h0, c0 = normal(3, (B, H), 0.5), normal(4, (B, H), 0.5)
  lengths = np.array([6, 2, 0])
  def run(p, x):  # b (nonzero) enters the layer's map, not gx
    args = layer_args(cell, p)
    return run_layer(args, precompute(cell, fm.precompute_params(args, p), x),
                     LSTMCarry(h0, c0), jnp.asarray(lengths), unroll)
  carry, ys = jax.jit(run)(params, xs)
  checks.assert_each_example_runs_its_length(
      ys, carry, (h0, c0), lengths, numpy_step(np_params(params), act), xs)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("unroll,reverse,lengths",
                         checks.option_cases(4, (6, 3, 0)))
def test_every_gradient_matches_autodiff_of_the_scan(act, lengths, reverse,
                                                     unroll):
  """Gradients to every parameter, the inputs and the initial carry equal
  JAX's VJP of the plain scan (fused_grad=False); values too."""
  cell, params = make(act=act)
  xs = normal(2, (B, T, D))
  carry = LSTMCarry(normal(3, (B, H), 0.5), normal(4, (B, H), 0.5))
  checks.assert_every_gradient_matches_autodiff(
      cell, params, xs, carry, normal(5, (B, T, H)),
      lengths=lengths,
      reverse=reverse, unroll=unroll)


@pytest.mark.parametrize("act", ACTS)
def test_bias_in_the_map_equals_bias_in_gx(act):
  """The layer given b (added inside its step) over gx = x W_x computes
  what it computes with b inside gx, and b's gradient is the sum of gx's
  over all steps."""
  cell, params = make(act=act)
  args = layer_args(cell, params)
  xp = precompute(cell, params, normal(1, (B, T, D)))  # gx = x W_x + b
  carry = LSTMCarry(normal(3, (B, H), 0.5), normal(4, (B, H), 0.5))
  G, lengths = normal(5, (B, T, H)), jnp.array([6, 2, 0])

  def loss(b, gx):
    c, ys = mlstm_layer(args.W_mh, args.W_m, xp._replace(gx=gx), carry,
                        lengths, candidate_activation=act, b=b)
    return jnp.sum(ys * G) + jnp.sum(c.c), ys

  checks.assert_bias_in_map_equals_bias_in_gx(loss, args.b, xp.gx)


def test_unroll_leaves_the_bias_out_of_the_hoisted_gates(monkeypatch):
  """unroll precomputes gx = x W_x with b = 0 for the layer: the compiled
  training step adds nothing to the hoisted [T*B, 4H] product (B=8 T=40
  H=16); with b in gx, as before session 36, it does."""
  cell = sorjax.cells.make("mlstm", hidden_size=16, intermediate_size=12)
  params = random_params(cell, D, 0)
  adds = lambda: checks.adds_to_hoisted_product(  # noqa: E731
      cell, params, normal(2, (8, 40, D)), 8 * 40, 4 * 16)
  assert not adds()
  args = fm.layer_args
  monkeypatch.setattr(fm, "layer_args",
                      lambda c, p: args(c, p)._replace(b=None))
  monkeypatch.setattr(fm, "precompute_params", lambda args, p: p)
  assert len(adds()) == 1


def test_needs_less_memory_than_the_generic_fused_scan(monkeypatch):
  """No saved m_t W_m stack and no time-major copies: the compiled
  training step's temporaries are smaller than the generic fused scan's
  (XLA's own figures, deterministic)."""
  cell = sorjax.cells.make("mlstm", hidden_size=64, intermediate_size=64)
  params = random_params(cell, 64, 0)
  xs, G = normal(2, (8, 40, 64)), normal(5, (8, 40, 64))
  ours, generic = checks.temp_bytes_vs_generic(fm, cell, params, xs, G,
                                               monkeypatch)
  assert ours <= 0.9 * generic, (ours, generic)


def test_argument_checks_name_the_argument():
  cell, params = make()
  W_mh, W_m = params["W_mh"], params["W_m"]
  xp = MLSTMInputs(jnp.zeros((B, T, M)), jnp.zeros((B, T, 4 * H)))
  c = cell.initial_carry(params, (B,))
  with pytest.raises(ValueError, match=r"W_mh must be \[H, M\] and W_m "
                     r"\[M, 4H\], got \(5, 7\) and \(6, 20\)"):
    mlstm_layer(W_mh, W_m[:6], xp, c)
  with pytest.raises(ValueError, match=r"xp.gx must be \[B, T, 4H\] with "
                     r"H = 5, got \(3, 6, 19\)"):
    mlstm_layer(W_mh, W_m, xp._replace(gx=xp.gx[..., :19]), c)
  with pytest.raises(ValueError, match=r"xp.mx must be \[B, T, M\] = "
                     r"\[3, 6, 7\], got \(3, 6, 6\)"):
    mlstm_layer(W_mh, W_m, xp._replace(mx=xp.mx[..., :6]), c)
  with pytest.raises(ValueError, match=r"carry \(h, c\) must be \[B, H\] = "
                     r"\[3, 5\] each"):
    mlstm_layer(W_mh, W_m, xp, LSTMCarry(c.h[:2], c.c))
  checks.assert_rejects_lengths_steps_unroll(
      lambda **k: mlstm_layer(W_mh, W_m, xp, c, **k),
      lambda: mlstm_layer(W_mh, W_m, MLSTMInputs(xp.mx[:, :0], xp.gx[:, :0]),
                          c), B)
  with pytest.raises(ValueError, match="candidate_activation must be "
                     "'identity' or 'tanh', got 'relu'"):
    mlstm_layer(W_mh, W_m, xp, c, candidate_activation="relu")
  with pytest.raises(ValueError, match=r"b must be \[4H\] = \[20\], got "
                     r"shape \(5, 4\)"):
    mlstm_layer(W_mh, W_m, xp, c, b=jnp.zeros((5, 4)))
  assert layer_args(sorjax.cells.make("gru", hidden_size=H), {}) is None
