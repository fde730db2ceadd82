"""Parameter counts without allocating, and sizes that meet a budget.

The papers compare models at equal parameter counts: Maupome & Meurs
(4.1-4.2) give every model 500k parameters, adjusting |h| (and |m| at a
fixed |m|/|h|); Renganathan & Singh (Table 1, 5.3) keep 4.5M parameters for
PTB characters (E = 128) and 2M for PTB words (E = 64). The latter count
the whole model: their sizes only reach 4.5M / 2M with the embedding and the
softmax layer included (e.g. a word-level LSTM with h = 125 has 95k
recurrent parameters, 640k in the embedding and 1.26M in the decoder), so
`solve` on a model counts embedding + layers + decoder; it reproduces their
Table 1 sizes for RNN, LSTM, mmRNN and (with 4 choice matrices per gate)
mmLSTM to within 1%. Their mRNN / mLSTM sizes (h = m = 1972 / 977) exceed
4.5M under eq. 6 and Krause's mLSTM, so only the budget can be matched.
Maupome & Meurs do not say what their 500k includes; counting the whole
model is the default here too, and `solve(..., input_size=D)` on a bare
cell counts the recurrent part only.

    count_params("mrnn", 27, hidden_size=128, intermediate_size=128)
    count_model_params(model).total
    cell = solve(lambda H, M: sorjax.cells.make(
                     "general2", hidden_size=H, intermediate_size=M,
                     use_D=False, use_E=False),
                 500_000, input_size=27, ratio=2.0)
    model = solve(lambda H: LanguageModel(stack("lstm", H, num_layers=2),
                                          vocab_size=50, embed_size=128),
                  4_500_000)

Only trainable parameters count: frozen embeddings and fixed matrices
(dyck_rnn's shift matrices, mts_lstm's fixed biases) are not parameters.
Counts use `jax.eval_shape` of `init`: nothing is allocated.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sorjax import cells as cells_lib
from sorjax import checks
from sorjax.models.dyck import DyckModel
from sorjax.models.lm import LanguageModel
from sorjax.models.stack import RecurrentTrunk
from sorjax.models.tree_classifier import TreeClassifier


# ------------------------------------------------------------------ checks

# A value of the wrong type is a TypeError here, a bad value a ValueError.
_check = functools.partial(checks.check_number, type_error=TypeError)


def _input_size(owner: str, v) -> int:
  # Checked before the cache: 3.0 and True hash like 3 and 1.
  return int(_check(f"{owner}: input_size", v, ">= 1", lambda x: x >= 1,
                    integer=True))


# ------------------------------------------------------------------ counting

@functools.lru_cache(maxsize=4096)
def _count_cell(cell, input_size: int) -> int:
  shapes = jax.eval_shape(lambda k: cell.init(k, input_size, jnp.float32),
                          jax.random.key(0))
  return sum(math.prod(s.shape) for s in jax.tree_util.tree_leaves(shapes))


def count_params(cell: Any, input_size: int, **hyperparameters: Any) -> int:
  """Trainable parameters of a cell (an instance, or a registry name plus
  hyperparameters) reading inputs of size `input_size`."""
  input_size = _input_size("count_params", input_size)
  if isinstance(cell, str):
    cell = cells_lib.make(cell, **hyperparameters)
  elif hyperparameters:
    raise TypeError(
        f"count_params: hyperparameters {sorted(hyperparameters)} go with a "
        f"cell name, not a cell instance ({cell!r})")
  return _count_cell(cell, input_size)


class ModelCount(NamedTuple):
  """Trainable parameters of a token model, by part."""
  embedding: int          # the learned table (0 for frozen, one_hot, cell)
  layers: tuple[int, ...]  # each layer's cell
  head: int               # decoder / head, with tying's bias and projection
  frozen: int             # non-trainable "frozen" table (not in total)

  @property
  def total(self) -> int:
    return self.embedding + sum(self.layers) + self.head


def count_model_params(model: RecurrentTrunk) -> ModelCount:
  """Parameter counts of a `LanguageModel` or `DyckModel`, by part, from
  its static fields (equal to the leaves of `model.init(...)["params"]`)."""
  if not isinstance(model, (LanguageModel, DyckModel)):
    raise TypeError(
        f"count_model_params: a LanguageModel or DyckModel, got "
        f"{type(model).__name__} (count() takes a TreeClassifier or a cell)")
  V, E, H = model.vocab_size, model.input_size, model.output_size
  learned = V * E if model.embedding == "learned" else 0
  frozen = V * E if model.embedding == "frozen" else 0
  layers = tuple(_count_cell(c, n) for c, n in
                 zip(model.cells, model.layer_input_sizes()))
  if isinstance(model, LanguageModel):
    if model.tie_embedding:  # decoder bias, and the projection H -> E if any
      head = V + (H * E if H != E else 0)
    else:
      head = H * V + V
  else:  # the head reads the last layer's first head_units units
    n = H if model.head_units is None else model.head_units
    head = n * model.num_classes + model.num_classes
  return ModelCount(learned, layers, head, frozen)


def count(obj: Any, input_size: int | None = None) -> int:
  """Trainable parameters of a model (`LanguageModel`, `DyckModel`,
  `TreeClassifier`), or of a cell given `input_size`."""
  if isinstance(obj, RecurrentTrunk):
    return count_model_params(obj).total
  if isinstance(obj, TreeClassifier):  # embedding, cell, classifier
    n, C = obj.cell.hidden_size, obj.num_classes
    return obj.vocab_size * n + _count_cell(obj.cell, n) + n * C + C
  if not hasattr(obj, "init") or isinstance(obj, nn.Module):
    raise TypeError(f"count: a LanguageModel, DyckModel, TreeClassifier "
                    f"or cell, got {type(obj).__name__}")
  if input_size is None:
    raise ValueError(
        f"count: a bare cell needs input_size (got cell {obj!r})")
  return count_params(obj, _input_size("count", input_size))


# ------------------------------------------------------------------ builders

def stack(name: str, hidden_size: int, num_layers: int = 1,
          intermediate_size: int | None = None, **hyperparameters: Any
          ) -> tuple:
  """num_layers identical cells `name` of hidden_size (and
  intermediate_size, for general2 / mrnn / mlstm), for a model's `cells`."""
  checks.check_int("stack: num_layers", num_layers, 1)
  if intermediate_size is not None:
    hyperparameters["intermediate_size"] = intermediate_size
  return (cells_lib.make(name, hidden_size=hidden_size, **hyperparameters),
          ) * num_layers


# ------------------------------------------------------------------ solving

def _quadratic_root(n: Callable[[int], int], budget: float) -> float:
  """The H > 0 where a quadratic through n(16), n(64), n(256) meets budget."""
  xs = np.array([16.0, 64.0, 256.0])
  a, b, c = np.polyfit(xs, [float(n(int(x))) for x in xs], 2)
  c -= budget
  if abs(a) < 1e-12 * max(abs(b), 1.0):  # linear in H
    return -c / b if b > 0 else 1.0
  disc = b * b - 4 * a * c
  if disc < 0:
    return 1.0
  return max((-b + math.sqrt(disc)) / (2 * a), (-b - math.sqrt(disc)) / (2 * a),
             1.0)


def _around(n: Callable[[int], int], budget: float, guess: int, lo_bound: int,
            hi_bound: int) -> tuple[int, ...]:
  """The sizes in [lo_bound, hi_bound] on either side of where the
  non-decreasing n(size) crosses budget: (s, s + 1) with n(s) < budget <=
  n(s + 1), or the bound itself when the crossing lies outside."""
  lo = hi = min(max(guess, lo_bound), hi_bound)
  step = 1
  while n(lo) >= budget and lo > lo_bound:  # gallop down
    hi, lo, step = lo, max(lo_bound, lo - step), 2 * step
  if n(lo) >= budget:
    return (lo_bound,)
  while n(hi) < budget and hi < hi_bound:  # gallop up
    lo, hi, step = hi, min(hi_bound, hi + step), 2 * step
  if n(hi) < budget:
    return (hi_bound,)
  while hi - lo > 1:  # n(lo) < budget <= n(hi)
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if n(mid) < budget else (lo, mid)
  return (lo, hi)


def _amount(budget) -> str:
  """A budget as given: 5,000 or 19.5 (`,.0f` read 0.5 as 0)."""
  return f"{budget:,.0f}" if float(budget).is_integer() else f"{budget:,}"


def _percent(tol) -> str:
  """A tolerance as given: 1.0% or 0.0001% (`.1%` read 1e-6 as 0.0%)."""
  short = f"{tol:.1%}"
  return short if math.isclose(float(short[:-1]), tol * 100) else \
      f"{tol * 100:.3g}%"


def _check_solve_args(budget, input_size, tol, ratio, ratio_tol, max_size):
  _check("solve: budget", budget, "> 0", lambda v: v > 0)
  if input_size is not None:
    _input_size("solve", input_size)
  _check("solve: tol", tol, "in (0, 1)", lambda v: 0 < v < 1)
  if ratio is not None:
    _check("solve: ratio", ratio, "> 0", lambda v: v > 0)
  _check("solve: ratio_tol", ratio_tol, "in [0, 1)", lambda v: 0 <= v < 1)
  _check("solve: max_size", max_size, ">= 1", lambda v: v >= 1, integer=True)


def solve(build: Callable[..., Any], budget: float, *,
          input_size: int | None = None, tol: float = 0.01,
          ratio: float | None = None, ratio_tol: float = 0.05,
          max_size: int = 1 << 20):
  """The `build(H)` (or `build(H, M)`) whose parameter count is closest to
  `budget`, within `tol`. Of sizes equally close, the smaller H wins (and,
  where M is tuned, first the M nearer ratio * H): the cheaper model.

  Args:
    build: H -> a model (`LanguageModel`, `DyckModel`) or a cell; with
      `ratio`, (H, M) -> the same, M the intermediate size. Its count must
      not decrease with H (or M).
    budget: the target number of trainable parameters.
    input_size: needed when `build` returns a bare cell.
    tol: the largest accepted relative error |count - budget| / budget.
    ratio: |m|/|h| (Maupome & Meurs 4.2): M = round(ratio * H). When no H
      meets the budget (a step of H moves the count by more than 2 * tol at
      large ratios), M is then tuned within ratio_tol of ratio * H for the
      two sizes H around the budget, as the paper adjusts "the absolute
      sizes of |m| and |h|".
    ratio_tol: the relative drift of M / H from ratio allowed when tuning M.
    max_size: the largest H tried.

  Raises:
    ValueError: naming the sizes around the budget and their counts when
      none is within `tol`.
  """
  _check_solve_args(budget, input_size, tol, ratio, ratio_tol, max_size)

  def m_of(H):
    return max(1, round(ratio * H))

  cache: dict[tuple[int, int | None], int] = {}

  def n(H: int, M: int | None = None) -> int:
    if ratio is not None and M is None:
      M = m_of(H)
    if (H, M) not in cache:
      obj = build(H) if M is None else build(H, M)
      cache[H, M] = count(obj, input_size)
    return cache[H, M]

  def err(H, M=None):
    return (n(H, M) - budget) / budget

  # Counts are quadratic in H (at a fixed |m|/|h|, up to rounding): a fit
  # through three sizes guesses H, a galloping search brackets it.
  Hs = _around(n, budget, round(_quadratic_root(n, budget)), 1, max_size)
  if n(Hs[-1]) < budget:
    raise ValueError(
        f"solve: even H={max_size} has {n(max_size):,} parameters, under the "
        f"budget of {_amount(budget)}; raise max_size")
  if Hs == (1,) and n(1) > budget * (1 + tol):
    raise ValueError(
        f"solve: even H=1 has {n(1):,} parameters, over the budget of "
        f"{_amount(budget)} (+{err(1):.2%}): the smallest model is larger than "
        "the budget (its parts that do not grow with H, such as the inputs' "
        "weights, an embedding or a decoder, alone may exceed it)")
  pairs = [(H, None if ratio is None else m_of(H)) for H in Hs]
  best = min(pairs, key=lambda p: (abs(err(*p)), p[0]))
  if abs(err(*best)) > tol and ratio is not None:
    for H in Hs:  # tune M near ratio * H
      lo = max(1, math.ceil(ratio * H * (1 - ratio_tol)))
      hi = math.floor(ratio * H * (1 + ratio_tol))
      if hi < lo:  # no int M within ratio_tol of ratio * H
        continue
      pairs += [(H, M) for M in _around(lambda M, H=H: n(H, M), budget,
                                        m_of(H), lo, hi)]
    best = min(pairs, key=lambda p: (abs(err(*p)),
                                     abs(p[1] / (ratio * p[0]) - 1), p[0]))
  if abs(err(*best)) > tol:
    around = ", ".join(
        f"H={H}{'' if M is None else f', M={M}'} gives {n(H, M):,} "
        f"({err(H, M):+.2%})" for H, M in pairs)
    raise ValueError(
        f"solve: no size meets the budget of {_amount(budget)} within "
        f"{_percent(tol)}: {around}")
  H, M = best
  return build(H) if M is None else build(H, M)
