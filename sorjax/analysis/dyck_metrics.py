"""Bracket-prediction metrics of Lin et al. 4.2 (after Hewitt et al. 2020).

Only closing brackets are scored ("there is no reason to favor one open
parenthesis over another"). A prediction is correct when at least 80% of
the probability mass on *any* closing bracket is on the true one. LDPA is
that accuracy per closing distance (close position minus open position);
WCPA is its minimum over the distances that occur.
"""

from __future__ import annotations

import numpy as np

THRESHOLD = 0.8


def close_correct(probs: np.ndarray, target: np.ndarray, k: int,
                  threshold: float = THRESHOLD) -> np.ndarray:
  """probs [..., V] next-token distributions (closing brackets are ids
  k..2k-1), target [...] the true closing id -> bool [...]."""
  probs = np.asarray(probs, np.float64)
  target = np.asarray(target)
  if np.any((target < k) | (target >= 2 * k)):
    raise ValueError(f"targets must be closing-bracket ids in [{k}, {2 * k})")
  p_true = np.take_along_axis(probs, target[..., None], -1)[..., 0]
  p_any = probs[..., k:2 * k].sum(-1)
  # no mass on any close is no prediction: wrong (0 >= 0.8 * 0 was right)
  return (p_true >= threshold * p_any) & (p_any > 0)


def ldpa(probs: np.ndarray, tokens: np.ndarray, distances: np.ndarray,
         k: int, threshold: float = THRESHOLD) -> dict[int, tuple[int, int]]:
  """Per closing distance: (correct, total).

  probs [B, T-1, V]: row t predicts tokens[:, t+1]; tokens [B, T];
  distances [B, T]: closing distance of each closing bracket, 0 elsewhere
  (and at padding), as `DyckKM.closing_distances` gives per sequence.
  """
  probs, tokens, distances = map(np.asarray, (probs, tokens, distances))
  nxt, dist = tokens[:, 1:], distances[:, 1:]
  sel = dist > 0
  correct = close_correct(probs[sel], nxt[sel], k, threshold)
  out: dict[int, tuple[int, int]] = {}
  for d in np.unique(dist[sel]):
    at = dist[sel] == d
    out[int(d)] = (int(correct[at].sum()), int(at.sum()))
  return out


def merge(a: dict[int, tuple[int, int]], b: dict[int, tuple[int, int]]):
  """Adds two LDPA count tables (e.g. over batches)."""
  out = dict(a)
  for d, (c, n) in b.items():
    c0, n0 = out.get(d, (0, 0))
    out[d] = (c0 + c, n0 + n)
  return out


def wcpa(counts: dict[int, tuple[int, int]]) -> float:
  """Worst-case prediction accuracy: min over distances of LDPA."""
  if not counts:
    raise ValueError("WCPA of an empty table: no closing brackets scored")
  return min(c / n for c, n in counts.values())


def accuracy(counts: dict[int, tuple[int, int]]) -> float:
  """Accuracy over all closing brackets."""
  c = sum(c for c, _ in counts.values())
  n = sum(n for _, n in counts.values())
  if n == 0:
    raise ValueError("accuracy of an empty table")
  return c / n
