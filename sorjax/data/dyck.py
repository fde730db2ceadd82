"""Dyck-(k, m): bounded Dyck languages with an exact next-token oracle.

The probabilistic automaton of Hewitt et al. (2020) (`DyckPDFA` in
john-hewitt/dyckkm-learning, generate_mbounded_dyck.py), which made the
m-bounded Dyck-2 data of Lin et al. 4.1 and Renganathan & Singh 4.2. With d
the number of unclosed brackets (the stack depth):

    d = 0        END w.p. 1/2, each of the k open brackets w.p. 1/(2k)
    0 < d < m    close the top bracket w.p. 1/2, each open w.p. 1/(2k)
    d = m        close the top bracket w.p. 1

Vocabulary: ids 0..k-1 open brackets, k..2k-1 their closing brackets in the
same order, 2k START, 2k+1 END. A sample is START, the brackets, END.

Length counts the brackets only (START and END excluded), so it is always
even; bounds are inclusive: min_length <= length <= max_length. (Hewitt's
files count END too: his bound L allows at most L - 1 brackets.)

Sampling follows Hewitt: an END drawn before min_length brackets is redrawn
(so at d = 0 the next bracket is an open, each w.p. 1/k), and a sample
longer than max_length is rejected whole. `DyckKM.oracle` is exact for this
process: given the bounds it conditions the automaton on the sample being
accepted, P(a | s) = P(a | s) Q(s') / Q(s) with Q(d, n) the probability that
from depth d after n brackets the sample ends within max_length (a backward
recursion over (d, n)); without bounds it is the automaton itself.

Defaults follow Hewitt's experiments: train and dev lengths 1..L and test
lengths L+1..2L (length generalisation), L = 8m(m-2)+60. `PRESETS` holds the
setting of Lin et al. 4.1 (k=2, m in {4, 6, 8}; 10k train, 4k dev, 10k test;
their data came from Hewitt). Samples are not deduplicated, as in Hewitt.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Iterable, NamedTuple, Sequence

import numpy as np

from sorjax.data.checks import check_fits, check_int, check_scale

SPLITS = ("train", "dev", "test")
_BRACKETS = (("(", ")"), ("[", "]"), ("{", "}"), ("<", ">"))


# ---------------------------------------------------------------- checks

def check_seed(owner: str, seed) -> int:
  return check_int(owner, "seed", seed, 0)


def check_length_bounds(owner: str, min_length, max_length) -> None:
  """Inclusive bounds on a bracket count; some even length must fit."""
  check_int(owner, "min_length", min_length, 0)
  check_int(owner, "max_length", max_length, 0)
  if min_length > max_length:
    raise ValueError(f"{owner}: min_length={min_length} > "
                     f"max_length={max_length}")
  if min_length == max_length and min_length % 2:
    raise ValueError(
        f"{owner}: no bracket sequence has a length in [min_length, "
        f"max_length] = [{min_length}, {max_length}]: lengths are even")


def check_ids(owner: str, seq, size: int) -> list[int]:
  """The ids of `seq` (any shape) as ints; a ValueError naming the first id
  outside [0, size), or a non-integer dtype."""
  arr = np.asarray(seq)
  if arr.size and not np.issubdtype(arr.dtype, np.integer):
    raise ValueError(f"{owner}: ids must be integers, got {arr.dtype} "
                     f"{arr.reshape(-1)[:5].tolist()}")
  ids = arr.reshape(-1).tolist()
  for j, i in enumerate(ids):
    if not 0 <= i < size:
      raise ValueError(f"{owner}: id {i} at position {j} is outside "
                       f"[0, {size})")
  return ids


def split_seeds(seed: int, names: Sequence[str]) -> dict[str, int]:
  """An independent, reproducible int seed per split name."""
  children = np.random.SeedSequence(seed).spawn(len(names))
  return {n: int(c.generate_state(1)[0]) for n, c in zip(names, children)}


def preset_and_seeds(presets: dict, preset, seed, scale: float):
  """What a `make_splits` starts from: the preset (`preset` itself, or
  the one `presets` names) and a seed per split (`split_seeds` of `seed`);
  a ValueError for an unknown name, a bad seed or a scale outside (0, 1]."""
  if isinstance(preset, str):
    if preset not in presets:
      raise ValueError(f"make_splits: unknown preset {preset!r}; "
                       f"known: {sorted(presets)}")
    preset = presets[preset]
  check_scale("make_splits", scale)
  return preset, split_seeds(check_seed("make_splits", seed),
                             [s for s, _ in preset.splits])


# ---------------------------------------------------------------- brackets

def bracket_pairs(is_open: np.ndarray, owner: str = "brackets",
                  offset: int = 0) -> tuple[np.ndarray, np.ndarray,
                                             np.ndarray]:
  """Matches brackets given a boolean open/close mask, without a Python loop.

  Returns (opens, closes, depth): positions of the matched pairs, sorted by
  closing position's level then position, and the depth after each bracket.
  An open bracket at level d raises the depth from d-1 to d and its closing
  bracket lowers it from d to d-1; while the depth stays >= 0 the events of
  one level alternate open, close, open, ..., so sorting by (level,
  position) puts every closing bracket right after its opening bracket.
  Raises a ValueError (position + offset) for a close without an open.
  """
  is_open = np.asarray(is_open, bool)
  depth = np.cumsum(np.where(is_open, 1, -1))
  if depth.size and depth.min() < 0:
    p = int(np.argmax(depth < 0))
    raise ValueError(f"{owner}: closing bracket at position {p + offset} "
                     "has no open bracket")
  level = np.where(is_open, depth, depth + 1)
  order = np.lexsort((np.arange(is_open.size), level))
  j = np.flatnonzero(~is_open[order])
  return order[j - 1], order[j], depth


def _symbols(k: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
  if k <= len(_BRACKETS):
    return (tuple(o for o, _ in _BRACKETS[:k]),
            tuple(c for _, c in _BRACKETS[:k]))
  return (tuple(f"({i}" for i in range(k)), tuple(f"{i})" for i in range(k)))


# ---------------------------------------------------------------- oracle

class OracleScore(NamedTuple):
  """The oracle's per-token loss on a split: the best any model can do."""
  cross_entropy: float   # nats per predicted token
  bits_per_token: float
  perplexity: float      # exp(cross_entropy)
  num_tokens: int        # predicted tokens: everything after START


@functools.lru_cache(maxsize=64)
def _acceptance(m: int, min_length: int, max_length: int) -> np.ndarray:
  """Q[d, n]: P(the sample ends with <= max_length brackets | depth d, n).

  Q[:, max_length + 1] = 0 and Q[m + 1, :] = 0 (never reached); the
  recursion follows the automaton, with END (and its redraw before
  min_length) only at d = 0.
  """
  Q = np.zeros((m + 2, max_length + 2))
  for n in range(max_length, -1, -1):
    nxt = Q[:, n + 1]
    can_end = n >= min_length
    Q[0, n] = 0.5 * can_end + (0.5 if can_end else 1.0) * nxt[1]
    Q[1:m, n] = 0.5 * nxt[2:m + 1] + 0.5 * nxt[0:m - 1]
    Q[m, n] = nxt[m - 1]
  Q.setflags(write=False)
  return Q


@dataclasses.dataclass(frozen=True)
class DyckKM:
  """Dyck-(k, m): k bracket types, at most m unclosed brackets.

      lang = DyckKM(k=2, m=4)
      train = lang.sample(10_000, 1, lang.max_train_length, seed=0)
      probs = lang.oracle(train[0], 1, lang.max_train_length)
      best = lang.oracle_score(train, 1, lang.max_train_length).perplexity
  """
  k: int
  m: int

  def __post_init__(self):
    check_int("DyckKM", "k", self.k, 1)
    check_int("DyckKM", "m", self.m, 1)

  # -------------------------------------------------------------- vocabulary

  @property
  def vocab_size(self) -> int:
    return 2 * self.k + 2

  @property
  def start(self) -> int:
    return 2 * self.k

  @property
  def end(self) -> int:
    return 2 * self.k + 1

  @property
  def vocab(self) -> tuple[str, ...]:
    """Printable symbol of each id: opens, closes, "START", "END"."""
    opens, closes = _symbols(self.k)
    return (*opens, *closes, "START", "END")

  def decode(self, seq) -> str:
    vocab = self.vocab
    return " ".join(vocab[t] for t in check_ids(f"{self}.decode", seq,
                                                 len(vocab)))

  def encode(self, text: str) -> np.ndarray:
    """Whitespace-separated symbols (as `vocab`) to an int32 id array."""
    index = {s: i for i, s in enumerate(self.vocab)}
    ids = []
    for j, s in enumerate(text.split()):
      if s not in index:
        raise ValueError(f"{self}: unknown symbol {s!r} at position {j}; "
                         f"symbols are {self.vocab}")
      ids.append(index[s])
    return np.asarray(ids, np.int32)

  # -------------------------------------------------------------- lengths

  @property
  def max_train_length(self) -> int:
    """L = 8m(m-2)+60, Hewitt's train/dev bound; test lengths are L+1..2L."""
    return 8 * self.m * (self.m - 2) + 60

  def default_lengths(self) -> dict[str, tuple[int, int]]:
    L = self.max_train_length
    return {"train": (1, L), "dev": (1, L), "test": (L + 1, 2 * L)}

  # -------------------------------------------------------------- sampling

  def sample(self, num: int, min_length: int = 1,
             max_length: int | None = None, seed: int = 0
             ) -> list[np.ndarray]:
    """`num` int32 samples START ... END with min_length <= #brackets <=
    max_length (inclusive; max_length defaults to `max_train_length`)."""
    owner = f"{self}.sample"
    num = check_int(owner, "num", num, 0)
    if max_length is None:
      max_length = self.max_train_length
    check_length_bounds(owner, min_length, max_length)
    # each sample an array of >= min_length + 2 int32s (~120 bytes apart)
    check_fits(owner, "num", num, 120 + 4 * (min_length + 2))
    rng = np.random.default_rng(check_seed(owner, seed))
    out: list[np.ndarray] = []
    while len(out) < num:
      batch = min(4096, max(64, 2 * (num - len(out))))
      for moves in self._walks(rng, batch, min_length, max_length):
        if len(out) == num:
          break
        out.append(self._typed(moves, rng))
    return out

  def _walks(self, rng, batch, min_length, max_length):
    """Accepted depth walks (+1 open, -1 close) of `batch` automaton runs,
    all run at once; the bracket types are drawn afterwards (they do not
    change the depth walk)."""
    m = self.m
    depth = np.zeros(batch, np.int64)
    live = np.ones(batch, bool)
    ended = np.zeros(batch, bool)
    length = np.zeros(batch, np.int64)
    moves = np.zeros((batch, max_length), np.int8)
    for n in range(max_length + 1):       # n brackets so far on live runs
      if not live.any():
        break
      u = rng.random(batch)
      at0, full = depth == 0, depth == m
      end = live & at0 & (n >= min_length) & (u < 0.5)
      # d = 0: open unless END; 0 < d < m: open w.p. 1/2; d = m: close.
      up = live & ~end & ~full & (at0 | (u < 0.5))
      down = live & ~end & ~up
      ended |= end
      length[end] = n
      live &= ~end
      if n == max_length:                 # one more bracket: too long
        break
      moves[up, n], moves[down, n] = 1, -1
      depth += up.astype(np.int64) - down
    return [moves[i, :length[i]] for i in np.flatnonzero(ended)]

  def _typed(self, moves, rng) -> np.ndarray:
    is_open = moves > 0
    opens, closes, _ = bracket_pairs(is_open)
    body = np.empty(moves.size, np.int32)
    body[is_open] = rng.integers(self.k, size=int(is_open.sum()))
    body[closes] = self.k + body[opens]   # a close repeats its open's type
    return np.concatenate([[self.start], body, [self.end]]).astype(np.int32)

  # -------------------------------------------------------------- analysis

  def _parse(self, seq) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Validates START, brackets[, END]; returns (body, opens, closes,
    complete), positions in `body` (seq position - 1)."""
    owner = f"{self}"
    seq = np.asarray(seq)
    if seq.ndim != 1 or seq.size < 1 or not np.issubdtype(seq.dtype,
                                                          np.integer):
      raise ValueError(f"{owner}: a sequence must be a non-empty 1-D int "
                       f"array, got shape {seq.shape} dtype {seq.dtype}")
    bad = np.flatnonzero((seq < 0) | (seq >= self.vocab_size))
    if bad.size:
      raise ValueError(f"{owner}: token {int(seq[bad[0]])} at position "
                       f"{bad[0]} is not in the vocabulary "
                       f"0..{self.vocab_size - 1}")
    if seq[0] != self.start:
      raise ValueError(f"{owner}: a sequence must start with START "
                       f"({self.start}), got {int(seq[0])} at position 0")
    complete = bool(seq[-1] == self.end) and seq.size > 1
    body = seq[1:-1] if complete else seq[1:]
    bad = np.flatnonzero(body >= 2 * self.k)
    if bad.size:
      raise ValueError(f"{owner}: {self.vocab[int(body[bad[0]])]} at "
                       f"position {bad[0] + 1} (only brackets may follow "
                       "START, and END only at the end)")
    is_open = body < self.k
    opens, closes, depth = bracket_pairs(is_open, owner, offset=1)
    deep = np.flatnonzero(depth > self.m)
    if deep.size:
      raise ValueError(f"{owner}: open bracket at position {deep[0] + 1} "
                       f"makes {self.m + 1} unclosed brackets > m={self.m}")
    wrong = np.flatnonzero(body[closes] - self.k != body[opens])
    if wrong.size:
      o, c = opens[wrong[0]], closes[wrong[0]]
      raise ValueError(f"{owner}: {self.vocab[int(body[c])]} at position "
                       f"{c + 1} does not close {self.vocab[int(body[o])]} "
                       f"at position {o + 1}")
    if complete and depth.size and depth[-1] != 0:
      raise ValueError(f"{owner}: END at position {seq.size - 1} with "
                       f"{int(depth[-1])} unclosed brackets")
    return body, opens, closes, complete

  def closing_distances(self, seq) -> np.ndarray:
    """Per position of `seq`: for a closing bracket, its position minus its
    opening bracket's position (>= 1); 0 for every other token."""
    seq = np.asarray(seq)
    _, opens, closes, _ = self._parse(seq)
    out = np.zeros(seq.shape, np.int64)
    out[closes + 1] = closes - opens
    return out

  def _next_probs(self, owner, seq, min_length, max_length):
    """Validates; returns (body, d, p_open, p_close, p_end): the depth d
    after n = 0..len(seq)-2 brackets and the probability of each open
    bracket, of closing the top and of END in that state."""
    body, _, _, complete = self._parse(seq)
    k, m = self.k, self.m
    if min_length is None:                 # with max_length: sample's default
      min_length = 0 if max_length is None else 1
    if max_length is not None:
      check_length_bounds(owner, min_length, max_length)
      if body.size > max_length:
        raise ValueError(f"{owner}: the sequence has {body.size} brackets "
                         f"> max_length={max_length}")
    else:
      check_int(owner, "min_length", min_length, 0)
    if complete and body.size < min_length:
      raise ValueError(f"{owner}: the sequence has {body.size} brackets "
                       f"< min_length={min_length}")
    rows = seq.size - 1                    # states after n = 0..rows-1
    n = np.arange(rows)
    d = np.concatenate([[0], np.cumsum(np.where(body < k, 1, -1))])[:rows]
    # The automaton, END redrawn before min_length.
    can_end = n >= min_length
    p_end = np.where((d == 0) & can_end, 0.5, 0.0)
    p_open = np.where(d == 0, np.where(can_end, 0.5, 1.0),
                      np.where(d < m, 0.5, 0.0)) / k
    p_close = np.where(d == 0, 0.0, np.where(d < m, 0.5, 1.0))
    if max_length is not None:             # conditioned on acceptance
      Q = _acceptance(m, min_length, max_length)
      here = Q[d, n]
      if np.any(here <= 0):
        t = int(np.argmax(here <= 0))
        raise ValueError(f"{owner}: after position {t} (depth {d[t]}) no "
                         f"sample within max_length={max_length} can "
                         "follow")
      p_open = p_open * Q[d + 1, n + 1] / here
      p_close = p_close * Q[np.maximum(d - 1, 0), n + 1] / here
      p_end = p_end / here
    return body, d, p_open, p_close, p_end

  def oracle(self, seq, min_length: int | None = None,
             max_length: int | None = None) -> np.ndarray:
    """Exact next-token probabilities, float64 [len(seq) - 1, vocab_size].

    Row t is the distribution of seq[t+1] given seq[:t+1]. `seq` is a
    sample (START ... END) or a prefix (START ...). Without bounds: the
    automaton. With bounds (those `sample` was called with): the sampling
    process, i.e. the automaton with END redrawn before min_length and
    conditioned on at most max_length brackets. As in `sample`, min_length
    defaults to 1 when max_length is given (to 0 without bounds).
    """
    seq = np.asarray(seq)
    body, d, p_open, p_close, p_end = self._next_probs(
        f"{self}.oracle", seq, min_length, max_length)
    k, rows = self.k, d.size
    # Top of the stack after n brackets: the latest open at level d.
    is_open = body < k
    level_after = np.cumsum(np.where(is_open, 1, -1))
    top = np.full(rows, -1)
    pos = np.arange(body.size)
    for level in range(1, self.m + 1):
      latest = np.maximum.accumulate(
          np.where(is_open & (level_after == level), pos, -1))
      sel = d[1:] == level
      top[1:][sel] = latest[:rows - 1][sel]
    probs = np.zeros((rows, self.vocab_size))
    probs[:, :k] = p_open[:, None]
    n = np.flatnonzero(d > 0)
    probs[n, k + body[top[n]]] = p_close[n]
    probs[:, self.end] = p_end
    return probs

  def oracle_score(self, seqs: Iterable, min_length: int | None = None,
                   max_length: int | None = None) -> OracleScore:
    """The oracle's cross-entropy and perplexity over a whole split, every
    token after START predicted (END included); reported beside every Dyck
    result as the best achievable. Pass the split's bounds for the exact
    sampling process, none for the automaton (defaults as in `oracle`)."""
    owner = f"{self}.oracle_score"
    nll, count = 0.0, 0
    for i, seq in enumerate(seqs):
      seq = np.asarray(seq)
      try:
        _, _, p_open, p_close, p_end = self._next_probs(
            owner, seq, min_length, max_length)
      except ValueError as e:
        raise ValueError(f"sequence {i}: {e}") from None
      nxt = seq[1:]                        # validated: the close is legal
      p = np.where(nxt < self.k, p_open,
                   np.where(nxt == self.end, p_end, p_close))
      if np.any(p <= 0):
        t = int(np.argmax(p <= 0)) + 1
        raise ValueError(f"{owner}: sequence {i} has token "
                         f"{self.vocab[int(seq[t])]} of probability 0 at "
                         f"position {t}")
      nll -= float(np.sum(np.log(p)))
      count += nxt.size
    if count == 0:
      raise ValueError(f"{owner}: no tokens to score")
    ce = nll / count
    return OracleScore(ce, ce / math.log(2), math.exp(ce), count)


# ---------------------------------------------------------------- splits

@dataclasses.dataclass(frozen=True)
class SplitSpec:
  """One split: how many samples (>= 1), inclusive bracket-count bounds."""
  num: int
  min_length: int
  max_length: int

  def __post_init__(self):
    # make_splits keeps >= 1 sample of a scaled split: num 0 would give 1
    check_int("SplitSpec", "num", self.num, 1)
    check_length_bounds("SplitSpec", self.min_length, self.max_length)


@dataclasses.dataclass(frozen=True)
class DyckPreset:
  language: DyckKM
  splits: tuple[tuple[str, SplitSpec], ...]


def hewitt_splits(language: DyckKM, num_train: int, num_dev: int,
                  num_test: int) -> tuple[tuple[str, SplitSpec], ...]:
  """Hewitt's lengths: train/dev 1..L, test L+1..2L."""
  bounds = language.default_lengths()
  nums = {"train": num_train, "dev": num_dev, "test": num_test}
  return tuple((s, SplitSpec(nums[s], *bounds[s])) for s in SPLITS)


PRESETS: dict[str, DyckPreset] = {
    f"lin_m{m}": DyckPreset(DyckKM(2, m),
                            hewitt_splits(DyckKM(2, m), 10_000, 4_000, 10_000))
    for m in (4, 6, 8)
}


def make_splits(preset: str | DyckPreset, seed: int = 0,
                scale: float = 1.0) -> dict[str, list[np.ndarray]]:
  """Samples every split of a preset (a name in PRESETS or a DyckPreset),
  each from its own seed derived from `seed`; `scale` shrinks the counts
  (e.g. for a smoke run)."""
  preset, seeds = preset_and_seeds(PRESETS, preset, seed, scale)
  return {s: preset.language.sample(max(1, round(spec.num * scale)),
                                    spec.min_length, spec.max_length,
                                    seeds[s])
          for s, spec in preset.splits}
