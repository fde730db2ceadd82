"""The sizes and effort of a benchmark run: `benchmarks.run`'s profiles.

A `Profile` names the shapes, cells and variants each section times, and
how long: rounds per group after untimed warm-up rounds, the least seconds
per timing, the roofline matmul's size, the naive forms' step budget and
the workers' reply timeout. `PROFILES` holds the three runs: "full" (the
whole grid), "quick" (the targets) and "smoke" (the test suite's run: tiny
sizes, every code path). `ALL_CELLS` is every cell the benchmarks time.
"""

from __future__ import annotations

import dataclasses

from benchmarks import specs


@dataclasses.dataclass(frozen=True)
class Profile:
  """Sizes and effort of a run."""
  lstm_shapes: tuple
  cell_shapes: tuple
  cells: tuple
  dyck_shape: tuple
  replicas: int
  scaling: dict            # axis -> ((B, T, H), ...)
  scaling_cells: tuple
  remat_shape: tuple
  remat_cells: tuple
  fused_shapes: tuple      # batched weight gradients vs autodiff, per cell
  unroll_shapes: tuple     # ((B, T, H), cells)
  unroll_factors: tuple
  dyck_variants: tuple     # option dicts of sorjax lstm in the Dyck regime
  replica_unrolls: tuple   # unroll factors of the replica comparison
  # CPU device counts over which the replicas are also timed sharded (the
  # training loop's replica parallelism), each in a worker of its own
  replica_devices: tuple
  # (B, T, H) of a paper's replicated runs, timed on one and on the
  # replica_devices (Mahto et al.: 20 replicas of a 256-unit LSTM, batch 128,
  # up to 200 brackets)
  replica_paper_shapes: tuple
  tree: dict               # B, H, min_leaves, max_leaves
  rounds: int
  warmup_rounds: int       # untimed rounds first (the first ran slow)
  min_round_s: float
  matmul_n: int
  naive_max_step_s: float
  timeout_s: float


ALL_CELLS = tuple(n for n in (
    "rnn", "gru", "lstm", "mts_lstm", "tensor_rnn", "general2", "mrnn",
    "mi_rnn", "mlstm", "attention_lstm", "assignment_lstm", "mm_rnn",
    "mm_lstm", "dyck_rnn"))

PROFILES = {
    "full": Profile(
        lstm_shapes=specs.SHAPES, cell_shapes=specs.SHAPES,
        cells=tuple(n for n in ALL_CELLS if n != "lstm"),
        dyck_shape=specs.DYCK_SHAPE, replicas=specs.DYCK_REPLICAS,
        scaling={"T": ((32, 100, 256), (32, 300, 256), (32, 1000, 256)),
                 "H": ((32, 100, 128), (32, 100, 256), (32, 100, 512),
                       (32, 100, 1024)),
                 "B": ((8, 100, 256), (32, 100, 256), (128, 100, 256))},
        scaling_cells=("lstm", "mrnn", "mm_rnn"),
        remat_shape=(32, 200, 512),
        remat_cells=("lstm", "mrnn", "mlstm", "attention_lstm", "mm_rnn",
                     "mm_lstm"),
        fused_shapes=specs.SHAPES,
        unroll_shapes=(((32, 100, 256), ("lstm", "mrnn", "mm_rnn")),
                       (specs.DYCK_SHAPE, ("lstm", "mrnn", "mm_rnn"))),
        unroll_factors=(1, 2, 4, 8),
        dyck_variants=({}, {"unroll": 1}, {"hoist": False},
                       {"small_loops": True}),
        replica_unrolls=(None, 1), replica_devices=(2,),
        replica_paper_shapes=((128, 200, 256),),
        tree=dict(B=32, H=256, min_leaves=10, max_leaves=40),
        rounds=5, warmup_rounds=1, min_round_s=0.5, matmul_n=2048,
        naive_max_step_s=8.0, timeout_s=1800.0),
    "quick": Profile(
        lstm_shapes=specs.SHAPES, cell_shapes=((64, 100, 512),),
        cells=specs.TARGET_CELLS,
        dyck_shape=specs.DYCK_SHAPE, replicas=specs.DYCK_REPLICAS,
        scaling={"T": ((32, 100, 256), (32, 1000, 256))},
        scaling_cells=("lstm", "mrnn"),
        remat_shape=(32, 200, 512), remat_cells=("lstm", "mrnn"),
        fused_shapes=((32, 100, 256), (64, 100, 512)),
        unroll_shapes=((specs.DYCK_SHAPE, ("lstm",)),),
        unroll_factors=(1, 2, 4, 8),
        dyck_variants=({}, {"unroll": 1}, {"hoist": False},
                       {"small_loops": True}),
        replica_unrolls=(None, 1), replica_devices=(2,),
        replica_paper_shapes=((128, 50, 256),),
        tree=dict(B=32, H=256, min_leaves=10, max_leaves=40),
        rounds=3, warmup_rounds=1, min_round_s=0.3, matmul_n=2048,
        naive_max_step_s=3.0, timeout_s=900.0),
    "smoke": Profile(  # the test suite's run: seconds, every code path
        lstm_shapes=((2, 5, 8),), cell_shapes=((2, 5, 8),),
        cells=("mrnn", "mm_rnn", "attention_lstm"),
        dyck_shape=(2, 6, 4), replicas=3,
        scaling={"T": ((2, 5, 8), (2, 10, 8))}, scaling_cells=("lstm",),
        remat_shape=(2, 5, 8), remat_cells=("mrnn",),
        fused_shapes=((2, 5, 8),),
        unroll_shapes=(((2, 5, 8), ("lstm",)),), unroll_factors=(1, 2),
        dyck_variants=({}, {"small_loops": True}), replica_unrolls=(None,),
        replica_devices=(3,), replica_paper_shapes=((8, 5, 32),),
        tree=dict(B=2, H=8, min_leaves=3, max_leaves=6),
        rounds=2, warmup_rounds=1, min_round_s=0.0, matmul_n=64,
        naive_max_step_s=0.0, timeout_s=300.0),
}
