"""Multi-matrix LSTM, mmLSTM (Renganathan & Singh sec. 4.4, eq. 9-22).

Each gate g in (c, i, f, o) has its own K_g choice matrices W_g[k] and its own
key vector v_g, updated as mmRNN's (sec. 4.3). In row form (`x @ W`; the
paper's W_g^proj is our W_g_proj.T):

    v_g,t    = softmax([v_g,t-1; h_{t-1}; x_t] W_g_proj)   # eq. 9, 11, 13, 15
    W_g_hh,t = sum_k v_g,t[k] W_g[k]                        # eq. 10, 12, 14, 16
    i_t      = sigmoid(h_{t-1} W_i_hh,t + x_t W_i_hx + b_i) # eq. 17
    f_t      = sigmoid(h_{t-1} W_f_hh,t + x_t W_f_hx + b_f) # eq. 18
    o_t      = sigmoid(h_{t-1} W_o_hh,t + x_t W_o_hx + b_o) # eq. 19
    ^c_t     = tanh(h_{t-1} W_c_hh,t + x_t W_c_hx + b_c)    # eq. 20
    c_t      = f_t * c_{t-1} + i_t * ^c_t                   # eq. 21
    h_t      = o_t * tanh(c_t)                              # eq. 22

Default K = (c:4, i:4, f:2, o:2) as eq. 10, 12, 14, 16; the upper limit "T"
of eq. 16's sum is a typo for 2 (o's matrices mirror f's). The biases b_g are
ours: eq. 17-20 have none. Key vectors start uniform (1/K_g), as mmRNN's.

No W_g_hh,t is formed: one fused matmul per step of h_{t-1} with every
gate's choice matrices side by side and every key projection's h rows
([H, sum_g K_g*H + sum_g K_g]) feeds all of eq. 9-20; each gate then mixes
its K_g products with its key vector.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp

from sorjax.cells import base
from sorjax.cells.mm_rnn import fused_recurrent, mix

GATES = ("c", "i", "f", "o")


class MMLSTMCarry(NamedTuple):
  h: jax.Array    # hidden state                             [..., H]
  c: jax.Array    # memory                                   [..., H]
  v_c: jax.Array  # key vectors v_g^key, each sums to 1      [..., K_c]
  v_i: jax.Array  #                                          [..., K_i]
  v_f: jax.Array  #                                          [..., K_f]
  v_o: jax.Array  #                                          [..., K_o]


class MMLSTMInputs(NamedTuple):
  """Input-only terms of one or all steps, gates in order c, i, f, o."""
  gx: jax.Array  # x_t W_g_hx + b_g for every gate           [..., 4H]
  vx: jax.Array  # x_t's part of every key's logits          [..., sum K_g]


def _num_matrices(value) -> tuple[int, int, int, int]:
  """{"c":..,"i":..,"f":..,"o":..} or a 4-sequence (c, i, f, o) -> tuple."""
  if isinstance(value, Mapping):
    missing = [g for g in GATES if g not in value]
    extra = sorted(str(k) for k in value if k not in GATES)
    if missing or extra:
      raise ValueError(
          f"mm_lstm: num_matrices must have exactly the gates {GATES}; "
          f"missing {missing}, unknown {extra}")
    value = tuple(value[g] for g in GATES)
  elif isinstance(value, (tuple, list)):
    if len(value) != 4:
      raise ValueError(
          f"mm_lstm: num_matrices as a sequence must give 4 counts in the "
          f"gate order {GATES}; got {len(value)}: {value!r}")
    value = tuple(value)
  else:
    raise ValueError(
        f"mm_lstm: num_matrices must be a dict over the gates {GATES} or a "
        f"4-tuple in that order; got {value!r}")
  for g, k in zip(GATES, value):
    base.check_positive_int("mm_lstm", f"num_matrices[{g!r}]", k)
  return value


@dataclasses.dataclass(frozen=True)
class MMLSTM:
  """Multi-matrix LSTM.

  Attributes:
    hidden_size: H.
    num_matrices: choice matrices per gate, a dict {"c", "i", "f", "o"} or a
      4-tuple in that order; stored as the tuple (K_c, K_i, K_f, K_o).
  """
  hidden_size: int
  num_matrices: Any = (4, 4, 2, 2)

  def __post_init__(self):
    base.check_positive_int("mm_lstm", "hidden_size", self.hidden_size)
    object.__setattr__(self, "num_matrices", _num_matrices(self.num_matrices))

  def init(self, key, input_size: int, dtype: Any = jnp.float32):
    """Per gate: U(+-1/sqrt(H)) for W_g, W_g_hx; U(+-1/sqrt(K_g+H+D)) for
    W_g_proj (its fan-in); zero b_g."""
    base.check_init(self, key, dtype)
    base.check_positive_int("mm_lstm", "input_size", input_size)
    D, H = input_size, self.hidden_size
    params = {}
    for g, K, k in zip(GATES, self.num_matrices, jax.random.split(key, 4)):
      kW, kx, kp = jax.random.split(k, 3)
      params[f"W_{g}"] = base.uniform(kW, (K, H, H), H, dtype)
      params[f"W_{g}_hx"] = base.uniform(kx, (D, H), H, dtype)
      params[f"W_{g}_proj"] = base.uniform(kp, (K + H + D, K), K + H + D,
                                           dtype)
      params[f"b_{g}"] = base.zeros((H,), dtype)
    return params

  def initial_carry(self, params, batch_shape=()):
    batch_shape = base.batch_shape(batch_shape)
    dtype = base.param_dtype(params)
    z = jnp.zeros((*batch_shape, self.hidden_size), dtype)
    keys = [jnp.full((*batch_shape, K), 1.0 / K, dtype)
            for K in self.num_matrices]
    return MMLSTMCarry(z, z, *keys)

  def precompute(self, params, xs):
    base.check_precompute(self, params, xs)
    H = self.hidden_size
    # One matmul: x [W_c_hx | .. | W_o_hx | W_c_proj's x rows | .. ].
    W = jnp.concatenate(
        [params[f"W_{g}_hx"] for g in GATES]
        + [params[f"W_{g}_proj"][K + H:]
           for g, K in zip(GATES, self.num_matrices)], axis=1)
    b = jnp.concatenate([params[f"b_{g}"] for g in GATES])
    z = xs @ W
    return MMLSTMInputs(gx=z[..., :4 * H] + base.lift(b, z.ndim),
                        vx=z[..., 4 * H:])

  # Split step (see sorjax.unroll): z = h_{t-1} [every W_g[k] | every
  # W_g_proj's h rows], then the rest; q holds the W_g_proj's v rows.
  def split(self, params):
    H, Ks = self.hidden_size, self.num_matrices
    W = fused_recurrent(
        [params[f"W_{g}"] for g in GATES],
        [params[f"W_{g}_proj"][K:K + H] for g, K in zip(GATES, Ks)])
    return W, {f"P_{g}_v": params[f"W_{g}_proj"][:K]
               for g, K in zip(GATES, Ks)}

  def recurrent_input(self, carry):
    return carry.h

  def post(self, q, carry, xp, z):
    H, Ks = self.hidden_size, self.num_matrices
    hW, hv = z[..., :sum(Ks) * H], z[..., sum(Ks) * H:]
    v_prev = (carry.v_c, carry.v_i, carry.v_f, carry.v_o)
    v, pre = [], []
    oW = ov = 0  # offsets of gate g in hW and in hv, xp.vx
    for g, K, vg in zip(GATES, Ks, v_prev):
      logits = (vg @ q[f"P_{g}_v"] + hv[..., ov:ov + K]
                + xp.vx[..., ov:ov + K])
      v.append(jax.nn.softmax(logits, axis=-1))             # eq. 9, 11, 13, 15
      pre.append(mix(v[-1], hW[..., oW:oW + K * H]))        # eq. 10, 12, 14, 16
      oW, ov = oW + K * H, ov + K
    gx = jnp.split(xp.gx, 4, axis=-1)
    c_hat = jnp.tanh(pre[0] + gx[0])                        # eq. 20
    i, f, o = (jax.nn.sigmoid(p + x)                        # eq. 17-19
               for p, x in zip(pre[1:], gx[1:]))
    c = f * carry.c + i * c_hat                             # eq. 21
    h = o * jnp.tanh(c)                                     # eq. 22
    return MMLSTMCarry(h, c, *v), h

  def step(self, params, carry, xp):
    # split's W: the one recurrent matmul, all gates
    return base.split_step(self, params, carry, xp)
