"""What is benchmarked: cell hyperparameters, input sizes, shapes.

Pure Python (no jax, no torch), shared by the driver and the workers.
"""

from __future__ import annotations

# (B, T, H) of the main table (issue "Performance").
SHAPES = ((32, 100, 256), (64, 100, 512), (32, 200, 1024))
# The small-model regime of the Dyck experiments (Lin et al., Mahto et al.).
DYCK_SHAPE = (10, 200, 12)
DYCK_REPLICAS = 20
# Set to "1" in the environment of a JAX worker that compiles small loops
# whole (sorjax.small_loops); specs with small_loops=True go to it.
SMALL_LOOPS_ENV = "SORJAX_BENCH_SMALL_LOOPS"

# The second-order cells and the cells with a torch Python-loop peer.
SECOND_ORDER = ("tensor_rnn", "general2", "mrnn", "mi_rnn", "mlstm",
                "attention_lstm", "assignment_lstm", "mm_rnn", "mm_lstm",
                "dyck_rnn")
TORCH_LOOP = ("mrnn", "mlstm", "mm_rnn", "attention_lstm")
# Cells with targets at H = 512 (>= 70% roofline, >= 2x torch loop,
# >= 10x naive with <= 1/10 of its memory).
TARGET_CELLS = ("mrnn", "mlstm", "mm_rnn", "attention_lstm")

# Cells with a split step (sorjax.unroll's fused_grad path).
SPLIT = ("rnn", "gru", "lstm", "mts_lstm", "tensor_rnn", "general2", "mrnn",
         "mi_rnn", "mlstm", "attention_lstm", "assignment_lstm", "mm_rnn",
         "mm_lstm")

TENSOR_RNN_INPUT = 32  # A is [D, H, H]: D = H = 1024 would be a 4 GiB tensor


def cell_hparams(name: str, H: int) -> dict:
  """Hyperparameters of `name` at hidden size H: the papers' usual choices
  (M = H; S = 2 cells as Lin et al.'s Dyck-2 model; K = 4 as Renganathan &
  Singh; Mahto et al.'s Dyck-2 inverse-gamma timescales)."""
  extra = {
      "general2": dict(intermediate_size=H),
      "mrnn": dict(intermediate_size=H),
      "mlstm": dict(intermediate_size=H),
      "attention_lstm": dict(num_cells=2),
      "assignment_lstm": dict(num_cells=2),
      "mm_rnn": dict(num_matrices=4),
      "dyck_rnn": dict(learn_embedding=True),
      "mts_lstm": dict(timescales=("inverse_gamma", 1.5)),
  }.get(name, {})
  return dict(hidden_size=H, **extra)


def input_size(name: str, H: int) -> int:
  """D: the hidden size (an embedding of width H), except tensor_rnn."""
  return min(TENSOR_RNN_INPUT, H) if name == "tensor_rnn" else H


def label(spec: dict) -> str:
  """A short readable name of a contender spec."""
  impl = spec["impl"]
  if impl == "matmul":
    return f"{spec['framework']} matmul {spec['n']}^3"
  if impl == "stepmm" and "K" in spec:  # a cell's per-step product chain
    return f"XLA per-step [{spec['K']}, {spec['N']}] product (fwd)"
  base = {
      "sorjax": "sorjax {cell}",
      "naive": "naive {cell}",
      "torch_lstm": "torch.nn.LSTM",
      "stepmm": "{framework} per-step h @ W_h (fwd)",
      "torch_loop": "torch loop {cell}",
      "flax_lstm": "flax OptimizedLSTMCell",
      "cudnn_lstm": "jax.experimental.rnn (cuDNN)",
      "tree_level": "tree_lstm level-scheduled",
      "tree_chunked": "tree_lstm chunked (Hu, W = nodes / height)",
      "tree_node": "tree_lstm node-by-node",
  }[impl].format(cell=spec.get("cell", ""),
                 framework={"jax": "XLA", "torch": "torch"}.get(
                     spec.get("framework"), ""))
  opts = []
  hp = spec.get("hparams") or {}
  if hp.get("mix") == "gates":
    opts.append("mix=gates")
  if impl == "stepmm" and spec.get("N", 4 * spec["H"]) != 4 * spec["H"]:
    opts.append(f"N = {spec['N']}")
  for k, default in (("hoist", True), ("remat", False), ("unroll", None),
                     ("fused_grad", None)):
    if k in spec and spec[k] != default:
      opts.append(f"{k}={spec[k]}")
  if spec.get("replicas"):
    opts.append(f"x{spec['replicas']} replicas " + (
        "(the training loop's groups)" if spec.get("replica_batch") == "rule"
        else "(vmap)"))
  if spec.get("optimizer"):
    opts.append(f"+{spec['optimizer']}")
  if spec.get("small_loops"):
    opts.append("small loops")
  if spec.get("devices"):
    opts.append(f"{spec['devices']} devices")
  return base + (f" [{', '.join(opts)}]" if opts else "")
