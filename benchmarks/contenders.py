"""What the benchmarks time: `Contender` and the constructors of each kind.

A contender is a spec for a worker (labelled by `benchmarks.specs`), the
worker that runs it ("jax", "torch", `SMALL_LOOPS`: the JAX worker that
compiles small loops whole, or `host_devices_worker(n)`: a JAX worker with
n CPU devices), its matmul FLOPs per token (`benchmarks.flops`), and what
measuring fills in: the worker's info, per-round rates, per-round CPU use
and core-to-core latency, or the error. `sorjax`, `naive`, `torch_loop`,
`lstm_peer` and `matmuls` build the contenders the sections compare.
"""

from __future__ import annotations

import dataclasses
import statistics

from benchmarks import flops, specs


# The worker of contenders timed with sorjax.small_loops.compile_whole().
SMALL_LOOPS = "jax_small_loops"


def host_devices_worker(n: int) -> str:
  """The worker of contenders timed on n CPU devices
  (`--xla_force_host_platform_device_count`, read at the process's start)."""
  return f"jax_{n}_devices"


@dataclasses.dataclass
class Contender:
  key: str
  spec: dict
  framework: str                 # "jax", "torch" or SMALL_LOOPS
  flops_per_token: float | None = None
  # filled by measurement
  info: dict = dataclasses.field(default_factory=dict)
  rates: list = dataclasses.field(default_factory=list)    # per round, or None
  # per timed round: cores its own process kept busy (CPU time / wall
  # time), cores the other workers used meanwhile (should be ~0), and the
  # core-to-core latency probed just before and just after it (hops_ns)
  cores: list = dataclasses.field(default_factory=list)
  error: str | None = None

  @property
  def label(self) -> str:
    return specs.label(self.spec)

  @property
  def rate(self) -> float | None:
    r = [x for x in self.rates if x is not None]
    return statistics.median(r) if r else None

  @property
  def peak_mb(self) -> float | None:
    b = self.info.get("peak_bytes")
    return None if b is None else b / 2 ** 20


def cell_spec(impl: str, cell: str, B: int, T: int, H: int, **opts) -> dict:
  hp = specs.cell_hparams(cell, H)
  hp.update(opts.pop("hparams", {}))
  return dict(impl=impl, cell=cell, hparams=hp, B=B, T=T,
              D=specs.input_size(cell, H), **opts)


def sorjax(cell, B, T, H, key=None, **opts) -> Contender:
  """small_loops=True: timed in a JAX worker that set
  `sorjax.small_loops.compile_whole()`."""
  spec = cell_spec("sorjax", cell, B, T, H, **opts)
  fw = (SMALL_LOOPS if spec.get("small_loops") else
        host_devices_worker(spec["devices"]) if spec.get("devices") else "jax")
  return Contender(key or specs.label(spec), spec, fw,
                   flops.train_flops(cell, spec["hparams"], spec["D"]))


def naive(cell, B, T, H, profile, budget, **opts) -> Contender:
  spec = cell_spec("naive", cell, B, T, H, mem_budget=budget,
                   max_step_s=profile.naive_max_step_s, **opts)
  return Contender(specs.label(spec), spec, "jax")


def torch_loop(cell, B, T, H) -> Contender:
  spec = cell_spec("torch_loop", cell, B, T, H)
  return Contender(specs.label(spec), spec, "torch",
                   flops.train_flops(cell, spec["hparams"], spec["D"]))


def lstm_peer(impl, B, T, H, framework, **opts) -> Contender:
  spec = dict(impl=impl, B=B, T=T, D=H, H=H, **opts)
  return Contender(specs.label(spec), spec, framework,
                   flops.train_flops("lstm", {"hidden_size": H}, H))


def step_chains(cell: str, B: int, T: int, H: int
                ) -> dict[tuple[int, int], Contender]:
  """A chain of T dependent per-step products (JAX worker, forward only)
  for each distinct shape of `flops.step_products` of `cell` at hidden
  size H (the benchmark's hyperparameters), keyed by (K, N); empty for a
  cell it does not count."""
  hp = specs.cell_hparams(cell, H)
  ps = flops.step_products(cell, hp, specs.input_size(cell, H)) or []
  shapes = dict.fromkeys(k for p in ps for k in p)
  return {(K, N): Contender(
      f"stepmm-{K}x{N}", dict(impl="stepmm", framework="jax", B=B, T=T, H=H,
                              K=K, N=N), "jax", 2 * K * N)
          for K, N in shapes}


def matmuls(n: int, torch_ok: bool) -> list[Contender]:
  out = [Contender("matmul-jax", dict(impl="matmul", framework="jax", n=n),
                   "jax", flops.matmul_flops(n))]
  if torch_ok:
    out.append(Contender("matmul-torch",
                         dict(impl="matmul", framework="torch", n=n),
                         "torch", flops.matmul_flops(n)))
  return out
