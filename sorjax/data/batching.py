"""Batching: TBPTT token streams, padded/bucketed sequences, k-fold splits.

Everything here is host-side NumPy that hands fixed-dtype int32 arrays to a
jitted step. Both iterators run one epoch per `for` loop, are seeded, and
can be checkpointed: `get_state()` is a small JSON- and Orbax-friendly dict
of numbers (and a list of bucket boundaries); `set_state(state)` on a fresh
iterator over the same data continues with exactly the batches the old one
would have produced.

Static shapes: `StreamBatcher(pad_to=T)` and `SequenceBatcher(boundaries=..)`
(or `multiple=`) keep the number of distinct [B, T] shapes, hence of jit
compilations, small; `lengths` marks the valid steps (`sorjax.unroll`'s
`lengths` argument), and padded steps must be masked out of the loss.
"""

from __future__ import annotations

import logging
import math
from typing import Any, NamedTuple, Sequence

import numpy as np

from sorjax import checks
from sorjax.data.checks import check_bool, check_int


_MAX_ID = int(np.iinfo(np.int32).max)   # ids are int32 on the device


def _check_id(fn: str, name: str, value: Any) -> None:
  """A token id: an int in [0, 2**31 - 1]."""
  check_int(fn, name, value, 0)
  if value > _MAX_ID:
    raise ValueError(f"{fn}: {name}={value} does not fit int32")


def _as_ids(fn: str, name: str, ids: Any) -> np.ndarray:
  ids = np.asarray(ids)
  if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer)
                           or ids.size == 0):
    raise ValueError(f"{fn}: {name} must be a 1-D integer array, got "
                     f"shape {ids.shape} dtype {ids.dtype}")
  bad = (ids < 0) | (ids > _MAX_ID)
  if bad.any():
    j = int(np.argmax(bad))
    raise ValueError(f"{fn}: {name} has id {ids[j]} at position {j}; ids "
                     f"must be in [0, 2**31 - 1] (int32)")
  return ids.astype(np.int32, copy=False)


# ============================================================ TBPTT streams

def batchify(tokens: Any, batch_size: int) -> tuple[np.ndarray, int]:
  """Cuts a 1-D token stream into `batch_size` contiguous rows.

  Row i holds tokens [i*N, (i+1)*N) with N = len(tokens) // batch_size, so
  successive windows of a row continue each other (the hidden state can be
  carried over). The len(tokens) % batch_size trailing tokens that do not
  fill the last row are dropped, as in the standard batchify; their number
  is returned.

  Returns:
    (data [batch_size, N] int32, number of dropped tokens).
  """
  check_int("batchify", "batch_size", batch_size, 1)
  tokens = _as_ids("batchify", "tokens", tokens)
  if tokens.size == 0:
    raise ValueError("batchify: tokens is empty")
  N = tokens.size // batch_size
  if N < 2:  # a window needs one input and its next-token target
    raise ValueError(
        f"batchify: batch_size={batch_size} is too large for {tokens.size} "
        f"tokens (each row needs >= 2 tokens, so at most "
        f"{tokens.size // 2} rows)")
  dropped = tokens.size - N * batch_size
  return tokens[:N * batch_size].reshape(batch_size, N), dropped


def awd_seq_len(rng: np.random.Generator, bptt: int, p: float = 0.95,
                sigma: float = 5.0, min_len: int = 5) -> int:
  """AWD-LSTM's variable BPTT length (Merity et al. 2018, sec. 4.1).

  The base length is `bptt` with probability p, else bptt / 2; the length
  is int(N(base, sigma)), at least `min_len` (AWD-LSTM: 70, 0.95, 5, 5).
  """
  base = bptt if rng.random() < p else bptt / 2
  return max(min_len, int(rng.normal(base, sigma)))


class StreamBatch(NamedTuple):
  """One TBPTT window over all B streams."""
  inputs: np.ndarray   # [B, T] int32
  targets: np.ndarray  # [B, T] int32: the next token of each input
  lengths: np.ndarray  # [B] int32: valid steps (< T only with pad_to)
  lr_scale: float      # AWD-LSTM: lr * seq_len / bptt; 1.0 for fixed bptt


class StreamBatcher:
  """TBPTT batches over B parallel streams of a 1-D token array.

  Row i of batch j+1 continues row i of batch j in the source, so a train
  loop carries the hidden state from batch to batch (and resets it at each
  epoch). `targets` are `inputs` shifted by one token in the stream.

  With `variable=True` the window lengths follow AWD-LSTM (`awd_seq_len`),
  drawn from a generator seeded by (seed, epoch, batch number), and each
  batch carries AWD-LSTM's learning-rate factor seq_len / bptt (computed,
  as there, from the drawn length before the end of the data shortens it).
  One deviation: AWD-LSTM stops when fewer than 2 steps remain; this keeps
  a final 1-step window, so no target is skipped.

  Args:
    tokens: 1-D int array, e.g. `Encoded.stream()`.
    batch_size: B, the number of parallel streams.
    bptt: the window length (the base length when variable).
    variable: draw window lengths as AWD-LSTM does.
    p, sigma, min_len: AWD-LSTM's parameters (0.95, 5, 5).
    seed: seeds the variable lengths.
    pad_to: pad every window to this T (>= bptt; longer draws are cut to
      it) so that a jitted step sees one shape; None: T = window length.
    pad_id: id written in padded steps.
  Attributes:
    data: the [B, N] batchified stream.
    dropped: trailing tokens batchify dropped (also logged).
    epoch: the current epoch (0-based).
  """

  def __init__(self, tokens: Any, batch_size: int, bptt: int, *,
               variable: bool = False, p: float = 0.95, sigma: float = 5.0,
               min_len: int = 5, seed: int = 0, pad_to: int | None = None,
               pad_id: int = 0):
    check_int("StreamBatcher", "bptt", bptt, 1)
    check_int("StreamBatcher", "min_len", min_len, 1)
    check_int("StreamBatcher", "seed", seed, 0)
    _check_id("StreamBatcher", "pad_id", pad_id)
    check_bool("StreamBatcher", "variable", variable)
    checks.check_number("StreamBatcher: p", p, "in [0, 1]",
                        lambda v: 0 <= v <= 1)
    checks.check_number("StreamBatcher: sigma", sigma, ">= 0",
                        lambda v: v >= 0)
    if pad_to is not None:
      check_int("StreamBatcher", "pad_to", pad_to, bptt)
    try:
      self.data, self.dropped = batchify(tokens, batch_size)
    except ValueError as e:
      raise ValueError(f"StreamBatcher: {e}") from e
    if self.dropped:
      logging.info("StreamBatcher: dropped the last %d of %d tokens that "
                   "do not fill a row of %d streams", self.dropped,
                   np.size(tokens), batch_size)
    self.batch_size, self.bptt, self.variable = batch_size, bptt, variable
    self.p, self.sigma, self.min_len = float(p), float(sigma), min_len
    self.seed, self.pad_to, self.pad_id = seed, pad_to, pad_id
    self.epoch, self._position, self._step = 0, 0, 0

  @property
  def num_tokens(self) -> int:
    return self.data.size + self.dropped

  def __len__(self) -> int:
    if self.variable:
      raise TypeError("StreamBatcher: the number of batches of an epoch is "
                      "random when variable=True")
    return math.ceil((self.data.shape[1] - 1) / self.bptt)

  def __iter__(self) -> "StreamBatcher":
    return self

  def __next__(self) -> StreamBatch:
    N, i = self.data.shape[1], self._position
    if i >= N - 1:  # epoch over: the next loop starts the next epoch
      self.epoch, self._position, self._step = self.epoch + 1, 0, 0
      raise StopIteration
    if self.variable:
      rng = np.random.default_rng((self.seed, self.epoch, self._step))
      drawn = awd_seq_len(rng, self.bptt, self.p, self.sigma, self.min_len)
      if self.pad_to is not None:
        drawn = min(drawn, self.pad_to)
      lr_scale = drawn / self.bptt
    else:
      drawn, lr_scale = self.bptt, 1.0
    seq_len = min(drawn, N - 1 - i)
    T = self.pad_to or seq_len
    inputs = np.full((self.batch_size, T), self.pad_id, np.int32)
    targets = np.full((self.batch_size, T), self.pad_id, np.int32)
    inputs[:, :seq_len] = self.data[:, i:i + seq_len]
    targets[:, :seq_len] = self.data[:, i + 1:i + 1 + seq_len]
    self._position, self._step = i + seq_len, self._step + 1
    return StreamBatch(inputs, targets,
                       np.full((self.batch_size,), seq_len, np.int32),
                       lr_scale)

  def _fingerprint(self) -> dict[str, int | float]:
    return {"num_tokens": self.num_tokens, "batch_size": self.batch_size,
            "bptt": self.bptt, "variable": int(self.variable),
            "p": self.p, "sigma": self.sigma, "min_len": self.min_len,
            "seed": self.seed, "pad_to": self.pad_to or 0,
            "pad_id": self.pad_id}

  def get_state(self) -> dict[str, int | float]:
    """Where the iterator stands, plus what it must be restored into."""
    return {"epoch": self.epoch, "position": self._position,
            "step": self._step, **self._fingerprint()}

  def set_state(self, state: dict[str, Any]) -> None:
    """Continues from `get_state()` of an iterator over the same data."""
    _restore_check("StreamBatcher", state, self._fingerprint(),
                   ("epoch", "position", "step"))
    if not 0 <= int(state["position"]) < self.data.shape[1]:
      raise ValueError(f"StreamBatcher.set_state: position "
                       f"{state['position']} outside the stream of "
                       f"{self.data.shape[1]} steps")
    self.epoch = int(state["epoch"])
    self._position, self._step = int(state["position"]), int(state["step"])


def _restore_check(cls: str, state: dict[str, Any],
                   fingerprint: dict[str, int | float],
                   keys: tuple[str, ...]):
  # A state without a key (e.g. from before it was fingerprinted) cannot be
  # checked, so it is refused.
  for key in keys + tuple(fingerprint):
    if key not in state:
      raise ValueError(f"{cls}.set_state: state lacks the key {key!r}")
  for key in keys:
    check_int(f"{cls}.set_state", key, state[key], 0)
  for key, value in fingerprint.items():
    if not np.array_equal(state[key], value):
      raise ValueError(
          f"{cls}.set_state: the state was saved with {key}={state[key]} "
          f"but this iterator has {key}={value}")


# ==================================================== padded / bucketed

def lm_pairs(sequences: Sequence[Any], bos: int | None = None
             ) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """Next-token pairs per sequence: inputs s[:-1], targets s[1:].

  With `bos`, each sequence is first prefixed by it, so its first token is
  predicted too (an `<eos>` id is a common choice: "after a line ends").
  """
  if bos is not None:
    _check_id("lm_pairs", "bos", bos)
  inputs, targets = [], []
  for n, s in enumerate(sequences):
    s = _as_ids("lm_pairs", f"sequence {n}", s)
    if bos is not None:
      s = np.concatenate([np.asarray([bos], np.int32), s])
    inputs.append(s[:-1])
    targets.append(s[1:])
  return inputs, targets


def cut_sentences(sequences: Sequence[Any], cutoff: int
                  ) -> tuple[list[np.ndarray], int]:
  """Keeps the first `cutoff` tokens of each sequence (training only).

  Renganathan & Singh 6.1: "during training we cut off sentences at 25
  characters (including whitespaces)" and train on these partial
  sentences; validation and test keep complete sentences. The cut is on
  the token sequence (spaces included), before `lm_pairs`.

  Returns:
    (the cut sequences, how many sequences were longer than `cutoff`).
  """
  check_int("cut_sentences", "cutoff", cutoff, 1)
  out = [_as_ids("cut_sentences", f"sequence {n}", s)
         for n, s in enumerate(sequences)]
  num_cut = sum(len(s) > cutoff for s in out)
  return [s[:cutoff] for s in out], num_cut


def cut_stream_sentences(ids: Any, eos_id: int, cutoff: int
                         ) -> tuple[np.ndarray, int]:
  """`cut_sentences` on a token stream whose sentences each end in eos_id.

  Every sentence keeps its first `cutoff` tokens and its end-of-sentence
  token, so the stream still marks where each (partial) sentence ends.
  Tokens after the last eos_id form a final sentence without one.

  Returns:
    (the cut stream, how many sentences were longer than `cutoff`).
  """
  check_int("cut_stream_sentences", "cutoff", cutoff, 1)
  docs = split_documents(ids, eos_id, "cut_stream_sentences")
  ended = [d.size > 0 and d[-1] == eos_id for d in docs]
  bodies = [d[:-1] if e else d for d, e in zip(docs, ended)]
  cut, num_cut = cut_sentences(bodies, cutoff)
  eos = np.asarray([eos_id], np.int32)
  out = [np.concatenate([c, eos]) if e else c for c, e in zip(cut, ended)]
  return np.concatenate(out).astype(np.int32), num_cut


def split_documents(ids: Any, eos_id: int, fn: str = "split_documents"
                    ) -> list[np.ndarray]:
  """A token stream cut after every `eos_id`: one array per line, each
  ending in its eos_id; tokens after the last eos_id (a stream cut short,
  e.g. a token prefix) form a final document without one. Concatenated,
  the documents are the stream again."""
  ids = _as_ids(fn, "ids", ids)
  _check_id(fn, "eos_id", eos_id)
  ends = np.flatnonzero(ids == eos_id)
  docs = np.split(ids, ends + 1)
  return docs if docs[-1].size or len(docs) == 1 else docs[:-1]


def length_boundaries(lengths: Any, num_buckets: int, multiple: int = 8
                      ) -> tuple[int, ...]:
  """Bucket boundaries at length quantiles, rounded up to `multiple`: the
  boundary at q = i / num_buckets is the sorted lengths' element at index
  ceil((n - 1) q) (NumPy's "higher" quantile), a length that occurs, with at
  least a fraction q of the sequences at or below it.

  The last boundary covers the longest sequence; duplicates are merged, so
  there may be fewer than `num_buckets` boundaries.
  """
  check_int("length_boundaries", "num_buckets", num_buckets, 1)
  check_int("length_boundaries", "multiple", multiple, 1)
  lengths = np.asarray(lengths)
  if lengths.size == 0:
    raise ValueError("length_boundaries: lengths is empty")
  q = np.quantile(lengths, np.arange(1, num_buckets + 1) / num_buckets,
                  method="higher")
  up = (np.maximum(q, 1) + multiple - 1) // multiple * multiple
  return tuple(sorted({int(b) for b in up}))


class SequenceBatch(NamedTuple):
  """B padded sequences; filler rows (to keep B static) have length 0."""
  inputs: np.ndarray   # [B, T] int32
  lengths: np.ndarray  # [B] int32
  targets: np.ndarray | None  # [B, T] per step, [B] per sequence, or None
  index: np.ndarray    # [B] int32: example number; -1 for filler rows


class SequenceBatcher:
  """Padded batches of variable-length id sequences, bucketed by length.

  Each epoch visits every example exactly once. Examples are grouped into
  buckets (the smallest boundary >= their length) and a batch holds one
  bucket's examples, padded to T = that boundary, so a jitted step sees
  one shape per bucket. Without boundaries, T is the batch's longest
  length rounded up to `multiple`. With `shuffle`, the examples of each
  bucket and the order of the batches are permuted by a generator seeded
  by (seed, epoch). With `fill`, a bucket's last, partial batch is filled
  up to B rows with filler rows (lengths 0, index -1), so B is static too.

  Args:
    inputs: 1-D int arrays, one per example (none empty).
    batch_size: B.
    targets: None; one array per example of the same length as its input
      (per-step targets, e.g. from `lm_pairs`); or one scalar per example
      (a label).
    boundaries: increasing bucket boundaries; an example longer than the
      last one is an error (cut it first, e.g. with `cut_sentences`).
    multiple: without boundaries, T is rounded up to a multiple of it.
    shuffle, seed: seeded shuffling per epoch.
    fill: fill partial batches up to B rows.
    pad_id: written in padded steps and filler rows.
  """

  def __init__(self, inputs: Sequence[Any], batch_size: int, *,
               targets: Sequence[Any] | None = None,
               boundaries: Sequence[int] | None = None, multiple: int = 1,
               shuffle: bool = True, seed: int = 0, fill: bool = True,
               pad_id: int = 0):
    fn = "SequenceBatcher"
    check_int(fn, "batch_size", batch_size, 1)
    check_int(fn, "multiple", multiple, 1)
    check_int(fn, "seed", seed, 0)
    _check_id(fn, "pad_id", pad_id)
    check_bool(fn, "shuffle", shuffle)
    check_bool(fn, "fill", fill)
    self.inputs = [_as_ids(fn, f"inputs[{n}]", s) for n, s in
                   enumerate(inputs)]
    if not self.inputs:
      raise ValueError(f"{fn}: inputs is empty (no examples)")
    self.lengths = np.asarray([len(s) for s in self.inputs], np.int64)
    if (self.lengths == 0).any():
      n = int(np.argmax(self.lengths == 0))
      raise ValueError(f"{fn}: inputs[{n}] is empty; filter empty "
                       f"examples out first")
    self.targets = self._check_targets(targets)
    if boundaries is not None:
      boundaries = tuple(boundaries)
      if multiple != 1:
        raise ValueError(f"{fn}: give boundaries or multiple, not both")
      for b in boundaries:
        check_int(fn, "boundaries", b, 1)
      if list(boundaries) != sorted(set(boundaries)) or not boundaries:
        raise ValueError(f"{fn}: boundaries must be strictly increasing "
                         f"and non-empty, got {boundaries}")
      if self.lengths.max() > boundaries[-1]:
        n = int(np.argmax(self.lengths))
        raise ValueError(f"{fn}: inputs[{n}] has length {self.lengths[n]} "
                         f"> the last boundary {boundaries[-1]}")
      self.bucket = np.searchsorted(np.asarray(boundaries), self.lengths)
    else:
      self.bucket = np.zeros(len(self.inputs), np.int64)
    self.batch_size, self.boundaries, self.multiple = (batch_size,
                                                       boundaries, multiple)
    self.shuffle, self.seed, self.fill, self.pad_id = (shuffle, seed, fill,
                                                       pad_id)
    self.epoch, self._batch, self._plan = 0, 0, None

  def _check_targets(self, targets):
    fn = "SequenceBatcher"
    if targets is None:
      return None
    if len(targets) != len(self.inputs):
      raise ValueError(f"{fn}: {len(targets)} targets for "
                       f"{len(self.inputs)} inputs")
    if all(np.ndim(t) == 0 for t in targets):
      return np.asarray(targets)
    out = []
    for n, t in enumerate(targets):
      t = np.asarray(t)
      if t.shape != self.inputs[n].shape:
        raise ValueError(f"{fn}: targets[{n}] has shape {t.shape}, "
                         f"inputs[{n}] {self.inputs[n].shape}; give one "
                         f"target per step or one scalar per example")
      out.append(t)
    return out

  def __len__(self) -> int:
    sizes = np.bincount(self.bucket)
    return int(sum(math.ceil(s / self.batch_size) for s in sizes))

  def _epoch_plan(self) -> list[np.ndarray]:
    """The batches (as example numbers) of the current epoch."""
    rng = np.random.default_rng((self.seed, self.epoch))
    batches = []
    for b in np.unique(self.bucket):
      members = np.flatnonzero(self.bucket == b)
      if self.shuffle:
        members = rng.permutation(members)
      batches += [members[k:k + self.batch_size]
                  for k in range(0, len(members), self.batch_size)]
    if self.shuffle:
      batches = [batches[k] for k in rng.permutation(len(batches))]
    return batches

  def __iter__(self) -> "SequenceBatcher":
    return self

  def __next__(self) -> SequenceBatch:
    if self._plan is None or self._plan[0] != self.epoch:
      self._plan = (self.epoch, self._epoch_plan())
    plan = self._plan[1]
    if self._batch >= len(plan):  # epoch over: the next loop starts the next
      self.epoch, self._batch = self.epoch + 1, 0
      raise StopIteration
    members = plan[self._batch]
    self._batch += 1
    return self._pad(members)

  def _pad(self, members: np.ndarray) -> SequenceBatch:
    lengths = self.lengths[members]
    if self.boundaries is not None:
      T = self.boundaries[self.bucket[members[0]]]
    else:
      T = -(-int(lengths.max()) // self.multiple) * self.multiple
    B = self.batch_size if self.fill else len(members)
    inputs = np.full((B, T), self.pad_id, np.int32)
    index = np.full((B,), -1, np.int32)
    index[:len(members)] = members
    for r, n in enumerate(members):
      inputs[r, :lengths[r]] = self.inputs[n]
    targets = None
    if isinstance(self.targets, np.ndarray):  # one label per example
      targets = np.full((B,), self.pad_id, self.targets.dtype)
      targets[:len(members)] = self.targets[members]
    elif self.targets is not None:
      targets = np.full((B, T), self.pad_id, self.targets[0].dtype)
      for r, n in enumerate(members):
        targets[r, :lengths[r]] = self.targets[n]
    all_lengths = np.zeros((B,), np.int32)
    all_lengths[:len(members)] = lengths
    return SequenceBatch(inputs, all_lengths, targets, index)

  def _fingerprint(self) -> dict[str, Any]:
    return {"num_examples": len(self.inputs), "batch_size": self.batch_size,
            "seed": self.seed, "shuffle": int(self.shuffle),
            "fill": int(self.fill), "boundaries": list(self.boundaries or ()),
            "multiple": self.multiple, "num_batches": len(self)}

  def get_state(self) -> dict[str, Any]:
    """Where the iterator stands, plus what it must be restored into."""
    return {"epoch": self.epoch, "batch": self._batch, **self._fingerprint()}

  def set_state(self, state: dict[str, Any]) -> None:
    """Continues from `get_state()` of an iterator over the same data."""
    _restore_check("SequenceBatcher", state, self._fingerprint(),
                   ("epoch", "batch"))
    if int(state["batch"]) > len(self):
      raise ValueError(f"SequenceBatcher.set_state: batch {state['batch']} "
                       f"beyond the {len(self)} batches of an epoch")
    self.epoch, self._batch = int(state["epoch"]), int(state["batch"])


# =============================================================== k-fold

class Fold(NamedTuple):
  """Sorted example numbers of one cross-validation fold."""
  train: np.ndarray
  valid: np.ndarray
  test: np.ndarray


def kfold(num_examples: int, k: int = 5, *, seed: int = 0,
          valid_fraction: float = 0.0) -> list[Fold]:
  """Deterministic k-fold cross-validation splits.

  A permutation seeded by `seed` is cut into k near-equal test folds; each
  fold trains on the rest, minus a seeded `valid_fraction` of it held out
  for validation. Maupome & Meurs 4 use k=5 (20% test) and train on 90% of
  the remaining lines (valid_fraction=0.1).
  """
  check_int("kfold", "k", k, 2)
  check_int("kfold", "num_examples", num_examples, k)
  check_int("kfold", "seed", seed, 0)
  checks.check_number("kfold: valid_fraction", valid_fraction, "in [0, 1)",
                      lambda v: 0 <= v < 1)
  perm = np.random.default_rng((seed, k)).permutation(num_examples)
  tests = np.array_split(perm, k)
  folds = []
  for f, test in enumerate(tests):
    rest = np.concatenate(tests[:f] + tests[f + 1:])
    rest = np.random.default_rng((seed, k, f)).permutation(rest)
    n_valid = int(round(valid_fraction * len(rest)))
    folds.append(Fold(np.sort(rest[n_valid:]), np.sort(rest[:n_valid]),
                      np.sort(test)))
  return folds
