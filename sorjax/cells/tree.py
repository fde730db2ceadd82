"""Recursive (tree) cells of Le & Zuidema (2016), section 2.

A tree cell computes the vector of a parent node p from its children x
(left) and y (right) of a production p -> x y,

    p = F(x, y)                                              (sec. 2, F)

and `sorjax.trees.run` applies it bottom-up over batches of binary trees.
Leaves are the word vectors themselves, x, y in R^n with n = hidden_size
("x, y in R^n representing x, y"; the word vectors and the node vectors share
the dimension, 50 in sec. 3), so `init` takes input_size = hidden_size and
`leaf` projects nothing.

The paper numbers no equations; comments cite sec. 2 and the left-hand side
of the line (e.g. "sec. 2, i_1"). Row-vector convention: the paper's W x is
our x @ W with W shaped [in, out].

Methods, batched over any leading axes:
    params = cell.init(key, input_size)     # input_size == hidden_size
    state  = cell.leaf(params, x)           # a word vector as a node state
    state  = cell.compose(params, left, right)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from sorjax.cells import base


def _check_input_size(cell: str, input_size: int, hidden_size: int) -> None:
  base.check_positive_int(cell, "input_size", input_size)
  if input_size != hidden_size:
    raise ValueError(
        f"{cell}: input_size must equal hidden_size={hidden_size}: leaves are "
        f"the word vectors themselves, x, y in R^n (Le & Zuidema sec. 2); "
        f"got input_size={input_size} (project the embeddings first)")


def _check_leaf(cell: str, x: jax.Array, hidden_size: int) -> None:
  if x.ndim < 1 or x.shape[-1] != hidden_size:
    raise ValueError(
        f"{cell}: leaf inputs must be word vectors of size hidden_size="
        f"{hidden_size} (Le & Zuidema sec. 2: x in R^n); got shape "
        f"{tuple(x.shape)}")


@dataclasses.dataclass(frozen=True)
class TreeRNN:
  """Recursive neural network: p = f(W_1 x + W_2 y + b)  (sec. 2, RNN).

  Params: W [2H, H] = [W_1; W_2] (rows for the left child, then the right
  one: one matmul on the concatenated children), b [H]. f = `activation`
  (tanh in the paper, after Socher et al. 2013b).
  """
  hidden_size: int
  activation: str = "tanh"

  def __post_init__(self):
    base.check_positive_int("tree_rnn", "hidden_size", self.hidden_size)
    base.check_choice("tree_rnn", "activation", self.activation,
                      ("tanh", "identity", "relu"))

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    base.check_init(self, key, dtype)
    H = self.hidden_size
    _check_input_size("tree_rnn", input_size, H)
    return {"W": base.uniform(key, (2 * H, H), 2 * H, dtype),
            "b": base.zeros((H,), dtype)}

  def leaf(self, params, x):
    _check_leaf("tree_rnn", x, self.hidden_size)
    return base.HCarry(x)

  def compose(self, params, left, right):
    f = base.activation(self.activation)
    xy = jnp.concatenate([left.h, right.h], axis=-1)   # [x; y]
    p = f(base.affine(xy, params["W"], params["b"]))   # sec. 2, RNN p
    return base.HCarry(p)


@dataclasses.dataclass(frozen=True)
class TreeLSTM:
  """Recursive LSTM (RLSTM) of Le & Zuidema (2015) as written in sec. 2.

      i_1 = sigma(W_i1 x + W_i2 y + W_ci1 c_x + W_ci2 c_y + b_i)
      i_2 = sigma(W_i1 y + W_i2 x + W_ci1 c_y + W_ci2 c_x + b_i)
      f_1 = sigma(W_f1 x + W_f2 y + W_cf1 c_x + W_cf2 c_y + b_f)
      f_2 = sigma(W_f1 y + W_f2 x + W_cf1 c_y + W_cf2 c_x + b_f)
      c_p = f_1 * c_x + f_2 * c_y + g(W_c1 x * i_1 + W_c2 y * i_2 + b_c)
      o   = sigma(W_o1 x + W_o2 y + W_co c_p + b_o)
      p   = o * g(c_p)

  Two input and two forget gates, one per child, share their weights with
  the children's roles swapped; the memory peepholes W_c* are full n x n
  matrices, as in the paper. The output gate's "W_co c" reads the new memory
  c_p (as the authors' lstm-rnn code does). Leaves: p = x, c = 0 (the paper
  gives leaves no memory; a zero memory drops exactly the leaf terms).

  Params (row convention, x @ W):
    W_if [4H, 2H]  rows (own h, sibling h, own c, sibling c), columns (i, f):
                   [[W_i1, W_f1], [W_i2, W_f2], [W_ci1, W_cf1], [W_ci2, W_cf2]]
    b_if [2H]      [b_i, b_f]
    W_c  [2, H, H] (W_c1, W_c2);  b_c [H]
    W_o  [2, H, H] (W_o1, W_o2);  W_co [H, H];  b_o [H]
  g = `activation` (tanh in the paper).

  Per composition: one matmul for all four gates (both child orders stacked
  on an axis of size 2), one batched matmul for W_c1 x, W_c2 y, W_o1 x,
  W_o2 y, and the peephole W_co c_p, which needs c_p first.
  """
  hidden_size: int
  activation: str = "tanh"

  def __post_init__(self):
    base.check_positive_int("tree_lstm", "hidden_size", self.hidden_size)
    base.check_choice("tree_lstm", "activation", self.activation,
                      ("tanh", "identity", "relu"))

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    base.check_init(self, key, dtype)
    H = self.hidden_size
    _check_input_size("tree_lstm", input_size, H)
    k_if, k_c, k_o, k_co = jax.random.split(key, 4)
    return {"W_if": base.uniform(k_if, (4 * H, 2 * H), 4 * H, dtype),
            "b_if": base.zeros((2 * H,), dtype),
            "W_c": base.uniform(k_c, (2, H, H), H, dtype),
            "b_c": base.zeros((H,), dtype),
            "W_o": base.uniform(k_o, (2, H, H), 2 * H, dtype),
            "W_co": base.uniform(k_co, (H, H), H, dtype),
            "b_o": base.zeros((H,), dtype)}

  def leaf(self, params, x):
    _check_leaf("tree_lstm", x, self.hidden_size)
    return base.LSTMCarry(x, jnp.zeros_like(x))

  def compose(self, params, left, right):
    H = self.hidden_size
    g = base.activation(self.activation)
    x, c_x = left
    y, c_y = right
    # Row k = 0 reads (x, y, c_x, c_y), row k = 1 the swapped (y, x, c_y, c_x):
    # the same weights give (i_1, f_1) and (i_2, f_2)    (sec. 2, i_1 .. f_2)
    u = jnp.stack([jnp.concatenate([x, y, c_x, c_y], axis=-1),
                   jnp.concatenate([y, x, c_y, c_x], axis=-1)], axis=-2)
    z = jax.nn.sigmoid(base.affine(u, params["W_if"], params["b_if"]))
    i, f = z[..., :H], z[..., H:]                       # [..., 2, H] each
    # Child k's own projections: (W_c1 x, W_o1 x) for k = 0, (W_c2 y, W_o2 y)
    # for k = 1, one matmul batched over k.
    W = jnp.concatenate([params["W_c"], params["W_o"]], axis=-1)  # [2, H, 2H]
    v = jnp.einsum("...kn,knm->...km", jnp.stack([x, y], axis=-2), W)
    c = jnp.stack([c_x, c_y], axis=-2)
    c_p = (jnp.sum(f * c, axis=-2)                 # f_1 c_x + f_2 c_y
           + g(jnp.sum(v[..., :H] * i, axis=-2)    # W_c1 x i_1 + W_c2 y i_2
               + base.lift(params["b_c"], x.ndim)))  # sec. 2, c_p
    o = jax.nn.sigmoid(jnp.sum(v[..., H:], axis=-2)     # W_o1 x + W_o2 y
                       + base.affine(c_p, params["W_co"], params["b_o"]))  # o
    return base.LSTMCarry(o * g(c_p), c_p)              # sec. 2, p
