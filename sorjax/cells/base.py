"""What every cell shares: the protocol, initialisers, activations, input
products, checks.

Row-vector convention throughout: `x @ W` with W shaped [in, out].
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from sorjax import checks
from sorjax.layer_scan import transposed_rows

Array = jax.Array
PyTree = Any


@runtime_checkable
class Cell(Protocol):
  """A recurrent cell: static hyperparameters plus pure methods.

  Implementations are frozen dataclasses (hashable, usable as a static
  argument of `jax.jit`). `precompute` is called on inputs with any leading
  axes ([T, B, D] inside `sorjax.unroll`) and must hold every term that
  depends on the input only; `step` gets one time slice of its output.
  """

  hidden_size: int

  def init(self, key: Array, input_size: int,
           dtype: Any = jnp.float32) -> PyTree: ...

  def initial_carry(self, params: PyTree, batch_shape: tuple[int, ...]
                    ) -> PyTree: ...

  def precompute(self, params: PyTree, xs: Array, **aux: Any) -> PyTree: ...

  def step(self, params: PyTree, carry: PyTree, xp: PyTree
           ) -> tuple[PyTree, Array]: ...


# ---------------------------------------------------------------- checks

def check_positive_int(cell: str, name: str, value: Any) -> None:
  checks.check_int(f"{cell}: {name}", value, 1)


def check_bool(cell: str, name: str, value: Any) -> None:
  checks.check_bool(f"{cell}: {name}", value, error=ValueError)


def check_finite_real(cell: str, name: str, value: Any) -> None:
  """A finite real scalar (a string, array or NaN would reach the gates)."""
  checks.check_number(f"{cell}: {name}", value)


def check_choice(cell: str, name: str, value: Any, choices: tuple) -> None:
  if value not in choices:
    raise ValueError(
        f"{cell}: {name} must be one of {choices}, got {value!r}")


def check_init(cell: Cell, key: Any, dtype: Any) -> None:
  """`cell.init`'s key and dtype: one PRNG key, typed (jax.random.key) or
  legacy uint32 (jax.random.PRNGKey), and a floating dtype; a TypeError
  naming the cell and the argument, where jax would fail inside the
  initialiser (an int key, an int dtype) naming neither."""
  from sorjax.cells import name_of  # the registry imports this module
  where = f"{name_of(cell)}.init"
  kind = getattr(key, "dtype", None)
  if kind is not None and jax.dtypes.issubdtype(kind, jax.dtypes.prng_key):
    ok = jnp.ndim(key) == 0
  else:
    ok = kind == jnp.uint32 and jnp.ndim(key) == 1
  if not ok:
    got = (f"{type(key).__name__} {key!r}" if kind is None else
           f"an array {kind}{list(jnp.shape(key))}")
    raise TypeError(f"{where}: key must be a jax PRNG key "
                    f"(jax.random.key(0)), got {got}")
  check_float_dtype(f"{where}: dtype", dtype)


def check_float_dtype(where: str, dtype: Any) -> Any:
  """`dtype` as a floating jnp dtype that JAX makes as asked; a TypeError
  naming `where` otherwise: float64 without jax_enable_x64 would be made
  float32, with a warning printed once per call site, then silently."""
  try:
    dt = None if dtype is None else jnp.dtype(dtype)
  except TypeError:
    dt = None
  if dt is None or not jnp.issubdtype(dt, jnp.floating):
    raise TypeError(f"{where} must be a floating dtype (e.g. "
                    f"jnp.float32), got {repr(dtype) if dt is None else dt}")
  made = jax.dtypes.canonicalize_dtype(dt)
  if made != dt:
    raise TypeError(f"{where} is {dt}, which JAX makes as {made} unless "
                    "64-bit types are on: jax.config.update("
                    f"'jax_enable_x64', True) first, or ask for {made}")
  return dt


def check_params(where: str, cell: Cell, params: PyTree, input_size: int,
                 source: str = "") -> None:
  """Trace-time check that params have the entries and shapes
  `cell.init(key, input_size)` makes (any dtype): a ValueError that names
  the first missing, unexpected or misshapen entry, where the cell's
  arithmetic would fail later with an anonymous shape error, or, for a
  missing entry, a bare KeyError. source says where input_size came from."""
  want, got = _init_shapes(cell, input_size), _shapes(params)
  made = (f"as {type(cell).__name__}.init makes them for input size "
          f"{input_size}{f', {source}' if source else ''}")
  if got != want:
    d = _input_size_of(cell, got, input_size)
    if d is not None:  # params for another input size: say so, as check_input
      raise _wrong_input_size(where, d, input_size,
                              f" ({source})" if source else "")
  for k, shape in want.items():
    if k not in got:
      raise ValueError(f"{where}: params lack {k} ({made}: "
                       f"{', '.join(want)})")
    if got[k] != shape:
      raise ValueError(f"{where}: params{k} must have shape {shape} "
                       f"({made}), got {got[k]}")
  extra = [k for k in got if k not in want]
  if extra:
    raise ValueError(f"{where}: params hold {', '.join(extra)}, which "
                     f"{type(cell).__name__} does not use ({made}: "
                     f"{', '.join(want)})")


def check_param_dtypes(where: str, params: PyTree) -> None:
  """Every param in one dtype (`cell.init` makes them so): the state's
  dtype is read from the first, so one of another dtype would change the
  state's dtype inside the step (a scan's anonymous carry-type error, or a
  bfloat16 state silently computed in float32)."""
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  if not leaves:
    return
  first = jnp.result_type(leaves[0][1])
  for k, v in leaves[1:]:
    if jnp.result_type(v) != first:
      raise ValueError(
          f"{where}: params{jax.tree_util.keystr(k)} is "
          f"{jnp.result_type(v)}, params{jax.tree_util.keystr(leaves[0][0])}"
          f" {first}: a cell's params share one dtype (cast them all, e.g. "
          f"jax.tree.map(lambda a: a.astype(jnp.{first}), params))")


def check_carry(where: str, cell: Cell, params: PyTree, carry: PyTree,
                batch_shape: tuple[int, ...]) -> None:
  """Trace-time check that carry has the structure, shapes and dtypes of
  `cell.initial_carry(params, batch_shape)`: a ValueError that names the
  first entry that differs, where the step would fail with an anonymous
  broadcasting error or a scan's mismatched carry types, or (a wider
  carry than the params) silently compute the state in the wider dtype."""
  initial = jax.eval_shape(lambda p: cell.initial_carry(p, batch_shape),
                           params)
  _check_carry_like(where, initial, carry, batch_shape)


def _check_carry_like(where: str, initial: PyTree, carry: PyTree,
                      batch_shape: tuple[int, ...]) -> None:
  """check_carry against the initial carry's ShapeDtypeStructs."""
  want, got = _shapes(initial), _shapes(carry)
  if got == want:
    _check_carry_dtypes(where, initial, carry)
    return
  if list(got) != list(want):
    raise ValueError(
        f"{where}: carry must be a {type(initial).__name__} with entries "
        f"{', '.join(want)}; got a {type(carry).__name__} with "
        f"{', '.join(got) or 'none'}")
  k = next(k for k in want if got[k] != want[k])
  raise ValueError(f"{where}: carry{k} must have shape {want[k]} for batch "
                   f"shape {tuple(batch_shape)}, got {got[k]}")


def _check_carry_dtypes(where: str, initial: PyTree, carry: PyTree) -> None:
  for (k, a), b in zip(jax.tree_util.tree_flatten_with_path(initial)[0],
                       jax.tree_util.tree_leaves(carry)):
    got = jnp.result_type(b)
    if got != a.dtype:
      other = (f" (or init the params in {got})"
               if jnp.issubdtype(got, jnp.floating) else "")
      raise ValueError(
          f"{where}: carry{jax.tree_util.keystr(k)} is {got}, but "
          f"cell.initial_carry makes it {a.dtype} for these params: the "
          f"state must stay {a.dtype}; cast the carry{other}")


def _shapes(tree: PyTree) -> dict[str, tuple]:
  """{key path: shape} of a pytree's leaves."""
  return {jax.tree_util.keystr(k): tuple(jnp.shape(v)) for k, v in
          jax.tree_util.tree_flatten_with_path(tree)[0]}


def _input_size_of(cell: Cell, got: dict, input_size: int) -> int | None:
  """The input size d != input_size whose `cell.init` makes exactly the
  shapes got, if there is one. None also for cells whose init takes one
  input size only (the tree cells')."""
  d = _read_input_size(cell, got, input_size)
  if d is not None and d != input_size and _init_shapes(cell, d) == got:
    return d
  return None


def _read_input_size(cell: Cell, got: dict, input_size: int) -> int | None:
  """The input size that the shapes got read, off their first entry whose
  shape grows with the input size (linearly, as every cell's does), whether
  or not the other entries agree; None if none can be read."""
  try:
    a, b = _init_shapes(cell, input_size), _init_shapes(cell, input_size + 1)
  except ValueError:
    return None
  for k in a:
    if a[k] != b[k] and k in got and len(got[k]) == len(a[k]):
      i = next(i for i, (p, q) in enumerate(zip(a[k], b[k])) if p != q)
      steps, rest = divmod(got[k][i] - a[k][i], b[k][i] - a[k][i])
      d = input_size + steps
      return d if rest == 0 and d >= 1 else None
  return None


def _init_shapes(cell: Cell, input_size: int) -> dict[str, tuple]:
  """{key path: shape} of cell.init(key, input_size), traced, not run
  (once per cell and size; every call for a cell that is not hashable)."""
  try:
    hash(cell)
  except TypeError:
    return _init_shapes_of.__wrapped__(cell, input_size)
  return _init_shapes_of(cell, input_size)


@functools.lru_cache(maxsize=256)
def _init_shapes_of(cell: Cell, input_size: int) -> dict[str, tuple]:
  return _shapes(jax.eval_shape(
      lambda: cell.init(jax.random.key(0), input_size)))


def check_input(cell: str, xs: Array, input_size: int) -> None:
  """Trace-time shape check of the last axis of an input."""
  if xs.ndim < 1 or xs.shape[-1] != input_size:
    raise _wrong_input_size(cell, input_size,
                            xs.shape[-1] if xs.ndim else None,
                            f" (shape {tuple(xs.shape)})")


def check_precompute(cell: Cell, params: PyTree, xs: Array) -> None:
  """Trace-time checks of `cell.precompute(params, xs)` (shapes and dtypes
  only): xs an array whose last axis is the params' input size, params
  with the entries and shapes `cell.init` makes for it (check_params), xs
  not promoting their dtype (check_input_dtype). A ValueError naming the
  cell, precompute and the entry, where the cell would fail with a bare
  KeyError or an anonymous shape error."""
  from sorjax.cells import name_of  # the registry imports this module
  where = f"{name_of(cell)}.precompute"
  if not (hasattr(xs, "shape") and hasattr(xs, "dtype")):
    raise ValueError(f"{where}: xs must be an array [..., D], got "
                     f"{type(xs).__name__}")
  if xs.ndim < 1:  # the params' input size, when it can be read
    raise _wrong_input_size(where, _read_input_size(cell, _shapes(params), 1),
                            None, " (a scalar xs)")
  check_params(where, cell, params, xs.shape[-1],
               f"the last axis of xs {tuple(xs.shape)}")
  check_input_dtype(where, params, xs)


def check_input_dtype(where: str, params: PyTree, xs: Array,
                      name: str = "xs") -> None:
  """Trace-time check that xs (named `name`) are floating and do not
  promote the params' dtype: bf16 params with f32 (or complex) inputs
  would compute the state in the wider dtype and fail as a scan's
  mismatched carry types, naming neither; integer inputs would be cast
  silently (token ids 256 and 257 are one bfloat16)."""
  check_param_dtypes(where, params)
  p = param_dtype(params)
  if not jnp.issubdtype(xs.dtype, jnp.inexact):
    raise ValueError(
        f"{where}: {name} are {xs.dtype}; cells read floating vectors "
        f"(embed token ids first, or cast: {name}.astype(jnp.{p}))")
  with jax.numpy_dtype_promotion("standard"):
    wider = jnp.result_type(xs.dtype, p) != p
  if wider:
    other = (f" or init the params in {xs.dtype}"
             if jnp.issubdtype(xs.dtype, jnp.floating) else "")
    raise ValueError(
        f"{where}: {name} are {xs.dtype} but the params {p}: the state "
        f"would not stay {p}; cast {name} ({name}.astype(jnp.{p})){other}")
  if not _keeps_dtype(xs.dtype, p):   # narrower: strict promotion refuses
    raise ValueError(
        f"{where}: {name} are {xs.dtype} and the params {p}, a pair that "
        f"strict dtype promotion (jax_numpy_dtype_promotion='strict') "
        f"refuses to mix; cast {name} ({name}.astype(jnp.{p}))")


def _keeps_dtype(dtype, p) -> bool:
  """Whether dtype combined with p stays p."""
  try:
    return jnp.result_type(dtype, p) == p
  except jax.dtypes.TypePromotionError:  # strict promotion refuses the pair
    return False


def _wrong_input_size(where: str, input_size: int, got, detail: str
                      ) -> ValueError:
  """The error of inputs whose last axis is not the params' input size."""
  return ValueError(
      f"{where}: inputs must have last axis = the input size {input_size} "
      f"the params were initialised for; got last axis {got}{detail}")


# ---------------------------------------------------------------- activations

ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "tanh": jnp.tanh,
    "identity": lambda x: x,
    "relu": jax.nn.relu,
    "sigmoid": jax.nn.sigmoid,
}


def activation(name: str) -> Callable[[Array], Array]:
  return ACTIVATIONS[name]


# ---------------------------------------------------------------- initialisers

def uniform(key: Array, shape: tuple[int, ...], fan_in: int,
            dtype: Any = jnp.float32) -> Array:
  """U(-1/sqrt(fan_in), 1/sqrt(fan_in)), the usual RNN initialisation."""
  bound = 1.0 / math.sqrt(max(fan_in, 1))
  return jax.random.uniform(key, shape, dtype, -bound, bound)


def zeros(shape: tuple[int, ...], dtype: Any = jnp.float32) -> Array:
  return jnp.zeros(shape, dtype)


# An LSTM's bias: zeros, or U(-1/sqrt(H), 1/sqrt(H)) as its weights (Mahto
# et al. 3.1.1: "All weights and biases ... uniformly initialized").
BIAS_INITS = ("zeros", "uniform")


def lstm_bias(key: Array, bias_init: str, shape: tuple[int, ...],
              hidden_size: int, dtype: Any) -> Array:
  """A bias of `shape` by `bias_init` (one of BIAS_INITS). The key is
  folded, not split, so the weights drawn beside it stay as with zeros."""
  if bias_init == "zeros":
    return zeros(shape, dtype)
  return uniform(jax.random.fold_in(key, 2), shape, hidden_size, dtype)


def param_dtype(params: PyTree) -> Any:
  """The dtype of a cell's parameters (of its first leaf)."""
  return jax.tree_util.tree_leaves(params)[0].dtype


# ---------------------------------------------------------------- carries

class HCarry(NamedTuple):
  """Carry of cells whose whole state is the hidden vector."""
  h: Array


class LSTMCarry(NamedTuple):
  """Carry of LSTM-family cells: hidden output h and memory c."""
  h: Array
  c: Array


# ---------------------------------------------------------------- steps

def split_step(cell: Cell, params: PyTree, carry: PyTree, xp: PyTree
               ) -> tuple[PyTree, Array]:
  """`step` of a cell with a split step (`sorjax.unroll`'s module doc):
  post(q, carry, xp, r_{t-1} W) with (W, q) = split(params) and r_{t-1} =
  recurrent_input(carry), its new carry checked by `check_step`."""
  def step():
    W, q = cell.split(params)
    return cell.post(q, carry, xp, cell.recurrent_input(carry) @ W)
  return check_step(cell, carry, xp, step, params)


def batch_shape(shape) -> tuple[int, ...]:
  """`initial_carry`'s batch_shape as a tuple of ints (an int B: (B,))."""
  if checks.is_int(shape):
    shape = (shape,)
  try:
    out = tuple(shape)
  except TypeError:
    out = None
  if out is None or not all(checks.is_int(d) and d >= 0 for d in out):
    raise ValueError(f"initial_carry: batch_shape must be a tuple of ints "
                     f">= 0 (e.g. (B,)), got {shape!r}")
  return tuple(int(d) for d in out)


def check_step(cell: Cell, carry: PyTree, xp: PyTree, step: Callable,
               params: PyTree = None):
  """step() = (new carry, y) of one step of cell, checked at trace time
  (static shapes and dtypes: once per trace, nothing in the program).
  Each a ValueError naming the cell, step and the entry:

  - params (None for a step that reads none, dyck_rnn's) with the entries
    and shapes `cell.init` makes at some input size: else a bare KeyError,
    or a shape error blaming xp;
  - the carry with the structure, shapes and dtypes `cell.initial_carry`
    makes for its batch shape: else an AttributeError, a broadcast, or a
    bfloat16 state silently computed in float32;
  - xp with those of `cell.precompute` of one step of that batch shape. An
    xp of a whole sequence ([B, T, ..]) fails to broadcast against the
    carry (an error naming neither) or, where T = B, broadcasts into a
    carry of another shape; one of batch 1 against a carry of batch B, or
    of another input width (tensor_rnn's x of D*H), broadcasts silently
    into a carry of the right shape."""
  from sorjax.cells import name_of  # the registry imports this module
  where = f"{name_of(cell)}.step"
  show = lambda d: ", ".join(  # noqa: E731
      f"{k} {v}".strip() for k, v in d.items())
  leaves = jax.tree_util.tree_leaves(carry)
  batch = tuple(jnp.shape(leaves[0]))[:-1] if leaves else ()
  if params is None:  # any input size; the carry's dtype is the state's
    d, dtype = 1, jnp.result_type(leaves[0]) if leaves else jnp.float32
  else:
    d, dtype = _step_input_size(where, cell, params), param_dtype(params)
    check_param_dtypes(where, params)
    if not jnp.issubdtype(dtype, jnp.floating):
      raise ValueError(f"{where}: params must be floating (cell.init(key, "
                       f"input_size, dtype)), got {dtype}")
  initial, terms = _step_structs(cell, d, dtype, batch)
  _check_carry_like(where, initial, carry, batch)
  want = _shapes(carry)
  must = (f"{where}: xp must be one step's input terms "
          f"(cell.precompute(params, xs[:, t])), for the carry's batch shape "
          f"{batch}")
  of = "carry is" if params is None else "params are"
  try:
    out = step()
  except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
    _check_step_input(where, must, terms, xp, dtype, of, shapes=False)
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise ValueError(f"{must}: the carry ({show(want)}) and xp "
                     f"({show(_shapes(xp))}) do not combine ({first})") from e
  got = _shapes(out[0])
  if got != want:
    raise ValueError(f"{must}: the carry ({show(want)}) became ({show(got)}) "
                     f"with xp ({show(_shapes(xp))})")
  _check_step_input(where, must, terms, xp, dtype, of, shapes=True)
  for (k, a), b in zip(jax.tree_util.tree_flatten_with_path(carry)[0],
                       jax.tree_util.tree_leaves(out[0])):
    if jnp.result_type(a) != jnp.result_type(b):
      raise ValueError(
          f"{where}: carry{jax.tree_util.keystr(k)} went in "
          f"{jnp.result_type(a)} and came out {jnp.result_type(b)}: params "
          "and xp must be in the state's dtype")
  return out


def _step_input_size(where: str, cell: Cell, params: PyTree) -> int:
  """The input size whose `cell.init` makes params' entries and shapes; a
  ValueError naming the first entry that differs when there is none."""
  got = _shapes(params)
  if _init_shapes(cell, 1) == got:
    return 1
  d = _input_size_of(cell, got, 1)
  if d is not None:
    return d
  d = _read_input_size(cell, got, 1) or 1  # name entries at the size read
  want, name = _init_shapes(cell, d), type(cell).__name__
  missing = [k for k in want if k not in got]
  extra = [k for k in got if k not in want]
  if missing:
    detail = f"they lack {missing[0]}"
  elif extra:
    detail = f"they hold {extra[0]}, which {name} does not use"
  else:
    k = next(k for k in want if got[k] != want[k])
    detail = (f"params{k} has shape {got[k]}; {name}.init makes {want[k]} "
              f"for input size {d}")
  shown = ", ".join(f"{k} {v}" for k, v in got.items())
  raise ValueError(f"{where}: params ({shown}) do not have the shapes "
                   f"{name}.init makes for hidden_size {cell.hidden_size} "
                   f"at any input size ({detail})")


def _check_step_input(where: str, must: str, terms: PyTree, xp: PyTree,
                      dtype, of: str, shapes: bool) -> None:
  """xp against one step's input terms (ShapeDtypeStructs): structure,
  dtypes that keep the state's dtype, and with `shapes` the shapes."""
  def what(tree, entries):
    if list(entries) == [""]:
      return "an array"
    return (f"a {type(tree).__name__} with entries "
            f"{', '.join(entries) or 'none'}")
  want, got = _shapes(terms), _shapes(xp)
  if list(got) != list(want):
    raise ValueError(f"{must}: xp is {what(xp, got)}; cell.precompute "
                     f"makes {what(terms, want)}")
  for k, a in zip(want, jax.tree_util.tree_leaves(xp)):
    if not _keeps_dtype(jnp.result_type(a), dtype):
      raise ValueError(
          f"{where}: xp{k} is {jnp.result_type(a)} but the {of} {dtype}: "
          f"the state would not stay {dtype}; make xp with cell.precompute "
          f"from {dtype} inputs")
  k = next((k for k in want if got[k] != want[k]), None)
  if shapes and k is not None:
    raise ValueError(f"{must}: xp{k} has shape {got[k]}; cell.precompute "
                     f"makes {want[k]}")


def _step_structs(cell: Cell, input_size: int, dtype, batch_shape: tuple):
  """(initial carry, one step's precompute) of cell for params
  `cell.init(key, input_size, dtype)` and batch_shape, as
  ShapeDtypeStructs (once per cell, size, dtype and batch shape; every
  call for a cell that is not hashable)."""
  args = (cell, input_size, jnp.dtype(dtype), tuple(batch_shape))
  try:
    hash(cell)
  except TypeError:
    return _step_structs_of.__wrapped__(*args)
  return _step_structs_of(*args)


@functools.lru_cache(maxsize=256)
def _step_structs_of(cell, input_size, dtype, batch_shape):
  # an aux that precompute requires (default None: assignment_lstm's
  # assignment) is an int per example
  aux = {k: jax.ShapeDtypeStruct(batch_shape, jnp.int32) for k, p in
         inspect.signature(cell.precompute).parameters.items()
         if p.default is None}

  def structs(aux):  # the key made inside: traced here, not in the caller's
    p = cell.init(jax.random.key(0), input_size, dtype)  # trace (a step's)
    x = jnp.zeros((*batch_shape, input_size), dtype)
    return cell.initial_carry(p, batch_shape), cell.precompute(p, x, **aux)
  return jax.eval_shape(structs, aux)


# ---------------------------------------------------------------- algebra

def lift(v: Array, ndim: int) -> Array:
  """Prepends unit axes so v has rank ndim: explicit broadcasting that the
  strict `jax_numpy_rank_promotion="raise"` mode accepts."""
  return v.reshape((1,) * (ndim - v.ndim) + v.shape)


def affine(x: Array, W: Array, b: Array) -> Array:
  """x @ W + b over any leading axes of x."""
  y = x @ W
  return y + lift(b, y.ndim)


def input_products(xs: Array, *Ws: Array) -> tuple[Array, ...]:
  """(xs @ W_1, .., xs @ W_n) over any leading axes of xs, one matmul each,
  for the hoisted input terms of cells that take several products of x.

  Their gradients to the Ws are sums over xs's rows, sum_r x_r^T dy_r.
  Autodiff of `xs @ W` forms each as a dot that contracts both operands
  along the rows, which XLA:CPU runs slower than from x^T in memory (a
  skinny [6400, 512]^T x [6400, 4]: 4.6 against 0.3 ms). Here the
  tangents read xs's rows transposed once (`layer_scan.transposed_rows`,
  in memory on CPU only), and the weight gradients are products from that
  copy. The copy is a pass over xs, made in the forward pass of a
  differentiated call and kept until the backward (a call that is not
  differentiated makes none), so it pays only where it serves enough:
  mm_rnn's two input terms, 1.02-1.05x its training step, and the attention
  LSTMs' one wide [D, S*4H] product (session 35, with `row_products`' wide
  rule: 1.21x at B=64 T=100 H=512 on a Zen 3 EPYC); not mlstm's (1.00x;
  BUILD_NOTES, "Input products from transposed rows"). The language
  model's decoder forms dW and db together (`affine_products`).
  A custom JVP, so forward mode, reverse mode, vmap and higher orders all
  go through it."""
  return _input_products(xs, Ws)


@jax.custom_jvp
def _input_products(xs, Ws):
  return tuple(xs @ W for W in Ws)


def _input_products_jvp(primals, tangents):
  xs, Ws = primals
  dxs, dWs = tangents
  ys = _input_products(xs, Ws)
  xT = None  # x^T [D, R], only when some W has a tangent
  dys = []
  for y, W, dW in zip(ys, Ws, dWs):
    parts = [] if type(dxs) is SymbolicZero else [dxs @ W]
    if type(dW) is not SymbolicZero:
      xT = transposed_rows(xs) if xT is None else xT
      parts.append((xT.T @ dW).reshape(y.shape))       # sum_r x_r^T dy_r
    dys.append(sum(parts[1:], parts[0]) if parts else jnp.zeros_like(y))
  return ys, tuple(dys)


_input_products.defjvp(_input_products_jvp, symbolic_zeros=True)


def affine_products(xs: Array, W: Array, b: Array) -> Array:
  """`affine(xs, W, b)`, xs @ W + b over any leading axes of xs (a
  decoder's logits), with both gradients formed by one product:
  [dW; db] = [xs^T; 1^T] dy, from xs's rows transposed in memory
  (`transposed_rows`) with a row of ones below.

  Autodiff's db, a reduction over the rows, ran on YNNPACK (XLA:CPU, jax
  0.10.2) 70x slower than a product (a [4480, 33278] WikiText-2 cotangent:
  1.3 s), and a separate 1^T dy compiled, under the training loop's vmap
  over replicas, to a transposed copy of the whole [rows, V] cotangent
  before a matrix-vector product: 1.97 of 6.9 s in a WikiText-2 step
  (lin_wikitext2:lstm, B=64 T=70), 0.37 of 0.83 s at PTB words
  (BUILD_NOTES, "The decoder's two gradients as one product"). db equals
  the cotangent's row sum to float rounding. A custom JVP, so forward
  mode, vmap and higher orders go through it. Inputs of different dtypes
  are promoted first, as `xs @ W + b` promotes them."""
  dtype = jnp.result_type(xs, W, b)
  return _affine_products(*(a.astype(dtype) for a in (xs, W, b)))


@jax.custom_jvp
def _affine_products(xs, W, b):
  return affine(xs, W, b)


def _affine_products_jvp(primals, tangents):
  xs, W, b = primals
  dxs, dW, db = tangents
  y = _affine_products(xs, W, b)
  parts = [] if type(dxs) is SymbolicZero else [dxs @ W]
  # the rows of x W + 1 b whose tangents are needed, one product of them
  rows, ds = [], []
  if type(dW) is not SymbolicZero:
    rows.append(xs)
    ds.append(dW)
  if type(db) is not SymbolicZero:
    rows.append(jnp.ones((*xs.shape[:-1], 1), xs.dtype))
    ds.append(db[None])
  if rows:
    xT1 = transposed_rows(jnp.concatenate(rows, -1))          # [D (+1), R]
    parts.append((xT1.T @ jnp.concatenate(ds)).reshape(y.shape))
  return y, (sum(parts[1:], parts[0]) if parts else jnp.zeros_like(y))


_affine_products.defjvp(_affine_products_jvp, symbolic_zeros=True)
