"""dyck_rnn (Renganathan & Singh sec. 4.2): eq. 3-5 against a NumPy loop with
the shift matrices, the stack on real bracket sequences, fixedness."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import sorjax
from sorjax import cells
from sorjax.cells.base import HCarry
from sorjax.cells.dyck_rnn import DyckInputs
from tests.cells.reference import assert_no_bhh, np_params, sigmoid

B, T, D, H = 2, 4, 3, 5  # all different, for assert_no_bhh
RNG = np.random.default_rng(0)
f32 = lambda a: jnp.asarray(a, jnp.float32)


def shift_matrices(n):
  """W_1 with ones on the subdiagonal, W_2 on the superdiagonal (sec. 4.2)."""
  W1, W2 = np.zeros((n, n)), np.zeros((n, n))
  for i in range(n - 1):
    W1[i + 1, i] = 1.0
    W2[i, i + 1] = 1.0
  return W1, W2


def make(learn_embedding=True, D_=D):
  cell = cells.make("dyck_rnn", hidden_size=H, learn_embedding=learn_embedding)
  params = cell.init(jax.random.key(0), D_)
  return cell, params, f32(RNG.normal(size=(B, T, D_)))


def np_dyck(p, xs):
  """Eq. 3-5 in the paper's column form, W_hh(t) built explicitly."""
  W1, W2 = shift_matrices(H)
  h = np.zeros((xs.shape[0], H))
  ys = np.zeros(xs.shape[:2] + (H,))
  for t in range(xs.shape[1]):
    for b in range(xs.shape[0]):
      x = xs[b, t]
      g = sigmoid(x @ p["W_proj"][:, 0])                          # eq. 3
      W_hh = g * W1 + (1 - g) * W2                                # eq. 4
      h[b] = W_hh @ h[b] + g * (x @ p["W_hx"])                    # eq. 5
      ys[b, t] = h[b]
  return h, ys


@pytest.mark.parametrize("learn_embedding,D_", [(True, D), (False, 1)])
def test_dyck_rnn_equations(learn_embedding, D_):
  cell, params, xs = make(learn_embedding, D_)
  carry, ys = sorjax.unroll(cell, params, xs)
  h, ref = np_dyck(np_params(params), np.asarray(xs, np.float64))
  np.testing.assert_allclose(ys, ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(carry.h, h, rtol=1e-5, atol=1e-6)


def test_shift_step_equals_matrix_form():
  cell, params, _ = make()
  W1, W2 = shift_matrices(H)
  fixed = cell.fixed_arrays()
  np.testing.assert_array_equal(fixed["W1"], W1)
  np.testing.assert_array_equal(fixed["W2"], W2)
  h = RNG.normal(size=(B, H))
  g = RNG.uniform(size=(B, 1))
  u = RNG.normal(size=(B, H))
  new, y = cell.step(params, HCarry(f32(h)), DyckInputs(f32(g), f32(u)))
  ref = np.stack([(g[b] * W1 + (1 - g[b]) * W2) @ h[b] for b in range(B)]) + u
  np.testing.assert_allclose(new.h, ref, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(y, new.h)


# ------------------------------------------------------------- naive JAX ref

def naive_unroll(params, xs):
  """lax.scan materialising W_hh(t) = g W_1 + (1 - g) W_2 as [B, H, H]."""
  W1, W2 = (f32(w) for w in shift_matrices(H))

  def body(h, x):
    g = jax.nn.sigmoid(x @ params["W_proj"])[:, :, None]       # [B, 1, 1]
    W_hh = g * W1[None] + (1 - g) * W2[None]                    # [B, H, H]
    h = jnp.einsum("bij,bj->bi", W_hh, h) + g[:, :, 0] * (x @ params["W_hx"])
    return h, h
  _, ys = jax.lax.scan(body, jnp.zeros((xs.shape[0], H)),
                      jnp.swapaxes(xs, 0, 1))
  return jnp.swapaxes(ys, 0, 1)


def test_matches_materialising_reference_with_gradients_and_no_bhh():
  cell, params, xs = make()
  w = f32(RNG.normal(size=(B, T, H)))
  loss = lambda p, x: jnp.sum(sorjax.unroll(cell, p, x)[1] * w)
  naive = lambda p, x: jnp.sum(naive_unroll(p, x) * w)
  v, g = jax.jit(jax.value_and_grad(loss, (0, 1)))(params, xs)
  vn, gn = jax.jit(jax.value_and_grad(naive, (0, 1)))(params, xs)
  np.testing.assert_allclose(v, vn, rtol=1e-5)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=1e-5, atol=1e-5), g, gn)
  assert_no_bhh(jax.value_and_grad(loss, (0, 1)), (params, xs), B, H)
  with pytest.raises(AssertionError, match="per-example"):  # check can fail
    assert_no_bhh(jax.value_and_grad(naive, (0, 1)), (params, xs), B, H)


# ------------------------------------------------------------- the stack

def dyck_sequence(rng, k, m, n_pairs):
  """A random m-bounded Dyck-k sequence framed by START / END; ids as in
  `fixed_embedding`: opens 0..k-1, closers k..2k-1, START 2k, END 2k+1."""
  ids, stack, opened = [2 * k], [], 0
  while opened < n_pairs or stack:
    if opened < n_pairs and len(stack) < m and (not stack or
                                                rng.random() < 0.5):
      j = int(rng.integers(k))
      stack.append(j)
      ids.append(j)
      opened += 1
    else:
      ids.append(k + stack.pop())
  return ids + [2 * k + 1]


def stacks_after_prefixes(ids, k):
  """The open-bracket stack (innermost first) after each prefix, by the
  grammar: an open pushes its type, a closer pops its match."""
  stack, out = [], []
  for i in ids:
    if i < k:
      stack.append(i)
    elif i < 2 * k:
      assert stack.pop() == i - k
    out.append(stack[::-1])
  return out


@pytest.mark.parametrize("k,m", [(2, 4), (3, 6)])
def test_hand_set_stack_tracks_innermost_bracket_wcpa_100(k, m):
  """Sec. 4.2 with hand-set weights and the fixed embedding: after every
  prefix unit j of h holds (type + 1) of the j-th innermost unclosed bracket,
  and an affine readout of the top puts > 80% on every true closer."""
  cell = cells.make("dyck_rnn", hidden_size=m)
  emb = cell.fixed_embedding(k)
  params = {"W_proj": f32([[50.0]]),                  # g ~ 1 open, ~ 0 close
            "W_hx": f32(np.eye(1, m))}                # write on top (unit 0)
  rng = np.random.default_rng(k)
  seqs = [dyck_sequence(rng, k, m, int(rng.integers(4, 25)))
          for _ in range(16)]
  L = max(map(len, seqs))
  ids = np.array([s + [2 * k + 1] * (L - len(s)) for s in seqs])  # pad: END
  _, ys = sorjax.unroll(cell, params, f32(emb[ids]))
  ys = np.asarray(ys)
  hits = {}  # closing distance -> [correct?]
  for b, seq in enumerate(ids):
    stacks = stacks_after_prefixes(seq, k)
    opened_at = []
    for t, (i, stack) in enumerate(zip(seq, stacks)):
      expected = np.zeros(m)
      expected[:len(stack)] = np.array(stack) + 1
      np.testing.assert_allclose(ys[b, t], expected, atol=1e-5)
      if i < k:
        opened_at.append(t)
      elif i < 2 * k:  # predict this closer from the prefix before it
        j = np.arange(1, k + 1)
        logits = 10.0 * j * (ys[b, t - 1, 0] - j / 2)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        hits.setdefault(t - opened_at.pop(), []).append(p[i - k] >= 0.8)
  assert len(hits) > 5
  wcpa = min(np.mean(v) for v in hits.values())
  assert wcpa == 1.0


def test_fixed_embedding_layout():
  cell = cells.make("dyck_rnn", hidden_size=4)
  emb = cell.fixed_embedding(2)
  # ( [ ) ] START END
  np.testing.assert_array_equal(emb, [[1.0], [2.0], [-1.0], [-2.0], [0.0],
                                      [0.0]])
  assert cell.fixed_embedding(3).shape == (8, 1)


# ------------------------------------------------------------- fixedness

def test_fixed_matrices_are_not_params_and_survive_training():
  cell, params, xs = make()
  assert {k: v.shape for k, v in params.items()} == {"W_proj": (D, 1),
                                                     "W_hx": (D, H)}
  before = cell.fixed_arrays()
  target = f32(RNG.normal(size=(B, T, H)))
  loss = lambda p: jnp.mean((sorjax.unroll(cell, p, xs)[1] - target) ** 2)
  opt = optax.sgd(0.5, momentum=0.9)

  @jax.jit
  def update(p, s):
    u, s = opt.update(jax.grad(loss)(p), s, p)
    return optax.apply_updates(p, u), s
  trained, state = params, opt.init(params)
  for _ in range(5):
    trained, state = update(trained, state)
  assert not np.allclose(trained["W_hx"], params["W_hx"])  # it did train
  assert set(trained) == set(params)
  after = cell.fixed_arrays()
  for k in before:
    np.testing.assert_array_equal(after[k], before[k])
  h = f32(RNG.normal(size=(B, H)))
  zero = jnp.zeros((B, H))
  for g, W in ((1.0, before["W1"]), (0.0, before["W2"])):  # push, pop
    new, _ = cell.step(trained, HCarry(h), DyckInputs(jnp.full((B, 1), g),
                                                      zero))
    np.testing.assert_allclose(new.h, np.asarray(h) @ W.T, atol=1e-7)


# ------------------------------------------------------------- errors

def test_errors_are_named():
  with pytest.raises(ValueError, match="dyck_rnn: hidden_size"):
    cells.make("dyck_rnn", hidden_size=0)
  with pytest.raises(ValueError, match="dyck_rnn: learn_embedding must be"):
    cells.make("dyck_rnn", hidden_size=3, learn_embedding="yes")
  fixed = cells.make("dyck_rnn", hidden_size=3)
  with pytest.raises(ValueError, match="input_size must be 1 with "
                     "learn_embedding=False.*got 2"):
    fixed.init(jax.random.key(0), 2)
  with pytest.raises(ValueError, match="dyck_rnn: num_brackets_k"):
    fixed.fixed_embedding(0)
  learned = cells.make("dyck_rnn", hidden_size=3, learn_embedding=True)
  with pytest.raises(ValueError, match="learn_embedding=True"):
    learned.fixed_embedding(2)
  params = learned.init(jax.random.key(0), 2)
  with pytest.raises(ValueError, match="input size 2.*got last axis 1"):
    sorjax.unroll(learned, params, jnp.zeros((1, 3, 1)))
