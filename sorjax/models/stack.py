"""The shared trunk of the token models: embedding -> dropout -> stack of
cells -> dropout. Heads (`lm.LanguageModel`, `dyck.DyckModel`) subclass it.

Parameters (one pytree, collection "params"):
    embedding  [V, E]   when embedding="learned"
    layer_l    the params dict of cell l (`cell.init(key, in_l)`), usable with
               `sorjax.unroll(cells[l], params[f"layer_{l}"], xs)` directly
Non-trainable arrays never enter "params": a frozen table lives in the
collection `FROZEN` ("frozen"), a cell's fixed table is a constant.

Embeddings:
    learned   a trainable [V, E] table
    frozen    a given [V, E] array (`embedding_table`), stored in "frozen"
    one_hot   x_t = one_hot(token), E = V (character models without a table)
    cell      the first cell's fixed table, `cells[0].fixed_embedding(k)` for
              a Dyck-k vocabulary of V = 2k + 2 symbols (dyck_rnn with
              learn_embedding=False, Renganathan & Singh 4.2)

Dropout sites (rates in [0, 1), rng stream "dropout"):
    embedding_dropout  drops whole word types: one mask over the vocabulary
                       per call, scaled 1/(1-p) (AWD-LSTM's "dropoute")
    input_dropout      on the embedded inputs x_t
    hidden_dropout     between layers
    output_dropout     on the last layer's outputs, before the head
`locked_dropout` (True, or a tuple of "input", "hidden", "output") draws one
mask per sequence shared across time at those sites (variational / locked
dropout, Gal & Ghahramani 2016; AWD-LSTM).
`weight_drop` is DropConnect on each layer's hidden-to-hidden matrix
(AWD-LSTM's "wdrop", Merity et al. 2018): one Bernoulli mask per call over
the parameter that the cell's `split` returns as its recurrent matrix
(lstm / mts_lstm / gru: W_h; rnn: W), scaled 1/(1-p), the same at every time
step and for every example.

Sown as intermediates (`apply(..., mutable="intermediates")` returns them):
"embedded", the embedded inputs after embedding dropout; "last_outputs" and
"last_outputs_dropped", the last layer's outputs before and after output
dropout (AWD-LSTM's TAR and AR penalties read them).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sorjax import checks
from sorjax.cells import base
from sorjax.layer_scan import first_outside
from sorjax.models.constant import constant
from sorjax.models.initializers import uniform_symmetric
from sorjax.unroll import unroll_layers

FROZEN = "frozen"  # variable collection of non-trainable arrays
EMBEDDINGS = ("learned", "frozen", "one_hot", "cell")
# The learned table's initialiser: "normal" N(0, 1/E); "uniform_0.1"
# U(-0.1, 0.1), AWD-LSTM's, which Mahto et al. 3.1.1 use.
EMBED_INITS = ("normal", "uniform_0.1")
DROPOUT_SITES = ("input", "hidden", "output")


class RecurrentTrunk(nn.Module):
  """Embedding -> layers of cells -> dropout; the heads subclass it.

  Attributes:
    cells: one cell per layer (`sorjax.cells.make`); layer l reads layer
      l-1's hidden_size, so layers may differ (e.g. mts_lstm's three layers).
    vocab_size: V.
    embed_size: E for embedding="learned"; implied otherwise (may be left
      None, or given and then checked).
    embedding: one of EMBEDDINGS.
    embed_init: one of EMBED_INITS, the learned table's initialiser.
    embedding_table: the [V, E] array for embedding="frozen" (held as a
      read-only, hashable `Constant` copy; only `init` reads it).
    embedding_dropout, input_dropout, hidden_dropout, output_dropout: rates.
    locked_dropout: True (all sites), False, or a tuple of DROPOUT_SITES.
    weight_drop: DropConnect rate on every layer's recurrent matrix.
    param_dtype: dtype of every parameter (cells compute in it).
    remat, unroll, hoist, fused_grad: passed to `sorjax.unroll` for every
      layer (remat: False, True or "dots"; fused_grad: None picks batched
      weight gradients where they measured faster).
  """
  cells: Sequence[Any]
  vocab_size: int
  embed_size: int | None = None
  embedding: str = "learned"
  embed_init: str = "normal"
  embedding_table: Any = None
  embedding_dropout: float = 0.0
  input_dropout: float = 0.0
  hidden_dropout: float = 0.0
  output_dropout: float = 0.0
  locked_dropout: bool | Sequence[str] = False
  weight_drop: float = 0.0
  param_dtype: Any = jnp.float32
  remat: bool | str = False
  unroll: int | None = None
  hoist: bool = True
  fused_grad: bool | None = None

  # ------------------------------------------------------------ validation

  def __post_init__(self):
    object.__setattr__(self, "cells", tuple(self.cells))
    # Hashable attributes: the module can be a static argument of jax.jit.
    object.__setattr__(self, "embedding_table",
                       constant(self.embedding_table))
    if not isinstance(self.locked_dropout, bool):
      object.__setattr__(self, "locked_dropout", tuple(self.locked_dropout))
    self._validate()
    super().__post_init__()

  def _error(self, msg: str) -> ValueError:
    return ValueError(f"{type(self).__name__}: {msg}")

  def _validate(self) -> None:
    if not self.cells:
      raise self._error("cells must hold at least one cell, got none")
    for l, cell in enumerate(self.cells):
      if not all(hasattr(cell, m) for m in
                 ("hidden_size", "init", "initial_carry", "precompute",
                  "step")):
        raise self._error(
            f"cells[{l}] is not a sequence cell (needs hidden_size, init, "
            f"initial_carry, precompute, step): {cell!r}")
    base.check_positive_int(type(self).__name__, "vocab_size",
                            self.vocab_size)
    base.check_float_dtype(f"{type(self).__name__}: param_dtype",
                           self.param_dtype)
    if self.embedding not in EMBEDDINGS:
      raise self._error(
          f"embedding must be one of {EMBEDDINGS}, got {self.embedding!r}")
    base.check_choice(type(self).__name__, "embed_init", self.embed_init,
                      EMBED_INITS)
    if self.embedding == "cell":
      self.fixed_table()  # raises unless cells[0] offers a [V, E] table
    if (self.embedding_table is not None) != (self.embedding == "frozen"):
      raise self._error(
          "embedding_table is given exactly when embedding='frozen' "
          f"(embedding={self.embedding!r}, embedding_table "
          f"{'given' if self.embedding_table is not None else 'None'})")
    if self.embedding == "frozen" and (
        np.ndim(self.embedding_table) != 2
        or np.shape(self.embedding_table)[0] != self.vocab_size):
      raise self._error(
          f"embedding_table must have shape [vocab_size={self.vocab_size}, "
          f"E], got {np.shape(self.embedding_table)}")
    if self.embedding == "learned":
      base.check_positive_int(type(self).__name__, "embed_size",
                              self.embed_size)
    elif self.embed_size is not None and self.embed_size != self.input_size:
      raise self._error(
          f"embed_size={self.embed_size} contradicts embedding="
          f"{self.embedding!r}, whose size is {self.input_size}")
    for name in ("embedding_dropout", "input_dropout", "hidden_dropout",
                 "output_dropout", "weight_drop"):
      checks.check_number(f"{type(self).__name__}: {name}",
                          getattr(self, name), "in [0, 1)",
                          lambda rate: 0 <= rate < 1)
    if self.hidden_dropout > 0 and len(self.cells) == 1:
      raise self._error(
          f"hidden_dropout={self.hidden_dropout} drops the outputs between "
          "layers, and this stack has one layer (input_dropout and "
          "output_dropout act around it)")
    if not isinstance(self.locked_dropout, bool):
      bad = [s for s in self.locked_dropout if s not in DROPOUT_SITES]
      if bad:
        raise self._error(
            f"locked_dropout must be a bool or a tuple of {DROPOUT_SITES}; "
            f"unknown sites {bad}")
    if self.unroll is not None:
      base.check_positive_int(type(self).__name__, "unroll", self.unroll)
    if self.weight_drop > 0.0:  # every layer must have a matrix to drop
      for l, (cell, n) in enumerate(zip(self.cells,
                                        self.layer_input_sizes())):
        def check(key, l=l, cell=cell, n=n):  # shapes only, no compute
          self._recurrent_name(l, cell, cell.init(key, n))
          return jnp.zeros(())
        jax.eval_shape(check, jax.random.key(0))

  # ------------------------------------------------------------ sizes

  @property
  def input_size(self) -> int:
    """The size E of the vectors the first cell reads."""
    if self.embedding == "learned":
      return self.embed_size
    if self.embedding == "frozen":
      return int(np.shape(self.embedding_table)[1])
    if self.embedding == "one_hot":
      return self.vocab_size
    return int(self.fixed_table().shape[1])

  @property
  def output_size(self) -> int:
    """hidden_size of the last layer."""
    return self.cells[-1].hidden_size

  def layer_input_sizes(self) -> tuple[int, ...]:
    """The input size of each layer: E, then each layer's hidden_size."""
    return (self.input_size,) + tuple(c.hidden_size for c in self.cells[:-1])

  @nn.nowrap
  def fixed_table(self) -> np.ndarray:
    """The first cell's fixed [V, E] table (embedding="cell")."""
    cell, V = self.cells[0], self.vocab_size
    if not hasattr(cell, "fixed_embedding"):
      raise self._error(
          "embedding='cell' needs a first cell with fixed_embedding(k) "
          f"(dyck_rnn with learn_embedding=False); cells[0] is {cell!r}")
    if V < 4 or V % 2:
      raise self._error(
          "embedding='cell' reads a Dyck-k vocabulary of 2k + 2 symbols; "
          f"vocab_size={V} is not of that form")
    table = np.asarray(cell.fixed_embedding((V - 2) // 2))
    if table.ndim != 2 or table.shape[0] != V:
      raise self._error(
          f"cells[0].fixed_embedding({(V - 2) // 2}) has shape {table.shape}, "
          f"expected [{V}, E]")
    return table

  @nn.nowrap
  def initial_carries(self, params, batch_size: int) -> tuple:
    """Each layer's initial carry for a batch: pass as `carries` to reset
    state (e.g. at a document boundary under TBPTT)."""
    missing = [f"layer_{l}" for l in range(len(self.cells))
               if f"layer_{l}" not in params]
    if missing:
      hint = (" (pass variables['params'], not the variables)"
              if "params" in params else "")
      raise self._error(f"initial_carries: params lack {', '.join(missing)}"
                        f"{hint}")
    return tuple(c.initial_carry(params[f"layer_{l}"], (batch_size,))
                 for l, c in enumerate(self.cells))

  # ------------------------------------------------------------ pieces

  def _locked(self, site: str) -> bool:
    if isinstance(self.locked_dropout, bool):
      return self.locked_dropout
    return site in self.locked_dropout

  def _dropout(self, x, rate: float, site: str, name: str,
               deterministic: bool):
    """Dropout on [B, T, F]; locked sites share one mask across T (axis 1)."""
    if rate == 0.0:
      return x
    return nn.Dropout(rate, broadcast_dims=(1,) if self._locked(site) else (),
                      name=name)(x, deterministic=deterministic)

  def _table(self):
    """The [V, E] embedding table (None for one_hot)."""
    V, dtype = self.vocab_size, self.param_dtype
    if self.embedding == "learned":
      init = (uniform_symmetric(0.1) if self.embed_init == "uniform_0.1"
              else nn.initializers.normal(1.0 / math.sqrt(self.embed_size)))
      return self.param("embedding", init, (V, self.embed_size), dtype)
    if self.embedding == "frozen":  # read at init only, then stored
      return self.variable(
          FROZEN, "embedding",
          lambda: jnp.asarray(np.asarray(self.embedding_table), dtype)).value
    if self.embedding == "cell":
      return jnp.asarray(self.fixed_table(), dtype)  # a constant: not trainable
    return None

  def _embed(self, tokens, deterministic: bool):
    """tokens [B, T] -> (x [B, T, E], the table or None)."""
    table = self._table()
    if table is None:
      x = jax.nn.one_hot(tokens, self.vocab_size, dtype=self.param_dtype)
    else:
      x = jnp.take(table, tokens, axis=0)
    p = self.embedding_dropout
    if p > 0.0 and not deterministic:  # drop word types, AWD-LSTM's dropoute
      keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - p,
                                  (self.vocab_size, 1))
      scale = keep.astype(x.dtype) / jnp.asarray(1.0 - p, x.dtype)
      x = x * jnp.take(scale, tokens, axis=0)
    self.sow("intermediates", "embedded", x)  # kept only if made mutable
    return x, table

  def _check_tokens(self, tokens, lengths) -> None:
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise self._error(
          f"tokens must be int [B, T], got {tokens.dtype} {tokens.shape}")
    # Out-of-range ids would embed as NaN (learned: a clamped gather's
    # fill), another row (a negative id wraps) or zeros (one_hot). Concrete
    # tokens are checked; traced ones (inside jit) cannot be.
    bad = first_outside(tokens, self.vocab_size)
    if bad is not None:
      (value, (b, t)) = bad
      raise self._error(
          f"token ids must be in [0, vocab_size={self.vocab_size}), got "
          f"{value} at tokens[{b}, {t}]")
    if lengths is not None and jnp.shape(lengths) != tokens.shape[:1]:
      raise self._error(
          f"lengths must have shape [B] = [{tokens.shape[0]}], got "
          f"{jnp.shape(lengths)}")

  def _trunk(self, tokens, carries, lengths, deterministic: bool, aux):
    """tokens [B, T] -> (last layer outputs [B, T, H], carries, table)."""
    self._check_tokens(tokens, lengths)
    if carries is not None and len(carries) != len(self.cells):
      raise self._error(
          f"carries must hold one carry per layer ({len(self.cells)}), got "
          f"{len(carries)}")
    x, table = self._embed(jnp.asarray(tokens), deterministic)
    x = self._dropout(x, self.input_dropout, "input", "input_dropout",
                      deterministic)
    params = tuple(
        self.param(f"layer_{l}", lambda k, c=c, n=n: c.init(
            k, n, self.param_dtype))
        for l, (c, n) in enumerate(zip(self.cells, self.layer_input_sizes())))

    if self.weight_drop > 0.0 and not deterministic:
      params = tuple(self._weight_drop(l, c, p) for l, (c, p) in
                     enumerate(zip(self.cells, params)))

    def between(l, ys):
      return self._dropout(ys, self.hidden_dropout, "hidden",
                           f"hidden_dropout_{l}", deterministic)

    carries, h = unroll_layers(
        self.cells, params, x, carries, lengths, between=between,
        remat=self.remat, unroll=self.unroll, hoist=self.hoist,
        fused_grad=self.fused_grad, **aux)
    self.sow("intermediates", "last_outputs", h)
    h = self._dropout(h, self.output_dropout, "output", "output_dropout",
                      deterministic)
    self.sow("intermediates", "last_outputs_dropped", h)
    return h, carries, table

  def _weight_drop(self, l: int, cell, params: dict) -> dict:
    """params of layer l with DropConnect on its recurrent matrix: the
    parameter `cell.split` returns as W (one mask, scaled 1/(1-p))."""
    name = self._recurrent_name(l, cell, params)
    W, p = params[name], self.weight_drop
    keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - p, W.shape)
    dropped = jnp.where(keep, W / (1.0 - p), jnp.zeros_like(W))
    return {**params, name: dropped.astype(W.dtype)}

  def _recurrent_name(self, l: int, cell, params: dict) -> str:
    """The name of the parameter that `cell.split` returns as its recurrent
    matrix W (the same array, not one built from several)."""
    split = getattr(cell, "split", None)
    W = split(params)[0] if callable(split) else None
    names = [k for k, v in params.items() if v is W]
    if len(names) != 1:
      raise self._error(
          f"weight_drop: cells[{l}] ({type(cell).__name__}) has no single "
          "recurrent matrix parameter to drop (its split step builds W from "
          "several parameters, or it has none); use weight_drop=0 or a cell "
          "such as lstm, mts_lstm, gru, rnn")
    return names[0]
