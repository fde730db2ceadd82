"""Small configurations of every sequence cell, shared by the grid tests.

Each entry: hyperparameters, input size, and a function (key, B, T) -> aux
kwargs for `sorjax.unroll` (per-token arrays are [B, T]).
"""

import jax
import jax.numpy as jnp


def _no_aux(key, B, T):
  return {}


def _temperature(key, B, T):
  return {"temperature": jnp.float32(0.7)}


def _assignment(key, B, T):
  return {"assignment": jax.random.randint(key, (B, T), 0, 3)}


SMALL = {
    "rnn": (dict(hidden_size=5), 3, _no_aux),
    "lstm": (dict(hidden_size=5, forget_bias=1.0), 3, _no_aux),
    "gru": (dict(hidden_size=5), 3, _no_aux),
    "tensor_rnn": (dict(hidden_size=5), 3, _no_aux),
    "general2": (dict(hidden_size=5, intermediate_size=4), 3, _no_aux),
    "mrnn": (dict(hidden_size=5, intermediate_size=6), 3, _no_aux),
    "mi_rnn": (dict(hidden_size=5, general=True), 3, _no_aux),
    "mlstm": (dict(hidden_size=5, intermediate_size=6), 3, _no_aux),
    "attention_lstm": (dict(hidden_size=5, num_cells=3), 3, _temperature),
    "assignment_lstm": (dict(hidden_size=5, num_cells=3), 3, _assignment),
    "mm_rnn": (dict(hidden_size=5, num_matrices=4), 3, _no_aux),
    "mm_lstm": (dict(hidden_size=5), 3, _no_aux),
    "dyck_rnn": (dict(hidden_size=5, learn_embedding=True), 2, _no_aux),
    "mts_lstm": (dict(hidden_size=5, timescales=(1.0, 2.0, 4.0, 8.0, 16.0)),
                 3, _no_aux),
}
