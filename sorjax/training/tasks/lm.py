"""Language modelling: truncated-BPTT streams, or one line per document.

Streams (the default; word, char; AWD-LSTM batching): each of B streams
continues across batches, so the hidden state is carried from batch to
batch (the loop keeps it in the train state, gradient stopped between
batches) and reset at the start of every epoch. Evaluation streams a whole
split the same way.

Documents (`data.documents`; Maupome & Meurs 4: "each line ... a separate
document", not trimmed): a batch holds B whole lines, padded within one of
`data.num_buckets` length buckets; every line starts from the zero state
with `<eos>` as its first input ("a line begins"), so its first symbol is
predicted too, and ends by predicting its own `<eos>`.

`data.folds = k` (with `data.fold`) pools the corpus's train, valid and
test lines and cross-validates over them (`sorjax.data.batching.kfold`):
fold f tests on its fifth of the lines and trains on the rest minus a
`data.fold_valid_fraction` held out for validation (Maupome & Meurs: k =
5, 10%); `python -m experiments.crossval` runs every fold.

Evaluation reports cross-entropy (nats per token), perplexity and, on
character corpora, bits per character; documents add the mean over
documents of each one's loss (and bits per character).
"""

from __future__ import annotations

import logging
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sorjax.checks import check_int, check_number
from sorjax.data import batching, corpora
from sorjax.models import LanguageModel
from sorjax.training.config import fields_set
from sorjax.training.tasks.base import EpochBatches, ModelTask, \
    masked_mean, step_mask
from sorjax.training.tasks.common import ConfigError, activation_regs, \
    build_model, check_bools, check_ints, refuse_head_fields, \
    trunk_kwargs, with_fields

log = logging.getLogger(__name__)

# Data fields added after the first runs were saved, with the value that
# does what those runs did (read for a field their config.json lacks).
ADDED_FIELDS = {"documents": False, "num_buckets": 16, "bucket_multiple": 8,
                "folds": None, "fold": 0, "fold_valid_fraction": 0.1,
                "fold_seed": 0}
DOCUMENT_FIELDS = ("num_buckets", "bucket_multiple")
FOLD_FIELDS = ("fold", "fold_valid_fraction", "fold_seed")


class ScoredBatch(NamedTuple):
  """One evaluation batch: per-token NLL and where each target sits in the
  split's token stream (`task.split_ids[split]`)."""
  inputs: np.ndarray     # [B, T] int32
  targets: np.ndarray    # [B, T] int32
  lengths: np.ndarray    # [B] scored steps per row (0: a filler row)
  nll: np.ndarray        # [B, T] float32 nats
  positions: np.ndarray  # [B, T] int64 index of the target; -1 if unscored


def activation_penalties(sown: dict, mask) -> tuple[jax.Array, jax.Array]:
  """AWD-LSTM's AR and TAR (Merity et al. 2018, sec. 4.6) over valid steps:
  AR = mean of the squared last-layer outputs after output dropout, TAR =
  mean of (h_t - h_{t-1})^2 of the outputs before it (pairs of valid
  steps); means over tokens and units, as `x.pow(2).mean()`."""
  dropped = sown["last_outputs_dropped"][0].astype(jnp.float32)
  raw = sown["last_outputs"][0].astype(jnp.float32)
  ar = masked_mean(jnp.mean(dropped ** 2, -1), mask)
  diff = jnp.mean((raw[:, 1:] - raw[:, :-1]) ** 2, -1)
  tar = masked_mean(diff, mask[:, 1:])  # 0 for one-step windows
  return ar, tar


def _folds(split_ids: dict, eos_id: int, d) -> tuple[dict, dict]:
  """data.folds: the corpus's lines pooled (train, valid, test in order)
  and re-split by `batching.kfold` into fold data.fold's train / valid /
  test; returns the new streams and the line counts."""
  k = check_int("data.folds", d.folds, 2, error=ConfigError)
  check_int("data.fold", d.fold, 0, error=ConfigError)
  if d.fold >= k:
    raise ConfigError(f"data.fold={d.fold}: data.folds={k} numbers the "
                      f"folds 0..{k - 1}")
  check_int("data.fold_seed", d.fold_seed, 0, error=ConfigError)
  frac = check_number("data.fold_valid_fraction", d.fold_valid_fraction,
                      "in (0, 1)", lambda v: 0 < v < 1, error=ConfigError)
  lines = [doc for s in ("train", "valid", "test")
           for doc in batching.split_documents(split_ids[s], eos_id)]
  try:
    fold = batching.kfold(len(lines), k, seed=d.fold_seed,
                          valid_fraction=frac)[d.fold]
  except ValueError as e:
    raise ConfigError(f"data.folds={k}: {e}") from None
  rest = fold.train.size + fold.valid.size
  if fold.valid.size == 0:
    raise ConfigError(f"data.fold_valid_fraction={frac} holds out no line "
                      f"of the {rest} non-test lines of fold {d.fold}")
  if fold.train.size == 0:
    raise ConfigError(f"data.fold_valid_fraction={frac} holds out all "
                      f"{rest} non-test lines of fold {d.fold}, leaving no "
                      "line to train on")
  out = {s: np.concatenate([lines[i] for i in idx]).astype(np.int32)
         for s, idx in (("train", fold.train), ("valid", fold.valid),
                        ("test", fold.test))}
  counts = {s: int(getattr(fold, s).size) for s in ("train", "valid", "test")}
  log.info("data.fold %d of %d: %d train, %d valid, %d test lines of %d",
           d.fold, k, counts["train"], counts["valid"], counts["test"],
           len(lines))
  return out, counts


def _check_fields(d) -> None:
  """The streams' and the documents' fields, each refused where unread."""
  docs = bool(d.get("documents", False))
  check_ints(d, {"batch_size": 1, "eval_batch_size": 1, "seed": 0,
                 "test_batch_size": 1}, optional=("test_batch_size",))
  if docs:
    check_ints(d, {"num_buckets": 1, "bucket_multiple": 1})
    for k in ("bptt", "eval_bptt", "pad_to"):
      if d.get(k) is not None:
        raise ConfigError(
            f"data.{k}={d[k]} cuts streams into windows; data.documents "
            f"reads whole lines: set it to None")
    if d.variable_bptt:
      raise ConfigError("data.variable_bptt varies the streams' windows; "
                        "data.documents reads whole lines: leave it False")
  else:
    check_ints(d, {"bptt": 1, "eval_bptt": 1, "pad_to": 1},
               optional=("pad_to",))
    if d.get("pad_to") is not None and not d.variable_bptt:
      raise ConfigError(f"data.pad_to={d.pad_to} pads AWD-LSTM's variable "
                        f"windows (data.variable_bptt=True); fixed windows "
                        f"are data.bptt={d.bptt} long already")
    unread = fields_set(d, ADDED_FIELDS, DOCUMENT_FIELDS)
    if unread:
      raise ConfigError(f"data.{unread[0]}={d[unread[0]]} buckets the lines "
                        f"of data.documents=True; streams do not read it")
  if d.get("folds") is None:
    unread = fields_set(d, ADDED_FIELDS, FOLD_FIELDS)
    if unread:
      raise ConfigError(f"data.{unread[0]}={d[unread[0]]} is read with "
                        f"data.folds (k-fold cross-validation) only")


def _token_prefixes(split_ids: dict, d) -> dict:
  """CPU-scale runs: the first data.max_train_tokens tokens of the train
  split and data.max_eval_tokens of valid / test (None: all)."""
  out = dict(split_ids)
  for name, splits in (("max_train_tokens", ("train",)),
                       ("max_eval_tokens", ("valid", "test"))):
    n = check_int(f"data.{name}", d.get(name), 1, optional=True,
                  error=ConfigError)
    if n is not None:
      out.update({s: out[s][:n] for s in splits})
  return out


def _lm_as_trained(saved: dict) -> tuple[dict, dict[str, str]]:
  """`tasks.as_trained` for the lm task: data.pad_to with fixed windows
  (no data.variable_bptt), refused now and never read, as None."""
  d = saved.get("data") or {}
  if d.get("pad_to") is None or d.get("variable_bptt") or d.get(
      "documents"):
    return saved, {}
  return with_fields(saved, {"data.pad_to": None}), {"data.pad_to": (
      f"config.json's {d['pad_to']!r}, which fixed windows (data."
      "variable_bptt False) do not read and never did")}


class LanguageModelTask(ModelTask):
  name = "lm"
  ADDED_FIELDS = ADDED_FIELDS
  as_trained = staticmethod(_lm_as_trained)

  def __init__(self, config):
    refuse_head_fields(config.model, self.name)
    d = self.data_cfg = config.data
    check_bools(d, ("variable_bptt", "documents"))
    _check_fields(d)
    self.documents = bool(d.get("documents", False))
    try:
      ids, self.vocab = corpora.load_corpus(d.corpus, "train", d.data_dir,
                                            manual_dir=d.manual_dir)
      self.split_ids = {"train": ids}
      for s in ("valid", "test"):
        self.split_ids[s] = corpora.load_corpus(
            d.corpus, s, d.data_dir, manual_dir=d.manual_dir)[0]
    except (FileNotFoundError, ValueError, KeyError) as e:
      raise ConfigError(f"data.corpus={d.corpus!r}: {e}") from None
    self.fold_lines = None
    if d.get("folds") is not None:
      self.split_ids, self.fold_lines = _folds(self.split_ids,
                                               self.vocab.eos_id, d)
    cutoff = check_int("data.train_sentence_cutoff",
                       d.get("train_sentence_cutoff"), 1, optional=True,
                       error=ConfigError)
    if cutoff is not None:  # Renganathan & Singh 6.1: partial training lines
      self.split_ids["train"], self.num_cut = batching.cut_stream_sentences(
          self.split_ids["train"], self.vocab.eos_id, cutoff)
    self.split_ids = _token_prefixes(self.split_ids, d)
    if self.documents:
      self._setup_documents(d)
    else:
      for s in self.eval_splits():   # each must fill the eval streams
        try:
          batching.batchify(self.split_ids[s], self.eval_streams(s))
        except ValueError as e:
          raise ConfigError(f"data.{self._streams_field(s)} / "
                            f"data.max_eval_tokens: split {s!r}: {e}"
                            ) from None
    V = len(self.vocab)
    self._setup_model(build_model(config.model, lambda cells: LanguageModel(
        cells=cells, vocab_size=V, tie_embedding=config.model.tie_embedding,
        tie_projection=config.model.tie_projection,
        **trunk_kwargs(config.model, activation_reg=True))), config)
    self.ar, self.tar = activation_regs(config.model)
    self.bits = d.corpus.startswith(("ptb_char", "tinyshakespeare"))
    # Characters per symbol, so bits per *character* also holds for the
    # character-bigram corpus (Maupome & Meurs 4.2); <eos> is one newline.
    specials = {self.vocab.eos_id, self.vocab.unk_id}
    self.char_len = np.asarray(
        [1 if i in specials else len(sym)
         for i, sym in enumerate(self.vocab.decode(range(V)))], np.int64)
    if self.documents:
      self.batcher = self._document_batcher("train", d.batch_size,
                                            shuffle=True)
      self.epochs = EpochBatches(self.batcher, lambda b: {
          "inputs": b.inputs, "targets": b.targets, "lengths": b.lengths,
          "reset": np.bool_(True)})
    else:
      pad_to = (d.pad_to or d.bptt + 25) if d.variable_bptt else None
      try:
        self.batcher = batching.StreamBatcher(
            self.split_ids["train"], d.batch_size, d.bptt,
            variable=bool(d.variable_bptt), seed=d.seed, pad_to=pad_to)
      except ValueError as e:
        raise ConfigError(f"data: {e}") from None
    self._eval_step = jax.jit(self._eval_nll)

  def _setup_documents(self, d) -> None:
    """Each split's lines as (input, target) pairs from `<eos>` on, where
    each line starts in its split's stream, and length buckets shared by
    every split (one compiled shape per bucket and batch size)."""
    eos = self.vocab.eos_id
    self.split_docs, self.doc_starts = {}, {}
    for s, ids in self.split_ids.items():
      docs = batching.split_documents(ids, eos)
      if not docs[0].size:
        raise ConfigError(f"data: split {s!r} has no tokens")
      self.split_docs[s] = batching.lm_pairs(docs, bos=eos)
      self.doc_starts[s] = np.cumsum([0] + [len(x) for x in docs[:-1]])
    lengths = np.concatenate([[len(x) for x in p[0]]
                              for p in self.split_docs.values()])
    self.boundaries = batching.length_boundaries(
        lengths, d.num_buckets, d.bucket_multiple)

  def _document_batcher(self, split: str, batch_size: int, shuffle: bool
                        ) -> batching.SequenceBatcher:
    inputs, targets = self.split_docs[split]
    return batching.SequenceBatcher(
        inputs, batch_size, targets=targets, boundaries=self.boundaries,
        shuffle=shuffle, seed=self.data_cfg.seed, fill=True)

  # ---------------------------------------------------------------- text
  def encode_text(self, text: str) -> np.ndarray:
    symbols = corpora.corpus(self.data_cfg.corpus).symbols(text)
    return np.asarray([self.vocab.id(s, where="text") for s in symbols],
                      np.int32)

  # ---------------------------------------------------------------- train
  def num_train_batches(self):
    variable = not self.documents and self.batcher.variable
    return None if variable else len(self.batcher)

  def train_batches(self, epoch, position):
    if self.documents:   # every batch starts from the zero state
      yield from self.epochs(epoch, position)
      return
    state = self.batcher.get_state()
    state.update(epoch=epoch, position=0, step=0)
    if position:
      state.update(position=position["position"], step=position["step"])
    self.batcher.set_state(state)
    first = position is None
    for b in self.batcher:
      yield ({"inputs": b.inputs, "targets": b.targets, "lengths": b.lengths,
              "lr_scale": np.float32(b.lr_scale),
              "reset": np.bool_(first)},
             {k: self.batcher.get_state()[k] for k in ("position", "step")})
      first = False

  def init_carry(self, params):
    return self.model.initial_carries(params, self.data_cfg.batch_size)

  def loss(self, params, carry, batch, rng, temperature, train):
    init = self.model.initial_carries(params, self.data_cfg.batch_size)
    carry = jax.tree_util.tree_map(
        lambda i, c: jnp.where(batch["reset"], i, c), init, carry)
    regs = train and (self.ar > 0 or self.tar > 0)
    out = self.apply(params, batch["inputs"], batch["lengths"], carry,
                     rng=rng if train else None, temperature=temperature,
                     mutable=["intermediates"] if regs else False)
    (logits, new_carry), sown = out if regs else (out, None)
    ce = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), batch["targets"])
    mask = step_mask(batch["lengths"], ce.shape[1])
    loss = masked_mean(ce, mask)
    metrics = {}
    if regs:
      ar, tar = activation_penalties(sown["intermediates"], mask)
      metrics = {"ar": ar, "tar": tar}
      loss = loss + self.ar * ar + self.tar * tar
    return loss, (jax.lax.stop_gradient(new_carry), metrics)

  # ---------------------------------------------------------------- eval
  def eval_splits(self):
    return ("valid", "test")

  def _eval_nll(self, params, carry, inputs, targets, lengths, temperature):
    logits, carry = self.apply(params, inputs, lengths, carry,
                               temperature=temperature)
    ce = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), targets)
    mask = step_mask(lengths, ce.shape[1])
    return carry, jnp.sum(ce * mask), jnp.sum(mask), ce

  def _streams_field(self, split: str) -> str:
    """The data field giving a split's number of evaluation streams."""
    if split == "test" and self.data_cfg.get("test_batch_size"):
      return "test_batch_size"
    return "eval_batch_size"

  def eval_streams(self, split: str) -> int:
    """How many streams a split is evaluated in: data.test_batch_size for
    "test" when set (AWD-LSTM validates in 10 and tests in 1, one stream
    whose state runs through the whole split), else data.eval_batch_size
    (older configs lack test_batch_size)."""
    return int(self.data_cfg[self._streams_field(split)])

  def token_losses(self, params, split, temperature):
    """Yields a `ScoredBatch` per evaluation batch of a split: streams in
    `eval_streams(split)` rows carried from batch to batch (each row's first
    token unscored), or documents `eval_streams(split)` lines at a time,
    each from the zero state (every token scored)."""
    tau = jnp.float32(temperature)
    B = self.eval_streams(split)
    if self.documents:
      starts = self.doc_starts[split]
      init = self.model.initial_carries(params, B)
      for b in self._document_batcher(split, B, shuffle=False):
        _, _, _, ce = self._eval_step(params, init, b.inputs, b.targets,
                                      b.lengths, tau)
        T = b.inputs.shape[1]
        pos = np.where(b.index[:, None] >= 0, starts[b.index][:, None], 0
                       ) + np.arange(T)[None]
        pos[np.arange(T)[None] >= b.lengths[:, None]] = -1
        yield ScoredBatch(b.inputs, b.targets, b.lengths, np.asarray(ce),
                          pos.astype(np.int64))
      return
    d = self.data_cfg
    ids = self.split_ids[split]
    b = batching.StreamBatcher(ids, B, d.eval_bptt, pad_to=d.eval_bptt)
    N = len(ids) // B                   # row r holds tokens r*N .. r*N+N-1
    carry, offset = self.model.initial_carries(params, B), 0
    for batch in b:
      carry, _, _, ce = self._eval_step(params, carry, batch.inputs,
                                        batch.targets, batch.lengths, tau)
      T = batch.inputs.shape[1]
      pos = (np.arange(B)[:, None] * N + offset + 1 + np.arange(T)[None])
      pos[np.arange(T)[None] >= batch.lengths[:, None]] = -1
      offset += int(batch.lengths[0])   # every row has the same window
      yield ScoredBatch(batch.inputs, batch.targets, batch.lengths,
                        np.asarray(ce), pos.astype(np.int64))

  def metric_names(self) -> tuple[str, ...]:
    """What `evaluate` returns (selection.metric is checked against it)."""
    names = ("loss", "perplexity") + (("bits_per_char",) if self.bits else ())
    if self.documents:
      names += ("document_loss",) + (
          ("document_bits_per_char",) if self.bits else ())
    return names

  def evaluate(self, params, split, temperature):
    nll, count, chars = 0.0, 0, 0
    doc_nll, doc_count, doc_chars = [], [], []
    for b in self.token_losses(params, split, temperature):
      mask = b.positions >= 0
      row_nll = np.sum(np.where(mask, b.nll, 0.0), 1, dtype=np.float64)
      row_chars = np.sum(self.char_len[b.targets] * mask, 1)
      nll += float(row_nll.sum())
      count += int(mask.sum())
      chars += int(row_chars.sum())
      if self.documents:
        rows = b.lengths > 0
        doc_nll.append(row_nll[rows])
        doc_count.append(b.lengths[rows])
        doc_chars.append(row_chars[rows])
    if count == 0:
      raise ConfigError(f"data: split {split!r} has no tokens to evaluate")
    loss = nll / count
    out = {"loss": loss, "perplexity": math.exp(min(loss, 700.0))}
    if self.bits:
      out["bits_per_char"] = nll / chars / math.log(2)
    if self.documents:   # the mean over documents of each one's figure
      doc_nll = np.concatenate(doc_nll)
      out["document_loss"] = float(np.mean(doc_nll /
                                           np.concatenate(doc_count)))
      if self.bits:
        out["document_bits_per_char"] = float(np.mean(
            doc_nll / np.concatenate(doc_chars)) / math.log(2))
    return out
