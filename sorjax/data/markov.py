"""The Markov control corpus of Mahto et al. 3.1.1 ("Markov-PTB").

"Using the empirical bigram probabilities from PTB, we sampled tokens
sequentially until a new corpus of the same size had been generated."
`markov_corpus(tokens, seed)` does that for any token stream (a 1-D array
of ids >= 0, e.g. those of ptb.train.txt with an <eos> after every line;
sparse ids are relabelled densely inside, which changes no draw):

    P(next = b | current = a) = count(a b) / count(a *)

Drawing the next token is drawing a uniformly random occurrence of the
current token in the source and copying its successor.

The end of the source is explicit:
- wrap=True (default): the source is read as a cycle, so its last token is
  followed by its first. Every token then has a successor (no dead end), the
  only bigram not in the source is (last, first), and the source's unigram
  frequencies are the stationary distribution of the chain (in a cycle each
  token is entered as often as it is left). The first token is drawn from
  them, so the resampled corpus keeps the source's unigram frequencies in
  expectation.
- wrap=False: only bigrams inside the source. A token with no successor (the
  last token, when it occurs nowhere else) is a dead end; transitions into
  dead ends are removed, repeatedly, and the rest renormalised, so every
  bigram of the output occurs in the source. The first token is drawn from
  the remaining bigrams' first tokens. If nothing remains (no token ever
  repeats in a way that lets the chain continue), a ValueError says so.
"""

from __future__ import annotations

import numpy as np

from sorjax.data.checks import check_bool, check_fits, check_int

_MAX_TABLE = 2 ** 24        # bigram_successors' tables are indexed by id


def _check_tokens(tokens) -> np.ndarray:
  x = np.asarray(tokens)
  if x.ndim != 1 or not np.issubdtype(x.dtype, np.integer):
    raise ValueError(f"markov_corpus: tokens must be a 1-D int array, got "
                     f"shape {x.shape} dtype {x.dtype}")
  if x.size < 2:
    raise ValueError(f"markov_corpus: tokens needs >= 2 tokens to have a "
                     f"bigram, got {x.size}")
  if x.min() < 0:
    raise ValueError(f"markov_corpus: token ids must be >= 0, got "
                     f"{int(x.min())} at position {int(np.argmin(x))}")
  return x.astype(np.int64)


def bigram_successors(tokens, wrap: bool = True
                      ) -> tuple[np.ndarray, np.ndarray]:
  """(offsets, successors): the successors of token a, one per occurrence of
  the bigram (a, b) in the source, are successors[offsets[a]:offsets[a+1]].
  Dead ends are pruned when wrap=False (see the module docstring). Ids index
  the tables, so they must be < 2**24 (`markov_corpus` takes any ids)."""
  x = _check_tokens(tokens)
  check_bool("markov_corpus", "wrap", wrap)
  if x.max() >= _MAX_TABLE:
    raise ValueError(f"bigram_successors: token ids must be < 2**24 (they "
                     f"index a table), got {int(x.max())} at position "
                     f"{int(np.argmax(x))}; relabel them, e.g. with "
                     "np.unique(tokens, return_inverse=True)")
  a, b = (x, np.roll(x, -1)) if wrap else (x[:-1], x[1:])
  V = int(x.max()) + 1
  while True:                              # prune transitions into dead ends
    alive = np.bincount(a, minlength=V) > 0
    keep = alive[b]
    if keep.all():
      break
    a, b = a[keep], b[keep]
  if a.size == 0:
    raise ValueError("markov_corpus: with wrap=False every path of the "
                     "source's bigram chain ends in a dead end; use wrap=True")
  order = np.argsort(a, kind="stable")
  offsets = np.concatenate([[0], np.cumsum(np.bincount(a, minlength=V))])
  return offsets, b[order]


def markov_corpus(tokens, seed: int = 0, length: int | None = None,
                  wrap: bool = True) -> np.ndarray:
  """A corpus of `length` tokens (default: as many as `tokens`) sampled from
  the source's empirical bigram chain; same dtype as `tokens`."""
  check_int("markov_corpus", "seed", seed, 0)
  x = np.asarray(tokens)
  # Dense ids 0..V-1 in the ids' order: the same draws for any ids.
  words, dense = np.unique(_check_tokens(x), return_inverse=True)
  offsets, successors = bigram_successors(dense.reshape(-1), wrap)
  n = x.size if length is None else check_int("markov_corpus", "length",
                                              length, 1)
  # the draws (float64), the list of picks and the output
  check_fits("markov_corpus", "length", n, 16 + x.dtype.itemsize)
  rng = np.random.default_rng(seed)
  u = rng.random(n)
  starts = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
  off, count = offsets[:-1].tolist(), np.diff(offsets).tolist()
  succ = successors.tolist()
  out = [0] * n
  cur = int(starts[int(u[0] * starts.size)])   # the first token of a bigram
  out[0] = cur
  for t, r in enumerate(u[1:].tolist(), 1):
    cur = succ[off[cur] + int(r * count[cur])]   # a random successor of cur
    out[t] = cur
  return words[out].astype(x.dtype)
