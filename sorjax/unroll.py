"""Running cells over time: the only module that knows about time.

`unroll` hoists every input-only term out of the loop (`cell.precompute` on
all T steps at once, one large matmul) and runs `lax.scan` over the recurrent
part only (`cell.step`). Padded steps keep the carry and emit zeros, so the
final carry is exact without storing every carry. `unroll_layers` stacks
cells, a different one per layer if wanted.

Split steps and batched weight gradients (`fused_grad`). A cell may split its
step into one matmul by the recurrent state and the rest:

    W, q = cell.split(params)      # W [H_rec, N]: everything the step
                                   # multiplies the state by, fused; q: the
                                   # other params the step needs (not W)
    r = cell.recurrent_input(carry)          # [..., H_rec], usually carry.h
    carry, y = cell.post(q, carry, xp, r @ W)   # == cell.step(params, ...)

`jax.grad` of a scan over `step` accumulates dW += r_{t-1}^T dz_t inside the
backward loop: T small matmuls (inner size B) plus a read-modify-write of the
whole [H_rec, N] accumulator per step. For a split cell `unroll` runs a scan
with its own VJP instead. The forward loop saves each step's incoming carry
and z_t = r_{t-1} W. The backward loop recomputes `post` from them (its
elementwise work, and a matmul inside `post` such as mrnn's m_t A), carries
only the carry's cotangent and writes dz_t over the saved z_t (and, hoisted,
dxp_t over xp_t: `layer_scan.scan_overwrite`, no fresh zero-filled buffers);
after it, dW = sum_t r_{t-1}^T dz_t is ONE [H_rec, T*B] x [T*B, N] matmul
(what cuDNN and oneDNN do). With
hoist=False `precompute` runs inside both loops and its parameters get one
VJP over all steps at once. q's gradient is summed per step, except a second
matmul that ends `post`: a cell whose post is post_second(.., u_t @ Q2), with
u_t = second_input(q, carry, xp, z) and `second_matmul` naming Q2 in q
(general2, mrnn: m_t A; mlstm: m_t W_m), gets u_t and v_t = u_t Q2 saved
instead of recomputed, and dQ2 = sum_t u_t^T dv_t as one matmul too. It is the
default for split cells of hidden_size >= FUSED_GRAD_MIN_HIDDEN without
remat; a cell can opt out with `fused_grad_default = False` (tensor_rnn,
whose hoisted default is its own layer, below).

The LSTM (`lstm`, `mts_lstm`) has a dedicated layer primitive,
`sorjax.fused_lstm.lstm_layer` (x W_x + b, the recurrence and all their
gradients in one hand-written VJP). `unroll` runs it unless fused_grad=False,
remat or hoist=False asks otherwise (see `_lstm_layer_args`), and the same
for `tensor_rnn` and `sorjax.fused_tensor_rnn`'s layer; `dyck_rnn`, which has
no split step, runs `sorjax.fused_dyck_rnn`'s from hidden size
FUSED_GRAD_MIN_HIDDEN or with fused_grad=True. On the fused
path `mm_rnn` and `mm_lstm` run `sorjax.fused_mm_rnn`'s layers, whose
backwards need no saved z_t, `attention_lstm` and `assignment_lstm` run
`sorjax.fused_attention_lstm`'s, `mlstm` `sorjax.fused_mlstm`'s, and `gru`
and `rnn` run `sorjax.fused_gru`'s and `sorjax.fused_rnn`'s
(`_batch_major_layer`).

Forward-mode autodiff (jvp, jacfwd) cannot go through a custom VJP: use
fused_grad=False there. Outside jit `unroll` turns JAX's error into one that
names the cell and the flag; under jit JAX raises its own when the program
lowers, with the fused layer in the stack trace it prints.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sorjax import (cells, fused_attention_lstm, fused_dyck_rnn, fused_gru,
                    fused_lstm, fused_mlstm, fused_mm_rnn, fused_rnn,
                    fused_tensor_rnn, layer_scan)
from sorjax.cells import base

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


def _masked(m: Array | None, new, y: Array, carry):
  """Padded steps (m False) keep the carry and emit zeros."""
  if m is None:
    return new, y
  return (_where_tree(m, new, carry),
          jnp.where(m[:, None], y, jnp.zeros_like(y)))


def _tree_add(a, b):
  return jax.tree_util.tree_map(jnp.add, a, b)


def supports_fused_grad(cell) -> bool:
  """Whether `cell` defines the split step (`split`, `recurrent_input`,
  `post`) that the batched-weight-gradient path needs."""
  return all(callable(getattr(cell, n, None))
             for n in ("split", "recurrent_input", "post"))


# Below this hidden size a step is overhead-bound: the fused backward's extra
# per-step work (post recomputed, dz_t and dxp_t stacked) costs more than the
# dW accumulation it saves (lstm per core: 0.84-0.96x autodiff at H = 12-64,
# 1.10x at H = 128).
FUSED_GRAD_MIN_HIDDEN = 128


def _fused_by_default(cell, remat) -> bool:
  """fused_grad=None: the batched path for split cells with hidden_size >=
  FUSED_GRAD_MIN_HIDDEN, unless the cell opts out (`fused_grad_default =
  False`, where it measured slower or needs far more memory) or remat asks
  for memory (the fused backward stacks dz_t [T, B, N], which remat on the
  autodiff path does not keep: lstm B=32 T=200 H=512, remat=True 241 MB
  autodiff vs 291 MB fused)."""
  return (supports_fused_grad(cell)
          and getattr(cell, "fused_grad_default", True)
          and cell.hidden_size >= FUSED_GRAD_MIN_HIDDEN
          and remat is False)


def _lstm_layer_args(cell, params, hoist, remat, fused_grad):
  """`fused_lstm.LSTMArgs` when unroll should run `fused_lstm.lstm_layer`:
  lstm and mts_lstm, hoisted, without remat, unless fused_grad=False. It
  measured 1.23-1.84x autodiff of the scan at every size from H = 12 to
  1024 on two threads (benchmarks/small_model.md, "lstm paths"), and
  1.09-1.36x per core at H = 256 / 512 / 1024 (benchmarks/RESULTS.md run
  K)."""
  if fused_grad is False or not hoist or remat is not False:
    return None
  return fused_lstm.lstm_args(cell, params)


def _batch_major_layer(cell, params, hoist, remat, fused_grad, fused):
  """A cell's own batch-major layer when unroll should run it: hoisted,
  without remat, unless fused_grad=False. tensor_rnn (`fused_tensor_rnn`:
  no saved h_{t-1} A, dA after the loop) at every size, as the LSTM: it
  measured 1.3-1.9x autodiff from H = 16 to 1024 with a sixth or less of
  its temporary memory. dyck_rnn (`fused_dyck_rnn`: h_t over u_t, no
  transposes) from FUSED_GRAD_MIN_HIDDEN or with fused_grad=True:
  1.15-1.56x autodiff from H = 128, 1.05x at 64, 0.60x at the Dyck
  experiments' H = 12. The others on the batched-weight-gradient path
  (fused): mm_rnn and mm_lstm (`fused_mm_rnn`: no saved z_t),
  attention_lstm and assignment_lstm (`fused_attention_lstm`: activations
  over gx_t), mlstm (`fused_mlstm`: activations over gx_t), gru
  (`fused_gru`: activations over xp_t), rnn (`fused_rnn`: h_t over xp_t).
  Returns a `_Layer` or None."""
  if fused_grad is False or not hoist or remat is not False:
    return None
  modules = (fused_tensor_rnn,)
  if fused_grad or cell.hidden_size >= FUSED_GRAD_MIN_HIDDEN:
    modules += (fused_dyck_rnn,)
  if fused:
    modules += (fused_mm_rnn, fused_attention_lstm, fused_mlstm, fused_gru,
                fused_rnn)
  for module in modules:
    args = module.layer_args(cell, params)
    if args is not None:
      inputs = getattr(module, "precompute_params", None)
      return _Layer(functools.partial(module.run_layer, args),
                    params if inputs is None else inputs(args, params))
  return None


class _Layer(NamedTuple):
  """A cell's own layer, run(xp, carry, lengths, unroll), and the params
  its xp is precomputed from (a layer that adds a bias in its own map has
  the precompute leave it out: `fused_attention_lstm.precompute_params`)."""
  run: Callable
  params: Any


def _precompute_rows(cell, params, xs, per_step, scalar):
  """`cell.precompute` of all T steps, run on the T*B tokens as rows
  ([T*B, D]) and reshaped to xs's two leading axes ([T, B] for the
  time-major scan, [B, T] for a cell's batch-major layer). Its matmuls
  then contract one axis in the backward: for x [T, B, D] (two axes, t and
  b) XLA:CPU transposed the [T, B, N] cotangent before the weight
  gradient, a pass over it (mrnn B=64 T=100 H=512: 12 ms of ~350)."""
  N1, N2 = xs.shape[:2]
  rows = lambda a: a.reshape(N1 * N2, *a.shape[2:])  # noqa: E731
  out = cell.precompute(params, rows(xs),
                        **{k: rows(v) for k, v in per_step.items()},
                        **scalar)
  return jax.tree_util.tree_map(lambda a: a.reshape(N1, N2, *a.shape[1:]),
                                out)


def _scan_time_major(cell, params, xs, per_step, scalar, carry, lengths,
                     hoist, remat, unroll, fused, fused_grad):
  """The time-major paths of `unroll` (the LSTM layer, the generic fused
  scan, autodiff of the scan) on batch-major xs; returns (carry, ys
  [B, T, H])."""
  T = xs.shape[1]
  xs_tm = jnp.swapaxes(xs, 0, 1)
  per_step_tm = {k: jnp.swapaxes(v, 0, 1) for k, v in per_step.items()}
  if lengths is None:
    mask_tm = None
  else:
    mask_tm = jnp.arange(T, dtype=jnp.int32)[:, None] < lengths[None, :]  # [T, B]

  lstm = _lstm_layer_args(cell, params, hoist, remat, fused_grad)
  if lstm is not None and T > 0 and not (per_step or scalar):
    # x W_x + b inside its VJP
    carry, ys = fused_lstm.lstm_layer(lstm.W_h, lstm.W_x, lstm.b, xs_tm,
                                      carry, lengths, lstm.forget_bias,
                                      unroll, name=lstm.name)
  else:
    loop = _Loop(cell, hoist, remat,
                 layer_scan.unroll_steps("unroll", unroll))
    if hoist:
      seq, pp = _precompute_rows(cell, params, xs_tm, per_step_tm, scalar), ()
    else:
      seq, pp = (xs_tm, per_step_tm), (params, scalar)
    if fused:
      W, q = cell.split(params)
      carry, ys = _fused_scan(loop, W, q, pp, seq, mask_tm, carry)
    else:
      carry, ys = _plain_scan(loop, params, pp, seq, mask_tm, carry)
  return carry, jnp.swapaxes(ys, 0, 1)


def _remat_policy(remat):
  """The jax.checkpoint policy of `remat` (None: no checkpoint)."""
  if remat is True:
    return jax.checkpoint_policies.nothing_saveable
  if remat == "dots":
    return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
  return None


@dataclasses.dataclass(frozen=True)
class _Loop:
  """What a scan step needs besides arrays: the cell and the options."""
  cell: Any
  hoist: bool
  remat: bool | str
  unroll: int

  def inputs(self, pp, s):
    """xp of one step (or of all steps) from its slice s of the sequence."""
    if self.hoist:
      return s  # precomputed before the scan
    (params, scalar), (x, aux) = pp, s
    return self.cell.precompute(params, x, **aux, **scalar)

  def post(self, q, carry, xp, z, m):
    new, y = self.cell.post(q, carry, xp, z)
    return _masked(m, new, y, carry)


def _plain_scan(loop: _Loop, params, pp, seq, mask, carry):
  """lax.scan over the step, differentiated by JAX's autodiff."""
  cell = loop.cell
  split = cell.split(params) if supports_fused_grad(cell) else None

  def body(carry, inp):
    s, m = inp
    xp = loop.inputs(pp, s)
    if split is None:
      new, y = cell.step(params, carry, xp)
      return _masked(m, new, y, carry)
    W, q = split  # split once, outside the loop
    return loop.post(q, carry, xp, cell.recurrent_input(carry) @ W, m)

  policy = _remat_policy(loop.remat)
  if policy is not None:
    body = jax.checkpoint(body, prevent_cse=False, policy=policy)
  return jax.lax.scan(body, carry, (seq, mask), unroll=loop.unroll)


# -------------------------------------------- the batched-weight-gradient scan

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused_scan(loop: _Loop, W, q, pp, seq, mask, carry):
  """lax.scan of `post` with z_t = recurrent_input(carry) @ W; its VJP forms
  dW in one matmul after the backward loop."""
  return _fused_forward(loop, W, q, pp, seq, mask, carry, save=False)[0]


def _second(cell, q):
  """(Q2, q without it) when the cell's `post` ends in a second matmul
  v_t = u_t @ Q2 (`second_matmul` names Q2 in q; `second_input` gives u_t,
  `post_second` the rest), else (None, q)."""
  key = getattr(cell, "second_matmul", None)
  if key is None:
    return None, q
  return q[key], {k: v for k, v in q.items() if k != key}


def _fused_forward(loop, W, q, pp, seq, mask, carry, save):
  cell = loop.cell
  keep_z = loop.remat is not True  # remat=True recomputes z_t backwards
  Q2, q1 = _second(cell, q)
  rW = layer_scan.step_product(W)
  uQ2 = None if Q2 is None else layer_scan.step_product(Q2)

  def body(carry, inp):
    s, m = inp
    xp = loop.inputs(pp, s)
    z = rW(cell.recurrent_input(carry))
    if Q2 is None:
      (new, y), uv = loop.post(q, carry, xp, z, m), None
    else:  # post = post_second(.., u_t @ Q2); u_t and v_t are saved
      u = cell.second_input(q1, carry, xp, z)
      v = uQ2(u)
      (new, y), uv = _masked(m, *cell.post_second(q1, carry, xp, z, v),
                             carry), (u, v)
    if not save:
      return new, y
    if not keep_z:
      return new, (y, carry, None, None)
    return new, (y, carry, z, uv)  # carry_{t-1}, z_t, (u_t, v_t)

  final, out = jax.lax.scan(body, carry, (seq, mask), unroll=loop.unroll)
  if not save:
    return (final, out), None
  ys, carries, zs, uvs = out
  return (final, ys), (W, q, pp, seq, mask, carries, zs, uvs)


def _fused_fwd(loop, W, q, pp, seq, mask, carry):
  return _fused_forward(loop, W, q, pp, seq, mask, carry, save=True)


def _fused_bwd(loop, res, cot):
  W, q, pp, seq, mask, carries, zs, uvs = res
  d_final, dys = cot
  cell = loop.cell
  Q2, q1 = _second(cell, q)
  rW, dzWt = layer_scan.step_product(W), layer_scan.step_product(W.T)
  uQ2, dvQ2t = ((None, None) if Q2 is None else
                (layer_scan.step_product(Q2), layer_scan.step_product(Q2.T)))
  us, vs = (None, None) if uvs is None else uvs
  # Residuals the backward consumes step by step are overwritten with the
  # cotangents of the same shape: dxp_t over xp_t (hoisted), dz_t over z_t,
  # dv_t over v_t.
  buf = {"xp": seq if loop.hoist else None, "z": zs, "v": vs}

  def body(acc, b, inp):
    d_carry, dq = acc
    s, m, carry, dy, u = inp
    s = b["xp"] if loop.hoist else s
    xp = loop.inputs(pp, s)
    r, r_pull = jax.vjp(cell.recurrent_input, carry)
    z = rW(r) if zs is None else b["z"]
    if Q2 is None:
      post = lambda q_, c_, xp_, z_: loop.post(q_, c_, xp_, z_, m)
      _, pull = jax.vjp(post, q, carry, xp, z)
      dq_t, d_prev, dxp, dz = pull((d_carry, dy))
      u = dv = None
    else:  # through post_second, then v_t = u_t Q2, then second_input
      if zs is None:  # remat: recompute u_t and v_t
        u = cell.second_input(q1, carry, xp, z)
        v = uQ2(u)
      else:
        v = b["v"]
      post = lambda q_, c_, xp_, z_, v_: _masked(
          m, *cell.post_second(q_, c_, xp_, z_, v_), c_)
      _, pull = jax.vjp(post, q1, carry, xp, z, v)
      dq_t, d_prev, dxp, dz, dv = pull((d_carry, dy))
      _, pull_u = jax.vjp(cell.second_input, q1, carry, xp, z)
      dq_u, d_prev_u, dxp_u, dz_u = pull_u(dvQ2t(dv))  # through v = u Q2
      dq_t, d_prev = _tree_add(dq_t, dq_u), _tree_add(d_prev, d_prev_u)
      dxp, dz = _tree_add(dxp, dxp_u), dz + dz_u
    dr = dzWt(dz)  # through z = r W
    d_prev = _tree_add(d_prev, r_pull(dr)[0])
    w = {"xp": dxp if loop.hoist else None, "z": None if zs is None else dz,
         "v": None if vs is None else dv}
    ys = (None if loop.hoist else dxp, dz if zs is None else None,
          (u, dv) if Q2 is not None and zs is None else None)
    return (d_prev, _tree_add(dq, dq_t)), ys, w

  dq0 = jax.tree_util.tree_map(jnp.zeros_like, q1)
  (d_carry, dq), (dxp, dz, uv_remat), buf = layer_scan.scan_overwrite(
      body, (d_final, dq0), buf,
      (None if loop.hoist else seq, mask, carries, dys, us), reverse=True,
      unroll=loop.unroll)
  dxp = buf["xp"] if loop.hoist else dxp
  dz = buf["z"] if zs is not None else dz
  if Q2 is not None:  # dQ2 = sum_t u_t^T dv_t: one matmul, as dW below
    us, dvs = uv_remat if zs is None else (us, buf["v"])
    dq = {**dq, cell.second_matmul: layer_scan.row_products(us, dvs,
                                                            Q2.dtype)}
  # dW = sum_t r_{t-1}^T dz_t: one matmul over all T*B rows, summed in at
  # least float32 (autodiff's per-step bfloat16 accumulator rounds T times).
  dW = layer_scan.row_products(cell.recurrent_input(carries), dz, W.dtype)
  if loop.hoist:
    dpp, dseq = (), dxp
  else:  # precompute's VJP, once over all steps
    dpp, dseq = _vjp_inexact(loop.inputs, (pp, seq), dxp)
  return dW, dq, dpp, dseq, None, d_carry


_fused_scan.defvjp(_fused_fwd, _fused_bwd)


def _vjp_inexact(f: Callable, args: tuple, ct):
  """VJP of f w.r.t. the float leaves of args; None (zero) for the others
  (int aux such as a cell assignment)."""
  leaves, tree = jax.tree_util.tree_flatten(args)
  diff = [jnp.issubdtype(l.dtype, jnp.inexact) for l in leaves]

  def g(*floats):
    it = iter(floats)
    return f(*tree.unflatten([next(it) if d else l
                              for l, d in zip(leaves, diff)]))
  _, pull = jax.vjp(g, *[l for l, d in zip(leaves, diff) if d])
  it = iter(pull(ct))
  return tree.unflatten([next(it) if d else None for d in diff])


# ------------------------------------------------------------------ unroll

def unroll(cell, params, xs: Array, carry=None, lengths: Array | None = None,
           reverse: bool = False, remat: bool | str = False,
           unroll: int | None = None,
           hoist: bool = True, fused_grad: bool | None = None, **aux: Any):
  """Runs `cell` over xs [B, T, D]; returns (final_carry, ys [B, T, H]).

  Args:
    cell: a cell from `sorjax.cells.make`.
    params: its parameters.
    xs: inputs [B, T, D].
    carry: initial carry; `cell.initial_carry(params, (B,))` when None.
    lengths: int [B] valid lengths in [0, T] (the range is checked when
      lengths is concrete, not traced); steps t >= length keep the carry
      and output zeros.
    reverse: run from the last valid step to the first (per example when
      `lengths` is given, as `flax.linen.RNN(reverse=True)`); ys stay aligned
      with xs.
    remat: memory for FLOPs in the backward pass. False: keep what autodiff
      keeps. True: rematerialise each step (save only the carries). "dots":
      save only matmul outputs (`dots_with_no_batch_dims_saveable`) and
      recompute the elementwise rest (lstm B=32 T=200 H=512: 0.80x the
      memory at 0.95x the speed; True 0.66x at 0.91x). With
      fused_grad=True the backward loop always recomputes `post` from the
      saved carry and z_t, so "dots" is False there and True recomputes
      z_t = r_{t-1} W instead of storing it.
    unroll: steps per loop iteration (`lax.scan`'s unroll factor; the fused
      loops run chunks of this many steps, `layer_scan.scan_overwrite`).
      None: `fused_lstm.default_unroll` on the LSTM layer path (2 for
      batch-major H <= 32, else 1), 1 on every other path.
    hoist: compute `cell.precompute` for all T before the scan (default) or
      inside the scan body, one step at a time.
    fused_grad: batched weight gradients (see the module docstring): True
      requires a split cell, False is JAX's autodiff of the scan, None picks
      the fused path for split cells with hidden_size >= 128 (smaller steps
      are overhead-bound and measured slower fused) and remat=False (remat
      asks for memory, which autodiff's remat saves more of), except cells
      that opt out with `fused_grad_default = False` (tensor_rnn).
      lstm and mts_lstm run `fused_lstm.lstm_layer`, and tensor_rnn
      `fused_tensor_rnn`'s layer, at every size with True or None when
      hoisted without remat; dyck_rnn `fused_dyck_rnn`'s with True, or
      None from hidden size 128 (module doc).
    **aux: extra inputs of the cell, scalars or [B, T] per-token arrays.
  """
  if not hasattr(cell, "initial_carry"):
    raise ValueError(f"unroll: {cells.name_of(cell)} is not a sequence cell "
                     "(it has no initial_carry); tree cells run with "
                     "sorjax.trees.run")
  xs = jnp.asarray(xs)
  if xs.ndim != 3:
    raise ValueError(f"unroll: xs must be [B, T, D], got shape {xs.shape}")
  base.check_params(f"unroll: {cells.name_of(cell)}", cell, params,
                    xs.shape[-1],
                    f"the last axis of xs {tuple(xs.shape)}")
  base.check_input_dtype(f"unroll: {cells.name_of(cell)}", params, xs)
  if isinstance(remat, (bool, np.bool_)):
    remat = bool(remat)
  elif remat != "dots":
    raise ValueError(
        f"unroll: remat must be True, False or \"dots\", got {remat!r}")
  if fused_grad is not None:  # a bool: 1 == True would pass `in`
    if not isinstance(fused_grad, (bool, np.bool_)):
      raise ValueError(f"unroll: fused_grad must be None, True or False, "
                       f"got {fused_grad!r}")
    fused_grad = bool(fused_grad)  # the paths test `is False`
  for name, flag in (("reverse", reverse), ("hoist", hoist)):
    if not isinstance(flag, (bool, np.bool_)):  # "no" would read as True
      raise ValueError(f"unroll: {name} must be True or False, got {flag!r}")
  layer_scan.check_unroll("unroll", unroll)
  fused = _fused_by_default(cell, remat) if fused_grad is None else fused_grad
  layer = _batch_major_layer(cell, params, hoist, remat, fused_grad, fused)
  if fused and layer is None and not supports_fused_grad(cell):
    raise ValueError(
        f"unroll: fused_grad=True needs a cell with a split step (split, "
        f"recurrent_input, post), or a layer of its own run hoisted without "
        f"remat; {type(cell).__name__} has no split step")
  B, T, _ = xs.shape
  per_step, scalar = _split_aux(aux, B, T)
  lengths = layer_scan.check_lengths("unroll", lengths, B, T)
  if carry is None:
    carry = cell.initial_carry(params, (B,))
  else:
    base.check_carry(f"unroll: {cells.name_of(cell)}", cell, params, carry,
                     (B,))

  if reverse:
    if lengths is None:
      xs = jnp.flip(xs, 1)
      per_step = {k: jnp.flip(v, 1) for k, v in per_step.items()}
    else:
      idx = _flip_index(lengths, T)
      xs = _gather_time(xs, idx)
      per_step = {k: _gather_time(v, idx) for k, v in per_step.items()}

  try:
    if layer is not None and T > 0:  # batch-major, its own VJP
      carry, ys = layer.run(
          _precompute_rows(cell, layer.params, xs, per_step, scalar), carry,
          lengths, unroll)
    else:
      # T = 0 on a layer's route runs the (empty) scan: the generic fused
      # path only where the cell has a split step (not dyck_rnn).
      carry, ys = _scan_time_major(cell, params, xs, per_step, scalar, carry,
                                   lengths, hoist, remat, unroll,
                                   fused and supports_fused_grad(cell),
                                   fused_grad)
  except TypeError as e:  # fused_grad=False runs no custom VJP
    if not str(e).startswith(_JVP_OF_CUSTOM_VJP):
      raise
    raise TypeError(_forward_mode_message(cell, fused_grad)) from e
  if reverse:
    ys = jnp.flip(ys, 1) if lengths is None else _gather_time(ys, idx)
  return carry, ys


_unroll = unroll  # unroll_layers' `unroll` argument shadows the name

# JAX's error for jvp of a jax.custom_vjp function, raised while tracing
# outside jit; under jit it is raised when the program lowers, after unroll
# has returned, and names the fused layer in its stack trace.
_JVP_OF_CUSTOM_VJP = "can't apply forward-mode autodiff (jvp)"


def _forward_mode_message(cell, fused_grad: bool | None) -> str:
  why = ("fused_grad=True" if fused_grad else
         f"fused_grad=None, which picks it for {cells.name_of(cell)} at "
         f"hidden_size {cell.hidden_size}")
  return (f"unroll: {cells.name_of(cell)} ran its fused path ({why}), whose "
          f"backward is a custom VJP: forward-mode autodiff (jax.jvp, "
          f"jax.jacfwd, jax.linearize's jvp) cannot go through it. Pass "
          f"fused_grad=False (a model's fused_grad field, "
          f"--config.model.fused_grad=false) to differentiate JAX's scan "
          f"instead; reverse mode (jax.grad, jax.vjp) works either way.")


# ------------------------------------------------------------------ stacking

def init_layers(key: Array, cells: Sequence[Any], input_size: int,
                dtype: Any = jnp.float32) -> tuple:
  """Parameters of a stack: layer l reads layer l-1's hidden_size."""
  _check_cells("init_layers", cells)
  params, size = [], input_size
  for cell, k in zip(cells, jax.random.split(key, len(cells))):
    params.append(cell.init(k, size, dtype))
    size = cell.hidden_size
  return tuple(params)


def _check_cells(where: str, cells) -> None:
  if not isinstance(cells, Sequence) or isinstance(cells, str):
    raise ValueError(f"{where}: cells must be a sequence of cells, one per "
                     f"layer (e.g. (cell,)); got {type(cells).__name__}")


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
                  reverse: bool = False, remat: bool | str = False,
                  unroll: int | None = None, hoist: bool = True,
                  fused_grad: bool | None = None, **aux: Any):
  """Runs a stack of cells, one scan per layer; returns (carries, ys).

  `between(l, ys)` transforms layer l's outputs before layer l+1 reads them
  (e.g. dropout). Each aux value goes to the layers whose `precompute`
  accepts it; an aux no layer accepts is an error.
  """
  _check_cells("unroll_layers", cells)
  if len(cells) != len(params):
    raise ValueError(
        f"unroll_layers: {len(cells)} cells but {len(params)} param sets")
  if carries is None:
    carries = (None,) * len(cells)
  elif len(carries) != len(cells):  # zip would drop the layers past them
    raise ValueError(f"unroll_layers: {len(cells)} cells but {len(carries)} "
                     f"carries (None for a layer's initial carry)")
  unused = set(aux)
  new_carries = []
  for l, (cell, p, c) in enumerate(zip(cells, params, carries)):
    # (a tree cell has no precompute: _unroll names it)
    keys = accepted_aux(cell, aux) if hasattr(cell, "precompute") else set()
    unused -= keys
    try:
      c, xs = _unroll(cell, p, xs, c, lengths, reverse=reverse, remat=remat,
                      unroll=unroll, hoist=hoist, fused_grad=fused_grad,
                      **{k: aux[k] for k in keys})
    except ValueError as e:  # which layer of a stack of like cells
      if len(cells) == 1:
        raise
      raise ValueError(f"unroll_layers: layer {l}: {e}") from e
    new_carries.append(c)
    if between is not None and l + 1 < len(cells):
      xs = between(l, xs)
  if unused:
    raise ValueError(f"unroll_layers: no layer accepts aux {sorted(unused)}")
  return tuple(new_carries), xs
