"""Matmul FLOPs per token of each cell's factored form (2 FLOPs a multiply-add).

Counted from the equations as the cells compute them (see each cell's
docstring): the input-only matmuls that `precompute` hoists plus the
recurrent matmuls and contractions of `step`. Elementwise work (gates,
nonlinearities) is not counted, as in a roofline. A training step (forward
plus backward through time) costs 3x the forward matmul FLOPs: the backward
pass of `x @ W` is two matmuls of the same size (dx and dW).

assignment_lstm is counted as its model (one of the S cells per token); the
implementation runs all S and keeps one, which shows as a lower fraction of
the roofline.
"""

from __future__ import annotations

import math

TRAIN_FACTOR = 3  # forward + backward (dx and dW) matmuls


def forward_macs(name: str, hp: dict, D: int) -> int:
  """Multiply-adds per token of one forward step of cell `name`."""
  H = hp["hidden_size"]
  M = hp.get("intermediate_size", H)
  if name == "rnn" or name == "mi_rnn":
    return D * H + H * H                                  # x U, h W
  if name in ("lstm", "mts_lstm"):
    return (D + H) * 4 * H                                # x W_x, h W_h
  if name == "gru":
    return (D + H) * 3 * H
  if name == "tensor_rnn":
    return D * H * H + D * H                              # h A, then x
  if name in ("general2", "mrnn"):
    use_D = hp.get("use_D", True)
    use_E = hp.get("use_E", name == "general2")
    return (D * M + H * M + M * H                         # B x, C h, m A
            + (D * H if use_D else 0) + (H * H if use_E else 0))
  if name == "mlstm":
    return D * M + D * 4 * H + H * M + M * 4 * H          # W_mx, W_x, W_mh, W_m
  if name == "attention_lstm":
    S = hp["num_cells"]
    cells = S * (D + H) * 4 * H                           # every cell's gates
    if hp.get("mix", "states") == "gates":
      mixing = 2 * S * 4 * H                              # gx and h W_h mixed
    else:
      mixing = S * 2 * H                                  # h and c, eq. (d)-(e)
    return D * S + cells + mixing                         # + x V
  if name == "assignment_lstm":
    return (D + H) * 4 * H                                # one cell per token
  if name == "mm_rnn":
    K = hp.get("num_matrices", 4)
    return (D * H + D * K                                 # x W_hx, x's key logits
            + H * K * H + H * K + K * K                   # h [W | P_h], v P_v
            + K * H)                                      # the mixture, eq. 7
  if name == "mm_lstm":
    Ks = hp.get("num_matrices", (4, 4, 2, 2))
    return sum(D * H + D * K + H * K * H + H * K + K * K + K * H for K in Ks)
  if name == "dyck_rnn":
    return D + D * H                                      # x W_proj, x W_hx
  if name == "tree_lstm":                                 # per internal node
    return 16 * H * H + 4 * H * H + H * H                 # W_if (2 orders), W_c|W_o, W_co
  if name == "tree_rnn":
    return 2 * H * H
  raise ValueError(f"flops: no FLOP count for cell {name!r}")


def train_flops(name: str, hp: dict, D: int) -> int:
  """Matmul FLOPs per token of a training step (forward + backward)."""
  return TRAIN_FACTOR * 2 * forward_macs(name, hp, D)


def matmul_flops(n: int) -> int:
  """FLOPs of one n x n by n x n matmul."""
  return 2 * n ** 3


def fmt_flops(f: float) -> str:
  if f <= 0:
    return "0"
  k = min(int(math.log10(f) // 3), 4)
  return f"{f / 10 ** (3 * k):.3g}{['', 'k', 'M', 'G', 'T'][k]}"
