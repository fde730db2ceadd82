"""The Dyck-2 PCFG of Suzgun et al. (2019), as used by Mahto et al. (A.10):

    S -> ( S )  w.p. p1
       | [ S ]  w.p. p2
       | S S    w.p. q
       | eps    w.p. 1 - (p1 + p2 + q)

with 0 < p1, p2, q < 1 and p1 + p2 + q < 1; p1 = p2 = q = 0.25 by default
(Mahto 3.1.2). `DyckPCFG(p=(p_1, ..., p_k), q)` is the same grammar with k
bracket types. Vocabulary: ids 0..k-1 open brackets, k..2k-1 their closing
brackets in the same order; sequences carry no START or END token.

Length is the number of brackets, bounds inclusive. `sample` is exact
rejection sampling from the grammar conditioned on min_length <= length <=
max_length: a derivation is abandoned (and redrawn from S) as soon as its
yield would exceed max_length. (Suzgun's generator instead cuts a derivation
at the limit and keeps the truncated string, which biases the distribution.)
With `unique=True` every returned sequence is distinct (and not in
`exclude`), Suzgun's "distinct sequences".

Targets (Suzgun's next-symbol prediction, Mahto's task): after reading
seq[:t+1], the set of admissible next symbols: every open bracket, the
closing bracket of the innermost unclosed bracket if any, and END (column
2k, not a token) exactly when every bracket is closed. So the last row of a
complete sequence is "any open or END" and its closing part is all zero.
`closing_targets` keeps the k closing columns, Mahto's 2-unit sigmoid output.

Timescales (Mahto 3.1.2): for every matched pair, the closing position minus
the opening position ("([])" has 3 and 1); a sequence's maximum timescale is
the largest (0 for the empty sequence).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable

import numpy as np

from sorjax import checks
from sorjax.data.checks import check_bool, check_fits, check_int
from sorjax.data.dyck import (SplitSpec, _symbols, bracket_pairs, check_ids,
                              check_length_bounds, check_seed,
                              preset_and_seeds)

_S = -1                      # the nonterminal on the derivation stack


@dataclasses.dataclass(frozen=True)
class DyckPCFG:
  """Dyck-k PCFG; p[i] = P(S -> open_i S close_i), q = P(S -> S S)."""
  p: tuple[float, ...] = (0.25, 0.25)
  q: float = 0.25

  def __post_init__(self):
    try:
      p = tuple(float(x) for x in np.asarray(self.p, float).reshape(-1))
    except (TypeError, ValueError):
      raise ValueError(f"DyckPCFG: p must be a sequence of probabilities, "
                       f"got {self.p!r}") from None
    object.__setattr__(self, "p", p)
    if not p:
      raise ValueError("DyckPCFG: p needs one probability per bracket type")
    for i, x in enumerate(p):
      if not 0 < x < 1:
        raise ValueError(f"DyckPCFG: p[{i}] must be in (0, 1), got {x}")
    checks.check_number("DyckPCFG: q", self.q, "in (0, 1)",
                        lambda v: 0 < v < 1)
    object.__setattr__(self, "q", float(self.q))
    if sum(p) + self.q >= 1:
      raise ValueError(f"DyckPCFG: sum(p) + q must be < 1 (eps needs "
                       f"probability > 0), got {sum(p) + self.q}")

  @property
  def k(self) -> int:
    return len(self.p)

  @property
  def eps(self) -> float:
    return 1.0 - sum(self.p) - self.q

  @property
  def vocab_size(self) -> int:
    return 2 * self.k

  @property
  def end_target(self) -> int:
    """The targets' END column ("the sequence may end here")."""
    return 2 * self.k

  @property
  def vocab(self) -> tuple[str, ...]:
    opens, closes = _symbols(self.k)
    return (*opens, *closes)

  def decode(self, seq) -> str:
    """Ids to text `encode` reads back: symbols joined by spaces if k > 4
    (multi-character symbols), else by nothing."""
    sep = " " if self.k > 4 else ""
    return sep.join(self.vocab[t] for t in check_ids(f"{self}.decode", seq,
                                                      len(self.vocab)))

  def encode(self, text: str) -> np.ndarray:
    """Bracket symbols to ids: a string of one-character symbols if k <= 4
    (whitespace ignored), else whitespace-separated symbols ("(3 3)")."""
    index = {s: i for i, s in enumerate(self.vocab)}
    symbols = text.split() if self.k > 4 else [c for c in text
                                               if not c.isspace()]
    ids = []
    for j, s in enumerate(symbols):
      if s not in index:
        raise ValueError(f"{self}: unknown symbol {s!r} at position {j}")
      ids.append(index[s])
    return np.asarray(ids, np.int32)

  # -------------------------------------------------------------- sampling

  def num_sequences(self, min_length: int, max_length: int) -> int:
    """How many distinct words have a length in the bounds: sum over even
    lengths 2n of k^n Catalan(n)."""
    return sum(self.k ** (L // 2) * math.comb(L, L // 2) // (L // 2 + 1)
               for L in range(min_length, max_length + 1) if L % 2 == 0)

  def sample(self, num: int, min_length: int, max_length: int,
             seed: int = 0, unique: bool = False,
             exclude: Iterable[tuple[int, ...]] = ()) -> list[np.ndarray]:
    """`num` int32 sequences with min_length <= #brackets <= max_length,
    drawn from the grammar conditioned on those bounds. `unique`: no two
    equal and none in `exclude` (id sequences, e.g. earlier samples; only
    with unique=True)."""
    owner = f"{self}.sample"
    num = check_int(owner, "num", num, 0)
    check_length_bounds(owner, min_length, max_length)
    check_fits(owner, "num", num, 120 + 4 * min_length)   # arrays of int32
    check_bool(owner, "unique", unique)
    rng = np.random.default_rng(check_seed(owner, seed))
    seen: set[tuple[int, ...]] = set()
    for i, s in enumerate(exclude):
      arr = np.asarray(s)
      if arr.ndim != 1 or arr.size and not np.issubdtype(arr.dtype,
                                                         np.integer):
        raise ValueError(f"{owner}: exclude[{i}] must be a 1-D sequence of "
                         f"ids, got {s!r}")
      seen.add(tuple(arr.tolist()))
    if seen and not unique:
      raise ValueError(f"{owner}: exclude is only honoured with "
                       "unique=True, got unique=False")
    if unique:                             # excluded words that could occur
      room = self.num_sequences(min_length, max_length) - sum(
          min_length <= len(s) <= max_length and self._is_word(s)
          for s in seen)
      if num > room:
        raise ValueError(
            f"{owner}: asked for num={num} distinct sequences but only "
            f"{room} exist with lengths in [{min_length}, {max_length}] "
            "(after `exclude`)")
    cum = np.cumsum([*self.p, self.q])
    k = self.k
    out: list[np.ndarray] = []
    rules, j = [], 0                       # rule draws, a block at a time
    attempts, limit = 0, 10_000 * num + 100_000
    while len(out) < num:
      attempts += 1
      if attempts > limit:
        raise RuntimeError(
            f"{owner}: {limit} draws gave only {len(out)} of {num} "
            f"sequences in [{min_length}, {max_length}]; widen the bounds "
            "or ask for fewer")
      word, stack, size = [], [_S], 0      # size: brackets emitted or owed
      while stack and size <= max_length:
        sym = stack.pop()
        if sym != _S:
          word.append(sym)
          continue
        if j == len(rules):
          rules = np.searchsorted(cum, rng.random(8192), "right").tolist()
          j = 0
        rule = rules[j]
        j += 1
        if rule < k:                        # S -> open_rule S close_rule
          stack += [k + rule, _S, rule]
          size += 2
        elif rule == k:                     # S -> S S
          stack += [_S, _S]
      if stack or not min_length <= size <= max_length:
        continue                            # abandoned, or too short
      key = tuple(word)
      if unique:
        if key in seen:
          continue
        seen.add(key)
      out.append(np.asarray(word, np.int32))
    return out

  # -------------------------------------------------------------- analysis

  def _pairs(self, seq, complete: bool):
    owner = f"{self}"
    seq = np.asarray(seq)
    if seq.ndim != 1 or not (np.issubdtype(seq.dtype, np.integer)
                             or seq.size == 0):
      raise ValueError(f"{owner}: a sequence must be a 1-D int array, got "
                       f"shape {seq.shape} dtype {seq.dtype}")
    seq = seq.astype(np.int64)
    bad = np.flatnonzero((seq < 0) | (seq >= self.vocab_size))
    if bad.size:
      raise ValueError(f"{owner}: token {seq[bad[0]]} at position {bad[0]} "
                       f"is not in the vocabulary 0..{self.vocab_size - 1}")
    opens, closes, depth = bracket_pairs(seq < self.k, owner)
    wrong = np.flatnonzero(seq[closes] - self.k != seq[opens])
    if wrong.size:
      o, c = opens[wrong[0]], closes[wrong[0]]
      raise ValueError(f"{owner}: {self.vocab[seq[c]]} at position {c} "
                       f"does not close {self.vocab[seq[o]]} at position {o}")
    if complete and depth.size and depth[-1]:
      raise ValueError(f"{owner}: the sequence leaves {depth[-1]} brackets "
                       "unclosed")
    return seq, opens, closes, depth

  def _is_word(self, seq) -> bool:
    """Whether `seq` is a complete word of the grammar."""
    try:
      self._pairs(np.asarray(seq, np.int64), complete=True)
    except ValueError:
      return False
    return True

  def targets(self, seq) -> np.ndarray:
    """bool [len(seq), 2k+1]: row t = admissible symbols after seq[:t+1]
    (all opens; the innermost unclosed bracket's close; END iff none is
    unclosed). `seq` may be a prefix."""
    seq, opens, closes, depth = self._pairs(seq, complete=False)
    k, T = self.k, seq.size
    out = np.zeros((T, 2 * k + 1), bool)
    out[:, :k] = True
    out[:, self.end_target] = depth == 0
    # The innermost unclosed open after t: the latest open at level depth[t].
    is_open = seq < k
    pos = np.arange(T)
    for level in np.unique(depth[depth > 0]):
      latest = np.maximum.accumulate(
          np.where(is_open & (depth == level), pos, -1))
      t = np.flatnonzero(depth == level)
      out[t, k + seq[latest[t]]] = True
    return out

  def closing_targets(self, seq) -> np.ndarray:
    """bool [len(seq), k]: which closing bracket may come next (Mahto)."""
    return self.targets(seq)[:, self.k:2 * self.k]

  def timescales(self, seq) -> np.ndarray:
    """Closing minus opening position of every pair, in closing order."""
    _, opens, closes, _ = self._pairs(seq, complete=True)
    order = np.argsort(closes)
    return (closes - opens)[order]

  def max_timescale(self, seq) -> int:
    ts = self.timescales(seq)
    return int(ts.max()) if ts.size else 0


# ---------------------------------------------------------------- presets

@dataclasses.dataclass(frozen=True)
class PCFGPreset:
  grammar: DyckPCFG
  splits: tuple[tuple[str, SplitSpec], ...]
  unique: bool                # distinct sequences within and across splits


PRESETS: dict[str, PCFGPreset] = {
    # Mahto et al. 3.1.2: at most 200 brackets, 10k/2k/5k; min 2 (ours: no
    # empty sequence); samples drawn independently (no dedup stated).
    "mahto": PCFGPreset(DyckPCFG(), (
        ("train", SplitSpec(10_000, 2, 200)),
        ("dev", SplitSpec(2_000, 2, 200)),
        ("test", SplitSpec(5_000, 2, 200))), unique=False),
    # Suzgun et al. 2019: 10k distinct of length 2-50, 5k distinct 52-100.
    "suzgun": PCFGPreset(DyckPCFG(), (
        ("train", SplitSpec(10_000, 2, 50)),
        ("test", SplitSpec(5_000, 52, 100))), unique=True),
}


def make_splits(preset: str | PCFGPreset, seed: int = 0,
                scale: float = 1.0, unique: bool | None = None
                ) -> dict[str, list[np.ndarray]]:
  """Samples every split of a preset, each from a seed derived from `seed`.
  `unique` (default: the preset's) dedups within and across splits, in
  split order; `scale` shrinks the counts."""
  preset, seeds = preset_and_seeds(PRESETS, preset, seed, scale)
  unique = preset.unique if unique is None else unique
  out: dict[str, list[np.ndarray]] = {}
  seen: set[tuple[int, ...]] = set()
  for name, spec in preset.splits:
    out[name] = preset.grammar.sample(
        max(1, round(spec.num * scale)), spec.min_length, spec.max_length,
        seeds[name], unique=unique, exclude=seen)
    if unique:
      seen.update(tuple(s.tolist()) for s in out[name])
  return out
