"""Tasks on bracket languages.

dyck_lm       next-token LM on Dyck-(k,m) (Lin et al. 4): cross-entropy,
              perplexity and its ratio to the oracle's, LDPA / WCPA.
dyck_closing  closing-bracket prediction (Renganathan & Singh 4.2): at every
              closing bracket, a softmax over the k closing brackets from
              the hidden state of the prefix before it; all closes of a
              sequence come from one causal pass.
dyck_pcfg     admissible-next-symbol prediction on the Dyck-2 PCFG (Mahto
              et al. 3.1.2 after Suzgun et al. 2019): sigmoid multi-label
              over the k closing brackets, MSE (Mahto) or BCE; a sequence is
              correct when every step's thresholded prediction is.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sorjax.analysis import dyck_metrics
from sorjax.data import batching, dyck, pcfg
from sorjax.models import DyckModel
from sorjax.training.tasks.base import (EpochBatches, EpochModelTask,
                                        masked_mean, step_mask)
from sorjax.training.tasks.common import BATCH_FIELDS, LM_ONLY_FIELDS, \
    ConfigError, build_model, check_ints, check_scale, head_fields, \
    refuse_lm_fields, trunk_kwargs, with_fields

_BUCKET_FIELDS = {"num_buckets": 1, "bucket_multiple": 1}


_COUNTS = {"train": "num_train", "dev": "num_dev", "test": "num_test"}


def _check_dyck_data(d) -> None:
  """The data fields of the Dyck-(k,m) tasks, before anything is built;
  max_length >= 2: the train split needs an even length in 1..max_length.
  The split counts may be None with a preset (its own counts)."""
  counts = tuple(_COUNTS.values()) if d.get("preset") else ()
  check_ints(d, {"k": 1, "m": 1, "num_train": 1, "num_dev": 1,
                 "num_test": 1, "max_length": 2, **BATCH_FIELDS,
                 **_BUCKET_FIELDS}, optional=("max_length", *counts))
  check_scale(d)


def _dyck_splits(d):
  """(language, {split: (samples, min_len, max_len)}) from config.data."""
  _check_dyck_data(d)
  lang = dyck.DyckKM(d.k, d.m)
  if d.get("preset"):
    if d.preset not in dyck.PRESETS:
      raise ConfigError(f"data.preset: unknown Dyck preset {d.preset!r}; "
                        f"known: {sorted(dyck.PRESETS)}")
    preset = dyck.PRESETS[d.preset]
    if (preset.language.k, preset.language.m) != (d.k, d.m):
      raise ConfigError(f"data.preset={d.preset!r} is Dyck-"
                        f"({preset.language.k},{preset.language.m}) but "
                        f"data.k={d.k}, data.m={d.m}")
    # a count given beside the preset replaces the preset's (its lengths
    # stay); data.scale shrinks either
    specs = {s: spec if d.get(_COUNTS[s]) is None else
             dyck.SplitSpec(int(d[_COUNTS[s]]), spec.min_length,
                            spec.max_length)
             for s, spec in preset.splits}
  else:
    specs = dict(dyck.hewitt_splits(lang, d.num_train, d.num_dev, d.num_test))
  if d.get("max_length") is not None:   # shorter sequences (CPU-scale runs)
    L = int(d.max_length)
    specs = {"train": dyck.SplitSpec(specs["train"].num, 1, L),
             "dev": dyck.SplitSpec(specs["dev"].num, 1, L),
             "test": dyck.SplitSpec(specs["test"].num, L + 1, 2 * L)}
  preset = dyck.DyckPreset(lang, tuple(specs.items()))
  samples = dyck.make_splits(preset, seed=d.seed, scale=d.scale)
  return lang, {s: (samples[s], spec.min_length, spec.max_length)
                for s, spec in specs.items()}


def _preset_counts_as_trained(saved: dict) -> tuple[dict, dict[str, str]]:
  """Until session 41 the split counts beside data.preset were not read:
  the preset's own were sampled. A config.json written then (it lacks
  model.head_units, a field of session 41) reads as those counts
  (`tasks.as_trained`)."""
  data, model = saved.get("data") or {}, saved.get("model") or {}
  preset = dyck.PRESETS.get(data.get("preset"))
  if preset is None or "head_units" in model:
    return saved, {}
  counts = {_COUNTS[s]: spec.num for s, spec in preset.splits}
  unread = {k: n for k, n in counts.items() if data.get(k) not in (None, n)}
  if not unread:
    return saved, {}
  why = {f"data.{k}": f"config.json's {data[k]!r} beside data.preset, "
                      f"which runs before session 41 did not read: they "
                      f"sampled the preset's {n}" for k, n in unread.items()}
  return {**saved, "data": {**data, **unread}}, why


def _dyck_as_trained(saved: dict) -> tuple[dict, dict[str, str]]:
  """`tasks.as_trained` for dyck_lm / dyck_closing: the preset's counts
  (`_preset_counts_as_trained`), and model.tie_embedding /
  tie_projection, which no Dyck task read, as False."""
  saved, why = _preset_counts_as_trained(saved)
  m = saved.get("model") or {}
  tied = [k for k in LM_ONLY_FIELDS if m.get(k)]
  if not tied:
    return saved, why
  return with_fields(saved, {f"model.{k}": False for k in tied}), {
      **why, **{f"model.{k}": f"config.json's {m[k]!r}, which the Dyck "
                              "tasks do not read and never did"
                for k in tied}}


def _boundaries(lengths, d):
  return batching.length_boundaries(lengths, d.num_buckets, d.bucket_multiple)


class DyckLM(EpochModelTask):
  name = "dyck_lm"

  def __init__(self, config):
    d = config.data
    self.lang, self.splits = _dyck_splits(d)
    self.k, V = self.lang.k, self.lang.vocab_size
    self.vocab = None
    refuse_lm_fields(config.model, self.name)
    self._setup_model(build_model(config.model, lambda cells: DyckModel(
        cells=cells, vocab_size=V, head=self._head,
        num_outputs=self._num_outputs, **head_fields(config.model),
        **trunk_kwargs(config.model))),
                      config, k=self.k)
    train = self.splits["train"][0]
    inputs, targets = batching.lm_pairs(train)
    self.epochs = EpochBatches(batching.SequenceBatcher(
        inputs, d.batch_size, targets=targets,
        boundaries=_boundaries([len(s) for s in inputs], d), shuffle=True,
        seed=d.seed), self._to_batch)
    self.eval_batch_size = d.eval_batch_size
    self._eval_step = jax.jit(self._eval_outputs)

  _head = "next_token"
  _num_outputs = None
  as_trained = staticmethod(_dyck_as_trained)

  # ---------------------------------------------------------------- train
  @staticmethod
  def _to_batch(b):
    return {"inputs": b.inputs, "targets": b.targets, "lengths": b.lengths}

  def loss(self, params, carry, batch, rng, temperature, train):
    logits, _ = self.apply(params, batch["inputs"], batch["lengths"],
                           rng=rng if train else None, temperature=temperature)
    ce = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), batch["targets"])
    mask = step_mask(batch["lengths"], ce.shape[1])
    loss = masked_mean(ce, mask)
    return loss, (carry, {"tokens": jnp.sum(mask)})

  # ---------------------------------------------------------------- eval
  def eval_splits(self):
    return ("dev", "test")

  def _eval_outputs(self, params, inputs, lengths, temperature):
    logits, _ = self.apply(params, inputs, lengths, temperature=temperature)
    return jax.nn.log_softmax(logits.astype(jnp.float32), -1)

  def eval_batches(self, split):
    seqs = self.splits[split][0]
    inputs, targets = batching.lm_pairs(seqs)
    b = batching.SequenceBatcher(inputs, self.eval_batch_size,
                                 targets=targets, shuffle=False, multiple=16)
    for batch in b:
      yield batch, [seqs[i] if i >= 0 else None for i in batch.index]

  def log_probs(self, params, split, temperature):
    """Yields (batch, sequences, log-probs [B, T, V]) over a split."""
    for batch, seqs in self.eval_batches(split):
      lp = self._eval_step(params, batch.inputs, batch.lengths,
                           jnp.float32(temperature))
      yield batch, seqs, np.asarray(lp)

  @functools.lru_cache(maxsize=8)
  def oracle(self, split):
    seqs, lo, hi = self.splits[split]
    return self.lang.oracle_score(seqs, lo, hi)

  def close_probs(self, lp):
    """Probabilities [B, T, V] for the 80% rule, which reads only their
    ratios among the closing ids: those renormalised over the closes in
    log space. (np.exp(lp) underflowed to all-zero closes where a model
    was sure no close came.)"""
    close = np.asarray(lp[..., self.k:2 * self.k], np.float64)
    close = close - close.max(-1, keepdims=True)
    probs = np.zeros(lp.shape[:2] + (self.lang.vocab_size,))
    probs[..., self.k:2 * self.k] = np.exp(close)
    return probs

  def ldpa_batch(self, batch, seqs, lp) -> dict[int, tuple[int, int]]:
    """LDPA counts {closing distance: (correct, total)} of one eval batch
    (as `log_probs` yields it)."""
    tokens = np.concatenate([batch.inputs[:, :1], batch.targets], 1)
    dist = np.zeros(tokens.shape, np.int64)
    for r, s in enumerate(seqs):
      if s is not None:
        dist[r, :len(s)] = self.lang.closing_distances(s)
    return dyck_metrics.ldpa(self.close_probs(lp), tokens, dist, self.k)

  def metric_names(self) -> tuple[str, ...]:
    """What `evaluate` returns (selection.metric is checked against it)."""
    return ("loss", "perplexity", "oracle_perplexity", "perplexity_ratio",
            "wcpa", "close_accuracy")

  def evaluate(self, params, split, temperature):
    nll, count, counts = 0.0, 0, {}
    for batch, seqs, lp in self.log_probs(params, split, temperature):
      mask = np.asarray(step_mask(batch.lengths, lp.shape[1]))
      tok_lp = np.take_along_axis(lp, batch.targets[..., None], -1)[..., 0]
      nll -= float(np.sum(tok_lp * mask))
      count += int(mask.sum())
      counts = dyck_metrics.merge(counts, self.ldpa_batch(batch, seqs, lp))
    loss = nll / count
    oracle = self.oracle(split)
    return {"loss": loss, "perplexity": math.exp(loss),
            "oracle_perplexity": oracle.perplexity,
            "perplexity_ratio": math.exp(loss) / oracle.perplexity,
            "wcpa": dyck_metrics.wcpa(counts),
            "close_accuracy": dyck_metrics.accuracy(counts)}


class DyckClosing(DyckLM):
  """Per-step softmax over the k closing brackets, scored at closes."""
  name = "dyck_closing"
  _head = "next_token"

  def __init__(self, config):
    self._num_outputs = config.data.k
    super().__init__(config)

  def _close_targets(self, targets):
    is_close = (targets >= self.k) & (targets < 2 * self.k)
    return is_close, jnp.where(is_close, targets - self.k, 0)

  def close_probs(self, lp):
    """The k-way softmax placed on the closing ids, all mass on closes."""
    probs = np.zeros(lp.shape[:2] + (self.lang.vocab_size,))
    probs[..., self.k:2 * self.k] = np.exp(lp)
    return probs

  def loss(self, params, carry, batch, rng, temperature, train):
    logits, _ = self.apply(params, batch["inputs"], batch["lengths"],
                           rng=rng if train else None, temperature=temperature)
    is_close, cls = self._close_targets(batch["targets"])
    ce = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), cls)
    mask = step_mask(batch["lengths"], ce.shape[1]) & is_close
    return masked_mean(ce, mask), (carry, {"closes": jnp.sum(mask)})

  def metric_names(self) -> tuple[str, ...]:
    return ("loss", "accuracy", "wcpa", "close_accuracy")

  def evaluate(self, params, split, temperature):
    nll, count, counts, argmax_ok = 0.0, 0, {}, 0
    for batch, seqs, lp in self.log_probs(params, split, temperature):
      is_close, cls = map(np.asarray, self._close_targets(batch.targets))
      mask = np.asarray(step_mask(batch.lengths, lp.shape[1])) & is_close
      tok_lp = np.take_along_axis(lp, cls[..., None], -1)[..., 0]
      nll -= float(np.sum(tok_lp * mask))
      count += int(mask.sum())
      argmax_ok += int(np.sum((lp.argmax(-1) == cls) & mask))
      counts = dyck_metrics.merge(counts, self.ldpa_batch(batch, seqs, lp))
    return {"loss": nll / count, "accuracy": argmax_ok / count,
            "wcpa": dyck_metrics.wcpa(counts),
            "close_accuracy": dyck_metrics.accuracy(counts)}


class DyckPCFGTask(EpochModelTask):
  name = "dyck_pcfg"

  def __init__(self, config):
    d = config.data
    if d.preset not in pcfg.PRESETS:
      raise ConfigError(f"data.preset: unknown PCFG preset {d.preset!r}; "
                        f"known: {sorted(pcfg.PRESETS)}")
    if d.loss not in ("mse", "bce"):
      raise ConfigError(f"data.loss must be 'mse' or 'bce', got {d.loss!r}")
    check_ints(d, {**BATCH_FIELDS, **_BUCKET_FIELDS})
    check_scale(d)
    self.grammar = pcfg.PRESETS[d.preset].grammar
    self.k = self.grammar.k
    self.splits = pcfg.make_splits(d.preset, seed=d.seed, scale=d.scale)
    if "dev" not in self.splits:   # Suzgun has no dev split: hold out 10%
      train = self.splits["train"]
      if len(train) < 2:
        raise ConfigError(f"data.scale={d.scale} leaves {len(train)} train "
                          f"sequence(s) of preset {d.preset!r}: too few to "
                          "hold out a dev split")
      n = max(1, len(train) // 10)
      self.splits = {"train": train[:-n], "dev": train[-n:],
                     **{s: v for s, v in self.splits.items() if s != "train"}}
    self.loss_kind, self.vocab = d.loss, None
    refuse_lm_fields(config.model, self.name)
    self._setup_model(build_model(config.model, lambda cells: DyckModel(
        cells=cells, vocab_size=self.grammar.vocab_size, head="admissible",
        num_outputs=self.k, **head_fields(config.model),
        **trunk_kwargs(config.model))), config, k=self.k)
    train = self.splits["train"]
    self._targets = {s: [self.grammar.closing_targets(x).astype(np.float32)
                         for x in seqs] for s, seqs in self.splits.items()}
    self.epochs = EpochBatches(batching.SequenceBatcher(
        train, d.batch_size,
        boundaries=_boundaries([len(s) for s in train], d), shuffle=True,
        seed=d.seed), functools.partial(self._to_batch, "train"))
    self.eval_batch_size = d.eval_batch_size
    self._eval_step = jax.jit(self._probs)

  def _to_batch(self, split, b):
    T = b.inputs.shape[1]
    tgt = np.zeros((b.inputs.shape[0], T, self.k), np.float32)
    for r, i in enumerate(b.index):
      if i >= 0:
        t = self._targets[split][i]
        tgt[r, :len(t)] = t
    return {"inputs": b.inputs, "targets": tgt, "lengths": b.lengths}

  def _per_step_loss(self, logits, targets):
    if self.loss_kind == "mse":
      return jnp.mean((jax.nn.sigmoid(logits) - targets) ** 2, -1)
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, targets), -1)

  def loss(self, params, carry, batch, rng, temperature, train):
    logits, _ = self.apply(params, batch["inputs"], batch["lengths"],
                           rng=rng if train else None, temperature=temperature)
    per = self._per_step_loss(logits.astype(jnp.float32), batch["targets"])
    return masked_mean(per, step_mask(batch["lengths"], per.shape[1])), (
        carry, {})

  def eval_splits(self):
    return ("dev",) + tuple(s for s in self.splits if s not in ("train",
                                                                 "dev"))

  def _probs(self, params, inputs, lengths, temperature):
    logits, _ = self.apply(params, inputs, lengths, temperature=temperature)
    logits = logits.astype(jnp.float32)
    return jax.nn.sigmoid(logits), logits

  def predictions(self, params, split, temperature):
    """Yields (batch, its arrays {inputs, targets, lengths}, probabilities
    [B, T, k], logits [B, T, k]) over a split; `batch.index` holds each
    row's sequence index (-1 for a filler row)."""
    b = batching.SequenceBatcher(self.splits[split], self.eval_batch_size,
                                 shuffle=False, multiple=16)
    for batch in b:
      probs, logits = self._eval_step(params, batch.inputs, batch.lengths,
                                      jnp.float32(temperature))
      yield batch, self._to_batch(split, batch), np.asarray(probs), logits

  def metric_names(self) -> tuple[str, ...]:
    """What `evaluate` returns (selection.metric is checked against it)."""
    return ("loss", "sequence_accuracy")

  def evaluate(self, params, split, temperature):
    total, steps, correct, n = 0.0, 0, 0, 0
    for batch, b, probs, logits in self.predictions(params, split,
                                                    temperature):
      mask = np.asarray(step_mask(batch.lengths, probs.shape[1]))
      per = np.asarray(self._per_step_loss(logits, b["targets"]))
      total += float(np.sum(per * mask))
      steps += int(mask.sum())
      ok = np.all((probs > 0.5) == (b["targets"] > 0.5), -1) | ~mask
      real = batch.index >= 0
      correct += int(np.sum(np.all(ok, -1) & real))
      n += int(real.sum())
    return {"loss": total / steps, "sequence_accuracy": correct / n}
