"""Running cells over time: the only module that knows about time.

`unroll` hoists every input-only term out of the loop (`cell.precompute` on
all T steps at once, one large matmul) and runs `lax.scan` over the recurrent
part only (`cell.step`). Padded steps keep the carry and emit zeros, so the
final carry is exact without storing every carry. `unroll_layers` stacks
cells, a different one per layer if wanted.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

Array = jax.Array


def _flip_index(lengths: Array, T: int) -> Array:
  """[B, T] gather index reversing each row within its length (pads stay)."""
  t = jnp.arange(T, dtype=lengths.dtype)[None, :]
  L = lengths[:, None]
  return jnp.where(t < L, L - 1 - t, t)


def _gather_time(a: Array, idx: Array) -> Array:
  """a[b, idx[b, t], ...] for a batch-major a of shape [B, T, ...]."""
  idx = idx.reshape(idx.shape + (1,) * (a.ndim - 2))
  return jnp.take_along_axis(a, idx, axis=1)


def _split_aux(aux: dict[str, Any], B: int, T: int):
  """Per-step aux ([B, T, ...] like xs) vs. static/scalar aux."""
  per_step, scalar = {}, {}
  for k, v in aux.items():
    v = jnp.asarray(v)
    if v.ndim == 0:
      scalar[k] = v
    elif v.ndim >= 2 and v.shape[:2] == (B, T):
      per_step[k] = v
    else:
      raise ValueError(
          f"aux {k!r} must be a scalar or have leading axes [B, T] = "
          f"[{B}, {T}] like xs; got shape {tuple(v.shape)}")
  return per_step, scalar


def _where_tree(mask: Array, new, old):
  def pick(n, o):
    m = mask.reshape(mask.shape + (1,) * (n.ndim - mask.ndim))
    return jnp.where(m, n, o)
  return jax.tree_util.tree_map(pick, new, old)


def unroll(cell, params, xs: Array, carry=None, lengths: Array | None = None,
           reverse: bool = False, remat: bool = False, unroll: int = 1,
           hoist: bool = True, **aux: Any):
  """Runs `cell` over xs [B, T, D]; returns (final_carry, ys [B, T, H]).

  Args:
    cell: a cell from `sorjax.cells.make`.
    params: its parameters.
    xs: inputs [B, T, D].
    carry: initial carry; `cell.initial_carry(params, (B,))` when None.
    lengths: int [B] valid lengths; steps t >= length keep the carry and
      output zeros.
    reverse: run from the last valid step to the first (per example when
      `lengths` is given, as `flax.linen.RNN(reverse=True)`); ys stay aligned
      with xs.
    remat: rematerialise each step in the backward pass (memory for FLOPs).
    unroll: `lax.scan` unroll factor.
    hoist: compute `cell.precompute` for all T before the scan (default) or
      inside the scan body, one step at a time.
    **aux: extra inputs of the cell, scalars or [B, T] per-token arrays.
  """
  if xs.ndim != 3:
    raise ValueError(f"unroll: xs must be [B, T, D], got shape {xs.shape}")
  B, T, _ = xs.shape
  per_step, scalar = _split_aux(aux, B, T)
  if lengths is not None:
    lengths = jnp.asarray(lengths)
    if lengths.shape != (B,):
      raise ValueError(
          f"unroll: lengths must have shape [B] = [{B}], got {lengths.shape}")
    lengths = lengths.astype(jnp.int32)
  if carry is None:
    carry = cell.initial_carry(params, (B,))

  if reverse:
    if lengths is None:
      xs = jnp.flip(xs, 1)
      per_step = {k: jnp.flip(v, 1) for k, v in per_step.items()}
    else:
      idx = _flip_index(lengths, T)
      xs = _gather_time(xs, idx)
      per_step = {k: _gather_time(v, idx) for k, v in per_step.items()}

  # Time-major for the scan.
  xs_tm = jnp.swapaxes(xs, 0, 1)
  per_step_tm = {k: jnp.swapaxes(v, 0, 1) for k, v in per_step.items()}
  if lengths is None:
    mask_tm = None
  else:
    mask_tm = jnp.arange(T, dtype=jnp.int32)[:, None] < lengths[None, :]          # [T, B]

  if hoist:
    seq = cell.precompute(params, xs_tm, **per_step_tm, **scalar)
  else:
    seq = (xs_tm, per_step_tm)

  def body(carry, inp):
    if mask_tm is None:
      xp = inp
    else:
      xp, m = inp
    if not hoist:
      x_t, aux_t = xp
      xp = cell.precompute(params, x_t, **aux_t, **scalar)
    new, y = cell.step(params, carry, xp)
    if mask_tm is not None:
      new = _where_tree(m, new, carry)
      y = jnp.where(m[:, None], y, jnp.zeros_like(y))
    return new, y

  if remat:
    body = jax.checkpoint(body, prevent_cse=False)
  inputs = seq if mask_tm is None else (seq, mask_tm)
  carry, ys = jax.lax.scan(body, carry, inputs, unroll=unroll)
  ys = jnp.swapaxes(ys, 0, 1)
  if reverse:
    ys = jnp.flip(ys, 1) if lengths is None else _gather_time(ys, idx)
  return carry, ys


_unroll = unroll  # unroll_layers' `unroll` argument shadows the name


# ------------------------------------------------------------------ stacking

def init_layers(key: Array, cells: Sequence[Any], input_size: int,
                dtype: Any = jnp.float32) -> tuple:
  """Parameters of a stack: layer l reads layer l-1's hidden_size."""
  params, size = [], input_size
  for cell, k in zip(cells, jax.random.split(key, len(cells))):
    params.append(cell.init(k, size, dtype))
    size = cell.hidden_size
  return tuple(params)


def accepted_aux(cell, keys) -> set[str]:
  """The keys among `keys` that `cell.precompute` accepts."""
  sig = inspect.signature(cell.precompute).parameters
  if any(p.kind == p.VAR_KEYWORD for p in sig.values()):
    return set(keys)
  return {k for k in keys if k in sig}


def unroll_layers(cells: Sequence[Any], params: Sequence[Any], xs: Array,
                  carries: Sequence[Any] | None = None,
                  lengths: Array | None = None, *,
                  between: Callable[[int, Array], Array] | None = None,
                  reverse: bool = False, remat: bool = False, unroll: int = 1,
                  hoist: bool = True, **aux: Any):
  """Runs a stack of cells, one scan per layer; returns (carries, ys).

  `between(l, ys)` transforms layer l's outputs before layer l+1 reads them
  (e.g. dropout). Each aux value goes to the layers whose `precompute`
  accepts it; an aux no layer accepts is an error.
  """
  if len(cells) != len(params):
    raise ValueError(
        f"unroll_layers: {len(cells)} cells but {len(params)} param sets")
  if carries is None:
    carries = (None,) * len(cells)
  unused = set(aux)
  new_carries = []
  for l, (cell, p, c) in enumerate(zip(cells, params, carries)):
    keys = accepted_aux(cell, aux)
    unused -= keys
    c, xs = _unroll(cell, p, xs, c, lengths, reverse=reverse, remat=remat,
                   unroll=unroll, hoist=hoist, **{k: aux[k] for k in keys})
    new_carries.append(c)
    if between is not None and l + 1 < len(cells):
      xs = between(l, xs)
  if unused:
    raise ValueError(f"unroll_layers: no layer accepts aux {sorted(unused)}")
  return tuple(new_carries), xs
