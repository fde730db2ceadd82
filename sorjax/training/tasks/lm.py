"""Language modelling with truncated BPTT (word, char; AWD-LSTM batching).

Each of B streams continues across batches, so the hidden state is carried
from batch to batch (the loop keeps it in the train state, gradient stopped
between batches) and reset at the start of every epoch. Evaluation streams
a whole split the same way and reports cross-entropy (nats per token),
perplexity and bits per symbol.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sorjax.checks import check_int
from sorjax.data import batching, corpora
from sorjax.models import LanguageModel
from sorjax.training.tasks.base import ModelTask, masked_mean, step_mask
from sorjax.training.tasks.common import ConfigError, activation_regs, \
    build_model, check_bools, check_ints, trunk_kwargs


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


class LanguageModelTask(ModelTask):
  name = "lm"

  def __init__(self, config):
    d = self.data_cfg = config.data
    check_ints(d, {"batch_size": 1, "bptt": 1, "eval_batch_size": 1,
                   "eval_bptt": 1, "seed": 0, "pad_to": 1,
                   "test_batch_size": 1},
               optional=("pad_to", "test_batch_size"))
    check_bools(d, ("variable_bptt",))
    if d.get("pad_to") is not None and not d.variable_bptt:
      raise ConfigError(f"data.pad_to={d.pad_to} pads AWD-LSTM's variable "
                        f"windows (data.variable_bptt=True); fixed windows "
                        f"are data.bptt={d.bptt} long already")
    try:
      ids, self.vocab = corpora.load_corpus(d.corpus, "train", d.data_dir,
                                            manual_dir=d.manual_dir)
      self.split_ids = {"train": ids}
      for s in ("valid", "test"):
        self.split_ids[s] = corpora.load_corpus(
            d.corpus, s, d.data_dir, manual_dir=d.manual_dir)[0]
    except (FileNotFoundError, ValueError, KeyError) as e:
      raise ConfigError(f"data.corpus={d.corpus!r}: {e}") from None
    cutoff = check_int("data.train_sentence_cutoff",
                       d.get("train_sentence_cutoff"), 1, optional=True,
                       error=ConfigError)
    if cutoff is not None:  # Renganathan & Singh 6.1: partial training lines
      self.split_ids["train"], self.num_cut = batching.cut_stream_sentences(
          self.split_ids["train"], self.vocab.eos_id, cutoff)
    self.split_ids = _token_prefixes(self.split_ids, d)
    for s in self.eval_splits():   # each must fill the eval streams
      try:
        batching.batchify(self.split_ids[s], self.eval_streams(s))
      except ValueError as e:
        raise ConfigError(f"data.{self._streams_field(s)} / "
                          f"data.max_eval_tokens: split {s!r}: {e}") from None
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
    pad_to = (d.pad_to or d.bptt + 25) if d.variable_bptt else None
    try:
      self.batcher = batching.StreamBatcher(
          self.split_ids["train"], d.batch_size, d.bptt,
          variable=bool(d.variable_bptt), seed=d.seed, pad_to=pad_to)
    except ValueError as e:
      raise ConfigError(f"data: {e}") from None
    self._eval_step = jax.jit(self._eval_nll)

  # ---------------------------------------------------------------- text
  def encode_text(self, text: str) -> np.ndarray:
    symbols = corpora.corpus(self.data_cfg.corpus).symbols(text)
    return np.asarray([self.vocab.id(s, where="text") for s in symbols],
                      np.int32)

  # ---------------------------------------------------------------- train
  def num_train_batches(self):
    return None if self.batcher.variable else len(self.batcher)

  def train_batches(self, epoch, position):
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
    """Yields (inputs, targets, lengths, per-token nll [B, T]) over a split
    streamed in `eval_streams(split)` streams (for frequency-binned
    analyses)."""
    d = self.data_cfg
    B = self.eval_streams(split)
    b = batching.StreamBatcher(self.split_ids[split], B, d.eval_bptt,
                               pad_to=d.eval_bptt)
    carry = self.model.initial_carries(params, B)
    for batch in b:
      carry, _, _, ce = self._eval_step(params, carry, batch.inputs,
                                        batch.targets, batch.lengths,
                                        jnp.float32(temperature))
      yield batch.inputs, batch.targets, batch.lengths, np.asarray(ce)

  def metric_names(self) -> tuple[str, ...]:
    """What `evaluate` returns (selection.metric is checked against it)."""
    return ("loss", "perplexity") + (("bits_per_char",) if self.bits else ())

  def evaluate(self, params, split, temperature):
    nll, count, chars = 0.0, 0, 0
    for _, targets, lengths, ce in self.token_losses(params, split,
                                                     temperature):
      mask = np.arange(ce.shape[1])[None] < lengths[:, None]
      nll += float(np.sum(ce * mask))
      count += int(mask.sum())
      chars += int(np.sum(self.char_len[targets] * mask))
    if count == 0:
      raise ConfigError(f"data: split {split!r} has no tokens to evaluate")
    loss = nll / count
    out = {"loss": loss, "perplexity": math.exp(min(loss, 700.0))}
    if self.bits:
      out["bits_per_char"] = nll / chars / math.log(2)
    return out
