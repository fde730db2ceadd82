"""unroll's batched-weight-gradient path (fused_grad) against JAX autodiff.

The reference is `unroll(..., fused_grad=False)`: JAX's own VJP of the scan,
no custom rule (the protocol grid checks that one against finite
differences). Sizes are all different (B=2, T=7, D=3, H=5, M=4 or 6, S=3)
so shapes in jaxprs identify their arrays.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from sorjax import cells
from sorjax.unroll import supports_fused_grad
from tests.cells.reference import assert_no_bhh, iter_eqns

B, T, D, H = 2, 7, 3, 5

CONFIGS = {
    "rnn": dict(hidden_size=H),
    "lstm": dict(hidden_size=H, forget_bias=1.0),
    "mts_lstm": dict(hidden_size=H, timescales=(1.0, 2.0, 4.0, 8.0, 16.0)),
    "gru": dict(hidden_size=H),
    "tensor_rnn": dict(hidden_size=H),
    "general2": dict(hidden_size=H, intermediate_size=4),
    "mrnn": dict(hidden_size=H, intermediate_size=6),
    "mi_rnn": dict(hidden_size=H),
    "mi_rnn_simple": dict(hidden_size=H, general=False),
    "mlstm": dict(hidden_size=H, intermediate_size=6),
    "attention_lstm": dict(hidden_size=H, num_cells=3),
    "attention_lstm_gates": dict(hidden_size=H, num_cells=3, mix="gates"),
    "assignment_lstm": dict(hidden_size=H, num_cells=3),
    "mm_rnn": dict(hidden_size=H, num_matrices=4),
    "mm_lstm": dict(hidden_size=H, num_matrices=(4, 4, 3, 3)),  # K != B
}
SPLIT = sorted(CONFIGS)


def make(key):
  name = key.replace("_simple", "").replace("_gates", "")
  return cells.make(name, **CONFIGS[key])


def test_every_cell_but_dyck_rnn_has_a_split_step():
  with_split = {n for n in cells.sequence_names()
                if supports_fused_grad(cells.make(n, **_hp(n)))}
  assert with_split == set(cells.sequence_names()) - {"dyck_rnn"}


@pytest.mark.parametrize("key,H_,remat,fused", [
    ("gru", 128, False, True), ("mm_rnn", 128, False, True),
    ("gru", 127, False, False), ("lstm", 12, False, True),
    ("lstm", 128, True, False),
    ("lstm", 128, "dots", False), ("mlstm", 128, False, True),
    ("tensor_rnn", 12, False, True), ("tensor_rnn", 128, True, False)])
def test_default_path_per_cell_size_and_remat(key, H_, remat, fused):
  """fused_grad=None: the custom-VJP scan from hidden size 128 on without
  remat, unless the cell opts out; lstm's and tensor_rnn's layer
  primitives at every size."""
  cell = cells.make(key, **dict(CONFIGS[key], hidden_size=H_))
  params = jax.eval_shape(lambda k: cell.init(k, D), jax.random.key(0))
  xs = jax.ShapeDtypeStruct((B, T, D), jnp.float32)
  eqns = jax.make_jaxpr(lambda p, x: sorjax.unroll(cell, p, x, remat=remat))(
      params, xs).eqns
  assert any(e.primitive.name.startswith("custom_vjp") for e in eqns) == fused


@pytest.mark.parametrize("key,H_,opts,expected", [
    ("lstm", 12, {}, True), ("lstm", 32, {}, True), ("lstm", 64, {}, True),
    ("lstm", 128, {}, True),
    ("mts_lstm", 16, {}, True), ("lstm", 64, dict(fused_grad=True), True),
    ("lstm", 128, dict(fused_grad=False), False),
    ("lstm", 12, dict(remat=True), False),
    ("lstm", 12, dict(remat="dots"), False),
    ("lstm", 128, dict(hoist=False), False),
    ("gru", 12, dict(fused_grad=True), False)])
def test_lstm_cells_route_through_fused_lstm(key, H_, opts, expected,
                                             monkeypatch):
  """lstm / mts_lstm take `fused_lstm.lstm_layer` at every size unless
  fused_grad=False, remat or unhoisted precompute asks otherwise; its result
  is what unroll returns."""
  import importlib
  fl = importlib.import_module("sorjax.fused_lstm")
  calls = []
  real = fl.lstm_layer

  def spy(*a, **k):
    calls.append(a)
    return real(*a, **k)
  monkeypatch.setattr(fl, "lstm_layer", spy)
  hp = dict(CONFIGS[key], hidden_size=H_)
  if key == "mts_lstm":
    hp["timescales"] = tuple(float(t + 1) for t in range(H_))
  cell = cells.make(key, **hp)
  params = cell.init(jax.random.key(0), D)
  xs = jax.random.normal(jax.random.key(1), (B, T, D))
  L = jnp.asarray((T, 3), jnp.int32)
  _, ys = sorjax.unroll(cell, params, xs, lengths=L, **opts)
  assert bool(calls) == expected
  if expected:  # same outputs as the autodiff scan of cell.step
    _, ref = sorjax.unroll(cell, params, xs, lengths=L, fused_grad=False)
    np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-6)


def _hp(name):
  return CONFIGS.get(name, dict(hidden_size=H, learn_embedding=True))


def setup(key, dtype=jnp.float64, seed=0):
  """Cell, params, xs, a non-zero initial carry, float aux, int aux. Every
  parameter (biases and gains too) is random, so no gradient is trivially
  zero; NumPy draws, so no per-shape RNG compiles."""
  cell = make(key)
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(lambda k: cell.init(k, D, dtype), jax.random.key(0))
  params = {k: jnp.asarray(rng.uniform(-0.6, 0.6, v.shape), dtype)
            for k, v in shapes.items()}
  xs = jnp.asarray(rng.standard_normal((B, T, D)), dtype)
  carry = jax.tree_util.tree_map(
      lambda a: jnp.asarray(0.5 * rng.uniform(0.1, 1, a.shape), dtype),
      jax.eval_shape(lambda p: cell.initial_carry(p, (B,)), params))
  faux, iaux = {}, {}
  if key == "attention_lstm":  # one temperature per token
    faux = {"temperature": jnp.asarray(rng.uniform(0.5, 2, (B, T)), dtype)}
  if key == "attention_lstm_gates":  # a scalar temperature
    faux = {"temperature": jnp.asarray(0.8, dtype)}
  if key == "assignment_lstm":
    iaux = {"assignment": jnp.asarray(rng.integers(0, 3, (B, T)), jnp.int32)}
  return cell, params, xs, carry, faux, iaux


def loss_fn(cell, iaux, w, **opts):
  def loss(params, xs, carry, faux):
    final, ys = sorjax.unroll(cell, params, xs, carry=carry, **opts, **faux,
                              **iaux)
    return jnp.sum(ys * w) + sum(jnp.sum(jnp.sin(l)) for l in
                                 jax.tree_util.tree_leaves(final))
  return loss


def both_grads(key, **opts):
  cell, params, xs, carry, faux, iaux = setup(key)
  w = jnp.asarray(np.random.default_rng(7).standard_normal(
      (B, T, cell.hidden_size)))
  grads = [jax.grad(loss_fn(cell, iaux, w, fused_grad=f, **opts),
                    argnums=(0, 1, 2, 3)) for f in (True, False)]
  return jax.jit(lambda *a: (grads[0](*a), grads[1](*a)))(
      params, xs, carry, faux)


def assert_trees_close(a, b, rtol=1e-10, atol=1e-12):
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  assert len(la) == len(lb) and la
  for x, y in zip(la, lb):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol,
                               atol=atol)


OPTIONS = {
    "lengths_reverse": dict(lengths=jnp.array([4, T]), reverse=True),
    "unhoisted": dict(hoist=False, lengths=jnp.array([T, 5])),
    "unhoisted_reverse_unroll": dict(hoist=False, reverse=True, unroll=2),
    "remat": dict(remat=True, lengths=jnp.array([2, T])),
    "remat_dots": dict(remat="dots"),
}
# Every cell with masking and per-example reversal; every other option
# (without lengths: no mask) on lstm; the options whose code depends on the
# cell's inputs on the cells that have them: a second matmul in post (mrnn), a traced float aux
# (attention_lstm) and an int aux (assignment_lstm) through precompute's VJP.
CASES = ([(k, "lengths_reverse") for k in SPLIT]
         + [("lstm", o) for o in ("unhoisted_reverse_unroll", "remat",
                                   "remat_dots")]
         + [("mrnn", "remat"), ("mrnn", "unhoisted"),
            ("attention_lstm", "unhoisted_reverse_unroll"),
            ("attention_lstm_gates", "unhoisted"),
            ("assignment_lstm", "unhoisted")])


@pytest.fixture
def fast_compile():
  """Tiny shapes: XLA's optimisations cost more compile time than they save."""
  before = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", before)


@pytest.mark.parametrize("key,option", CASES)
def test_gradients_equal_autodiff(key, option, fast_compile):
  with jax.enable_x64(True):
    fused, plain = both_grads(key, **OPTIONS[option])
  nonzero = [np.max(np.abs(l)) for l in jax.tree_util.tree_leaves(plain)]
  assert min(nonzero) > 0, f"{key}: a zero reference gradient tests nothing"
  assert_trees_close(fused, plain)


@pytest.mark.parametrize("key,hoist", [("gru", True), ("gru", False),
                                       ("dyck_rnn", True)])
def test_zero_steps_pass_the_carry_and_its_gradient_through(key, hoist):
  # T = 0: the final carry is the initial one, so its gradient is the
  # loss's, and the weights get zero gradients, as autodiff of lax.scan.
  # (dyck_rnn: fused_grad=True picks its layer, which has no split step to
  # fall back on when there are no steps.)
  cell = cells.make(key, hidden_size=4, **(
      {"learn_embedding": True} if key == "dyck_rnn" else {}))
  params = cell.init(jax.random.key(0), 3)
  carry = cell.initial_carry(params, (2,))
  xs = jnp.zeros((2, 0, 3))

  def loss(p, c, fused):
    c, ys = sorjax.unroll(cell, p, xs, carry=c, hoist=hoist,
                          fused_grad=fused)
    assert ys.shape == (2, 0, 4)
    return jnp.sum(c.h * jnp.arange(1.0, 5.0)[None])

  got = jax.grad(loss, argnums=(0, 1))(params, carry, True)
  ref = jax.grad(loss, argnums=(0, 1))(params, carry, False)
  assert_trees_close(got, ref, rtol=0, atol=0)
  np.testing.assert_array_equal(got[1].h, jnp.broadcast_to(
      jnp.arange(1.0, 5.0), (2, 4)))


def test_forward_is_the_same_computation():
  """The generic fused path's forward is the plain scan's, bit for bit
  (mrnn: a second matmul in post; the layers' own forwards, such as
  fused_mlstm's one activation map, are checked to 1e-5 in their tests)."""
  with jax.enable_x64(True):
    cell, params, xs, carry, _, _ = setup("mrnn")
    opts = dict(carry=carry, lengths=jnp.array([T, 4]), reverse=True)
    a = sorjax.unroll(cell, params, xs, fused_grad=True, **opts)
    b = sorjax.unroll(cell, params, xs, fused_grad=False, **opts)
  assert_trees_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("key", ["attention_lstm"])
def test_gradients_under_vmap_over_params(key, fast_compile):
  """Replicas as the Trainer runs them: vmap of grad over stacked params."""
  with jax.enable_x64(True):
    cell, _, xs, carry, faux, iaux = setup(key)
    params = jax.tree_util.tree_map(
        lambda *a: jnp.stack(a),
        *[setup(key, seed=s)[1] for s in (1, 2)])
    w = jnp.ones((B, T, cell.hidden_size), jnp.float64)
    opts = dict(lengths=jnp.array([T, 4]))
    g = lambda f: jax.grad(loss_fn(cell, iaux, w, fused_grad=f, **opts),
                           argnums=(0, 3))
    vm = jax.jit(jax.vmap(g(True), in_axes=(0, None, None, None)))(
        params, xs, carry, faux)
    for r in range(2):
      p = jax.tree_util.tree_map(lambda a: a[r], params)
      ref = g(False)(p, xs, carry, faux)
      assert_trees_close(jax.tree_util.tree_map(lambda a: a[r], vm), ref)


@pytest.mark.parametrize("key", SPLIT)
def test_step_is_post_of_the_split_matmul(key):
  with jax.enable_x64(True):
    cell, params, xs, carry, faux, iaux = setup(key)
    aux = {k: (v[:, 0] if v.ndim >= 2 else v)
           for k, v in {**faux, **iaux}.items()}
    W, q = cell.split(params)
    assert cell.recurrent_input(carry).shape[-1] == W.shape[0]
    # W must not also be in q: its zero per-step cotangent would be summed.
    assert not any(l.shape == W.shape for l in jax.tree_util.tree_leaves(q))

    def three(p, c, x):
      xp = cell.precompute(p, x, **aux)
      W, q = cell.split(p)
      z = cell.recurrent_input(c) @ W
      return (cell.step(p, c, xp), cell.post(q, c, xp, z),
              cell.post(q, c, xp, jnp.zeros_like(z)))
    ref, out, out0 = jax.jit(three)(params, carry, xs[:, 0])
  assert_trees_close(out, ref, rtol=1e-13, atol=1e-15)
  # ... and the recurrent matmul matters: post without it differs.
  assert not np.allclose(out0[1], ref[1])


# ------------------------------------------------------------------ jaxpr

def _scan_bodies(jaxpr, reverse):
  """Body jaxprs of every scan (at any depth) with the given direction."""
  from jax.extend import core as jcore
  out = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scan" and eqn.params["reverse"] == reverse:
      out.append(eqn.params["jaxpr"].jaxpr)
    for p in eqn.params.values():
      for sub in (p if isinstance(p, (tuple, list)) else (p,)):
        if isinstance(sub, jcore.ClosedJaxpr):
          out += _scan_bodies(sub.jaxpr, reverse)
        elif isinstance(sub, jcore.Jaxpr):
          out += _scan_bodies(sub, reverse)
  return out


def _dots(jaxpr):
  """(lhs shape, rhs shape, out shape) of the top-level dot_generals."""
  return [(tuple(e.invars[0].aval.shape), tuple(e.invars[1].aval.shape),
           tuple(e.outvars[0].aval.shape))
          for e in jaxpr.eqns if e.primitive.name == "dot_general"]


@pytest.mark.parametrize("key", ["lstm", "gru", "mm_rnn", "mi_rnn"])
def test_backward_forms_dW_in_one_matmul_not_per_step(key):
  # mi_rnn runs the generic fused scan; the others their own layers.
  cell, params, xs, carry, faux, iaux = setup(key, dtype=jnp.float32)
  W, _ = cell.split(params)
  w = jnp.ones((B, T, H), jnp.float32)

  def grad_jaxpr(fused):
    g = jax.grad(loss_fn(cell, iaux, w, fused_grad=fused))
    return jax.make_jaxpr(g)(params, xs, carry, faux).jaxpr

  def per_step_dW(jaxpr):  # arrays of W's shape built in a backward scan
    return [s for body in _scan_bodies(jaxpr, reverse=True)
            for s in intermediate_shapes_of(body) if s == W.shape]

  fused, plain = grad_jaxpr(True), grad_jaxpr(False)
  assert _scan_bodies(fused, reverse=True), "no backward scan found"
  assert not per_step_dW(fused)
  assert per_step_dW(plain), "the check must see autodiff's accumulator"
  if key == "mm_rnn":
    # fused_mm_rnn: dW[k] = sum_t h_{t-1}^T (v_t[k] dpre_t) over all T*B
    # rows: one dot_general per choice matrix, h_{t-1}'s rows transposed
    # once (`transposed_rows`), in a loop of K iterations (a forward scan
    # of length K, not T).
    each = ((H, T * B), (T * B, H), (H, H))
    loops = [e for e in iter_eqns(fused) if e.primitive.name == "scan"
             and e.params["length"] == cell.num_matrices
             and each in _dots(e.params["jaxpr"].jaxpr)]
    assert len(loops) == 1 and cell.num_matrices != T
    return
  if key == "gru":
    # fused_gru: the r and z columns of dW_h from the precompute's
    # cotangent, the n columns from the hn buffer, each one product over
    # all T*B rows of h_{t-1} transposed once (`transposed_rows`; and no
    # [H, 3H] accumulator in the backward scan above).
    for n in (2 * H, H):
      assert ((H, T * B), (T * B, n), (H, n)) in _dots(fused)
    return
  # dW = r^T dz over all T*B rows: one dot_general outside every scan
  # (r [T*B, H] by dz [T*B, 4H] for lstm's fused_lstm layer; r^T [H, T*B]
  # as `row_products` reads it for a wide dz).
  forms = _row_sums(*W.shape)
  assert any(f in _dots(fused) for f in forms)
  assert not any(f in _dots(plain) for f in forms)


def _row_sums(m, n):
  """The dot shapes of one weight sum sum_r a_r^T d_r [m, n] over the T*B
  rows: rows-contracted, or from a^T (`layer_scan.row_products` for n >=
  WIDE_ROWS * m)."""
  return (((T * B, m), (T * B, n), (m, n)), ((m, T * B), (T * B, n), (m, n)))


def intermediate_shapes_of(jaxpr):
  from jax.extend import core as jcore
  shapes = []
  for eqn in jaxpr.eqns:
    shapes += [tuple(v.aval.shape) for v in eqn.outvars
               if hasattr(v.aval, "shape")]
    for p in eqn.params.values():
      for sub in (p if isinstance(p, (tuple, list)) else (p,)):
        if isinstance(sub, jcore.ClosedJaxpr):
          shapes += intermediate_shapes_of(sub.jaxpr)
        elif isinstance(sub, jcore.Jaxpr):
          shapes += intermediate_shapes_of(sub)
  return shapes


@pytest.mark.parametrize("key", ["general2", "mrnn", "mi_rnn", "mlstm",
                                 "attention_lstm", "attention_lstm_gates",
                                 "assignment_lstm", "mm_rnn", "mm_lstm"])
def test_no_per_example_transition_through_unroll(key):
  """Forward and backward of the fused path build no [B, H, H] array."""
  cell, params, xs, carry, faux, iaux = setup(key, dtype=jnp.float32)
  w = jnp.ones((B, T, H), jnp.float32)
  g = jax.grad(loss_fn(cell, iaux, w, fused_grad=True,
                       lengths=jnp.array([T, 4])), argnums=(0, 1, 2))
  assert_no_bhh(lambda p: g(p, xs, carry, faux), (params,), B, H)


@pytest.mark.parametrize("key", ["mrnn", "general2", "mlstm"])
def test_second_matmul_gradient_is_one_matmul_not_per_step(key):
  # post's second matmul v_t = m_t Q2 (general2 / mrnn: A [M, H]; mlstm:
  # W_m [M, 4H]). dQ2 = sum_t m_t^T dv_t is one [M, T*B] x [T*B, N] product
  # after the backward loop, which no longer builds an [M, N] accumulator
  # (autodiff's does).
  cell, params, xs, carry, faux, iaux = setup(key, dtype=jnp.float32)
  M, N = cell.split(params)[1][cell.second_matmul].shape
  w = jnp.ones((B, T, H), jnp.float32)

  def grad_jaxpr(fused):
    g = jax.grad(loss_fn(cell, iaux, w, fused_grad=fused))
    return jax.make_jaxpr(g)(params, xs, carry, faux).jaxpr

  def per_step_dA(jaxpr):
    return [s for body in _scan_bodies(jaxpr, reverse=True)
            for s in intermediate_shapes_of(body) if s == (M, N)]

  fused, plain = grad_jaxpr(True), grad_jaxpr(False)
  assert per_step_dA(plain), "the check must see autodiff's accumulator"
  assert not per_step_dA(fused)
  assert any(f in _dots(fused) for f in _row_sums(M, N))



def test_generic_path_multiplies_every_step_through_step_product(
    monkeypatch):
  """The generic fused path's per-step products, z_t = h_{t-1} W and the
  second matmul v_t = m_t Q2 forward, dz_t W^T and dv_t Q2^T backward, all
  go through `layer_scan.step_product` (which picks their CPU layout):
  recorded by the shapes of the weights it is given. general2, whose four
  shapes differ (W = [C | E] is [H, M + H], Q2 = A [M, H]; mrnn's C and A
  are each other's transposed shapes, so they could not tell)."""
  key = "general2"
  from sorjax import layer_scan
  cell, params, xs, carry, faux, iaux = setup(key, dtype=jnp.float32)
  W, q = cell.split(params)
  Q2 = q[cell.second_matmul]
  seen, real = [], layer_scan.step_product

  def recording(w):
    seen.append(tuple(w.shape))
    return real(w)

  monkeypatch.setattr(layer_scan, "step_product", recording)
  w = jnp.ones((B, T, H), jnp.float32)
  jax.make_jaxpr(jax.grad(loss_fn(cell, iaux, w, fused_grad=True)))(
      params, xs, carry, faux)
  expected = {W.shape, W.T.shape, Q2.shape, Q2.T.shape}
  assert expected <= set(seen), (expected, seen)


# ------------------------------------------------------------------ remat

def _compiled(f, *args):
  return jax.jit(f).lower(*args).compile()


@pytest.mark.parametrize("fused", [False, True])
def test_remat_saves_memory_and_keeps_gradients(fused, fast_compile):
  # mrnn, not lstm or gru: with remat=False those take their own layers
  # (fused_lstm, fused_gru), different scans from the one remat applies
  # to. Two layers: the fused backward writes dz_t over the saved z_t, so
  # one layer's peak holds z or dz either way; what remat=True saves is
  # the residuals of the layers below (mrnn's h_{t-1}, z_t, m_t, m_t A)
  # while the top one runs backwards.
  cell = cells.make("mrnn", hidden_size=32, intermediate_size=32)
  params = (cell.init(jax.random.key(0), 16), cell.init(jax.random.key(2), 32))
  xs = jax.random.normal(jax.random.key(1), (8, 40, 16))

  def grad(remat):
    def loss(p):
      ys = xs
      for p_layer in p:
        ys = sorjax.unroll(cell, p_layer, ys, remat=remat,
                           fused_grad=fused)[1]
      return jnp.sum(ys ** 2)
    return jax.grad(loss)

  compiled = {r: _compiled(grad(r), params) for r in (False, True, "dots")}
  peak = {r: c.memory_analysis().temp_size_in_bytes
          for r, c in compiled.items()}
  g = {r: c(params) for r, c in compiled.items()}
  for r in (True, "dots"):
    assert_trees_close(g[r], g[False], rtol=1e-5, atol=1e-6)
  assert peak[True] < peak[False]
  if fused:  # the fused path saves only z_t and the carries already
    assert peak["dots"] == peak[False]
  else:
    assert peak["dots"] < peak[False]


# ------------------------------------------------------------------ dtypes

def test_bfloat16_gradients_follow_float32():
  cell, params, xs, carry, _, _ = setup("lstm", dtype=jnp.float32)
  w = jnp.ones((B, T, H), jnp.float32)
  g32 = jax.jit(jax.grad(loss_fn(cell, {}, w, fused_grad=True)))(
      params, xs, carry, {})
  bf = lambda t: jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), t)
  g16 = jax.jit(jax.grad(loss_fn(cell, {}, bf(w), fused_grad=True)))(
      bf(params), bf(xs), bf(carry), {})
  for a, b in zip(jax.tree_util.tree_leaves(g16),
                  jax.tree_util.tree_leaves(g32)):
    assert a.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(a, np.float32), b, rtol=0.05,
                               atol=0.05)


# ------------------------------------------------------------------ errors

def test_fused_grad_true_on_a_cell_without_split_or_layer_is_named():
  """dyck_rnn has no split step; its layer runs only hoisted without
  remat, so fused_grad=True anywhere else is an error."""
  cell = cells.make("dyck_rnn", hidden_size=4, learn_embedding=True)
  params = cell.init(jax.random.key(0), 2)
  xs = jnp.zeros((2, 3, 2))
  for opts in (dict(hoist=False), dict(remat=True), dict(remat="dots")):
    with pytest.raises(ValueError, match="fused_grad=True.*DyckRNN has no "
                       "split step"):
      sorjax.unroll(cell, params, xs, fused_grad=True, **opts)
    with pytest.raises(ValueError, match="fused_grad=True.*DyckRNN"):
      sorjax.unroll_layers((cell,), (params,), xs, fused_grad=True, **opts)
  _, ys = sorjax.unroll(cell, params, xs)  # None: autodiff at this size
  assert ys.shape == (2, 3, 4)


def test_bad_remat_and_fused_grad_values_are_named():
  cell = cells.make("rnn", hidden_size=4)
  params = cell.init(jax.random.key(0), 3)
  xs = jnp.zeros((2, 5, 3))
  with pytest.raises(ValueError, match="remat must be True, False or"):
    sorjax.unroll(cell, params, xs, remat="everything")
  with pytest.raises(ValueError, match="fused_grad must be None, True or"):
    sorjax.unroll(cell, params, xs, fused_grad="yes")


def test_lstm_refuses_an_aux_it_does_not_take():
  """The lstm layer path takes no aux; one given is refused by name, not
  silently dropped."""
  cell = cells.make("lstm", hidden_size=4)
  params = cell.init(jax.random.key(0), D)
  with pytest.raises(TypeError, match="temperature"):
    sorjax.unroll(cell, params, jnp.ones((B, T, D)),
                  temperature=jnp.ones((B, T)))


@pytest.mark.parametrize("name", ["lstm", "mrnn", "mm_rnn"])
def test_forward_mode_through_the_fused_path_names_fused_grad(name):
  """jvp / jacfwd cannot go through a custom VJP: outside jit the error
  names the cell and fused_grad=False, and with fused_grad=False the jvp
  is the directional derivative that the fused path's reverse mode gives."""
  cell = make(name)
  params = cell.init(jax.random.key(0), D)
  xs = jax.random.normal(jax.random.key(1), (B, T, D))
  tx = jax.random.normal(jax.random.key(2), (B, T, D))

  def loss(x, fused_grad):
    return jnp.sum(sorjax.unroll(cell, params, x,
                                 fused_grad=fused_grad)[1] ** 2)

  for fused_grad, why in ((True, r"fused_grad=True"),
                          (None, r"fused_grad=None, which picks it")):
    if fused_grad is None and name != "lstm":
      continue  # None takes autodiff below hidden size 128
    f = functools.partial(loss, fused_grad=fused_grad)
    for transform in (lambda: jax.jvp(f, (xs,), (tx,)),
                      lambda: jax.jacfwd(f)(xs)):
      with pytest.raises(TypeError,
                         match=rf"unroll: {name} ran its fused path \({why}"
                         r".*Pass fused_grad=False"):
        transform()
  # under jit the error comes when the program lowers, still an error
  with pytest.raises(TypeError, match="forward-mode autodiff"):
    jax.jit(lambda x, t: jax.jvp(
        functools.partial(loss, fused_grad=True), (x,), (t,)))(xs, tx)

  _, tangent = jax.jvp(functools.partial(loss, fused_grad=False), (xs,),
                       (tx,))
  grad = jax.grad(functools.partial(loss, fused_grad=True))(xs)
  np.testing.assert_allclose(tangent, jnp.sum(grad * tx), rtol=1e-4)
