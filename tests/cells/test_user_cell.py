"""A researcher's own cell, written to the protocol (README, "Your own
cell") and never registered, runs through the public API as the zoo's do:
`unroll` (against a NumPy loop of its equation), `unroll_layers`, the flax
models, `sorjax.linen`, `budget.count`, and the argument checks name it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import sorjax
from sorjax.cells import base


@dataclasses.dataclass(frozen=True)
class GatedProduct:
  """h_t = tanh((x_t U) * (h_{t-1} W) + x_t V + b): a toy second-order cell."""
  hidden_size: int

  def init(self, key, input_size, dtype=jnp.float32):
    kU, kW, kV = jax.random.split(key, 3)
    H = self.hidden_size
    return {"U": base.uniform(kU, (input_size, H), H, dtype),
            "W": base.uniform(kW, (H, H), H, dtype),
            "V": base.uniform(kV, (input_size, H), H, dtype),
            "b": base.zeros((H,), dtype)}

  def initial_carry(self, params, batch_shape=()):
    return base.HCarry(jnp.zeros((*batch_shape, self.hidden_size),
                                 base.param_dtype(params)))

  def precompute(self, params, xs):
    return xs @ params["U"], base.affine(xs, params["V"], params["b"])

  def step(self, params, carry, xp):
    u, v = xp
    h = jnp.tanh(u * (carry.h @ params["W"]) + v)
    return base.HCarry(h), h


@dataclasses.dataclass(frozen=True)
class GatedProductSplit(GatedProduct):
  """The same cell with a split step: z = h_{t-1} W, then the rest, which
  lets `unroll` take the weight gradient of W as one matmul after the
  backward loop (fused_grad)."""

  def split(self, params):
    return params["W"], {}

  def recurrent_input(self, carry):
    return carry.h

  def post(self, q, carry, xp, z):
    u, v = xp
    h = jnp.tanh(u * z + v)
    return base.HCarry(h), h

  def step(self, params, carry, xp):
    return base.split_step(self, params, carry, xp)


def loop(p, xs, lengths, reverse=False):
  """The equation in float64, one example and step at a time."""
  p = {k: np.asarray(v, np.float64) for k, v in p.items()}
  xs = np.asarray(xs, np.float64)
  B, T, _ = xs.shape
  hs, ys = np.zeros((B, p["W"].shape[0])), np.zeros((B, T, p["W"].shape[0]))
  for b in range(B):
    h = np.zeros(p["W"].shape[0])
    ts = range(lengths[b])
    for t in (reversed(ts) if reverse else ts):
      x = xs[b, t]
      h = np.tanh((x @ p["U"]) * (h @ p["W"]) + x @ p["V"] + p["b"])
      ys[b, t] = h
    hs[b] = h
  return hs, ys


@pytest.mark.parametrize("reverse", [False, True])
def test_unroll_runs_an_unregistered_cell_as_its_equation(reverse):
  cell = GatedProduct(6)
  p = cell.init(jax.random.key(0), 4)
  xs = jax.random.normal(jax.random.key(1), (3, 5, 4))
  lengths = np.array([5, 2, 0])
  carry, ys = jax.jit(lambda p, xs: sorjax.unroll(
      cell, p, xs, lengths=jnp.asarray(lengths), reverse=reverse))(p, xs)
  h, y = loop(p, xs, lengths, reverse)
  np.testing.assert_allclose(carry.h, h, atol=2e-6)
  np.testing.assert_allclose(np.asarray(ys)[0], y[0], atol=2e-6)
  np.testing.assert_allclose(np.asarray(ys)[1, :2], y[1, :2], atol=2e-6)
  # its gradient: the generic scan's autodiff, finite differences agree
  f = lambda p: sorjax.unroll(cell, p, xs)[1].sum()
  g = jax.grad(f)(p)
  d = jax.random.normal(jax.random.key(2), p["W"].shape)
  eps = 1e-2
  fd = (f({**p, "W": p["W"] + eps * d}) - f({**p, "W": p["W"] - eps * d})
        ) / (2 * eps)
  np.testing.assert_allclose(jnp.vdot(g["W"], d), fd, rtol=1e-2)


def test_an_unregistered_split_step_cell_takes_the_fused_gradient():
  cell = GatedProductSplit(6)
  p = cell.init(jax.random.key(0), 4)
  xs = jax.random.normal(jax.random.key(1), (3, 5, 4))
  lengths = jnp.array([5, 2, 1])
  h, _ = loop(p, xs, np.asarray(lengths))
  np.testing.assert_allclose(
      sorjax.unroll(cell, p, xs, lengths=lengths)[0].h, h, atol=2e-6)

  def f(p, fused):
    _, ys = sorjax.unroll(cell, p, xs, lengths=lengths, fused_grad=fused)
    return (ys * jnp.arange(6.0)[None, None]).sum()
  want = jax.grad(f)(p, False)
  got = jax.grad(f)(p, True)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], atol=1e-5, err_msg=k)


def test_an_unregistered_cell_is_named_in_errors_and_counted():
  cell = GatedProduct(6)
  p = cell.init(jax.random.key(0), 4)
  with pytest.raises(ValueError, match="GatedProduct"):
    sorjax.unroll(cell, p, jnp.ones((2, 3, 5)))   # 5 inputs, params for 4
  with pytest.raises(ValueError, match="fused_grad=True needs a cell with a "
                     "split step"):
    sorjax.unroll(cell, p, jnp.ones((2, 3, 4)), fused_grad=True)
  assert sorjax.budget.count(cell, 4) == 2 * 4 * 6 + 6 * 6 + 6
  assert sorjax.cells.name_of(cell) == "GatedProduct"


def test_an_unregistered_cell_stacks_and_trains_in_the_flax_models():
  cells = (GatedProduct(8), sorjax.cells.make("lstm", hidden_size=8))
  model = sorjax.models.LanguageModel(cells=cells, vocab_size=11,
                                      embed_size=5)
  tokens = (jnp.arange(9)[None] + jnp.arange(4)[:, None]) % 11  # learnable
  variables = model.init(jax.random.key(1), tokens)
  logits, _ = model.apply(variables, tokens)
  assert logits.shape == (4, 9, 11)
  # the trunk is unroll_layers over the cells: the first layer's output
  # feeds the LSTM
  emb = variables["params"]["embedding"][tokens]
  layer_params = [variables["params"][k] for k in ("layer_0", "layer_1")]
  _, ys = sorjax.unroll_layers(cells, layer_params, emb)
  _, y0 = sorjax.unroll(cells[0], layer_params[0], emb)
  _, y1 = sorjax.unroll(cells[1], layer_params[1], y0)
  np.testing.assert_allclose(ys, y1, atol=1e-6)

  def loss(params):
    logits, _ = model.apply({"params": params}, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, tokens[:, 1:]).mean()
  opt = optax.sgd(1.0)
  params, state = variables["params"], opt.init(variables["params"])
  first = loss(params)
  grad = jax.jit(jax.grad(loss))
  for _ in range(30):
    g = grad(params)
    upd, state = opt.update(g, state)
    params = optax.apply_updates(params, upd)
  assert loss(params) < 0.8 * first
  assert float(jnp.abs(params["layer_0"]["W"]
                       - variables["params"]["layer_0"]["W"]).max()) > 0


def test_an_unregistered_cell_runs_in_flax_linen_rnn():
  import flax.linen as nn
  cell = GatedProduct(6)
  rnn = nn.RNN(sorjax.linen.CellAdapter(cell))
  xs = jax.random.normal(jax.random.key(1), (2, 4, 3))
  variables = rnn.init(jax.random.key(0), xs)
  p = variables["params"]["cell"]
  ys = rnn.apply(variables, xs)
  _, want = sorjax.unroll(cell, p, xs)
  np.testing.assert_allclose(ys, want, atol=1e-6)


def test_the_readmes_cell_snippets_run_as_written():
  """README's "Cells as pure functions" and "Your own cell" code, run in
  order as a reader would paste it."""
  import pathlib
  import re
  readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
  section = readme[readme.index("## Cells as pure functions"):
                   readme.index("## Analysing a trained run")]
  blocks = re.findall(r"```python\n(.*?)```", section, re.S)
  assert len(blocks) == 2 and "class GatedProduct" in blocks[1]
  namespace = {}
  for block in blocks:
    exec(compile(block, "README.md", "exec"), namespace)
  assert namespace["ys"].shape == (8, 100, 256)
  assert type(namespace["cell"]).__name__ == "GatedProduct"
