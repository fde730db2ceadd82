"""Any sorjax sequence cell as a `flax.linen.RNNCellBase`.

    rnn = nn.RNN(sorjax.linen.CellAdapter(sorjax.cells.make("mrnn", ...)))
    bi = nn.Bidirectional(nn.RNN(CellAdapter(cell)), nn.RNN(CellAdapter(cell)))

The adapter's params are exactly the cell's (`cell.init` names and shapes,
one flax param per top-level name), so `variables["params"]` of an adapter
(or `["params"]["cell"]` of an `nn.RNN`) is a valid `params` argument of
`sorjax.unroll`. `sorjax.unroll` stays the fast path: `nn.RNN` runs
`precompute` inside every step (no hoisting) and, under `seq_lengths`, keeps
every carry to pick the last valid one. A row of length 0 differs: flax's
final carry for it is not the initial carry, which `sorjax.unroll` returns
(its outputs, all padding, agree).

Extra inputs (aux): `aux={"temperature": 0.5}` as a module attribute; each
value is passed to `precompute` unchanged at every step, so it must be a
scalar or have the batch shape of one step (e.g. one assignment per
sequence, [B]). Per-token aux that varies over time ([B, T] in
`sorjax.unroll`) cannot go through `nn.RNN`, which scans over one input
array: use `sorjax.unroll` for those.
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sorjax.cells import base
from sorjax.models.constant import Constant, constant


class CellAdapter(nn.RNNCellBase):
  """`__call__(carry, x) -> (carry, y)`: one `precompute` + `step` of `cell`.

  Attributes:
    cell: a sequence cell from `sorjax.cells.make`.
    aux: extra `precompute` inputs held fixed over time (see module doc).
    param_dtype: dtype of the cell's params.
  """
  cell: Any
  aux: Mapping[str, Any] | None = None
  param_dtype: Any = jnp.float32

  def __post_init__(self):
    if not all(hasattr(self.cell, m) for m in ("initial_carry", "precompute",
                                               "step")):
      raise ValueError(f"CellAdapter: cell must be a sequence cell "
                       f"(initial_carry, precompute, step); got "
                       f"{type(self.cell).__name__} (tree cells run with "
                       "sorjax.trees.run)")
    base.check_float_dtype("CellAdapter: param_dtype", self.param_dtype)
    # Sorted (name, value) pairs, arrays as hashable Constants: the module
    # stays hashable (a valid static argument of jax.jit).
    if self.aux is not None and not isinstance(self.aux, tuple):
      object.__setattr__(self, "aux", tuple(
          (k, constant(v)) for k, v in sorted(dict(self.aux).items())))
    super().__post_init__()

  def _aux(self, batch_shape: tuple[int, ...]) -> dict[str, Any]:
    out = {}
    for k, v in self.aux or ():
      v = jnp.asarray(np.asarray(v) if isinstance(v, Constant) else v)
      if v.ndim and v.shape != batch_shape:
        raise ValueError(
            f"CellAdapter: aux {k!r} must be a scalar or have the batch shape "
            f"{batch_shape} of one step, got shape {v.shape}; per-token aux "
            "does not go through nn.RNN (use sorjax.unroll)")
      out[k] = v
    return out

  def _abstract_params(self, input_size: int):
    return jax.eval_shape(
        lambda k: self.cell.init(k, input_size, self.param_dtype),
        jax.random.key(0))

  @nn.compact
  def __call__(self, carry, x):
    D = x.shape[-1]
    full = {}

    def init(key, name):  # one cell.init (the first name's key) for all names
      if not full:
        full.update(self.cell.init(key, D, self.param_dtype))
      return full[name]

    params = {name: self.param(name, init, name)
              for name in self._abstract_params(D)}
    where = f"CellAdapter({type(self.cell).__name__})"
    base.check_param_dtypes(where, params)
    got, want = base.param_dtype(params), jnp.dtype(self.param_dtype)
    if got != want:   # nn.RNN made the carry from param_dtype
      raise ValueError(
          f"{where}: params are {got} but param_dtype is {want} (which "
          f"initialize_carry makes the carry in): give CellAdapter("
          f"param_dtype=jnp.{got}) or cast the params to {want}")
    base.check_input_dtype(where, params, x)
    base.check_carry(where, self.cell, params, carry, x.shape[:-1])
    xp = self.cell.precompute(params, x, **self._aux(x.shape[:-1]))
    return self.cell.step(params, carry, xp)

  @nn.nowrap
  def initialize_carry(self, rng, input_shape: tuple[int, ...]):
    """The cell's initial carry for inputs of shape [*batch, D] (the carry
    depends only on the params' dtype, so abstract params suffice)."""
    *batch, D = input_shape
    return self.cell.initial_carry(self._abstract_params(D), tuple(batch))

  @property
  def num_feature_axes(self) -> int:
    return 1
