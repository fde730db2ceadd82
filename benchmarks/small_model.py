"""The small-model regime of the Dyck experiments, per core (issue 7).

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \
      python -m benchmarks.small_model
      [--sections dyck,replicas,floor,codegen,paths] [--rounds 5]
      [--min-seconds 0.3] [--path-shapes "10,200,12;32,100,256"]
      [--small-loops]

B=10 T=200 H=12 (D = H): Lin et al. train LSTMs of hidden 3m with batch 10,
20 seeds each. Every JAX timing is CPU time of this process
(`time.process_time`); torch.nn.LSTM runs in `benchmarks.torch_worker` on
one thread (its reply's CPU time). Contenders of a table are timed in
rotating rounds; a ratio is the median of per-round ratios, so load that
drifts between rounds cancels. Sections:

- dyck: one training step (forward + backward through time, fixed output
  cotangent, no optimizer: what torch's `loss.backward()` does) of
  torch.nn.LSTM, `sorjax.unroll` (autodiff; and the split-step batched-dW
  path when `unroll` has `fused_grad`) and `sorjax.fused_lstm.lstm_scan`.
- replicas: one Adam step of 1 model vs R vmapped replicas (every replica its
  own params and batch) for the same contenders, plus a minimal LSTM scan
  whose recurrent product is a dot, a static Python loop over the H input
  rows (`acc += h[..., k, None] * W[k]`, one fused elementwise loop), or a
  broadcast-multiply-and-sum.
- lanes: forward + backward (fixed output cotangent) of one
  `fused_lstm.lstm_layer`, of R of them vmapped, and of the R layers in
  vectorised lanes (`benchmarks.replica_lanes`: replicas and batch in the
  minor dimension, products as H unrolled multiply-adds).
- floor: the LSTM's elementwise work alone (no matmul: the product replaced
  by one multiply), forward + hand-written backward on flat vectorised
  lanes, for 1 model (B*H = 120 lanes) and R models (R*B*H lanes), next to
  one model's complete step. If R models' elementwise work alone costs more
  than 3x one model's complete step, no formulation of the product can meet
  "R replicas in <= 3x one model" with this code generator.
- codegen: one elementwise op in a scan, minor dimension small vs large:
  XLA:CPU emits scalar code for small minor dimensions.
- paths: for lstm at each of --path-shapes, what `unroll` runs by default
  (`fused_lstm.lstm_layer`) vs `fused_lstm.lstm_scan` of a precomputed xp,
  the generic batched-dW scan, autodiff and flax (the measurements behind
  `_lstm_layer_args` in sorjax/unroll.py).
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import sorjax
from sorjax import cells, small_loops
from sorjax.cells.base import LSTMCarry
from sorjax.cells.lstm import LSTM
from benchmarks import flags, replica_lanes
from benchmarks.jax_worker import JaxCase
from sorjax.fused_lstm import lstm_layer, lstm_scan
from sorjax.layer_scan import scan_prefetch

B, T, H = SHAPE = 10, 200, 12   # SHAPE: --shape's default
CLOCK = time.process_time   # --clock wall: time.perf_counter
D = H
SECTIONS = ("dyck", "replicas", "lanes", "floor", "codegen", "paths",
            "layouts")


# ------------------------------------------------------------------ timing

class Case:
  """A compiled step; `stateful` steps feed their output back (Adam).
  clock: a timer (default: this script's --clock, read at each timing)."""

  def __init__(self, label, fn, args, stateful=False, donate=False,
               clock=None):
    self.label, self.clock = label, clock
    jfn = jax.jit(fn, donate_argnums=0 if donate else ())
    self.compiled = jfn.lower(*args).compile()
    self.args, self.stateful = list(args), stateful
    self.run(2)

  run = JaxCase.run    # n calls, feeding stateful outputs back

  def time(self, n):
    clock = self.clock or CLOCK
    t0 = clock()
    self.run(n)
    return clock() - t0


TORCH_TIMEOUT_S = 600  # the torch worker's reply, e.g. a timing


class TorchLSTM:
  """torch.nn.LSTM in its own worker process, one thread."""
  label = "torch.nn.LSTM"

  def __init__(self):
    from benchmarks.workers import Worker
    os.environ["SORJAX_BENCH_TORCH_THREADS"] = "1"
    self.w = Worker("benchmarks.torch_worker",
                    Path(tempfile.gettempdir())
                    / f"sorjax-small-model-{os.getpid()}.log")
    rep = self.w.request(600, cmd="prepare", id="lstm", spec=dict(
        impl="torch_lstm", B=B, T=T, D=D, H=H))
    if not rep.get("ok"):
      raise RuntimeError(rep.get("error"))

  def time(self, n):
    rep = self.w.request(TORCH_TIMEOUT_S, cmd="time", id="lstm", n=n)
    return rep["cpu_seconds"]

  def close(self):
    self.w.close()


def rounds(cases, n_rounds, min_s):
  """Per-step seconds of each case (by its own clock: CPU time unless it
  says otherwise), per round, order rotating."""
  reps = {}
  for c in cases:  # calibrate: enough steps for min_s
    n = 1
    while (dt := c.time(n)) < min_s / 4:
      n *= 2
    reps[c.label] = max(1, round(n * min_s / max(dt, 1e-9)))
  out = {c.label: [] for c in cases}
  for r in range(n_rounds):
    for c in cases[r % len(cases):] + cases[:r % len(cases)]:
      out[c.label].append(c.time(reps[c.label]) / reps[c.label])
  return out


def ratio(ts, num, den):
  """Median over rounds of ts[num] / ts[den] (time ratio)."""
  return statistics.median(a / b for a, b in zip(ts[num], ts[den]))


def table(header, rows):
  lines = ["| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
  return "\n".join(lines)


# ------------------------------------------------------------------ models

CELL = cells.make("lstm", hidden_size=H)


def set_shape(b: int, t: int, h: int) -> None:
  """Every section's B, T, H (D = H)."""
  global B, T, H, D, CELL
  B, T, H, D = b, t, h, h
  CELL = cells.make("lstm", hidden_size=H)


HAS_FUSED_GRAD = "fused_grad" in inspect.signature(sorjax.unroll).parameters


def fwd_unroll(fused_grad):
  opts = {"fused_grad": fused_grad} if HAS_FUSED_GRAD else {}

  def fwd(p, xs):
    return sorjax.unroll(CELL, p, xs, **opts)[1]
  return fwd


def fwd_fused(p, xs):
  xp = jnp.swapaxes(CELL.precompute(p, xs), 0, 1)
  _, ys = lstm_scan(p["W_h"], xp, CELL.initial_carry(p, (xs.shape[0],)),
                    forget_bias=CELL.forget_bias)
  return jnp.swapaxes(ys, 0, 1)


def product(kind):
  """h [.., H] times W [H, N]: dot, rows (static loop), reduce."""
  def mm(h, W):
    if kind == "dot":
      return h @ W
    if kind == "rows":
      acc = h[..., 0:1] * W[0]
      for k in range(1, W.shape[0]):
        acc = acc + h[..., k:k + 1] * W[k]
      return acc
    return jnp.sum(h[..., :, None] * W, axis=-2)
  return mm


def fwd_minimal(kind):
  """A minimal LSTM scan (hoisted x W_x + b) with the product `kind`."""
  mm = product(kind)

  def fwd(p, xs):
    xp = jnp.swapaxes(xs, 0, 1) @ p["W_x"] + p["b"]

    def body(carry, x):
      h, c = carry
      new = cells.lstm.lstm_update(x + mm(h, p["W_h"]), c)
      return (new.h, new.c), new.h
    z = jnp.zeros((xs.shape[0], H), xs.dtype)
    return jnp.swapaxes(jax.lax.scan(body, (z, z), xp)[1], 0, 1)
  return fwd


CONTENDERS = {
    "sorjax.unroll (autodiff)": fwd_unroll(False),
    **({"sorjax.unroll (fused_grad)": fwd_unroll(True)} if HAS_FUSED_GRAD
       else {}),
    "fused_lstm.lstm_scan": fwd_fused,
}


class _GenericLSTM(LSTM):
  """The LSTM by another type: `fused_lstm.lstm_args` refuses it, so
  `unroll(fused_grad=True)` runs the generic split-step scan on it."""


def fwd_generic(p, xs):
  cell = _GenericLSTM(hidden_size=H)
  return sorjax.unroll(cell, p, xs, fused_grad=True)[1]


def fwd_flax(p, xs):
  """flax.linen.RNN(OptimizedLSTMCell) with sorjax's lstm weights (the same
  FLOPs; the values do not matter for timing)."""
  import flax.linen as nn
  cell = nn.OptimizedLSTMCell(H)
  W_x, W_h, b = p["W_x"], p["W_h"], p["b"]
  gates = ("i", "f", "g", "o")
  params = {f"i{g}": {"kernel": W_x[:, k * H:(k + 1) * H]}
            for k, g in enumerate(gates)}
  params.update({f"h{g}": {"kernel": W_h[:, k * H:(k + 1) * H],
                           "bias": b[k * H:(k + 1) * H]}
                 for k, g in enumerate(gates)})
  return nn.RNN(cell).apply({"params": {"cell": params}}, xs)


# The paths `unroll` can take for an lstm, compared per shape (section
# "paths"), and flax's LSTM; the first is what `unroll` picks by default.
PATHS = {
    "unroll default": fwd_unroll(None),
    "fused_lstm.lstm_scan": fwd_fused,
    "generic fused_grad": fwd_generic,
    "autodiff": fwd_unroll(False),
    "flax OptimizedLSTMCell": fwd_flax,
}
PATH_SHAPES = ((10, 200, 12), (10, 200, 16), (10, 200, 24), (10, 200, 32),
               (32, 100, 64), (32, 100, 128), (32, 100, 256),
               (64, 100, 512), (32, 200, 1024))


def grad_case(label, fwd):
  k1, k2 = jax.random.split(jax.random.key(1))
  xs = jax.random.normal(k1, (B, T, D))
  G = jax.random.normal(k2, (B, T, H))

  def step(p, xs, G):
    return jax.vjp(lambda p: fwd(p, xs), p)[1](G)[0]
  return Case(label, step, (CELL.init(jax.random.key(0), D), xs, G))


def adam_case(label, fwd, R):
  tx = optax.adam(1e-3)

  def step(state, xs, G):
    p, o = state
    g = jax.vjp(lambda p: fwd(p, xs), p)[1](G)[0]
    u, o = tx.update(g, o, p)
    return optax.apply_updates(p, u), o

  def init(k):
    p = CELL.init(k, D)
    return p, tx.init(p)

  lead = (R,) if R else ()
  k1, k2 = jax.random.split(jax.random.key(1))
  xs = jax.random.normal(k1, (*lead, B, T, D))
  G = jax.random.normal(k2, (*lead, B, T, H))
  if R:
    state = jax.vmap(init)(jax.random.split(jax.random.key(0), R))
    step = jax.vmap(step)
  else:
    state = init(jax.random.key(0))
  return Case(label, step, (state, xs, G), stateful=True, donate=True)


# ------------------------------------------------------------------ sections

def section_dyck(args):
  cases = [grad_case(k, f) for k, f in CONTENDERS.items()]
  torch_c = None
  try:
    torch_c = TorchLSTM()
    cases = [torch_c] + cases
  except Exception as e:  # torch not installed: JAX-only table
    print(f"(torch.nn.LSTM skipped: {type(e).__name__}: {e})\n")
  try:
    ts = rounds(cases, args.rounds, args.min_seconds)
  finally:
    if torch_c is not None:
      torch_c.close()
  base = cases[0].label
  rows = [[c.label, f"{1e6 * statistics.median(ts[c.label]) / T:.2f}",
           f"{ratio(ts, base, c.label):.2f}x"] for c in cases]
  print(f"## One model, forward + backward (B={B} T={T} H={H})\n")
  print(table(["implementation", "us per time step", f"speed vs {base}"],
              rows) + "\n")


def per_shape(args, contenders, row):
  """For each of --path-shapes: time `contenders` (label -> fwd) in rounds
  and make a table row `row(ts)`; the shape is restored after."""
  rows, before = [], (B, T, H)
  for shape in args.path_shapes:
    set_shape(*shape)
    cases = [grad_case(k, f) for k, f in contenders.items()]
    rows.append([f"({B}, {T}, {H})"]
                + row(rounds(cases, args.rounds, args.min_seconds)))
    print(f"  {rows[-1]}", flush=True)
  set_shape(*before)
  return rows


def section_paths(args):
  """What `unroll` runs for lstm by default (fused_lstm.lstm_layer) vs
  fused_lstm.lstm_scan of a precomputed xp, the generic batched-dW scan,
  autodiff and flax, per shape."""
  d = "unroll default"
  rows = per_shape(args, PATHS, lambda ts: (
      [f"{B * T / statistics.median(ts[d]):,.0f}"]
      + [f"{ratio(ts, other, d):.2f}x"
         for other in ("fused_lstm.lstm_scan", "generic fused_grad",
                       "autodiff", "flax OptimizedLSTMCell")]))
  print("## lstm paths through unroll, forward + backward\n")
  print(table(["(B, T, H)", f"default tokens/{args.clock}-s",
               "default vs lstm_scan", "default vs generic fused_grad",
               "default vs autodiff", "default vs flax"], rows) + "\n")


def fwd_layer(layout):
  """fused_lstm.lstm_layer in the given layout (None: its default)."""
  def fwd(p, xs):
    _, ys = lstm_layer(p["W_h"], p["W_x"], p["b"], jnp.swapaxes(xs, 0, 1),
                       CELL.initial_carry(p, (xs.shape[0],)),
                       forget_bias=CELL.forget_bias, layout=layout)
    return jnp.swapaxes(ys, 0, 1)
  return fwd


LAYOUTS = {
    "lstm_layer batch_major": fwd_layer("batch_major"),
    "lstm_layer gate_major": fwd_layer("gate_major"),
    "flax OptimizedLSTMCell": fwd_flax,
}


def section_layouts(args):
  """fused_lstm.lstm_layer's two layouts against flax, per shape: the
  measurements behind GATE_MAJOR_FROM in sorjax/fused_lstm.py."""
  fl = "flax OptimizedLSTMCell"
  rows = per_shape(args, LAYOUTS, lambda ts: (
      [f"{B * T / statistics.median(ts[k]):,.0f}" for k in LAYOUTS]
      + [f"{ratio(ts, fl, k):.2f}x" for k in list(LAYOUTS)[:2]]))
  print("## lstm_layer layouts, forward + backward\n")
  print(table(["(B, T, H)"] + [f"{k} tokens/{args.clock}-s" for k in LAYOUTS]
              + ["batch_major vs flax", "gate_major vs flax"], rows) + "\n")


def section_replicas(args):
  R = args.replicas
  fwds = dict(CONTENDERS)
  fwds.update({f"minimal scan, product={k}": fwd_minimal(k)
               for k in ("dot", "rows", "reduce")})
  rows = []
  for label, fwd in fwds.items():
    one, many = adam_case(f"{label} x1", fwd, 0), adam_case(
        f"{label} x{R}", fwd, R)
    ts = rounds([one, many], args.rounds, args.min_seconds)
    rows.append([label, f"{1e6 * statistics.median(ts[one.label]) / T:.2f}",
                 f"{1e6 * statistics.median(ts[many.label]) / T:.2f}",
                 f"{ratio(ts, many.label, one.label):.1f}x"])
  print(f"## {R} replicas (vmap) vs one model, one Adam step\n")
  print(table(["step", "x1 us per time step", f"x{R} us per time step",
               f"x{R} time / x1 time"], rows) + "\n")


def layer_grad(fwd, lead=()):
  """(step, args): d<fwd(W_h, W_x, b, xs), G>/d(W_h, W_x, b) at D = H,
  with a leading `lead` axis (the replicas) on every array."""
  k = jax.random.split(jax.random.key(4), 5)
  p = (0.3 * jax.random.normal(k[0], (*lead, H, 4 * H)),
       0.3 * jax.random.normal(k[1], (*lead, D, 4 * H)),
       0.1 * jax.random.normal(k[2], (*lead, 4 * H)))
  xs = jax.random.normal(k[3], (*lead, B, T, D))
  G = jax.random.normal(k[4], (*lead, B, T, H))

  def step(p, xs, G):
    return jax.vjp(lambda p: fwd(*p, xs), p)[1](G)[0]
  return step, (p, xs, G)


def one_layer(W_h, W_x, b, xs):
  """`fused_lstm.lstm_layer` from zero state, [B, T, D] -> [B, T, H]."""
  zero = jnp.zeros((xs.shape[0], H), xs.dtype)
  _, ys = lstm_layer(W_h, W_x, b, jnp.swapaxes(xs, 0, 1),
                     LSTMCarry(zero, zero))
  return jnp.swapaxes(ys, 0, 1)


def section_lanes(args):
  R = args.replicas
  one, one_args = layer_grad(one_layer)
  vm, vm_args = layer_grad(one_layer, (R,))
  ln, _ = layer_grad(replica_lanes.lstm_replicas, (R,))
  cases = [Case("one model (fused_lstm.lstm_layer)", one, one_args),
           Case(f"{R} replicas, vmap", jax.vmap(vm), vm_args),
           Case(f"{R} replicas in lanes (benchmarks.replica_lanes)", ln,
                vm_args)]
  ts = rounds(cases, args.rounds, args.min_seconds)
  base = cases[0].label
  rows = [[c.label, f"{1e6 * statistics.median(ts[c.label]) / T:.2f}",
           f"{ratio(ts, c.label, base):.2f}x"] for c in cases]
  print(f"## {R} replicas in lanes vs vmap, forward + backward of the "
        f"layer (B={B} T={T} H={H})\n")
  print(table(["computation", "us per time step", "time vs one model"],
              rows) + "\n")


def elementwise_floor(N):
  """LSTM elementwise work alone on N flat lanes, forward + backward."""
  sig = jax.nn.sigmoid

  def f(xp, dys):                                   # [T, 4, N], [T, N]
    def fb(carry, x):
      h, c = carry
      z = x + 0.5 * h[None, :]                      # stand-in for h W_h
      A = jnp.stack([sig(z[0]), sig(z[1]), jnp.tanh(z[2]), sig(z[3])])
      c2 = A[1] * c + A[0] * A[2]
      return (A[3] * jnp.tanh(c2), c2), (A, c)
    z0 = jnp.zeros((N,), xp.dtype)
    _, (As, cs) = scan_prefetch(fb, (z0, z0), xp)

    def bb(carry, inp):
      dh, dc = carry
      A, c0, dy = inp
      si, sf, tg, so = A[0], A[1], A[2], A[3]
      tc = jnp.tanh(sf * c0 + si * tg)
      dh = dh + dy
      dct = dc + dh * so * (1 - tc * tc)
      dz = jnp.stack([dct * tg * si * (1 - si), dct * c0 * sf * (1 - sf),
                      dct * si * (1 - tg * tg), dh * tc * so * (1 - so)])
      return (0.5 * jnp.sum(dz, 0), dct * sf), dz
    return scan_prefetch(bb, (z0, z0), (As, cs, dys), reverse=True)[1]

  k1, k2 = jax.random.split(jax.random.key(3))
  return f, (jax.random.normal(k1, (T, 4, N)), jax.random.normal(k2, (T, N)))


def section_floor(args):
  R = args.replicas
  f1, a1 = elementwise_floor(B * H)
  fR, aR = elementwise_floor(R * B * H)
  cases = [grad_case("one model, complete step (fused_lstm)", fwd_fused),
           grad_case("one model, complete step (sorjax.unroll)",
                     fwd_unroll(False)),
           Case(f"elementwise only, {B * H} lanes (1 model)", f1, a1),
           Case(f"elementwise only, {R * B * H} lanes ({R} models)", fR, aR)]
  ts = rounds(cases, args.rounds, args.min_seconds)
  last = cases[-1].label
  rows = [[c.label, f"{1e6 * statistics.median(ts[c.label]) / T:.2f}",
           f"{ratio(ts, last, c.label):.2f}x"] for c in cases]
  print(f"## Floor: {R} models' elementwise work alone vs one model\n")
  print(table(["computation (forward + backward)", "us per time step",
               f"{R}-model elementwise time / this"], rows) + "\n")


def section_codegen(args):
  def scan_of(op):
    def f(x):
      return jax.lax.scan(lambda c, _: (op(c), None), x, None, length=T)[0]
    return f

  ops = {"x * 0.9 + 0.01": lambda c: c * 0.9 + 0.01,
         "tanh(x) * 0.9": lambda c: jnp.tanh(c) * 0.9}
  cases, elems = [], {}
  for name, op in ops.items():
    for shape in ((60, 40), (40, 60), (200, 48), (48, 200), (10, 12),
                  (120,)):
      label = f"{name} on {list(shape)}"
      cases.append(Case(label, scan_of(op), (jnp.full(shape, 0.3),)))
      elems[label] = int(np.prod(shape))
  ts = rounds(cases, args.rounds, args.min_seconds)
  rows = [[c.label, f"{1e9 * statistics.median(ts[c.label]) / T / elems[c.label]:.3f}"]
          for c in cases]
  print("## XLA:CPU elementwise code by minor dimension (one op per scan "
        "step)\n")
  print(table(["op and shape", "ns per element"], rows) + "\n")


def shape_arg(ap, flag, text):
  """--flag's B,T,H: three positive ints, or the parser's error naming it."""
  try:
    shape = tuple(int(v) for v in text.split(","))
  except ValueError:
    shape = ()
  if len(shape) != 3 or min(shape) < 1:
    ap.error(f"{flag}: want three positive ints B,T,H, got {text!r}")
  return shape


def chosen_sections(ap, text, sections):
  """--sections' names, or the parser's error naming the unknown ones."""
  chosen = [s.strip() for s in text.split(",") if s.strip()]
  unknown = sorted(set(chosen) - set(sections))
  if unknown or not chosen:
    ap.error(f"--sections: {f'unknown {unknown}' if unknown else 'none given'}"
             f"; choose from {sections}")
  return [s for s in sections if s in chosen]


# The sections that read each flag: given to none of them, a flag is refused
# (not ignored: --shape with --sections paths timed the default shapes).
FLAG_SECTIONS = {"--shape": ("dyck", "replicas", "lanes", "floor", "codegen"),
                 "--path-shapes": ("paths", "layouts"),
                 "--replicas": ("replicas", "lanes", "floor")}


def unused_flags(ap, chosen, given, uses=FLAG_SECTIONS):
  """The parser's error naming a flag of `given` (flag -> value, None when
  not given) that none of the `chosen` sections reads."""
  for flag, value in given.items():
    if value is not None and not set(uses[flag]) & set(chosen):
      ap.error(f"{flag} {value}: read only by --sections "
               f"{','.join(uses[flag])}, and --sections {','.join(chosen)} "
               f"runs none of them")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--sections", default=",".join(SECTIONS))
  ap.add_argument("--rounds", type=flags.at_least(1), default=5)
  ap.add_argument("--min-seconds", default=0.3, type=flags.number(
      f"in [0, {TORCH_TIMEOUT_S}) (torch's reply timeout)",
      lambda v: 0 <= v < TORCH_TIMEOUT_S),
                  help="least seconds per timing (default 0.3; 0: one step)")
  ap.add_argument("--replicas", type=flags.at_least(1), default=None,
                  help="of the 'replicas', 'lanes' and 'floor' sections "
                  "(default 20)")
  ap.add_argument("--shape", default=None,
                  help=f"B,T,H of every section but 'paths' and 'layouts' "
                  f"(D = H; default {','.join(map(str, SHAPE))})")
  ap.add_argument("--path-shapes", default=None,
                  help="B,T,H;B,T,H;... of the 'paths' and 'layouts' "
                  "sections (default " + ";".join(
                      ",".join(map(str, s)) for s in PATH_SHAPES) + ")")
  ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                  help="JAX timings: CPU time of this process (default; "
                  "per core) or wall time (for multi-threaded runs)")
  ap.add_argument("--small-loops", action="store_true",
                  help="compile small loops whole (sorjax.small_loops; "
                  "set before this process's first computation)")
  args = ap.parse_args(argv)
  chosen = chosen_sections(ap, args.sections, SECTIONS)
  unused_flags(ap, chosen, {"--shape": args.shape,
                            "--path-shapes": args.path_shapes,
                            "--replicas": args.replicas})
  if args.replicas is None:
    args.replicas = 20
  args.path_shapes = (PATH_SHAPES if args.path_shapes is None else
                      flags.shape_list(ap, "--path-shapes", args.path_shapes))
  set_shape(*(SHAPE if args.shape is None
              else shape_arg(ap, "--shape", args.shape)))
  if args.small_loops:  # after the checks: it starts JAX
    try:
      small_loops.compile_whole_checked("--small-loops")
    except ValueError as e:   # XLA_FLAGS sets its flags already
      ap.error(f"--small-loops: {e}")
  global CLOCK
  CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
  print(f"# Small-model regime, per core: {time.strftime('%Y-%m-%d %H:%M')}, "
        f"load {os.getloadavg()[0]:.2f}, XLA_FLAGS="
        f"{os.environ.get('XLA_FLAGS', '')!r}, clock {args.clock}, "
        f"jax {jax.__version__}\n")
  for s in chosen:
    globals()[f"section_{s}"](args)
  print(f"load at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()
