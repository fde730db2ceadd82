"""JAX worker: sorjax cells, their naive forms, flax, cuDNN, trees, matmul.

    python -m benchmarks.jax_worker      # serves benchmarks.worker's protocol

A training step is the forward pass and the backward pass through time to
every parameter, given a fixed random cotangent of the outputs (the same
work as `loss.backward()` on a linear readout, without the readout).
Memory is XLA's own account of the compiled step, `memory_analysis()`:
arguments + outputs + temporaries - aliased bytes, i.e. the step's peak
footprint including parameters and inputs.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import sorjax
from sorjax import cells, layer_scan, small_loops
from sorjax.training import loop
from benchmarks import naive, specs, worker

# Whether this worker compiles small loops whole (set before any compile).
SMALL_LOOPS = os.environ.get(specs.SMALL_LOOPS_ENV) == "1"


def peak_bytes(compiled) -> int | None:
  m = compiled.memory_analysis()
  if m is None:
    return None
  return int(m.argument_size_in_bytes + m.output_size_in_bytes
             + m.temp_size_in_bytes - m.alias_size_in_bytes)


class JaxCase:
  """A compiled step and its arguments; `stateful` steps feed their output
  back as the first argument (an optimizer loop)."""

  def __init__(self, fn: Callable, args: tuple, info: dict,
               stateful: bool = False):
    t0 = time.perf_counter()
    self.compiled = jax.jit(fn).lower(*args).compile()
    self.args = list(args)
    self.stateful = stateful
    self.info = dict(info, compile_s=time.perf_counter() - t0,
                     peak_bytes=peak_bytes(self.compiled))

  def run(self, n: int) -> None:
    out = None
    for _ in range(n):
      out = self.compiled(*self.args)
      if self.stateful:
        self.args[0] = out
    jax.block_until_ready(out)


def vjp_step(fwd: Callable) -> Callable:
  """(params, xs, aux, G) -> d<fwd(params, xs, aux), G>/d params."""
  def step(params, xs, aux, G):
    _, pull = jax.vjp(lambda p: fwd(p, xs, aux), params)
    return pull(G)[0]
  return step


def _aux(name: str, key, B: int, T: int, hp: dict) -> dict:
  if name == "attention_lstm":
    return {"temperature": jnp.float32(1.0)}
  if name == "assignment_lstm":
    return {"assignment": jax.random.randint(key, (B, T), 0,
                                             hp["num_cells"])}
  return {}


def _data(key, B, T, D, H, lead=()):
  kx, kg = jax.random.split(key)
  return (jax.random.normal(kx, (*lead, B, T, D), jnp.float32),
          jax.random.normal(kg, (*lead, B, T, H), jnp.float32))


# ------------------------------------------------------------------ cells

def sorjax_case(spec: dict) -> JaxCase:
  name, hp = spec["cell"], spec["hparams"]
  B, T, D = spec["B"], spec["T"], spec["D"]
  R = spec.get("replicas", 0)
  cell = cells.make(name, **hp)
  opts = dict(hoist=spec.get("hoist", True), remat=spec.get("remat", False),
              unroll=spec.get("unroll"),
              fused_grad=spec.get("fused_grad"))
  k0, k1, k2 = jax.random.split(jax.random.key(0), 3)

  def fwd(p, xs, aux):
    return sorjax.unroll(cell, p, xs, **opts, **aux)[1]

  grad = vjp_step(fwd)
  aux = _aux(name, k2, B, T, hp)
  if spec.get("optimizer"):
    import optax
    tx = optax.adam(1e-3)

    def step(state, xs, aux, G):  # one optimizer step: grads, then Adam
      params, opt = state
      g = grad(params, xs, aux, G)
      updates, opt = tx.update(g, opt, params)
      return optax.apply_updates(params, updates), opt

    def init(k):
      p = cell.init(k, D)
      return p, tx.init(p)
    stateful = True
  else:
    step, init, stateful = grad, (lambda k: cell.init(k, D)), False

  info = {"tokens_per_step": max(R, 1) * B * T}
  if R:
    state = jax.vmap(init)(jax.random.split(k0, R))
    xs, G = _data(k1, B, T, D, cell.hidden_size, lead=(R,))
    aux = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (R,) + a.shape),
                                 aux)
    if spec.get("replica_batch") not in (None, "rule"):
      raise ValueError(f"jax_worker: replica_batch must be None or 'rule', "
                       f"got {spec['replica_batch']!r}")
    if spec.get("replica_batch") == "rule":  # as the training loop runs them
      k = loop.replica_batch_for(R, B, loop.replica_width((cell,)))
      info["replica_batch"] = k
      one_step = step
      step = lambda *a: loop.map_replicas(lambda t: one_step(*t), a, k)  # noqa: E731
    else:
      step = jax.vmap(step)
  else:
    state = init(k0)
    xs, G = _data(k1, B, T, D, cell.hidden_size)
  args = (state, xs, aux, G)
  if R and spec.get("devices"):  # the replica axis over the devices
    n = spec["devices"]
    if R % n:
      raise ValueError(f"jax_worker: {R} replicas do not split over {n} "
                       "devices")
    mesh = Mesh(np.array(jax.devices()), ("replica",))
    args = jax.device_put(args, NamedSharding(mesh, P("replica")))
  return JaxCase(step, args, info, stateful)


def naive_case(spec: dict) -> JaxCase:
  """The naive form at the requested T when it fits `mem_budget` bytes and
  `max_step_s` seconds a step; else at the largest T' that does (its cost
  per token is flat in T). Memory is XLA's figure at the full T (compiled,
  not run). The cost per step is estimated from a run at T = 2."""
  name, hp = spec["cell"], spec["hparams"]
  B, T, D = spec["B"], spec["T"], spec["D"]
  cell = cells.make(name, **hp)
  params = cell.init(jax.random.key(0), D)

  def fwd(p, xs, aux):
    return naive.naive_unroll(name, cell, p, xs, **aux)

  def build(t):
    xs, G = _data(jax.random.key(1), B, t, D, cell.hidden_size)
    aux = _aux(name, jax.random.key(2), B, t, hp)
    return JaxCase(vjp_step(fwd), (params, xs, aux, G),
                   {"tokens_per_step": B * t, "measured_T": t})

  full = build(T)
  need = full.info["peak_bytes"]
  t = T
  budget, max_s = spec.get("mem_budget"), spec.get("max_step_s")
  if budget and need > budget:
    t = max(2, int(T * budget / need))
  if max_s and t > 2:
    probe = build(2)
    probe.run(1)
    t0 = time.perf_counter()
    probe.run(1)
    per_t = (time.perf_counter() - t0) / 2
    t = max(2, min(t, int(max_s / per_t)))
  case = full if t == T else build(t)
  del full
  case.info.update(executed_peak_bytes=case.info["peak_bytes"],
                   peak_bytes=need)
  return case


# ------------------------------------------------------------------ peers

def flax_case(spec: dict) -> JaxCase:
  import flax.linen as nn
  B, T, D, H = spec["B"], spec["T"], spec["D"], spec["H"]
  model = nn.RNN(nn.OptimizedLSTMCell(H), unroll=spec.get("unroll", 1))
  xs, G = _data(jax.random.key(1), B, T, D, H)
  variables = model.init(jax.random.key(0), xs)

  def fwd(v, xs, aux):
    return model.apply(v, xs)

  return JaxCase(vjp_step(fwd), (variables, xs, {}, G),
                 {"tokens_per_step": B * T})


def cudnn_case(spec: dict) -> JaxCase:
  if jax.devices()[0].platform != "gpu":
    raise RuntimeError("jax.experimental.rnn needs a GPU (cuDNN)")
  from jax.experimental import rnn
  B, T, D, H = spec["B"], spec["T"], spec["D"], spec["H"]
  w = rnn.init_lstm_weight(jax.random.key(0), D, H, 1, False)
  xs, G = _data(jax.random.key(1), B, T, D, H)
  z = jnp.zeros((1, B, H), jnp.float32)
  lengths = jnp.full((B,), T, jnp.int32)

  def fwd(w, xs, aux):
    return rnn.lstm(xs, z, z, w, lengths, input_size=D, hidden_size=H,
                    num_layers=1, dropout=0.0, bidirectional=False)[0]

  return JaxCase(vjp_step(fwd), (w, xs, {}, G), {"tokens_per_step": B * T})


def stepmm_case(spec: dict) -> JaxCase:
  """The recurrent matmul alone: T dependent [B, K] x [K, N] products in a
  lax.scan (forward only; K = spec["K"], H by default; N = spec["N"], 4H
  by default), in the layout sorjax's loops multiply in on this backend:
  gate-major where `layer_scan.step_product` is (on CPU, W^T [N, K] made
  once times the state kept as h^T [K, B], as the LSTM layer's gate-major
  loop multiplies), a @ W otherwise. The floor under the step of any cell
  that multiplies its state by a [K, N] matrix: the product and nothing
  else. The next step's state is the product's first K columns (N >= K)
  or the state with its first N columns replaced by the product (N < K,
  in place): no reduction or transpose is timed with the product (a
  column-block sum there cost 4% and step_product's transpose back to
  [B, N] 4% of a chain at B=64 K=512 N=2048; BUILD_NOTES "Per-step product
  chains timed alone"), and W ~ N(0, 1/K) keeps the state's scale (no
  denormals).
  `check_stepmm_dot` verifies that XLA kept the whole [K, N] product."""
  B, T, H = spec["B"], spec["T"], spec["H"]
  K, N = spec.get("K", H), spec.get("N", 4 * H)
  kh, kw = jax.random.split(jax.random.key(0))
  h0 = jax.random.normal(kh, (B, K), jnp.float32)
  W = jax.random.normal(kw, (K, N), jnp.float32) / np.sqrt(K)
  gate_major = (jax.default_backend() == "cpu"
                and layer_scan.gate_major_step(B, K, N))

  def fn(h0, W):
    if gate_major:  # the barrier keeps W^T in memory: XLA folding it into
      Wt = jax.lax.optimization_barrier(W.T)  # the dot ran 3-4x slower
      def body(hT, _):                        # [K, B] -> [N, B]
        yT = Wt @ hT
        return yT[:K] if N >= K else hT.at[:N].set(yT), None
      return jax.lax.scan(body, h0.T, None, length=T)[0].T

    def body(h, _):                           # [B, K] -> [B, N]
      y = h @ W
      return y[:, :K] if N >= K else h.at[:, :N].set(y), None
    return jax.lax.scan(body, h0, None, length=T)[0]

  case = JaxCase(fn, (h0, W), {"tokens_per_step": B * T})
  check_stepmm_dot(case.compiled.as_text(), B, K, N)
  return case


def check_stepmm_dot(hlo: str, B: int, K: int, N: int) -> None:
  """Raises unless the compiled chain `hlo` multiplies a [B, K] state by
  the whole [K, N] weight: XLA may narrow a dot whose output is sliced,
  which would time a smaller product than the FLOPs counted."""
  shapes = re.findall(r"= f32\[([\d,]*)\][^ ]* dot\(", hlo)
  if not any(sorted(map(int, s.split(","))) == sorted((B, N))
             for s in shapes if s):
    raise RuntimeError(f"jax_worker: the stepmm chain's dot is not the "
                       f"whole [{B}, {K}] x [{K}, {N}] product; compiled "
                       f"dots: {shapes}")


def matmul_case(spec: dict) -> JaxCase:
  n = spec["n"]
  ka, kb = jax.random.split(jax.random.key(0))
  a = jax.random.normal(ka, (n, n), jnp.float32)
  b = jax.random.normal(kb, (n, n), jnp.float32)
  return JaxCase(lambda a, b: a @ b, (a, b), {"tokens_per_step": 1})


# ------------------------------------------------------------------ trees

def random_trees(B: int, min_leaves: int, max_leaves: int, seed: int):
  """B random binary trees (nested pairs of ints): split points uniform."""
  rng = np.random.default_rng(seed)

  def grow(lo, hi):  # leaves lo .. hi-1
    if hi - lo == 1:
      return lo
    k = int(rng.integers(lo + 1, hi))
    return (grow(lo, k), grow(k, hi))

  return [grow(0, int(rng.integers(min_leaves, max_leaves + 1)))
          for _ in range(B)]


def node_order(schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """[S, B] node / left / right flat indices, one internal node of every tree
  per step in the module's numbering (children before parents); padded
  steps write past the end (dropped)."""
  B, N = schedule.node_mask.shape
  per_tree = [[] for _ in range(B)]
  for n, l, r, m in zip(schedule.node.ravel(), schedule.left.ravel(),
                        schedule.right.ravel(), schedule.step_mask.ravel()):
    if m:
      per_tree[n // N].append((n, l, r))
  S = max(len(t) for t in per_tree)
  node = np.tile(B * N + np.arange(B, dtype=np.int32), (S, 1))
  left = np.zeros((S, B), np.int32)
  right = np.zeros((S, B), np.int32)
  for b, t in enumerate(per_tree):
    for s, (n, l, r) in enumerate(sorted(t)):
      node[s, b], left[s, b], right[s, b] = n, l, r
  return node, left, right


def run_node_by_node(cell, params, leaf_inputs, schedule, order):
  """Roots of the trees, composing one node per tree per scan step."""
  B, L = schedule.tokens.shape
  N = schedule.node_mask.shape[1]
  mask = jnp.asarray(schedule.leaf_mask)[..., None]

  def slots(a):
    a = jnp.where(mask, a, jnp.zeros_like(a))
    return jnp.pad(a, ((0, 0), (0, N - L), (0, 0))).reshape(B * N, -1)

  states = jax.tree_util.tree_map(slots, cell.leaf(params, leaf_inputs))

  def body(states, idx):
    node, left, right = idx
    get = lambda i: jax.tree_util.tree_map(lambda a: a[i], states)
    new = cell.compose(params, get(left), get(right))
    states = jax.tree_util.tree_map(
        lambda a, p: a.at[node].set(p, mode="drop"), states, new)
    return states, None

  states, _ = jax.lax.scan(body, states, tuple(map(jnp.asarray, order)))
  root = jnp.asarray(schedule.root) + N * jnp.arange(B, dtype=jnp.int32)
  return states[0][root]


def tree_case(spec: dict) -> JaxCase:
  from sorjax import trees
  B, H = spec["B"], spec["H"]
  forest = random_trees(B, spec["min_leaves"], spec["max_leaves"],
                        spec.get("seed", 0))
  schedule = trees.encode(forest, schedule="level" if spec["impl"] ==
                          "tree_level" else "chunked",
                          width=spec.get("width"))
  cell = cells.make("tree_lstm", hidden_size=H)
  params = cell.init(jax.random.key(0), H)
  L = schedule.tokens.shape[1]
  leaves = jax.random.normal(jax.random.key(1), (B, L, H), jnp.float32)
  G = jax.random.normal(jax.random.key(2), (B, H), jnp.float32)
  if spec["impl"] in ("tree_level", "tree_chunked"):
    def fwd(p, x, aux):
      return trees.run(cell, p, x, schedule)[1][0]
    steps, slots = schedule.node.shape
  else:
    order = node_order(schedule)

    def fwd(p, x, aux):
      return run_node_by_node(cell, p, x, schedule, order)
    steps, slots = order[0].shape
  compositions = int(schedule.step_mask.sum())
  return JaxCase(vjp_step(fwd), (params, leaves, {}, G),
                 {"tokens_per_step": compositions, "sequential_steps": steps,
                  "slots": steps * slots})


BUILDERS = {"sorjax": sorjax_case, "naive": naive_case,
            "flax_lstm": flax_case,
            "cudnn_lstm": cudnn_case, "matmul": matmul_case,
            "stepmm": stepmm_case,
            "tree_level": tree_case, "tree_chunked": tree_case,
            "tree_node": tree_case}


def make_case(spec: dict[str, Any]) -> JaxCase:
  if spec.get("impl") not in BUILDERS:
    raise ValueError(f"jax_worker: unknown impl {spec.get('impl')!r}; known: "
                     f"{', '.join(sorted(BUILDERS))}")
  if spec.get("devices") and spec["devices"] != jax.device_count():
    raise ValueError(
        f"jax_worker: spec devices={spec['devices']} sent to a worker with "
        f"{jax.device_count()} devices")
  if bool(spec.get("small_loops")) != SMALL_LOOPS:
    raise ValueError(
        f"jax_worker: spec small_loops={bool(spec.get('small_loops'))} sent "
        f"to a worker with {specs.SMALL_LOOPS_ENV}="
        f"{os.environ.get(specs.SMALL_LOOPS_ENV)!r}")
  case = BUILDERS[spec["impl"]](spec)
  case.info.setdefault("platform", jax.devices()[0].platform)
  case.info["small_loops"] = SMALL_LOOPS
  case.info["devices"] = jax.device_count()
  return case


if __name__ == "__main__":
  if SMALL_LOOPS:
    small_loops.compile_whole_checked("jax_worker")
  worker.serve(make_case)
