"""Torch worker (CPU): torch.nn.LSTM, Python-loop second-order cells, matmul.

    python -m benchmarks.torch_worker             # serves benchmarks.worker
    python -m benchmarks.torch_worker --memory '<spec json>'   # one number

Threads = cores (`torch.set_num_threads`). Nothing here imports jax: on this
machine importing jax after torch had set up its threads slowed
torch.nn.LSTM ~24x in that process.

The Python-loop cells are what a PyTorch user writes: an nn.Module holding
the paper's matrices and a `for t in range(T)` loop over the recurrent part,
with the input-only projections done for all steps in one matmul first (a
courtesy that makes the baseline stronger, not weaker). They are factored
(no per-example W_hh), like Renganathan & Singh's sec. 5.3 code.

Memory (`--memory`, run in a fresh process by the driver, with
MALLOC_MMAP_THRESHOLD_ set so freed blocks go back to the OS): parameters +
inputs + the rise of the resident set's high-water mark over one training
step (Linux VmHWM, reset through /proc/self/clear_refs after a warm-up).
Blocks below that threshold (the loops' per-step [B, H] tensors, 32 KB at
B=32 H=256) stay in the heap when freed, so the warm-up's are returned
with glibc's malloc_trim first: without it the timed step reused them and
the torch loops read 2-3x under their peak (QA, session 41).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import sys

import torch
from torch import nn

from benchmarks import worker

# threads = cores unless the driver's --torch-threads says otherwise
torch.set_num_threads(int(os.environ.get("SORJAX_BENCH_TORCH_THREADS", 0))
                      or len(os.sched_getaffinity(0)))


def _param(*shape, fan_in):
  bound = fan_in ** -0.5
  return nn.Parameter(torch.empty(*shape).uniform_(-bound, bound))


class MRNN(nn.Module):
  """h_t = tanh(((x_t B) * (h_{t-1} C)) A + x_t D + f), Maupome & Meurs eq. 6."""

  def __init__(self, D, H, M):
    super().__init__()
    self.B, self.D = _param(D, M, fan_in=D), _param(D, H, fan_in=D)
    self.C, self.A = _param(H, M, fan_in=H), _param(M, H, fan_in=M)
    self.f = _param(H, fan_in=H)

  def forward(self, x):                       # x [T, B, D]
    Bx, Dx = x @ self.B, x @ self.D + self.f
    h = x.new_zeros(x.shape[1], self.A.shape[1])
    ys = []
    for t in range(x.shape[0]):
      m = Bx[t] * (h @ self.C)
      h = torch.tanh(m @ self.A + Dx[t])
      ys.append(h)
    return torch.stack(ys)


class MLSTM(nn.Module):
  """Krause et al.'s multiplicative LSTM, linear candidate (sorjax's mlstm)."""

  def __init__(self, D, H, M):
    super().__init__()
    self.W_mx, self.W_mh = _param(D, M, fan_in=H), _param(H, M, fan_in=H)
    self.W_x, self.W_m = _param(D, 4 * H, fan_in=H), _param(M, 4 * H, fan_in=H)
    self.b = nn.Parameter(torch.zeros(4 * H))
    self.H = H

  def forward(self, x):
    mx, gx = x @ self.W_mx, x @ self.W_x + self.b
    h = x.new_zeros(x.shape[1], self.H)
    c = torch.zeros_like(h)
    ys = []
    for t in range(x.shape[0]):
      m = mx[t] * (h @ self.W_mh)
      i, f, g, o = (gx[t] + m @ self.W_m).chunk(4, 1)
      c = torch.sigmoid(f) * c + torch.sigmoid(i) * g
      h = torch.sigmoid(o) * torch.tanh(c)
      ys.append(h)
    return torch.stack(ys)


class MMRNN(nn.Module):
  """Renganathan & Singh eq. 6-8, h W_hh(t) as sum_k v_k (h W[k])."""

  def __init__(self, D, H, K):
    super().__init__()
    self.W = _param(K, H, H, fan_in=H)
    self.W_hx = _param(D, H, fan_in=H)
    self.W_proj = _param(K + H + D, K, fan_in=K + H + D)
    self.b = nn.Parameter(torch.zeros(H))
    self.K, self.H = K, H

  def forward(self, x):
    K, H = self.K, self.H
    hx, vx = x @ self.W_hx + self.b, x @ self.W_proj[K + H:]
    Wcat = self.W.permute(1, 0, 2).reshape(H, K * H)   # [W[1] | ... | W[K]]
    Pv, Ph = self.W_proj[:K], self.W_proj[K:K + H]
    B = x.shape[1]
    h = x.new_zeros(B, H)
    v = x.new_full((B, K), 1.0 / K)
    ys = []
    for t in range(x.shape[0]):
      v = torch.softmax(v @ Pv + h @ Ph + vx[t], dim=-1)
      hW = (h @ Wcat).view(B, K, H)
      h = torch.tanh((v.unsqueeze(-1) * hW).sum(1) + hx[t])
      ys.append(h)
    return torch.stack(ys)


class AttentionLSTM(nn.Module):
  """Lin et al. sec. 3.2.2 as their code has it: S nn.LSTMCells on (x_t,
  h_{t-1}, c_{t-1}), new states mixed by softmax(x_t V / tau)."""

  def __init__(self, D, H, S):
    super().__init__()
    self.V = _param(D, S, fan_in=D)
    self.cells = nn.ModuleList(nn.LSTMCell(D, H) for _ in range(S))
    self.H = H

  def forward(self, x, tau=1.0):
    alpha = torch.softmax(x @ self.V / tau, dim=-1)     # [T, B, S]
    h = x.new_zeros(x.shape[1], self.H)
    c = torch.zeros_like(h)
    ys = []
    for t in range(x.shape[0]):
      hs, cs = zip(*(cell(x[t], (h, c)) for cell in self.cells))
      a = alpha[t].unsqueeze(-1)                         # [B, S, 1]
      h = (a * torch.stack(hs, 1)).sum(1)
      c = (a * torch.stack(cs, 1)).sum(1)
      ys.append(h)
    return torch.stack(ys)


LOOPS = {"mrnn": lambda D, hp: MRNN(D, hp["hidden_size"],
                                    hp["intermediate_size"]),
         "mlstm": lambda D, hp: MLSTM(D, hp["hidden_size"],
                                      hp["intermediate_size"]),
         "mm_rnn": lambda D, hp: MMRNN(D, hp["hidden_size"],
                                       hp.get("num_matrices", 4)),
         "attention_lstm": lambda D, hp: AttentionLSTM(D, hp["hidden_size"],
                                                       hp["num_cells"])}


class TorchCase:
  """A training step: zero the grads, forward, backward with a fixed
  random cotangent of the outputs [T, B, H]."""

  def __init__(self, model: nn.Module | None, x, G, info, fn=None):
    self.model, self.x, self.G = model, x, G
    self.fn = fn
    self.info = info

  def step(self):
    if self.fn is not None:
      self.fn()
      return
    for p in self.model.parameters():
      p.grad = None
    y = self.model(self.x)
    y = y[0] if isinstance(y, tuple) else y
    y.backward(self.G)

  def run(self, n: int) -> None:
    for _ in range(n):
      self.step()

  def resident_bytes(self) -> int:
    """Parameters and inputs held across steps."""
    ts = [self.x, self.G] + ([] if self.model is None
                             else list(self.model.parameters()))
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def make_case(spec: dict) -> TorchCase:
  torch.manual_seed(0)
  impl = spec["impl"]
  if impl == "matmul":
    n = spec["n"]
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    return TorchCase(None, None, None, {"tokens_per_step": 1},
                     fn=lambda: torch.mm(a, b, out=out))
  if impl == "stepmm":  # T dependent [B, H] x [H, N] products, forward
    B, T, H = spec["B"], spec["T"], spec["H"]
    N = spec.get("N", 4 * H)
    h0, W = torch.randn(B, H), torch.randn(H, N) / H ** 0.5

    def loop():  # the next state: the product's first H columns, as the
      h = h0     # JAX chain (jax_worker.stepmm_case; N >= H here)
      for _ in range(T):
        h = torch.mm(h, W)[:, :H]
    return TorchCase(None, None, None, {"tokens_per_step": B * T}, fn=loop)
  B, T, D = spec["B"], spec["T"], spec["D"]
  if impl == "torch_lstm":
    H = spec["H"]
    model = nn.LSTM(D, H)
  elif impl == "torch_loop":
    if spec["cell"] not in LOOPS:
      raise ValueError(f"torch_worker: no Python-loop {spec['cell']!r}; "
                       f"have {sorted(LOOPS)}")
    H = spec["hparams"]["hidden_size"]
    model = LOOPS[spec["cell"]](D, spec["hparams"])
  else:
    raise ValueError(f"torch_worker: unknown impl {impl!r}")
  x = torch.randn(T, B, D)
  G = torch.randn(T, B, H)
  return TorchCase(model, x, G, {"tokens_per_step": B * T})


def _status(field: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1]) * 1024
  raise RuntimeError(f"no {field} in /proc/self/status")


def _trim_heap() -> None:
  """Returns the heap's free memory to the OS (glibc's malloc_trim; a
  no-op elsewhere), so that the measured step cannot reuse the warm-up's
  freed blocks and hide its own."""
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    trim = libc.malloc_trim
  except (OSError, AttributeError):
    return
  trim(0)


def measure_memory(spec: dict) -> dict:
  """Peak bytes of one training step (see the module docstring)."""
  case = make_case(spec)
  case.run(2)
  if case.model is not None:
    for p in case.model.parameters():
      p.grad = None
  _trim_heap()
  before = _status("VmRSS")
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")                      # reset VmHWM to the current RSS
  case.run(1)
  rise = _status("VmHWM") - before
  return {"ok": True, "peak_bytes": case.resident_bytes() + max(rise, 0)}


if __name__ == "__main__":
  if len(sys.argv) == 3 and sys.argv[1] == "--memory":
    try:
      print(json.dumps(measure_memory(json.loads(sys.argv[2]))))
    except Exception as e:
      print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}))
  else:
    worker.serve(make_case)
