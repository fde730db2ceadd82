"""Matmul FLOPs per token of each cell's factored form (2 FLOPs a multiply-add).

Counted from the equations as the cells compute them (see each cell's
docstring): the input-only matmuls that `precompute` hoists plus the
recurrent matmuls and contractions of `step`. Elementwise work (gates,
nonlinearities) is not counted, as in a roofline.

A timed training step takes gradients to the parameters only, in every
framework (sorjax and flax differentiate with respect to the params, the
torch workers' inputs do not require grad), so its backward pass costs one
product per operand that depends on the parameters: a product by the state
(h W) two (dW and dh), an input-only one (x W, hoisted) one (dW; no
framework forms the dx that nothing uses). `products` tags every product
with that count (its `grads`), and `train_flops` is forward plus backward.
Until session 22 every product was counted three times, dx of the inputs
included, which overstated each fraction of the roofline by up to 1.2x
(the LSTM at D = H: 24 H^2 counted, 20 H^2 computed).

assignment_lstm is counted as its model (one of the S cells per token); the
implementation runs all S and keeps one, which shows as a lower fraction of
the roofline.
"""

from __future__ import annotations

import math

# Backward products of a product whose operands depend on the parameters:
STATE = 2  # h W, and products of two such operands: dW (or d-other) and dh
INPUT = 1  # x W: dW only


def products(name: str, hp: dict, D: int) -> list[tuple[int, int]]:
  """(multiply-adds per token, backward products) of each product in one
  forward step of cell `name`."""
  H = hp["hidden_size"]
  M = hp.get("intermediate_size", H)
  if name == "rnn" or name == "mi_rnn":
    return [(D * H, INPUT), (H * H, STATE)]               # x U, h W
  if name in ("lstm", "mts_lstm", "assignment_lstm"):     # assignment_lstm:
    return [(D * 4 * H, INPUT), (H * 4 * H, STATE)]       # one cell a token
  if name == "gru":
    return [(D * 3 * H, INPUT), (H * 3 * H, STATE)]
  if name == "tensor_rnn":                                # h A, then x (x
    return [(D * H * H, STATE), (D * H, INPUT)]           # needs no dx)
  if name in ("general2", "mrnn"):
    use_D = hp.get("use_D", True)
    use_E = hp.get("use_E", name == "general2")
    return ([(D * M, INPUT), (H * M, STATE), (M * H, STATE)]  # B x, C h, m A
            + ([(D * H, INPUT)] if use_D else [])              # D x
            + ([(H * H, STATE)] if use_E else []))             # E h
  if name == "mlstm":                                     # W_mx, W_x, W_mh, W_m
    return [(D * M, INPUT), (D * 4 * H, INPUT), (H * M, STATE),
            (M * 4 * H, STATE)]
  if name == "attention_lstm":
    S = hp["num_cells"]
    cells = [(S * D * 4 * H, INPUT), (S * H * 4 * H, STATE)]  # every cell
    if hp.get("mix", "states") == "gates":
      mixing = 2 * S * 4 * H                              # gx and h W_h mixed
    else:
      mixing = S * 2 * H                                  # h and c, eq. (d)-(e)
    return [(D * S, INPUT)] + cells + [(mixing, STATE)]   # x V first
  if name == "mm_rnn":
    return _mm_products(D, H, hp.get("num_matrices", 4))
  if name == "mm_lstm":
    return [p for K in hp.get("num_matrices", (4, 4, 2, 2))
            for p in _mm_products(D, H, K)]
  if name == "dyck_rnn":
    return [(D, INPUT), (D * H, INPUT)]                   # x W_proj, x W_hx
  if name == "tree_lstm":                                 # per internal node
    return [(16 * H * H + 4 * H * H + H * H, STATE)]      # W_if (2 orders), W_c|W_o, W_co
  if name == "tree_rnn":
    return [(2 * H * H, STATE)]
  raise ValueError(f"flops: no FLOP count for cell {name!r}")


def _mm_products(D: int, H: int, K: int) -> list[tuple[int, int]]:
  return [(D * H + D * K, INPUT),                         # x W_hx, x's key logits
          (H * K * H + H * K + K * K, STATE),             # h [W | P_h], v P_v
          (K * H, STATE)]                                 # the mixture, eq. 7


def step_products(name: str, hp: dict, D: int
                  ) -> list[tuple[tuple[int, int], tuple[int, int]]] | None:
  """The weight products a training step runs in sequence, one per time
  step, as sorjax's layers run them: for each state product of the
  forward step, its shape (K, N) ([B, K] x [K, N]) and the shape of the
  backward loop's product that carries dh back through it. The mixtures'
  small products (attention_lstm's S*2H, mm_rnn's K*H) are left out, as
  in `ceiling` they count with the rest. None for a cell whose step is no
  such product (tensor_rnn, dyck_rnn, the trees) or is not counted here
  (assignment_lstm, mm_lstm)."""
  H = hp["hidden_size"]
  M = hp.get("intermediate_size", H)
  back = lambda ps: [(p, (p[1], p[0])) for p in ps]  # dz W^T: [N, K]
  if name in ("rnn", "mi_rnn"):
    return back([(H, H)])
  if name in ("lstm", "mts_lstm"):
    return back([(H, 4 * H)])
  if name == "gru":
    return back([(H, 3 * H)])
  if name in ("general2", "mrnn"):                        # h [C | E], m A
    use_E = hp.get("use_E", name == "general2")
    return back([(H, M + (H if use_E else 0)), (M, H)])
  if name == "mlstm":                                     # h W_mh, m W_m
    return back([(H, M), (M, 4 * H)])
  if name == "attention_lstm":                            # h [W_h[1] | ..]
    return back([(H, hp["num_cells"] * 4 * H)])
  if name == "mm_rnn":  # h [W[1] | ..]; back: dpre W[k]^T, [H, K*H] too
    KH = hp.get("num_matrices", 4) * H
    return [((H, KH), (H, KH))]
  return None


def ceiling(name: str, hp: dict, D: int, s: dict) -> float | None:
  """The highest fraction of the roofline a training step of `name` can
  reach when its per-step products (`step_products`) run at the fractions
  s[(K, N)] measured for chains of them, every other product (the hoisted
  input products, the weight gradients as one matmul each) at the
  roofline, and the elementwise work takes no time. A target that needs
  more is beyond what the measured products allow. None where a shape is
  unmeasured or the cell uncounted."""
  ps = step_products(name, hp, D)
  if ps is None or any(not s.get(k) for p in ps for k in p):
    return None
  F = train_flops(name, hp, D)
  t = F
  for fwd, bwd in ps:
    f = 2 * fwd[0] * fwd[1]  # FLOPs per token of each of the two products
    t += f / s[fwd] - f + f / s[bwd] - f
  return F / t


def forward_macs(name: str, hp: dict, D: int) -> int:
  """Multiply-adds per token of one forward step of cell `name`."""
  return sum(m for m, _ in products(name, hp, D))


def train_flops(name: str, hp: dict, D: int) -> int:
  """Matmul FLOPs per token of a training step (forward + backward, the
  gradients to the parameters only; module docstring)."""
  return 2 * sum(m * (1 + grads) for m, grads in products(name, hp, D))


def matmul_flops(n: int) -> int:
  """FLOPs of one n x n by n x n matmul."""
  return 2 * n ** 3


def fmt_flops(f: float) -> str:
  if f <= 0:
    return "0"
  k = min(int(math.log10(f) // 3), 4)
  return f"{f / 10 ** (3 * k):.3g}{['', 'k', 'M', 'G', 'T'][k]}"
