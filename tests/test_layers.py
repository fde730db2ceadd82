"""Checks every cell-specific layer primitive passes alike, one table of
them: bfloat16 gradients within bfloat16 rounding of float32's (the weight
sums accumulate in float32), vmap over replicas equal to each replica,
`sorjax.unroll` running the layer exactly on its route (and returning what
the plain scan does), and every gradient kept with the loops' per-step
products in `layer_scan.step_product`'s gate-major form. Each layer's own
module (tests/test_fused_*.py) checks its values against a NumPy loop of
its equations, every gradient against autodiff, its memory and its
argument errors."""

import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax import layer_scan
from tests import layer_checks as checks
from tests.cells.reference import normal, random_params

B, T, D, H = 3, 6, 2, 5

# Routes of a layer that runs at every size, as the LSTM's: hoisted,
# without remat, unless fused_grad=False.
EVERY_SIZE_ROUTES = [
    (12, {}, True), (128, {}, True), (12, dict(fused_grad=True), True),
    (12, dict(fused_grad=False), False), (12, dict(remat=True), False),
    (12, dict(remat="dots"), False), (12, dict(hoist=False), False),
    (12, dict(hoist=False, fused_grad=True), False)]


# dyck_rnn's: from hidden size 128 or with fused_grad=True (it has no
# split step, so no generic fused path either).
DYCK_ROUTES = [
    (128, {}, True), (12, {}, False), (12, dict(fused_grad=True), True),
    (128, dict(fused_grad=False), False), (128, dict(remat=True), False),
    (128, dict(remat="dots"), False), (128, dict(hoist=False), False)]


def _assignment():
  rng = np.random.default_rng(1)
  return {"assignment": jnp.asarray(rng.integers(0, 2, (B, T)), jnp.int32)}


# key: (layer module, cell name, hyperparameters besides hidden_size, the
# cell's per-token aux or None, the routes on which the layer runs).
LAYERS = {
    "rnn": ("fused_rnn", "rnn", {}, None, checks.ROUTES),
    "gru": ("fused_gru", "gru", {}, None, checks.ROUTES),
    "mlstm": ("fused_mlstm", "mlstm", dict(intermediate_size=7), None,
              checks.ROUTES),
    "tensor_rnn": ("fused_tensor_rnn", "tensor_rnn", {}, None,
                   EVERY_SIZE_ROUTES),
    "dyck_rnn": ("fused_dyck_rnn", "dyck_rnn", dict(learn_embedding=True),
                 None, DYCK_ROUTES),
    "mm_rnn": ("fused_mm_rnn", "mm_rnn", dict(num_matrices=4), None,
               checks.ROUTES),
    "mm_lstm": ("fused_mm_rnn", "mm_lstm", dict(num_matrices=(3, 1, 2, 4)),
                None, checks.ROUTES),
    "attention_lstm": ("fused_attention_lstm", "attention_lstm",
                       dict(num_cells=2), None, checks.ROUTES),
    "attention_lstm_gates": ("fused_attention_lstm", "attention_lstm",
                             dict(num_cells=2, mix="gates"), None,
                             checks.ROUTES),
    "assignment_lstm": ("fused_attention_lstm", "assignment_lstm",
                        dict(num_cells=2), _assignment, checks.ROUTES),
}


def make(key, H_=H):
  _, name, hp, _, _ = LAYERS[key]
  cell = sorjax.cells.make(name, hidden_size=H_, **hp)
  return cell, random_params(cell, D, 0)  # biases off zero too


def aux(key):
  fn = LAYERS[key][3]
  return {} if fn is None else fn()


# assignment_lstm's assignment is an int aux that these two helpers, which
# differentiate the cell alone, do not pass; its layer is attention_lstm
# mix="gates"'s, covered by that entry.
NO_AUX = sorted(k for k in LAYERS if LAYERS[k][3] is None)


@pytest.mark.parametrize("key", NO_AUX)
def test_bfloat16_gradients_close_to_float32(key):
  cell, params = make(key, H_=16)
  checks.assert_bfloat16_grads_close(cell, params, normal(2, (B, T, D)),
                                     normal(5, (B, T, 16)))


@pytest.mark.parametrize("key", NO_AUX)
def test_vmap_over_replicas_equals_each_replica(key):
  checks.assert_vmap_equals_each_replica(make(key)[0], D,
                                         normal(2, (B, T, D)),
                                         normal(5, (B, T, H)))


@pytest.mark.parametrize("key,H_,opts,expected", [
    (k, *route) for k in sorted(LAYERS) for route in LAYERS[k][4]])
def test_unroll_runs_the_layer_exactly_on_its_route(key, H_, opts, expected,
                                                    monkeypatch):
  """The fused path (fused_grad=True, or None from H = 128; tensor_rnn at
  every size; dyck_rnn, which has no generic fused path, the same) of a
  hoisted cell without remat is its layer; its result is what unroll
  returns."""
  cell, params = make(key, H_=H_)
  module = importlib.import_module(f"sorjax.{LAYERS[key][0]}")
  checks.assert_unroll_routes_through(module, cell, params,
                                      normal(2, (B, T, D)), opts, expected,
                                      monkeypatch, **aux(key))


def _gate_major_dots(cell, params, xs, G):
  """The number of dots in the compiled training step (fused path) in
  `step_product`'s gate-major form: W^T by a^T, both contracted along
  their last axis, giving y^T [N, B]."""
  def step(p, x):
    return jax.grad(lambda p, x: jnp.sum(sorjax.unroll(
        cell, p, x, fused_grad=True)[1] * G), (0, 1))(p, x)
  hlo = jax.jit(step).lower(params, xs).compile().as_text()
  return sum(bool(" dot(" in line and re.search(rf"= f32\[\d+,{B}\]", line)
                  and "lhs_contracting_dims={1}, rhs_contracting_dims={1}"
                  in line) for line in hlo.splitlines())


# The layers whose loops multiply by a weight matrix every step, the LSTM
# layer (batch-major at this size) and the generic fused path (mrnn has no
# layer of its own). tensor_rnn's step contracts a [D, H, H] tensor with
# x_t and h_{t-1}; dyck_rnn's has no recurrent weights.
STEP_PRODUCT_CASES = sorted(set(NO_AUX) - {"dyck_rnn", "tensor_rnn"}) + [
    "lstm", "mrnn"]


@pytest.mark.parametrize("key", STEP_PRODUCT_CASES)
def test_gate_major_step_products_keep_every_gradient(key, monkeypatch):
  """With `layer_scan.step_product`'s size rule lowered to every weight,
  the loops' per-step products run gate-major (more dots give y^T
  [N, B]) and the fused path's values and gradients to every parameter
  and the inputs still equal autodiff of the plain scan."""
  if key in ("lstm", "mrnn"):
    hp = dict(intermediate_size=7) if key == "mrnn" else {}
    cell = sorjax.cells.make(key, hidden_size=H, **hp)
    params = random_params(cell, D, 0)
  else:
    cell, params = make(key)
  xs, G = normal(2, (B, T, D)), normal(5, (B, T, H))
  plain = _gate_major_dots(cell, params, xs, G)
  monkeypatch.setattr(layer_scan, "STEP_GATE_MAJOR_ELEMS", (1, 1))
  assert _gate_major_dots(cell, params, xs, G) > plain

  def loss(fused_grad):
    def f(p, x):
      ys = sorjax.unroll(cell, p, x, fused_grad=fused_grad)[1]
      return jnp.sum(ys * G), ys
    return jax.jit(jax.value_and_grad(f, (0, 1), has_aux=True))

  (_, ys), grads = loss(True)(params, xs)
  (_, ref), ref_grads = loss(False)(params, xs)
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-6)
  for g, r in zip(jax.tree_util.tree_leaves(grads),
                  jax.tree_util.tree_leaves(ref_grads)):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
