"""Every layer's states over time, from a restored token model.

The training model returns only the last layer's outputs; the analyses need
each layer's carries (the LSTM memory c_t), forget gates f_t and attention
weights alpha_t. `trace` re-runs the trunk (embedding -> cells) with the
restored params through each cell's own `precompute` / `step`, one
`lax.scan` per layer, keeping every carry:

    out = trace(run.task, run.params, tokens, lengths)
    out.layers[l].c      # [B, T, H] memory of layer l (LSTM-like cells)
    out.layers[l].f      # [B, T, H] forget gates (lstm, mts_lstm)
    out.layers[l].alpha  # [B, T, S] mixing weights (attention_lstm)

Forget gates are recomputed from the carry before each step, with the
cell's gate order (i, f, g, o):

    f_t = sigma(x_t W_x[:, f] + b_f + h_{t-1} W_h[:, f] (+ forget_bias))

(Mahto et al. sec. 2.1; for mts_lstm the fixed b_f of eq. 5 is already in
`precompute`). Padded steps (t >= length) keep the carry, as `sorjax.unroll`.
"""

from __future__ import annotations

import functools
from typing import Any, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sorjax.analysis.common import FORGET_GATE_CELLS, cell_name
from sorjax.unroll import accepted_aux


class LayerTrace(NamedTuple):
  h: jax.Array                    # [B, T, H] outputs
  carry: Any                      # carry after each step, leaves [B, T, ...]
  f: jax.Array | None = None      # [B, T, H] forget gates (lstm, mts_lstm)
  alpha: jax.Array | None = None  # [B, T, S] mixing weights (attention_lstm)

  @property
  def c(self):
    """The LSTM memory c_t [B, T, H] (None for cells without one)."""
    return getattr(self.carry, "c", None)


class Trace(NamedTuple):
  layers: tuple[LayerTrace, ...]
  final: tuple                    # each layer's carry after the last valid step


def embed(task, params, tokens) -> jax.Array:
  """The first layer's inputs x [B, T, E] of `tokens` [B, T], as the
  model's embedding (learned, frozen, one_hot or the cell's table)."""
  model = task.model
  kind = model.embedding
  if kind == "learned":
    table = params["embedding"]
  elif kind == "frozen":
    table = task.constants["frozen"]["embedding"]
  elif kind == "cell":
    table = jnp.asarray(model.fixed_table(), model.param_dtype)
  else:   # one_hot
    return jax.nn.one_hot(tokens, model.vocab_size, dtype=model.param_dtype)
  return jnp.take(table, tokens, axis=0)


def forget_gate(cell, params, xp, h_prev) -> jax.Array:
  """f_t of an lstm / mts_lstm step from its precomputed inputs xp [..., 4H]
  and the previous output h_{t-1} [..., H] (gate order i, f, g, o)."""
  H = cell.hidden_size
  z = xp[..., H:2 * H] + h_prev @ params["W_h"][:, H:2 * H]
  return jax.nn.sigmoid(z + getattr(cell, "forget_bias", 0.0))


def _time_major(a):
  return jnp.swapaxes(a, 0, 1)


def _layer(cell, params, x, mask, carry, aux):
  """One layer over x [B, T, D]: its LayerTrace and final carry."""
  xs = _time_major(x)
  aux = {k: _time_major(v) if v.ndim >= 2 else v for k, v in aux.items()}
  xp = cell.precompute(params, xs, **aux)
  gated = cell_name(cell) in FORGET_GATE_CELLS

  def body(c, inputs):
    xp_t, m_t = inputs
    new, y = cell.step(params, c, xp_t)
    new = jax.tree_util.tree_map(
        lambda n, o: jnp.where(m_t.reshape(m_t.shape + (1,) * (n.ndim - 1)),
                               n, o), new, c)
    y = jnp.where(m_t[:, None], y, jnp.zeros_like(y))
    return new, (c.h if gated else None, new, y)

  final, (h_prev, carries, ys) = jax.lax.scan(body, carry, (xp, mask.T))
  f = forget_gate(cell, params, xp, h_prev) if gated else None
  alpha = getattr(xp, "alpha", None)
  return LayerTrace(
      h=_time_major(ys), carry=jax.tree_util.tree_map(_time_major, carries),
      f=None if f is None else _time_major(f),
      alpha=None if alpha is None else _time_major(alpha)), final


@functools.partial(jax.jit, static_argnums=0)
def _trace(cells, layer_params, x, lengths, carries, aux):
  T = x.shape[1]
  mask = jnp.arange(T, dtype=lengths.dtype)[None, :] < lengths[:, None]
  layers, finals = [], []
  for cell, params, carry in zip(cells, layer_params, carries):
    out, final = _layer(cell, params, x, mask,
                        carry, {k: aux[k] for k in accepted_aux(cell, aux)})
    layers.append(out)
    finals.append(final)
    x = out.h
  return Trace(tuple(layers), tuple(finals))


def trace(task, params, tokens, lengths=None, temperature: float = 1.0,
          carries=None, ablate=None) -> Trace:
  """Runs the restored trunk over tokens [B, T] keeping every layer's
  states.

  Args:
    task: a token-model task (lm, dyck_lm, dyck_closing, dyck_pcfg).
    params: its params (`run.params`).
    tokens: int [B, T].
    lengths: int [B] valid lengths (default T).
    temperature: the softmax temperature aux (attention_lstm).
    carries: per-layer carries to start from (TBPTT streams), or None.
    ablate: an int position, or bool [B, T]: the inputs x_t there are set to
      zero (the word ablation of Mahto et al. A.4).
  """
  tokens = jnp.asarray(tokens, jnp.int32)
  if tokens.ndim != 2:
    raise ValueError(f"trace: tokens must be int [B, T], got shape "
                     f"{tuple(tokens.shape)}")
  B, T = tokens.shape
  lengths = (jnp.full((B,), T, jnp.int32) if lengths is None else
             jnp.asarray(lengths, jnp.int32))
  x = embed(task, params, tokens)
  if ablate is not None:
    keep = np.ones((B, T), bool)
    if isinstance(ablate, (int, np.integer)):
      keep[:, int(ablate)] = False
    else:
      keep = ~np.asarray(ablate, bool)
    x = jnp.where(jnp.asarray(keep)[..., None], x, jnp.zeros_like(x))
  cells = tuple(task.model.cells)
  layer_params = tuple(params[f"layer_{l}"] for l in range(len(cells)))
  if carries is None:
    carries = tuple(c.initial_carry(p, (B,))
                    for c, p in zip(cells, layer_params))
  return _trace(cells, layer_params, x, lengths, tuple(carries),
                task.aux_inputs(tokens, temperature))


def split_sequences(task, split: str) -> list[np.ndarray]:
  """The sequences of a Dyck task's split (DyckLM keeps (seqs, min_len,
  max_len) per split, DyckPCFGTask the list)."""
  seqs = task.splits[split]
  return list(seqs[0] if task.name in ("dyck_lm", "dyck_closing") else seqs)


def batches(task, split: str, max_tokens: int | None = None,
            max_sequences: int | None = None) -> Iterator[tuple]:
  """(tokens [B, T], lengths [B], carry_over) over a split: the LM task's
  TBPTT windows (carry_over True: each window continues the last), or
  its lines with data.documents and the Dyck tasks' padded sequences
  (carry_over False)."""
  from sorjax.data import batching
  for flag, v in (("max_tokens", max_tokens),
                  ("max_sequences", max_sequences)):
    if v is not None and v < 1:
      raise ValueError(f"--{flag} must be >= 1, got {v}")
  if task.name == "lm" and task.documents:   # lines, each from h_0
    inputs = task.split_docs[split][0]
    if max_tokens is not None:    # the lines that start in the first tokens
      starts = task.doc_starts[split]
      inputs = inputs[:max(1, int(np.sum(starts < max_tokens)))]
    if max_sequences is not None:
      inputs = inputs[:int(max_sequences)]
    for b in batching.SequenceBatcher(inputs, task.eval_streams(split),
                                      boundaries=task.boundaries,
                                      shuffle=False):
      yield b.inputs, b.lengths, False
    return
  if task.name == "lm":
    d = task.data_cfg
    ids, B = task.split_ids[split], task.eval_streams(split)
    if max_tokens is not None:
      ids = ids[:max(int(max_tokens), 2 * B)]
    for b in batching.StreamBatcher(ids, B, d.eval_bptt, pad_to=d.eval_bptt):
      yield b.inputs, b.lengths, True
    return
  seqs = split_sequences(task, split)
  if max_sequences is not None:
    seqs = seqs[:int(max_sequences)]
  if task.name == "dyck_pcfg":
    inputs = seqs
  else:
    inputs = batching.lm_pairs(seqs)[0]
  for b in batching.SequenceBatcher(inputs, task.eval_batch_size,
                                    shuffle=False, multiple=16):
    yield b.inputs, b.lengths, False


def sample(task, split: str, num: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [n, T], lengths [n]) of the first `num` sequences of a split,
  as the model reads them: Dyck tasks' sequences in split order; an LM
  split's first `num` consecutive windows of eval_bptt tokens, or with
  data.documents its first `num` lines (from their leading `<eos>`)."""
  if task.name == "lm" and task.documents:
    rows = task.split_docs[split][0][:num]
  elif task.name == "lm":
    L = task.data_cfg.eval_bptt
    ids = np.asarray(task.split_ids[split][:num * L], np.int32)
    n = max(1, ids.size // L)
    rows = [ids[i * L:(i + 1) * L] for i in range(n)]
  else:
    from sorjax.data import batching
    seqs = split_sequences(task, split)[:num]
    rows = seqs if task.name == "dyck_pcfg" else batching.lm_pairs(seqs)[0]
  lengths = np.array([len(r) for r in rows], np.int32)
  tokens = np.zeros((len(rows), max(lengths.max(initial=0), 1)), np.int32)
  for i, r in enumerate(rows):
    tokens[i, :len(r)] = r
  return tokens, lengths


def split_traces(task, params, split: str, temperature: float = 1.0,
                 max_tokens: int | None = None,
                 max_sequences: int | None = None
                 ) -> Iterator[tuple[Trace, np.ndarray]]:
  """(Trace, valid mask [B, T]) per batch of a split; LM streams carry
  their state across windows, as the task's evaluation does."""
  carries = None
  for tokens, lengths, carry_over in batches(task, split, max_tokens,
                                             max_sequences):
    out = trace(task, params, tokens, lengths, temperature,
                carries if carry_over else None)
    carries = out.final
    T = np.shape(tokens)[1]
    yield out, np.arange(T)[None, :] < np.asarray(lengths)[:, None]


__all__ = ["LayerTrace", "Trace", "batches", "embed", "forget_gate",
           "sample", "split_sequences", "split_traces", "trace"]
