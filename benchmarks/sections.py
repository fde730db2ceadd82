"""The sections of a benchmark run, each a function of a `Bench` and a
`Report`.

A section builds its contenders, times them in groups (`Bench.group`), adds
its tables to the report and records its targets: `section_lstm` (sorjax's
LSTM against torch.nn.LSTM and flax), `section_gemm` (the per-step product,
the ceiling of a step), `section_cells` (every cell against its naive form
and a torch loop; the LSTM's and each cell's groups also time chains of
their per-step products, which give the step's *ceiling*,
`flops.ceiling`), `section_dyck` (the small-model regime and its replicas,
`replica_table`), `section_scaling`, `section_remat`, `section_fused`,
`section_unroll`, `section_trees` and `section_gpu`. `RUNNERS` maps each
name of `--sections` to its function.
"""

from __future__ import annotations

from typing import Callable

from benchmarks import flops, specs
from benchmarks.bench import Bench
from benchmarks.contenders import (Contender, lstm_peer, naive, sorjax,
                                   step_chains, torch_loop)
from benchmarks.groups import Group
from benchmarks.report import (Report, errors, f_mb, f_pct, f_rate, f_x,
                               roof_line, table)


def _shape(s) -> str:
  return f"B={s[0]} T={s[1]} H={s[2]}"


def section_lstm(b: Bench, rep: Report):
  rep.add("## LSTM against torch.nn.LSTM and flax\n\nD = H, f32, "
          "forward + backward through time.")
  fast, flax_ok = [], []
  for (B, T, H) in b.profile.lstm_shapes:
    torch_c = lstm_peer("torch_lstm", B, T, H, "torch")
    flax_c = lstm_peer("flax_lstm", B, T, H, "jax")
    ours = sorjax("lstm", B, T, H)
    unhoisted = sorjax("lstm", B, T, H, hoist=False)
    autodiff = sorjax("lstm", B, T, H, fused_grad=False)
    cs = [torch_c, flax_c, ours, unhoisted, autodiff]
    chains = step_chains("lstm", B, T, H)
    timed = cs + list(chains.values())
    g = b.group(timed)
    ceil = _ceiling(g, "lstm", H, chains)
    rows = [[c.label, f_rate(c), f_pct(g.fraction(c)),
             f_x(g.ratio(c, torch_c)), f_x(g.ratio(c, flax_c)),
             f_mb(c.peak_mb)] for c in cs]
    rep.add(f"### {_shape((B, T, H))}\n\n{roof_line(g)}\n\n" + table(
        ["implementation", "tokens/s", "% roofline", "vs torch.nn.LSTM",
         "vs flax", "peak memory"], rows) + "\n\n"
        + _ceiling_text(g, chains, ceil) + _errs(timed))
    best = max([ours, unhoisted, autodiff], key=lambda c: c.rate or 0)
    fast.append((B, T, H, g.ratio(ours, torch_c), g.ratio(best, torch_c),
                 best, _needs(g, ours, torch_c, 1.0, ceil),
                 (ours, torch_c, 1.0)))
    flax_ok.append((B, T, H, g.ratio(ours, flax_c),
                    _needs(g, ours, flax_c, 1.3, ceil), (ours, flax_c, 1.3)))
  for B, T, H, r, rb, best, need, pool in fast:
    rep.target(f"lstm >= 1.0x torch.nn.LSTM at {_shape((B, T, H))}",
               None if r is None else r >= 1.0,
               f"{f_x(r)} (best variant {best.label}: {f_x(rb)}){need}", pool)
  for B, T, H, r, need, pool in flax_ok:
    rep.target(f"lstm >= 1.3x flax OptimizedLSTMCell at {_shape((B, T, H))}",
               None if r is None else r >= 1.3, f_x(r) + need, pool)


def _needs(g: "Group", ours: Contender, peer: Contender, x: float,
           ceil: float | None = None) -> str:
  """What a ">= x times the peer" target asks in roofline terms: x times
  the peer's fraction of the roofline (same FLOPs per token), next to ours
  and, if measured, the cell's ceiling (`_ceiling`). Above 100% the target
  needs a faster matmul than the roofline's."""
  fp, fo = g.fraction(peer), g.fraction(ours)
  if fp is None or fo is None:
    return ""
  return (f"; needs {f_pct(x * fp)} of the roofline, is at {f_pct(fo)}"
          + _against_ceiling(x * fp, ceil))


def _against_ceiling(need: float | None, ceil: float | None) -> str:
  if ceil is None:
    return ""
  return f", ceiling {f_pct(ceil)}" + (
      " (beyond the ceiling)" if need is not None and need > ceil else "")


def _ceiling(g: "Group", cell: str, H: int,
             chains: dict[tuple[int, int], Contender]) -> float | None:
  """`flops.ceiling` of cell at hidden size H from the fractions of the
  roofline its per-step product chains (`step_chains`) reached in g."""
  hp = specs.cell_hparams(cell, H)
  return flops.ceiling(cell, hp, specs.input_size(cell, H),
                       {k: g.fraction(c) for k, c in chains.items()})


def _ceiling_text(g: "Group", chains: dict, ceil: float | None) -> str:
  """One sentence: the chains' fractions of the roofline and the ceiling
  they put on the cell's training step."""
  if not chains:
    return ""
  parts = ", ".join(f"[{K}, {N}] {f_pct(g.fraction(c))}"
                    for (K, N), c in chains.items())
  return ("Per-step products alone (T dependent products in a scan, "
          "each step's state the last product's first columns, in the "
          "layout the loops multiply in; forward and backward shapes): "
          f"{parts} of the roofline. With "
          "those products at these rates, every other product at the "
          "roofline and the elementwise work free, a training step would "
          f"reach {f_pct(ceil)} of the roofline: the *ceiling*.")


def section_gemm(b: Bench, rep: Report):
  rep.add("## The per-step GEMM ceiling\n\nA recurrent step multiplies "
          "[B, H] by [H, N], T times in sequence: N = 4H in the LSTM (and "
          "mlstm's m_t W_m, mm_rnn's h [W | P_h]), N = H in rnn, mi_rnn, "
          "mrnn, general2 and mlstm's h_{t-1} W_mh. Timed alone (forward "
          "only, the product's first H columns the next step's state: "
          "no other work), in XLA (in the layout sorjax's loops use, "
          "gate-major where `layer_scan.step_product` is) and in torch, "
          "next to the LSTMs (fwd + bwd): an LSTM step can be no faster "
          "than its framework's per-step product, except where the "
          "framework keeps the weights packed across steps, and a cell "
          "whose steps multiply by [H, H] runs its per-step FLOPs at no "
          "more than the N = H row's fraction of the roofline.")
  for (B, T, H) in b.profile.lstm_shapes:
    mms = [Contender(f"stepmm-{fw}" + ("" if N == 4 * H else f"-n{N}"),
                     dict(impl="stepmm", framework=fw, B=B, T=T, H=H, N=N),
                     fw, 2 * H * N)
           for N in (4 * H, H) for fw in ("jax", "torch")]
    cs = mms + [lstm_peer("torch_lstm", B, T, H, "torch"),
                sorjax("lstm", B, T, H)]
    g = b.group(cs)
    rows = [[c.label, f_rate(c), f_pct(g.fraction(c))] for c in cs]
    rep.add(f"### {_shape((B, T, H))}\n\n{roof_line(g)}\n\n" + table(
        ["", "tokens/s", "% roofline"], rows) + _errs(cs))


def _errs(cs) -> str:
  e = errors(cs)
  return ("\n\nErrors:\n" + "\n".join(e)) if e else ""


def section_cells(b: Bench, rep: Report):
  rep.add("## Every cell: factored (sorjax) vs naive materialised W_hh(t) vs "
          "a torch Python loop\n\nD = H (tensor_rnn: D = "
          f"{specs.TENSOR_RNN_INPUT}). Hyperparameters: M = H; S = 2 cells; "
          "K = 4 matrices (mm_lstm 4, 4, 2, 2). 'vs' columns are paired "
          "speed ratios (>1: sorjax faster); 'naive mem' is the naive "
          "form's peak over sorjax's. Naive forms that need more than the "
          "memory budget, or more than a few seconds a step, are timed at a "
          "shorter T (column 'naive T'; tokens/s of the naive form is flat "
          "in T) while their memory is XLA's figure at the full T. Each "
          "naive form is timed in a group of its own beside a second copy "
          "of sorjax's cell (its 'vs naive' ratio): a round of a naive form "
          "maps and faults in gigabytes, and the roofline matmul timed next "
          "to it measured 235-310 GFLOP/s against 361-442 elsewhere "
          "(session 10), so the groups that give '% "
          "roofline' (sorjax, its torch loop, the two matmuls) hold no "
          "naive form. 'ceiling' is the fraction of the roofline a "
          "training step of the cell could reach with its per-step "
          "products at the rates that chains of them (forward and backward "
          "shapes, `benchmarks.flops.step_products`) reached in the cell's "
          "group, every other product at the roofline and the elementwise "
          "work free (`benchmarks.flops.ceiling`); '-' where the cell's "
          "step is not counted so (tensor_rnn, dyck_rnn, assignment_lstm, "
          "mm_lstm, mix=gates).")
  budget = int(b.args.mem_budget_gb * 2 ** 30)
  for (B, T, H) in b.profile.cell_shapes:
    rows, all_cs = [], []
    for name in b.profile.cells:
      variants = [{}]
      if name == "attention_lstm":
        variants.append({"hparams": {"mix": "gates"}})
      for v in variants:
        ours = sorjax(name, B, T, H, **v)
        cs = [ours]
        loop = None
        if name in specs.TORCH_LOOP and not v:
          loop = torch_loop(name, B, T, H)
          cs.append(loop)
        chains = {} if v else step_chains(name, B, T, H)
        timed = cs + list(chains.values())
        g = b.group(timed)
        ceil = _ceiling(g, name, H, chains) if chains else None
        all_cs += timed
        nv = gn = mate = None
        mix_states = (name == "attention_lstm"
                      and ours.spec["hparams"].get("mix", "states") == "states")
        if name in specs.SECOND_ORDER and not mix_states:
          mate = sorjax(name, B, T, H, **v)
          nv = naive(name, B, T, H, b.profile, budget, **v)
          gn = b.group([mate, nv], roofline=False)
          all_cs += [mate, nv]
        mem_ratio = (None if nv is None or not nv.peak_mb or not ours.peak_mb
                     else nv.peak_mb / ours.peak_mb)
        vs_naive = None if nv is None else gn.ratio(mate, nv)
        rows.append([
            ours.label.replace("sorjax ", ""),
            flops.fmt_flops(ours.flops_per_token), f_rate(ours),
            f_pct(g.fraction(ours)), f_pct(ceil),
            "-" if nv is None else f_x(vs_naive),
            "-" if mem_ratio is None else f"{mem_ratio:.1f}x",
            "-" if loop is None else f_x(g.ratio(ours, loop)),
            f_mb(ours.peak_mb),
            "-" if nv is None else f_rate(nv),
            "-" if nv is None else str(nv.info.get("measured_T", "-")),
            "-" if nv is None else f_mb(nv.peak_mb),
            "-" if loop is None else f_rate(loop),
            "-" if loop is None else f_mb(loop.peak_mb),
            f"{g.roof_gflops()['roofline'] or 0:.0f}"])
        if H == 512 and name in specs.TARGET_CELLS:
          _cell_targets(rep, name, ours, nv, vs_naive, loop, g, mem_ratio, v,
                        ceil)
    rep.add(f"### {_shape((B, T, H))}\n\n" + table(
        ["cell", "FLOP/token", "tokens/s", "% roofline", "ceiling",
         "vs naive",
         "naive mem", "vs torch loop", "peak memory", "naive tokens/s",
         "naive T", "naive peak", "torch loop tokens/s", "torch loop peak",
         "roofline GFLOP/s"], rows) + _errs(all_cs))


def _cell_targets(rep, name, ours, nv, vs_naive, loop, g, mem_ratio,
                  variant, ceil=None):
  tag = name + (" [mix=gates]" if variant else "")
  if not variant:
    f = g.fraction(ours)
    rep.target(f"{tag} >= 70% of roofline at H=512",
               None if f is None else f >= 0.7,
               f_pct(f) + _against_ceiling(0.7, ceil), frac=(g, ours))
    if loop is not None:
      r = g.ratio(ours, loop)
      rep.target(f"{tag} >= 2x torch Python loop at H=512",
                 None if r is None else r >= 2.0,
                 f_x(r) + _needs(g, ours, loop, 2.0, ceil),
                 (ours, loop, 2.0))
  if nv is not None:
    r = vs_naive
    rep.target(f"{tag} >= 10x its naive form at H=512",
               None if r is None else r >= 10.0,
               f"{f_x(r)} (naive timed at T={nv.info.get('measured_T')})")
    rep.target(f"{tag} <= 1/10 of the naive form's memory at H=512",
               None if mem_ratio is None else mem_ratio >= 10.0,
               "-" if mem_ratio is None else f"1/{mem_ratio:.0f}")


def section_dyck(b: Bench, rep: Report):
  B, T, H = b.profile.dyck_shape
  R = b.profile.replicas
  rep.add(f"## Small-model regime of the Dyck experiments ({_shape((B, T, H))}, "
          "D = H)")
  torch_c = lstm_peer("torch_lstm", B, T, H, "torch")
  flax_c = lstm_peer("flax_lstm", B, T, H, "jax")
  ours = [sorjax("lstm", B, T, H, **v) for v in b.profile.dyck_variants]
  cs = [torch_c, flax_c] + ours
  g = b.group(cs, roofline=False)
  rows = [[c.label, f_rate(c), f_x(g.ratio(c, torch_c)), f_mb(c.peak_mb)]
          for c in cs]
  rep.add(table(["implementation", "tokens/s", "vs torch.nn.LSTM",
                 "peak memory"], rows) + _errs(cs))
  r1 = g.ratio(ours[0], torch_c)
  best = max(ours, key=lambda c: c.rate or 0)
  rep.target(f"lstm (defaults) >= 1.5x torch.nn.LSTM at {_shape((B, T, H))}",
             None if r1 is None else r1 >= 1.5,
             f"{f_x(r1)} (best variant {best.label}: "
             f"{f_x(g.ratio(best, torch_c))})", (ours[0], torch_c, 1.5))

  trs, _ = replica_table(b, rep, (B, T, H), R, b.profile.replica_unrolls)
  n_u = len(b.profile.replica_unrolls)
  rest = [f"unroll={u}: {f_x(t)}" for u, t in
          zip(b.profile.replica_unrolls[1:], trs[1:n_u])]
  rest += [f"over {n} CPU devices: {f_x(t)}" for n, t in
           zip(replica_device_counts(b, R), trs[n_u:])]
  met = [t for t in trs if t is not None]
  rep.target(f"{R} vmapped replicas in <= 3x the time of one "
             f"({_shape((B, T, H))})",
             None if not met else min(met) <= 3.0,
             f_x(trs[0]) + (f" ({'; '.join(rest)})" if rest else ""))
  for shape in b.profile.replica_paper_shapes:  # no target: a record
    _, speedups = replica_table(
        b, rep, shape, R, (None,), loop_groups=True,
        title=f"at Mahto et al.'s batch and width ({_shape(shape)})")
    for n, x in zip(replica_device_counts(b, R), speedups):
      rep.add(f"Sharded over {n} CPU devices, the {R} replicas ran "
              f"{f_x(x)} as fast as on one device.")


def replica_device_counts(b: Bench, R: int) -> list[int]:
  """The profile's CPU device counts that R replicas divide evenly."""
  return [n for n in b.profile.replica_devices if R % n == 0]


def replica_table(b: Bench, rep: Report, shape, R: int, unrolls,
                  title: str = "", loop_groups: bool = False) -> list:
  """One Adam step of R models at once (vmap) against one model, for each
  unroll factor; then the R models sharded over n CPU devices (R / n each,
  as the training loop shards them), against one model in that process;
  with loop_groups, last, the R models in the training loop's groups
  (`loop.replica_batch_for`) on one device.
  Adds the table. Returns each pair's time ratio (None where unmeasured),
  the unroll pairs first, and the rate of the R replicas on each device
  count over their rate with the first unroll factor on one device."""
  B, T, H = shape
  pairs = [(sorjax("lstm", B, T, H, optimizer="adam", unroll=u),
            sorjax("lstm", B, T, H, optimizer="adam", replicas=R, unroll=u))
           for u in unrolls]
  pairs += [(sorjax("lstm", B, T, H, optimizer="adam", devices=n),
             sorjax("lstm", B, T, H, optimizer="adam", replicas=R, devices=n))
            for n in replica_device_counts(b, R)]
  n_dev = len(pairs) - len(unrolls)
  if loop_groups:
    pairs.append((pairs[0][0], sorjax("lstm", B, T, H, optimizer="adam",
                                      replicas=R, replica_batch="rule")))
  cs = list({id(c): c for p in pairs for c in p}.values())  # each once
  g = b.group(cs, roofline=False)

  def time_ratio(x, y):  # step time of y over x's: R tokens per token of x
    r = g.ratio(x, y)
    return None if r is None else r * R

  rows, seen = [], []
  for single, vm in pairs:
    for c in (single, vm):
      if any(c is x for x in seen):  # the groups' pair reuses one model
        continue
      seen.append(c)
      step_ms = (None if c.rate is None else
                 1e3 * c.info["tokens_per_step"] / c.rate)
      rows.append([c.label, f_rate(c),
                   "-" if step_ms is None else f"{step_ms:.2f}",
                   f_x(time_ratio(single, c)) if c is vm else "1.00x",
                   f_mb(c.peak_mb)])
  rep.add(f"### {R} replicas trained at once (vmap), one Adam step"
          + (f", {title}" if title else "") + "\n\n"
          "A row with n devices ran in a process with n CPU devices "
          "(`XLA_FLAGS=--xla_force_host_platform_device_count=n`); its "
          "replicas' axis is sharded over them, and its single model ran in "
          "that process too." + groups_text(pairs[-1][1] if loop_groups
                                            else None) + "\n\n" + table(
      ["step", "tokens/s (all replicas)", "ms/step", "time vs one model",
       "peak memory"], rows) + _errs(cs))
  return ([time_ratio(*p) for p in pairs],
          [g.ratio(vm, pairs[0][1])
           for _, vm in pairs[len(unrolls):len(unrolls) + n_dev]])


def groups_text(c: Contender | None) -> str:
  """What the training loop's groups row ran (k from its worker)."""
  if c is None:
    return ""
  k = c.info.get("replica_batch", "?")
  return (f" The row of the training loop's groups vmaps {k} "
          f"replica{'' if k == 1 else 's'} at a time, a `lax.map` over the "
          "groups (`loop.replica_batch_for`, as the loop picks it for this "
          "batch and width).")


def section_scaling(b: Bench, rep: Report):
  rep.add("## Scaling with T, H and B\n\nsorjax cells and torch.nn.LSTM; "
          "tokens/s, fraction of the roofline and peak memory.")
  for axis, shapes in b.profile.scaling.items():
    rows, all_cs = [], []
    for (B, T, H) in shapes:
      cs = [lstm_peer("torch_lstm", B, T, H, "torch")]
      cs += [sorjax(n, B, T, H) for n in b.profile.scaling_cells]
      g = b.group(cs)
      all_cs += cs
      for c in cs:
        rows.append([_shape((B, T, H)), c.label, f_rate(c),
                     f_pct(g.fraction(c)), f_x(g.ratio(c, cs[0])),
                     f_mb(c.peak_mb)])
    rep.add(f"### {axis}\n\n" + table(
        ["shape", "implementation", "tokens/s", "% roofline",
         "vs torch.nn.LSTM", "peak memory"], rows) + _errs(all_cs))


def section_remat(b: Bench, rep: Report):
  B, T, H = b.profile.remat_shape
  rep.add(f"## Rematerialisation at {_shape((B, T, H))}\n\nremat=True "
          "saves only the carries; remat=\"dots\" saves matmul outputs and "
          "recomputes the elementwise rest. The autodiff scan "
          "(fused_grad=False, the default under remat) and the batched-dW "
          "scan (fused_grad=True: True recomputes z_t, \"dots\" is no "
          "remat); speed and memory over no remat.")
  rows, all_cs = [], []
  for name in b.profile.remat_cells:
    for fg in ((False, True) if name in specs.SPLIT else (None,)):
      extra = {} if fg is None else {"fused_grad": fg}
      cs = [sorjax(name, B, T, H, remat=r, **extra)
            for r in (False, True, "dots")]
      g = b.group(cs, roofline=False)
      all_cs += cs
      for c in cs:
        mem = (None if not c.peak_mb or not cs[0].peak_mb
               else c.peak_mb / cs[0].peak_mb)
        rows.append([c.label.replace("sorjax ", ""), f_rate(c),
                     f_x(g.ratio(c, cs[0])), f_mb(c.peak_mb),
                     "-" if mem is None else f"{mem:.2f}x"])
  rep.add(table(["cell", "tokens/s", "speed vs no remat", "peak",
                 "memory vs no remat"], rows) + _errs(all_cs))


def section_fused(b: Bench, rep: Report):
  rep.add("## Batched weight gradients (fused_grad) vs autodiff\n\nThe "
          "default path of each split cell (dW = sum_t h_{t-1}^T dz_t as one "
          "matmul after the backward loop; rnn, lstm, mts_lstm, gru, "
          "mlstm, mm_rnn, mm_lstm, attention_lstm, assignment_lstm and "
          "tensor_rnn run their own layer primitives) against JAX's "
          "autodiff of the scan (fused_grad=False, dW accumulated every "
          "step); fwd + bwd.")
  names = [n for n in (b.args.cells or specs.SPLIT) if n in specs.SPLIT]
  for (B, T, H) in b.profile.fused_shapes:
    rows, all_cs = [], []
    for name in names:
      cs = [sorjax(name, B, T, H, fused_grad=True),
            sorjax(name, B, T, H, fused_grad=False)]
      g = b.group(cs, roofline=False)
      all_cs += cs
      mem = (None if not cs[0].peak_mb or not cs[1].peak_mb
             else cs[0].peak_mb / cs[1].peak_mb)
      rows.append([name, f_rate(cs[0]), f_rate(cs[1]),
                   f_x(g.ratio(cs[0], cs[1])), f_mb(cs[0].peak_mb),
                   f_mb(cs[1].peak_mb), "-" if mem is None else f"{mem:.2f}x"])
    rep.add(f"### {_shape((B, T, H))}\n\n" + table(
        ["cell", "tokens/s fused", "tokens/s autodiff", "speed fused/autodiff",
         "peak fused", "peak autodiff", "memory fused/autodiff"], rows)
        + _errs(all_cs))


def section_unroll(b: Bench, rep: Report):
  rep.add("## The lax.scan unroll factor")
  for (B, T, H), names in b.profile.unroll_shapes:
    rows, all_cs = [], []
    for name in names:
      cs = [sorjax(name, B, T, H, unroll=u) for u in b.profile.unroll_factors]
      g = b.group(cs, roofline=False)
      all_cs += cs
      rows += [[name, str(c.spec["unroll"]), f_rate(c), f_x(g.ratio(c, cs[0])),
                f"{c.info.get('compile_s', 0):.1f}"] for c in cs]
    rep.add(f"### {_shape((B, T, H))}\n\n" + table(
        ["cell", "unroll", "tokens/s", "vs unroll=1", "compile s"], rows)
        + _errs(all_cs))


def section_trees(b: Bench, rep: Report):
  t = b.profile.tree
  rep.add(f"## tree_lstm: chunked vs level-scheduled vs node-by-node\n\n"
          f"{t['B']} random binary trees of {t['min_leaves']}-"
          f"{t['max_leaves']} leaves (split points uniform), H = {t['H']}; "
          "throughput in compositions (internal nodes) per second, forward + "
          "backward; slots = steps x width, the compositions computed.")
  cs = [Contender(impl, dict(impl=impl, **t), "jax",
                  flops.train_flops("tree_lstm", {"hidden_size": t["H"]},
                                    t["H"]))
        for impl in ("tree_chunked", "tree_level", "tree_node")]
  g = b.group(cs)
  rows = [[c.label, str(c.info.get("sequential_steps", "-")),
           str(c.info.get("slots", "-")), f_rate(c), f_pct(g.fraction(c)),
           f_x(g.ratio(c, cs[2])), f_x(g.ratio(c, cs[1])), f_mb(c.peak_mb)]
          for c in cs]
  rep.add(roof_line(g) + "\n\n" + table(
      ["schedule", "sequential steps", "slots", "nodes/s", "% roofline",
       "vs node-by-node", "vs level", "peak memory"], rows) + _errs(cs))


def section_gpu(b: Bench, rep: Report):
  probe = Contender("probe", dict(impl="matmul", framework="jax", n=8), "jax")
  rep_ = b.call(probe, b.profile.timeout_s, cmd="prepare", id="probe",
                 spec=probe.spec)
  plat = rep_.get("platform") if rep_ else None
  if rep_:
    b.call(probe, 60, cmd="release", id="probe")
  if plat != "gpu":
    rep.add(f"## GPU: jax.experimental.rnn (cuDNN) LSTM\n\nSkipped: the JAX "
            f"platform is {plat or 'unknown'}, not gpu.")
    return
  rep.add("## GPU: jax.experimental.rnn (cuDNN) LSTM")
  for (B, T, H) in b.profile.lstm_shapes:
    cud = lstm_peer("cudnn_lstm", B, T, H, "jax")
    cs = [cud, lstm_peer("flax_lstm", B, T, H, "jax"), sorjax("lstm", B, T, H),
          sorjax("mrnn", B, T, H), sorjax("mm_rnn", B, T, H)]
    g = b.group(cs, roofline=False)
    rows = [[c.label, f_rate(c), f_x(g.ratio(c, cud)), f_mb(c.peak_mb)]
            for c in cs]
    rep.add(f"### {_shape((B, T, H))}\n\n" + table(
        ["implementation", "tokens/s", "vs cuDNN", "peak memory"], rows)
        + _errs(cs))


RUNNERS: dict[str, Callable[[Bench, Report], None]] = {
    "lstm": section_lstm, "gemm": section_gemm, "cells": section_cells,
    "fused": section_fused, "dyck": section_dyck, "scaling": section_scaling,
    "remat": section_remat, "unroll": section_unroll, "trees": section_trees,
    "gpu": section_gpu}
