"""The benchmark harness cannot rot: a tiny run end to end, plus its parts.

Benchmarks are not tests; these check that `python -m benchmarks.run` still
runs and reports, that its FLOP counts and statistics are right, and that
the naive and node-by-node baselines compute what they claim. Torch parts
skip (with the reason) when torch is not installed: CI installs only the
`test` extra.
"""

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sorjax
from benchmarks import (contenders, flops, jax_worker, naive, profiles,
                        report, run, specs, workers)
from benchmarks.bench import Bench
from benchmarks.groups import BUSY_MIN_S, Group, pooled
from tests.cells.reference import intermediate_shapes
from tests.test_benchmarks_placement import CAN_PROBE

HAS_TORCH = importlib.util.find_spec("torch") is not None
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_torch = pytest.mark.skipif(
    not HAS_TORCH, reason="torch not installed (the 'bench' extra)")


@pytest.fixture(autouse=True)
def _worker_log_in_tmp_path(tmp_path, monkeypatch):
  """benchmarks.run keeps its workers' stderr in $TMPDIR: not in /tmp."""
  monkeypatch.setenv("TMPDIR", str(tmp_path))


# ------------------------------------------------------------------ FLOPs

def test_flops_hand_counts():
  # LSTM, D = H = 256: forward x W_x (D 4H) + h W_h (H 4H) multiply-adds;
  # backward dW_x for the input product, dW_h and dh for the state's (the
  # step takes gradients to the params only: no dx); x2 FLOPs.
  assert flops.train_flops("lstm", {"hidden_size": 256}, 256) == \
      2 * (2 * 256 * 1024 + 3 * 256 * 1024)
  # mRNN D=3, H=4, M=5: B x (15) + D x (12) + C h (20) + m A (20) = 67.
  mrnn = {"hidden_size": 4, "intermediate_size": 5}
  assert flops.forward_macs("mrnn", mrnn, 3) == 67
  # backward: dB, dD (input-only); dC, dh and dA, dm (the state's).
  assert flops.train_flops("mrnn", mrnn, 3) == 2 * (2 * (15 + 12)
                                                     + 3 * (20 + 20))
  # general2 adds E h (16).
  assert flops.forward_macs("general2", {"hidden_size": 4,
                                         "intermediate_size": 5}, 3) == 83
  # mmRNN D=3, H=2, K=4: x W_hx 6, x P_x 12, h W 16, h P_h 8, v P_v 16,
  # mixture 8 = 66; the first two are input-only.
  mm = {"hidden_size": 2, "num_matrices": 4}
  assert flops.forward_macs("mm_rnn", mm, 3) == 66
  assert flops.train_flops("mm_rnn", mm, 3) == 2 * (2 * 18 + 3 * 48)
  # tensor_rnn D=2, H=3: h A (18) needs dA and dh; its product with x (6)
  # only the cotangent of h A.
  assert flops.train_flops("tensor_rnn", {"hidden_size": 3}, 2) == \
      2 * (3 * 18 + 2 * 6)
  assert flops.matmul_flops(2048) == 2 * 2048 ** 3


def test_step_products_and_ceiling_hand_counts():
  # mRNN H=4, M=5: C [4, 5] and A [5, 4] forward, dz C^T [5, 4] and
  # dv A^T [4, 5] backward; mm_rnn's backward products are [H, K H] too.
  mrnn = {"hidden_size": 4, "intermediate_size": 5}
  assert flops.step_products("mrnn", mrnn, 3) == [((4, 5), (5, 4)),
                                                  ((5, 4), (4, 5))]
  assert flops.step_products("mm_rnn", {"hidden_size": 2,
                                        "num_matrices": 4}, 3) == [
      ((2, 8), (2, 8))]
  assert flops.step_products("general2", mrnn, 3)[0] == ((4, 9), (9, 4))
  assert flops.step_products("tensor_rnn", {"hidden_size": 3}, 2) is None
  # LSTM D = H = 1: training does 2 (2 * 4 + 3 * 4) = 40 FLOPs a token
  # (the formula above), 16 of them in the two per-step products (8 each).
  # At s = 1/2 forward and 1/4 backward those take 16 + 32 = 48
  # roofline-FLOP units, the other 24 FLOPs 24: 40 / 72 of the roofline.
  lstm = {"hidden_size": 1}
  assert flops.train_flops("lstm", lstm, 1) == 40
  assert flops.ceiling("lstm", lstm, 1, {(1, 4): 0.5, (4, 1): 0.25}) == \
      pytest.approx(40 / 72)
  # at the roofline the ceiling is the roofline; unmeasured: none
  assert flops.ceiling("lstm", lstm, 1, {(1, 4): 1, (4, 1): 1}) == 1
  assert flops.ceiling("lstm", lstm, 1, {(1, 4): 0.5}) is None
  assert flops.ceiling("dyck_rnn", {"hidden_size": 2}, 2, {}) is None


@pytest.mark.parametrize("B,K,N", [(3, 4, 16), (3, 16, 4), (3, 8, 8),
                                   (3, 6, 4), (32, 256, 1024),
                                   (32, 1024, 256)])
def test_stepmm_chain_multiplies_k_by_n_every_step(B, K, N):
  """The chain's worker case: T dependent [B, K] x [K, N] products, the
  next step's state the product's first K columns or the state with its
  first N columns replaced, against a NumPy loop; the last two shapes run
  gate-major on CPU (`layer_scan.gate_major_step`)."""
  from benchmarks import jax_worker
  T = 4
  case = jax_worker.stepmm_case(dict(B=B, T=T, H=8, K=K, N=N))
  h0, W = (np.asarray(a, np.float64) for a in case.args)
  h = h0
  for _ in range(T):
    z = h @ W
    if N >= K:
      h = z[:, :K]
    else:
      h = h.copy()
      h[:, :N] = z
  np.testing.assert_allclose(case.compiled(*case.args), h, rtol=1e-4,
                             atol=1e-4)
  assert specs.label(dict(impl="stepmm", framework="jax", B=B, T=T, H=8,
                          K=K, N=N)) == f"XLA per-step [{K}, {N}] product (fwd)"


def test_stepmm_dot_check_refuses_a_narrowed_product():
  """A chain whose compiled dot is narrower than [K, N] (XLA may narrow a
  sliced dot) would time less than the FLOPs counted: refused by name."""
  from benchmarks import jax_worker
  hlo = "%d = f32[64,512]{1,0} dot(%a, %b), lhs_contracting_dims={1}"
  jax_worker.check_stepmm_dot(hlo, 64, 512, 512)
  with pytest.raises(RuntimeError, match=r"\[64, 512\] x \[512, 2048\]"):
    jax_worker.check_stepmm_dot(hlo, 64, 512, 2048)
  jax_worker.check_stepmm_dot(hlo.replace("64,512", "2048,64"), 64, 512,
                              2048)  # gate-major: [N, B]


def test_jax_step_forms_no_input_gradient():
  """train_flops counts no dx of the inputs: the JAX workers' step of
  y = x W compiles to the one product dW = x^T G."""
  from benchmarks import jax_worker
  step = jax_worker.vjp_step(lambda p, xs, aux: xs @ p)
  args = (jnp.ones((8, 3)), jnp.ones((16, 8)), {}, jnp.ones((16, 3)))
  hlo = jax.jit(step).lower(*args).compile().as_text()
  assert len(re.findall(r" dot\(", hlo)) == 1, hlo


@needs_torch
def test_torch_step_forms_no_input_gradient():
  from benchmarks import torch_worker
  case = torch_worker.make_case(contenders.cell_spec("torch_loop", "mrnn", 2, 3, 4))
  assert not case.x.requires_grad
  case.step()
  assert case.x.grad is None


def test_flops_unknown_cell_is_named():
  with pytest.raises(ValueError, match="'nope'"):
    flops.forward_macs("nope", {"hidden_size": 4}, 3)


def test_every_benchmarked_cell_has_a_flop_count():
  for name in profiles.ALL_CELLS:
    hp = specs.cell_hparams(name, 8)
    assert flops.train_flops(name, hp, specs.input_size(name, 8)) > 0


def test_host_malloc_gives_every_worker_the_tunables(monkeypatch):
  from sorjax import host_memory
  monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
  assert workers.host_malloc_env("default") == {}
  assert workers.host_malloc_env("reuse") == {"GLIBC_TUNABLES": host_memory.TUNABLES}
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
  assert workers.host_malloc_env("reuse")["GLIBC_TUNABLES"] == (
      host_memory.TUNABLES + ":glibc.malloc.hugetlb=1")
  assert run.parse_args(["--host-malloc", "reuse"]).host_malloc == "reuse"
  monkeypatch.delenv("GLIBC_TUNABLES")
  assert workers.host_malloc_env("hugepages") == {
      "GLIBC_TUNABLES": host_memory.HUGEPAGE_TUNABLES}


# ------------------------------------------------------------------ baselines

def _setup(name, B=3, T=5, H=6):
  hp = specs.cell_hparams(name, H)
  if name == "attention_lstm":
    hp["mix"] = "gates"
  cell = sorjax.cells.make(name, **hp)
  D = 4 if name != "tensor_rnn" else 7
  params = cell.init(jax.random.key(0), D, jnp.float64)
  rng = np.random.default_rng(1)  # NumPy draws: no RNG programs compile
  xs = jnp.asarray(rng.standard_normal((B, T, D)), jnp.float64)
  aux = {}
  if name == "attention_lstm":
    aux = {"temperature": jnp.float64(0.6)}
  if name == "assignment_lstm":
    aux = {"assignment": jnp.asarray(rng.integers(0, 2, (B, T)), jnp.int32)}
  return cell, params, xs, aux


@pytest.mark.parametrize("name", specs.SECOND_ORDER)
def test_naive_form_equals_the_cell_and_materialises_w_hh(name):
  """The naive step is another implementation of the same equations (it
  forms W_hh(x_t)), so it must agree with sorjax.unroll, and it must really
  build the per-example [B, H, H'] matrix the factored cells avoid."""
  B, H = 3, 6
  with jax.enable_x64(True):
    cell, params, xs, aux = _setup(name, B=B, H=H)
    both = jax.jit(lambda p, x, a: (sorjax.unroll(cell, p, x, **a)[1],
                                    naive.naive_unroll(name, cell, p, x, **a)))
    ys, yn = both(params, xs, aux)
    np.testing.assert_allclose(yn, ys, rtol=1e-10, atol=1e-12)
    shapes = intermediate_shapes(
        lambda p: naive.naive_unroll(name, cell, p, xs, **aux), params)
  per_example = [s for s in shapes if s in ((B, H, H), (B, H, 4 * H))]
  assert per_example, f"naive {name} built no [B, H, H'] array: {shapes}"


def test_naive_rejects_first_order_and_state_mixing():
  cell = sorjax.cells.make("lstm", hidden_size=4)
  with pytest.raises(ValueError, match="'lstm'"):
    naive.naive_unroll("lstm", cell, {}, jnp.zeros((1, 2, 3)))
  cell = sorjax.cells.make("attention_lstm", hidden_size=4, num_cells=2)
  params = jax.eval_shape(lambda: cell.init(jax.random.key(0), 3))
  with pytest.raises(ValueError, match="mix='gates'"):
    jax.eval_shape(lambda p: naive.naive_unroll(
        "attention_lstm", cell, p, jnp.zeros((1, 2, 3)),
        temperature=jnp.float32(1.0)), params)


def test_split_cells_are_the_ones_with_a_split_step():
  """specs.SPLIT (the 'fused' section's cells) is every cell sorjax.unroll
  can run with fused_grad=True."""
  from sorjax.unroll import supports_fused_grad
  split = {n for n in profiles.ALL_CELLS if supports_fused_grad(
      sorjax.cells.make(n, **specs.cell_hparams(n, 8)))}
  assert split == set(specs.SPLIT)


def test_node_by_node_equals_level_schedule():
  from sorjax import trees
  forest = jax_worker.random_trees(4, 2, 7, seed=3)
  schedule = trees.encode(forest)
  node, left, right = jax_worker.node_order(schedule)
  N = schedule.node_mask.shape[1]
  # Every internal node once; both children written before the parent.
  for b in range(4):
    done = set(np.flatnonzero(schedule.leaf_mask[b]) + b * N)
    for s in range(node.shape[0]):
      if node[s, b] >= 4 * N:
        continue
      assert left[s, b] in done and right[s, b] in done
      done.add(node[s, b])
    assert len(done) == schedule.node_mask[b].sum()
  cell = sorjax.cells.make("tree_lstm", hidden_size=5)
  params = cell.init(jax.random.key(0), 5)
  leaves = jax.random.normal(jax.random.key(1),
                             (4, schedule.tokens.shape[1], 5))
  roots, by_node = jax.jit(lambda p, x: (
      trees.run(cell, p, x, schedule)[1][0],
      jax_worker.run_node_by_node(cell, p, x, schedule, (node, left, right))
  ))(params, leaves)
  np.testing.assert_allclose(by_node, roots, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ statistics

def _fake(rates, flops_per_token=None, framework="jax"):
  c = contenders.Contender("k", {"impl": "matmul", "framework": framework, "n": 2},
                    framework, flops_per_token)
  c.rates = list(rates)
  return c


def test_paired_ratio_and_roofline_fraction():
  # Load drifts 2x between rounds; the paired ratio stays exactly 2.
  a, b = _fake([200, 100, 400]), _fake([100, 50, 200])
  mm_x = _fake([10, 5, 20], flops_per_token=100)          # 1000, 500, 2000
  mm_t = _fake([12, 4, None], flops_per_token=100, framework="torch")
  g = Group([mm_x, mm_t], [a, b])
  assert g.ratio(a, b) == 2.0
  assert g.roof == [1200, 500, 2000]                        # the faster per round
  a.flops_per_token = 3
  assert g.fraction(a) == pytest.approx(np.median([0.5, 0.6, 0.6]))
  assert a.rate == 200


def test_proc_stat_cpu_seconds_reads_utime_and_stime():
  tick = os.sysconf("SC_CLK_TCK")
  # a command name with a space and a parenthesis; utime 250, stime 50 ticks
  stat = ("4242 (python -m x)) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 3 0 "
          "100 2000 300")
  assert workers.proc_stat_cpu_seconds(stat) == pytest.approx(300 / tick)
  me = Path(f"/proc/{os.getpid()}/stat")
  if me.exists():
    before = workers.proc_stat_cpu_seconds(me.read_text())
    t0 = time.process_time()
    while time.process_time() - t0 < 0.1:
      pass
    assert workers.proc_stat_cpu_seconds(me.read_text()) - before >= 0.05


def test_cpu_text_names_rounds_where_other_workers_were_busy():
  quiet = _fake([1, 1], flops_per_token=1)
  noisy, failed = _fake([1, 1]), _fake([None])
  quiet.cores = [dict(own=1.9, others=0.01, seconds=0.3)] * 2
  noisy.cores = [dict(own=1.0, others=0.9, seconds=0.3),
                 dict(own=1.8, others=0.0, seconds=0.3)]
  failed.cores = [None]
  # busy by the ratio but below two clock ticks: /proc cannot tell
  blur = _fake([1])
  blur.cores = [dict(own=1.0, others=5.0, seconds=BUSY_MIN_S / 10)]
  text = report.cpu_text([Group([quiet], [noisy]), Group([], [failed,
                                                                   blur])])
  assert "1 of 5 timed rounds had the other workers use more than" in text
  assert text.endswith("| 1 | jax matmul 2^3 | 1 of 2 | 0.90 | 1.40 |")
  assert report.cpu_text([Group([], [quiet])]).endswith(
      "0 of 2 timed rounds had the other workers use more than 0.1 cores.")


def _pair(ours_rates, peer_rates):
  # Each section builds its own Contender objects; groups match them by spec.
  ours = contenders.sorjax("lstm", 2, 5, 8)
  peer = contenders.lstm_peer("torch_lstm", 2, 5, 8, "torch")
  ours.rates, peer.rates = list(ours_rates), list(peer_rates)
  return ours, peer


def test_a_ratio_target_is_judged_over_every_group_that_timed_its_pair():
  a1, t1 = _pair([110, 220], [100, 200])                  # 1.10x: met alone
  a2, t2 = _pair([80, 80], [100, 100])                    # 0.80x
  a3, t3 = _pair([90, 45], [100, 50])                     # 0.90x
  other = contenders.sorjax("mrnn", 2, 5, 8)
  other.rates = [50, 50]
  groups = [Group([], [a1, t1]), Group([], [other]),
            Group([], [t2, a2, other]), Group([], [a3, t3])]
  assert pooled(groups, a1, t1) == pytest.approx([1.1, 0.8, 0.9])
  rep = report.Report()
  rep.target("lstm >= 1.0x torch", groups[0].ratio(a1, t1) >= 1.0, "1.10x",
             (a1, t1, 1.0))
  rep.target("mrnn fraction", True, "71%")                # no pair: as given
  text = report.targets_text(rep, groups)
  assert ("| lstm >= 1.0x torch | NOT met | 1.10x; 3 groups of this run "
          "timed both: 1.10x / 0.80x / 0.90x, median 0.90x |") in text
  assert "| mrnn fraction | met | 71% |" in text
  # Timed in one group only, the target keeps that group's verdict.
  assert "| lstm >= 1.0x torch | met | 1.10x |" in report.targets_text(
      rep, groups[:2])


def test_warmup_rounds_are_timed_and_dropped(tmp_path, monkeypatch):
  """Each contender is timed warmup_rounds + rounds times, in rotating
  order; only the last `rounds` timings become rates."""
  args = run.parse_args(["--smoke", "--no-torch"])
  profile = dataclasses.replace(profiles.PROFILES["smoke"], rounds=3,
                                warmup_rounds=2)
  bench = Bench(args, profile, False, tmp_path / "log")
  calls, clock = [], iter(range(1, 100))

  def fake_call(c, timeout, cmd, **msg):
    calls.append((cmd, msg.get("id")))
    if cmd == "prepare":
      return {"ok": True, "step_s": 0.1, "tokens_per_step": 10}
    if cmd == "time":  # the k-th timing overall took k seconds, 1 core
      k = float(next(clock))
      return {"ok": True, "seconds": k, "cpu_seconds": k}
    return {"ok": True}

  monkeypatch.setattr(bench, "call", fake_call)
  a, b = _fake([]), _fake([])
  bench.group([a, b], roofline=False)
  times = [i for cmd, i in calls if cmd == "time"]
  ida, idb = a.info["id"], b.info["id"]
  assert times == [ida, idb, idb, ida, ida, idb, idb, ida, ida, idb]
  # timings 5..10 are kept: a took 5, 8, 9 s and b 6, 7, 10 s
  assert a.rates == [10 / 5, 10 / 8, 10 / 9]
  assert b.rates == [10 / 6, 10 / 7, 10 / 10]
  assert [x["own"] for x in a.cores] == [1.0] * 3   # no worker ran: others 0
  assert [x["others"] for x in a.cores + b.cores] == [0.0] * 6


def test_cli_rejects_unknown_sections_and_cells(capsys):
  with pytest.raises(SystemExit):
    run.parse_args(["--sections", "lstm,bogus"])
  assert "--sections" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    run.parse_args(["--cells", "mrnn,nope"])
  assert "'nope'" in capsys.readouterr().err


def test_cli_rejects_report_paths_it_could_not_write(tmp_path, capsys):
  """Found when parsing, not when the first group's report is written."""
  afile = tmp_path / "afile"
  afile.write_text("")
  for flag, path, why in (("--out", afile / "r.md", "cannot be made"),
                          ("--json", tmp_path, "is a directory")):
    with pytest.raises(SystemExit):
      run.parse_args([flag, str(path)])
    err = capsys.readouterr().err
    assert f"{flag} {path}: " in err and why in err
  # checked without making anything: the folder is made when written
  args = run.parse_args(["--out", str(tmp_path / "new" / "r.md"),
                         "--json", "-"])
  assert not (tmp_path / "new").exists() and args.out.endswith("r.md")
  # '-' is no JSON, as it is no report for --out (not a file named '-')
  assert args.json is None
  long = "x" * 300
  for path, why in (
      (tmp_path / f"{long}.md", "cannot be written (File name too long)"),
      (tmp_path / "new" / long / "r.md", "longer than"),
      (workers.ROOT / "benchmarks" / "RESULTS.md", "merge by hand"),
      (workers.ROOT / "benchmarks" / ".." / "benchmarks" / "RESULTS.md",
       "merge by hand")):
    with pytest.raises(SystemExit):
      run.parse_args(["--out", str(path)])
    err = capsys.readouterr().err
    assert f"--out {path}: " in err and why in err
  assert not (tmp_path / "new").exists()
  if Path("/proc/self").is_dir():  # a folder no file can be made in
    with pytest.raises(SystemExit):
      run.parse_args(["--out", "/proc/r.md", "--json", str(tmp_path / "j")])
    assert "--out /proc/r.md: cannot be written" in capsys.readouterr().err
  with pytest.raises(SystemExit):  # one would overwrite the other
    run.parse_args(["--out", str(tmp_path / "r.md"), "--json",
                    str(tmp_path / "." / "r.md")])
  assert "the same file as --out" in capsys.readouterr().err
  assert list(tmp_path.iterdir()) == [afile]


@pytest.mark.parametrize("argv, flag", [
    (["--rounds", "0"], "--rounds"),
    (["--warmup-rounds", "-1"], "--warmup-rounds"),
    (["--min-round-seconds", "nan"], "--min-round-seconds"),
    (["--min-round-seconds", "inf"], "--min-round-seconds"),
    (["--min-round-seconds", "-1"], "--min-round-seconds"),
    (["--smoke", "--min-round-seconds", "300"], "--min-round-seconds"),
    (["--mem-budget-gb", "nan"], "--mem-budget-gb"),
    (["--mem-budget-gb", "-2"], "--mem-budget-gb"),
    (["--torch-threads", "-1"], "--torch-threads"),
    (["--sections", ","], "--sections: none given"),
    (["--sections", ""], "--sections: none given"),
    (["--sections", "fused", "--cells", "dyck_rnn"],
     "--cells: section fused runs none of dyck_rnn"),
    (["--sections", "cells,fused", "--cells", "dyck_rnn"],
     "--cells: section fused runs none of dyck_rnn"),
    (["--sections", "fused", "--cells", "lstm,dyck_rnn"],
     "--cells: no section of --sections fused runs dyck_rnn"),
    (["--sections", "lstm", "--cells", "mrnn"],
     "--cells: only the sections cells and fused take cells"),
])
def test_cli_rejects_bad_values_before_making_anything(argv, flag, tmp_path,
                                                       capsys):
  with pytest.raises(SystemExit) as e:
    run.parse_args(argv + ["--out", str(tmp_path / "new" / "r.md")])
  assert e.value.code == 2 and flag in capsys.readouterr().err
  assert not (tmp_path / "new").exists()


def test_cli_names_empty_cells_and_paths_that_name_no_file(tmp_path, capsys):
  # --cells '' said "unknown []"; --out '' "is a directory" (Path('') is
  # '.'), and --out new/ was accepted and written as the file new (QA,
  # session 43)
  for argv, msg in (
      (["--cells", ","], "--cells: none given"),
      (["--out", ""], "--out '': empty"),
      (["--json", ""], "--json '': empty"),
      (["--out", f"{tmp_path}/new/"], f"--out {tmp_path}/new/: names a folder"),
      (["--json", f"{tmp_path}/"], f"--json {tmp_path}/: names a folder")):
    with pytest.raises(SystemExit) as e:
      run.parse_args(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err
  afile = tmp_path / "afile"    # "afile/" is no way to replace afile
  afile.write_text("kept")
  with pytest.raises(SystemExit):
    run.parse_args(["--out", f"{afile}/", "--overwrite"])
  assert "names a folder" in capsys.readouterr().err
  assert sorted(tmp_path.iterdir()) == [afile]


def test_cli_runs_a_section_named_twice_once():
  assert run.parse_args(["--sections", "lstm, lstm,gemm"]).section_list == [
      "lstm", "gemm"]
  assert run.parse_args(["--sections", "fused", "--cells", "lstm,lstm"]
                        ).cells == ["lstm"]


def _fake_sections(monkeypatch, interrupt=None, between=None):
  """RUNNERS whose sections 'a' and 'b' each add a part and finish two
  groups (no worker); `interrupt`: the section that is interrupted after
  its first group; `between`: called after each section's groups."""
  def section(name):
    def runner(b, rep):
      rep.add(f"## section {name}")
      for k in range(2):
        g = Group([], [_fake([100.0 + k])])
        b.groups.append(g)
        b.raw.append(g.as_json())
        if name == interrupt:
          raise KeyboardInterrupt
      if between:
        between(name)
    return runner
  # run_args looks RUNNERS up in run (imported from benchmarks.sections)
  monkeypatch.setattr(run, "RUNNERS", {"lstm": section("a"),
                                       "gemm": section("b")})


def test_an_interrupted_run_writes_what_finished_and_exits_130(
    tmp_path, monkeypatch, capsys):
  _fake_sections(monkeypatch, interrupt="b")
  out, raw = tmp_path / "r.md", tmp_path / "r.json"
  try:
    code = run.main(["--smoke", "--no-torch", "--sections", "lstm,gemm",
                     "--out", str(out), "--json", str(raw)])
  except KeyboardInterrupt:
    pytest.fail("run.main let the KeyboardInterrupt through")
  assert code == 130
  # section a's 2 groups and b's first, finished before the interrupt
  assert len(json.loads(raw.read_text())) == 3
  text = out.read_text()
  assert "## section b" in text and "(partial: run in progress)" not in text
  assert "### Groups of section gemm finished before the interrupt" in text
  assert "| 3 | jax matmul 2^3 | 100 |" in text
  assert "**Run interrupted (Ctrl-C) during section gemm.**" in text
  err = capsys.readouterr().err
  assert (f"interrupted (Ctrl-C) during section gemm; what finished is in "
          f"--out {out}, --json {raw}") in err
  assert "Traceback" not in err


def test_an_existing_report_is_replaced_only_when_asked(tmp_path, capsys):
  # an earlier report was overwritten, even by a run that finished nothing
  # (QA, session 41)
  out, raw = tmp_path / "r.md", tmp_path / "r.json"
  for path in (out, raw):
    path.write_text("earlier\n")
  for flag, path in (("--out", out), ("--json", raw)):
    with pytest.raises(SystemExit) as e:
      run.parse_args([flag, str(path)])
    assert e.value.code == 2
    assert (f"{flag} {path}: exists (an earlier run's?); give a new file, "
            "or --overwrite") in capsys.readouterr().err
  args = run.parse_args(["--out", str(out), "--json", str(raw),
                         "--overwrite"])
  assert args.overwrite
  with pytest.raises(SystemExit):
    run.parse_args(["--no-torch", "--torch-threads", "7"])
  assert "no torch worker runs with --no-torch" in capsys.readouterr().err


def test_a_run_stopped_before_any_group_leaves_an_earlier_report(
    tmp_path, monkeypatch, capsys):
  def stopped_at_once(b, rep):
    raise KeyboardInterrupt
  monkeypatch.setattr(run, "RUNNERS", {"lstm": stopped_at_once})
  out = tmp_path / "r.md"
  out.write_text("earlier\n")
  assert run.main(["--smoke", "--no-torch", "--sections", "lstm", "--out",
                   str(out), "--overwrite"]) == 130
  assert out.read_text() == "earlier\n"
  assert ("interrupted (Ctrl-C) during section lstm before any group "
          "finished; nothing written") in capsys.readouterr().err
  assert [p.name for p in tmp_path.iterdir()] == ["r.md"]   # no temp file


def test_sigterm_is_handled_as_ctrl_c(tmp_path, monkeypatch, capsys):
  # a scheduler's SIGTERM (or `timeout`) left the report marked "partial:
  # run in progress" for good (QA, session 41)
  import signal

  def terminated(name):
    if name == "b":
      os.kill(os.getpid(), signal.SIGTERM)
  _fake_sections(monkeypatch, between=terminated)
  out = tmp_path / "r.md"
  assert run.main(["--smoke", "--no-torch", "--sections", "lstm,gemm",
                   "--out", str(out)]) == 128 + signal.SIGTERM
  text = out.read_text()
  assert "(partial: run in progress)" not in text
  assert "**Run interrupted (SIGTERM) during section gemm.**" in text
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL   # restored


def test_a_report_that_cannot_be_written_loses_not_the_other(
    tmp_path, monkeypatch, capsys):
  """--out's folder turns into a file after the first section: the JSON is
  still written, the run stops there and says which flag failed."""
  out, raw = tmp_path / "sub" / "r.md", tmp_path / "r.json"

  def break_out(name):
    (tmp_path / "sub").write_text("")
  _fake_sections(monkeypatch, between=break_out)
  assert run.main(["--smoke", "--no-torch", "--sections", "lstm,gemm",
                   "--out", str(out), "--json", str(raw)]) == 1
  assert len(json.loads(raw.read_text())) == 2  # section b never ran
  err = capsys.readouterr().err
  assert f"--out {out}: not written (" in err
  assert "section gemm" not in err
  assert (f"stopped after section lstm: --out not written; what finished "
          f"is in --json {raw}") in err


def test_worker_reports_a_bad_spec_and_keeps_serving(tmp_path):
  w = workers.Worker("benchmarks.jax_worker", tmp_path / "log")
  try:
    rep = w.request(120, cmd="prepare", id="x", spec={"impl": "nope"})
    assert not rep["ok"] and "'nope'" in rep["error"]
    assert w.request(60, cmd="ping") == {"ok": True}
  finally:
    w.close()


def test_a_spec_for_the_other_kind_of_jax_worker_is_refused():
  spec = contenders.sorjax("lstm", 2, 3, 4, small_loops=True).spec
  assert not jax_worker.SMALL_LOOPS
  with pytest.raises(ValueError, match="spec small_loops=True sent to a "
                     "worker with SORJAX_BENCH_SMALL_LOOPS=None"):
    jax_worker.make_case(spec)
  n = jax.device_count()
  spec = contenders.sorjax("lstm", 2, 3, 4, replicas=2, devices=n + 1).spec
  assert contenders.sorjax("lstm", 2, 3, 4, devices=n + 1).framework == \
      contenders.host_devices_worker(n + 1)
  with pytest.raises(ValueError, match=f"spec devices={n + 1} sent to a "
                     f"worker with {n} devices"):
    jax_worker.make_case(spec)
  spec = contenders.sorjax("lstm", 2, 3, 4, replicas=2, replica_batch=2).spec
  with pytest.raises(ValueError, match="replica_batch must be None or "
                     "'rule', got 2"):
    jax_worker.make_case(spec)


# ------------------------------------------------------------------ end to end

def _by_label(raw):
  """Per group of a --json list, its contenders by label."""
  return [{c["label"]: c for c in g["contenders"]} for g in raw]


def _groups(path):
  """Per group of the --json file, its contenders by label."""
  return _by_label(json.loads(path.read_text()))


def test_report_names_the_cpu_family_and_model():
  info = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n"
          "model\t\t: 2\nmodel name\t: AMD EPYC\n\n"
          "processor\t: 1\ncpu family\t: 25\nmodel\t\t: 17\n"
          "model name\t: Other\n")
  assert run.cpu_from_cpuinfo(info) == "AMD EPYC (family 26 model 2)"
  assert run.cpu_from_cpuinfo("processor\t: 0\nmodel name\t: X\n") == "X"
  assert run.cpu_from_cpuinfo("processor\t: 0\nfeatures\t: fp\n") == ""


def test_default_report_is_a_new_file_not_results_md(tmp_path, monkeypatch):
  """Without --out the report goes to a new file under benchmarks/reports:
  the curated benchmarks/RESULTS.md is never overwritten."""
  (tmp_path / "benchmarks").mkdir()
  curated = tmp_path / "benchmarks" / "RESULTS.md"
  curated.write_text("curated\n")
  # The workers still import benchmarks from this checkout.
  monkeypatch.setenv("PYTHONPATH", str(workers.ROOT))
  # The checkout is read where the report goes (run) and where the workers
  # start (workers): both move.
  monkeypatch.setattr(run, "ROOT", tmp_path)
  monkeypatch.setattr(workers, "ROOT", tmp_path)
  assert run.main(["--smoke", "--no-torch", "--sections", "unroll"]) == 0
  assert curated.read_text() == "curated\n"
  reports = list((tmp_path / "benchmarks" / "reports").glob("*-smoke.md"))
  assert len(reports) == 1
  assert "| lstm | 2 |" in reports[0].read_text()
  assert (tmp_path / f"sorjax-bench-{os.getpid()}.log").read_text() == ""


def test_a_run_whose_workers_fail_says_so_and_exits_1(tmp_path, monkeypatch,
                                                      capsys):
  # A checkout without the worker modules: every contender fails.
  (tmp_path / "benchmarks").mkdir()
  monkeypatch.delenv("PYTHONPATH", raising=False)
  monkeypatch.setattr(run, "ROOT", tmp_path)
  monkeypatch.setattr(workers, "ROOT", tmp_path)  # where the workers start
  out = tmp_path / "r.md"
  assert run.main(["--smoke", "--no-torch", "--sections", "unroll",
                   "--out", str(out)]) == 1
  log = tmp_path / f"sorjax-bench-{os.getpid()}.log"
  assert "No module named benchmarks.jax_worker" in log.read_text()
  text = out.read_text()
  assert "| lstm | 1 | error |" in text
  assert (f"- sorjax lstm [unroll=1]: benchmarks.jax_worker exited with "
          f"code 1 (see {log})") in text
  assert "2 contender(s) failed" in capsys.readouterr().err


# One smoke run of the JAX-only sections the four tests below read, each
# test checking its sections' part of it: one set of workers, one report
# header (FMA peak, placement probe), where four runs started their own.
# --cells lstm,mrnn: fused times lstm (and mrnn), cells mrnn (and lstm).
JAX_RUN = ["--smoke", "--no-torch", "--sections",
           "lstm,gemm,fused,remat,cells,dyck",
           "--cells", "lstm,mrnn"]
# its tests on one worker, which makes the run once (--dist loadgroup)
jax_run_group = pytest.mark.xdist_group("test_benchmarks_smoke.jax_run")


@dataclasses.dataclass
class SmokeRun:
  code: int           # run.main's exit status
  text: str           # the report
  raw: list           # the --json groups, in the order they ran

  def groups(self):
    """Per group, its contenders by label."""
    return _by_label(self.raw)

  def group(self, *labels):
    """(index, contenders by label) of the one group that timed every one
    of `labels`."""
    found = [(i, g) for i, g in enumerate(self.groups())
             if all(k in g for k in labels)]
    assert len(found) == 1, (labels, [sorted(g) for g in self.groups()])
    return found[0]

  def section(self, heading):
    """The report's part under the '## ' heading that starts `heading`."""
    (part,) = [p for p in self.text.split("\n## ")[1:]
               if p.startswith(heading)]
    return part


# Session-scoped, as the shared runs of tests/experiments: a worker may run
# another module's tests between two of the group's, which tore a module
# fixture down and made it run again (31 s).
@pytest.fixture(scope="session")
def jax_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("jax_run")
  out, raw = tmp / "r.md", tmp / "r.json"
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("TMPDIR", str(tmp))  # as _worker_log_in_tmp_path does
    code = run.main(JAX_RUN + ["--out", str(out), "--json", str(raw)])
  return SmokeRun(code, out.read_text(), json.loads(raw.read_text()))


@jax_run_group
def test_smoke_run_jax_only(jax_run):
  assert jax_run.code == 0
  text = jax_run.text
  for heading in ("## Targets", "## Small-model regime",
                  "replicas trained at once", "Load average at end"):
    assert heading in text
  assert "gradients go to the parameters only" in text  # the FLOP count
  # the dyck section's groups: the small-model regime, its replicas, and
  # the replicas at a paper's shape
  i, dyck = jax_run.group("flax OptimizedLSTMCell",
                          "sorjax lstm [small loops]")
  replicas, paper = jax_run.groups()[i + 1:i + 3]
  assert "sorjax lstm [x3 replicas (the training loop's groups), +adam]" in \
      paper
  assert dyck["torch.nn.LSTM"]["error"].startswith(
      "skipped: torch not installed")
  for g, label in ((dyck, "sorjax lstm"), (dyck, "flax OptimizedLSTMCell"),
                   (dyck, "sorjax lstm [small loops]"),
                   (replicas, "sorjax lstm [+adam]"),
                   (replicas, "sorjax lstm [x3 replicas (vmap), +adam]"),
                   (replicas, "sorjax lstm [+adam, 3 devices]"),
                   (replicas, "sorjax lstm [x3 replicas (vmap), +adam, "
                              "3 devices]")):
    assert g[label]["error"] is None
    assert len(g[label]["rates"]) == 2 and all(r > 0 for r in g[label]["rates"])
    assert g[label]["info"]["peak_bytes"] > 0
    assert [sorted(x) for x in g[label]["cores"]] == [
        ["hops_ns", "others", "own", "seconds"]] * 2
    assert all(x["own"] >= 0 and x["others"] >= 0 for x in g[label]["cores"])
    # the cores' placement, probed on either side of every timing
    hops = [h for x in g[label]["cores"] for h in x["hops_ns"]]
    assert len(hops) == 4
    assert all(h > 0 for h in hops) if CAN_PROBE else hops == [None] * 4
  assert "## CPU use in the timed rounds" in text
  assert "## Where the cores sat" in text
  assert replicas["sorjax lstm [x3 replicas (vmap), +adam]"]["info"][
      "tokens_per_step"] == 3 * 2 * 6
  assert "| skipped |" in jax_run.section("Small-model regime")
  assert "vmapped replicas in <= 3x the time of one" in text
  # its own worker process, which compiled small loops whole
  assert dyck["sorjax lstm [small loops]"]["info"]["small_loops"] is True
  assert dyck["sorjax lstm"]["info"]["small_loops"] is False
  # the replicas' axis over the 3 CPU devices of a worker of its own
  sharded = replicas["sorjax lstm [x3 replicas (vmap), +adam, 3 devices]"]
  assert sharded["info"]["devices"] == 3
  assert "over 3 CPU devices: " in text
  # the replicas at a paper's batch and width, on one and on 3 devices
  assert "at Mahto et al.'s batch and width (B=8 T=5 H=32)" in text
  one = paper["sorjax lstm [x3 replicas (vmap), +adam]"]
  three = paper["sorjax lstm [x3 replicas (vmap), +adam, 3 devices]"]
  assert one["info"]["tokens_per_step"] == 3 * 8 * 5
  assert three["info"]["devices"] == 3 and three["error"] is None
  # and as the training loop groups them: B=8 H=32 gives 512 // 256 = 2
  # at a time (a lax.map over a group of 2 and the 1 left)
  groups = paper["sorjax lstm [x3 replicas (the training loop's groups), "
                 "+adam]"]
  assert groups["error"] is None and groups["info"]["replica_batch"] == 2
  assert all(r > 0 for r in groups["rates"])
  assert "vmaps 2 replicas at a time" in text
  speedup = np.median(np.array(three["rates"]) / np.array(one["rates"]))
  assert f"Sharded over 3 CPU devices, the 3 replicas ran {speedup:.2f}x " \
      "as fast as on one device." in text


@jax_run_group
def test_smoke_run_gemm_times_both_per_step_products(jax_run):
  """The gemm section times [B, H] x [H, 4H] and [B, H] x [H, H] chains,
  each against its own FLOPs (2 H N a token), beside the LSTMs."""
  assert jax_run.code == 0
  _, gemm = jax_run.group("XLA per-step h @ W_h (fwd)")
  H = 8  # the smoke profile's shape, (2, 5, 8)
  for label, N in (("XLA per-step h @ W_h (fwd)", 4 * H),
                   (f"XLA per-step h @ W_h (fwd) [N = {H}]", H)):
    c = gemm[label]
    assert c["error"] is None and all(r > 0 for r in c["rates"])
    assert c["spec"]["N"] == N and c["flops_per_token"] == 2 * H * N
  assert gemm["sorjax lstm"]["error"] is None
  assert f"| XLA per-step h @ W_h (fwd) [N = {H}] |" in jax_run.section(
      "The per-step GEMM ceiling")


@jax_run_group
def test_smoke_run_fused_and_remat(jax_run):
  assert jax_run.code == 0
  _, fused = jax_run.group("sorjax lstm [fused_grad=True]")
  _, remat_autodiff = jax_run.group(
      "sorjax mrnn [remat=dots, fused_grad=False]")
  _, remat_fused = jax_run.group("sorjax mrnn [remat=True, fused_grad=True]")
  labels = [(fused, "sorjax lstm [fused_grad=True]"),
            (fused, "sorjax lstm [fused_grad=False]"),
            (remat_autodiff, "sorjax mrnn [remat=dots, fused_grad=False]"),
            (remat_fused, "sorjax mrnn [remat=True, fused_grad=True]")]
  for g, label in labels:
    assert g[label]["error"] is None, g[label]["error"]
    assert all(r > 0 for r in g[label]["rates"])
  assert "| lstm |" in jax_run.section("Batched weight gradients")
  assert "mrnn [remat=dots, fused_grad=False]" in jax_run.section(
      "Rematerialisation")


@jax_run_group
def test_smoke_run_cells_keeps_naive_forms_out_of_the_roofline_group(
    jax_run):
  """The cell's roofline group holds the two matmuls, sorjax's cell, its
  torch loop and the chain of its per-step product (mrnn's C [H, M] and
  A [M, H], forward and backward, are all [8, 8] at H = M = 8); its naive
  form is timed in a second group beside another copy of the cell, which
  gives the 'vs naive' ratio."""
  assert jax_run.code == 0
  i, main = jax_run.group("torch loop mrnn")
  j, beside = jax_run.group("naive mrnn")
  assert set(main) == {"sorjax mrnn", "torch loop mrnn",
                       "XLA per-step [8, 8] product (fwd)"}
  assert set(beside) == {"sorjax mrnn", "naive mrnn"}
  assert jax_run.raw[i]["roofline_gflops"]["jax"] > 0
  assert jax_run.raw[j]["roofline_gflops"]["roofline"] is None
  assert main["sorjax mrnn"]["fraction"] > 0
  for label in ("sorjax mrnn", "naive mrnn"):
    assert beside[label]["error"] is None, beside[label]["error"]
    assert all(r > 0 for r in beside[label]["rates"])
  assert main["torch loop mrnn"]["error"].startswith("skipped")
  (row,) = [ln for ln in jax_run.section("Every cell").splitlines()
            if ln.startswith("| mrnn |")]
  cols = [c.strip() for c in row.split("|")]
  vs_naive = cols[6]
  assert vs_naive.endswith("x") and float(vs_naive[:-1]) > 0
  # the ceiling column: flops.ceiling of the chain's fraction in the group
  s = main["XLA per-step [8, 8] product (fwd)"]["fraction"]
  hp = specs.cell_hparams("mrnn", 8)
  assert cols[5] == f"{100 * flops.ceiling('mrnn', hp, 8, {(8, 8): s}):.0f}%"


@jax_run_group
def test_smoke_run_lstm_groups_time_its_per_step_chains(jax_run):
  """Each LSTM group times chains of the LSTM's per-step products, h W_h
  ([H, 4H]) and dz W_h^T ([4H, H]), and its targets give the ceiling
  they put on its step."""
  assert jax_run.code == 0
  _, g = jax_run.group("flax OptimizedLSTMCell", "sorjax lstm [hoist=False]")
  for K, N in ((8, 32), (32, 8)):
    c = g[f"XLA per-step [{K}, {N}] product (fwd)"]
    assert c["error"] is None and all(r > 0 for r in c["rates"])
    assert c["flops_per_token"] == 2 * K * N
  assert "the *ceiling*" in jax_run.section("LSTM against")
  (row,) = [ln for ln in jax_run.text.splitlines()
            if ln.startswith("| lstm >= 1.3x flax")]
  assert ", ceiling " in row


@needs_torch
def test_smoke_run_with_torch(tmp_path):
  out, raw = tmp_path / "r.md", tmp_path / "r.json"
  assert run.main(["--smoke", "--sections", "cells", "--cells", "mrnn",
                   "--out", str(out), "--json", str(raw)]) == 0
  cs, beside = _groups(raw)
  for g, label in ((cs, "sorjax mrnn"), (beside, "naive mrnn"),
                   (cs, "torch loop mrnn")):
    assert g[label]["error"] is None, g[label]["error"]
    assert all(r > 0 for r in g[label]["rates"])
    assert g[label]["info"]["peak_bytes"] > 0
  groups = json.loads(raw.read_text())
  assert groups[0]["roofline_gflops"]["torch"] > 0
  assert cs["sorjax mrnn"]["fraction"] > 0
  assert "| mrnn |" in out.read_text()


def test_small_model_study_runs(capsys):
  """benchmarks.small_model end to end at a tiny shape (torch: if present)."""
  from benchmarks import small_model
  # A study script, not library code: optax and its hand-written reference
  # steps are not strict-promotion clean.
  with jax.numpy_dtype_promotion("standard"), \
       jax.numpy_rank_promotion("allow"):
    small_model.main(["--shape", "2,3,4", "--rounds", "1", "--min-seconds",
                      "0", "--replicas", "2", "--path-shapes", "2,3,4"])
  out = capsys.readouterr().out
  assert "sorjax" in out and "replicas" in out
  assert "| (2, 3, 4) |" in out and "lstm paths" in out
  assert "lstm_layer layouts" in out
  assert "2 replicas in lanes (benchmarks.replica_lanes)" in out


def test_replica_lanes_equal_vmapped_lstm_layers():
  """The lanes formulation computes what vmap of fused_lstm.lstm_layer
  does: outputs and the gradients of every weight."""
  from benchmarks import replica_lanes
  from sorjax.cells.base import LSTMCarry
  from sorjax.fused_lstm import lstm_layer
  R, B, T, D, H = 3, 2, 7, 5, 4
  rng = np.random.default_rng(0)  # NumPy draws: no RNG programs compile
  normal = lambda scale, *shape: jnp.asarray(  # noqa: E731
      scale * rng.standard_normal(shape), jnp.float32)
  p = (normal(0.5, R, H, 4 * H), normal(0.5, R, D, 4 * H),
       normal(0.3, R, 4 * H))
  xs = normal(1.0, R, B, T, D)
  G = normal(1.0, R, B, T, H)

  def one(W_h, W_x, b, x):
    z = jnp.zeros((B, H))
    return jnp.swapaxes(lstm_layer(W_h, W_x, b, jnp.swapaxes(x, 0, 1),
                                   LSTMCarry(z, z))[1], 0, 1)

  @jax.jit  # one program: eagerly, every op compiled one of its own
  def outputs_and_grads(p, xs):
    def of(f):  # f's outputs, the gradients of <f(W_h, W_x, b, xs), G>
      ys, pull = jax.vjp(lambda p, x: f(*p, x), p, xs)  # by weights and xs
      return ys, pull(G)
    return of(jax.vmap(one)), of(replica_lanes.lstm_replicas)

  (ref, grads_ref), (got, grads_got) = outputs_and_grads(p, xs)
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
  g_ref, g_got = (jax.tree_util.tree_leaves(g) for g in (grads_ref,
                                                         grads_got))
  assert len(g_got) == 4
  for a, b in zip(g_got, g_ref):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match=r"lstm_replicas: want W_h .* got W_h "
                     r"\(3, 4, 16\), W_x \(3, 4, 16\)"):
    replica_lanes.lstm_replicas(p[0], jnp.asarray(np.asarray(p[1])[:, :4]),
                                p[2], xs)


@pytest.mark.parametrize("argv, flag", [
    (["--sections", "floor", "--replicas", "0"], "--replicas"),
    (["--sections", "floor", "--replicas", "-2"], "--replicas"),
    (["--sections", "codegen", "--min-seconds", "nan"], "--min-seconds"),
    (["--sections", "codegen", "--min-seconds", "-1"], "--min-seconds"),
    (["--sections", "codegen", "--rounds", "0"], "--rounds"),
    (["--sections", ","], "--sections: none given"),
])
def test_small_model_study_rejects_bad_flags(argv, flag, capsys):
  """Before any work: each of these ran, or failed with a traceback."""
  from benchmarks import small_model
  with pytest.raises(SystemExit) as e:
    small_model.main(["--shape", "2,3,4", "--path-shapes", "2,3,4",
                      "--min-seconds", "0", "--rounds", "1"] + argv)
  err = capsys.readouterr().err
  assert e.value.code == 2 and "error: " in err and flag in err


@pytest.mark.parametrize("argv, msg", [
    (["--sections", "paths", "--shape", "2,3,4"],
     "--shape 2,3,4: read only by --sections dyck,replicas,lanes,floor,"
     "codegen, and --sections paths runs none of them"),
    (["--sections", "dyck,codegen", "--path-shapes", "2,3,4"],
     "--path-shapes 2,3,4: read only by --sections paths,layouts"),
    (["--sections", "dyck", "--replicas", "2"],
     "--replicas 2: read only by --sections replicas,lanes,floor"),
])
def test_small_model_study_refuses_flags_no_section_reads(argv, msg, capsys):
  """Not ignored: --sections paths --shape B,T,H timed the nine default
  path shapes (QA, session 43)."""
  from benchmarks import small_model
  with pytest.raises(SystemExit) as e:
    small_model.main(["--rounds", "1", "--min-seconds", "0"] + argv)
  assert e.value.code == 2 and msg in capsys.readouterr().err


def test_small_model_study_defaults_shapes_not_given(monkeypatch):
  from benchmarks import small_model
  seen = []
  monkeypatch.setattr(small_model, "section_paths", lambda a: seen.append(
      (small_model.B, small_model.T, small_model.H, list(a.path_shapes))))
  monkeypatch.setattr(small_model, "section_dyck", lambda a: seen.append(
      (small_model.B, small_model.T, small_model.H, a.replicas)))
  small_model.set_shape(2, 3, 4)   # a call before: the default again
  small_model.main(["--sections", "paths"])
  small_model.main(["--sections", "dyck,paths", "--shape", "2,3,5"])
  shapes = list(small_model.PATH_SHAPES)
  assert seen == [(10, 200, 12, shapes), (2, 3, 5, 20), (2, 3, 5, shapes)]
  small_model.set_shape(*small_model.SHAPE)


def test_small_model_study_names_small_loops_flags_set_already(monkeypatch,
                                                               capsys):
  """--small-loops with XLA_FLAGS setting its flag: the parser's error,
  not a traceback (QA, session 43); checked before JAX could start."""
  from benchmarks import small_model
  monkeypatch.setenv("XLA_FLAGS", "--xla_backend_extra_options=x")
  monkeypatch.setattr("sorjax.host_memory.backend_started", lambda: False)
  with pytest.raises(SystemExit) as e:
    small_model.main(["--sections", "dyck", "--small-loops"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "error: --small-loops: " in err
  assert "already sets --xla_backend_extra_options" in err


def test_small_model_study_compiles_small_loops_whole():
  """--small-loops in a fresh process (XLA reads its flags once)."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run(
      [sys.executable, "-m", "benchmarks.small_model", "--sections", "dyck",
       "--shape", "2,3,4", "--rounds", "1", "--min-seconds", "0",
       "--small-loops"], cwd=ROOT, env=env, capture_output=True, text=True,
      timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "xla_cpu_small_while_loop_byte_threshold" in out.stdout
  assert "| sorjax.unroll (fused_grad) |" in out.stdout


def test_small_model_study_refuses_small_loops_too_late():
  from benchmarks import small_model
  jax.devices()  # started here, not only by the tests before (run alone,
  # this ran the dyck section with XLA_FLAGS changed)
  with pytest.raises(RuntimeError, match="must run before JAX starts"):
    small_model.main(["--sections", "dyck", "--small-loops"])


def test_thread_study_runs(capsys):
  """benchmarks.threads end to end at a tiny shape (torch: if present)."""
  from benchmarks import threads
  with jax.numpy_rank_promotion("allow"):
    threads.main(["--shape", "2,3,4", "--dyck-shape", "2,3,4", "--gaps",
                  "0,2", "--rounds", "1", "--min-seconds", "0"])
  out = capsys.readouterr().out
  rows = {r.split("|")[1].strip(): r.split("|")[2:-1]
          for r in out.splitlines() if r.startswith("| K=")}
  assert set(rows) == {"K=0", "K=2"}
  for cols in rows.values():  # step, gap, step - gap, product, wait, threads
    step, gap, rest, product, wait = map(float, cols[:5])
    assert step > 0 and product > 0 and 0 <= wait <= product
    assert rest == pytest.approx(step - gap, abs=0.11)
    assert cols[5].strip() in ("one", "both")
  assert "OMP_WAIT_POLICY" in out or "skipped: torch not installed" in out
  assert "| sorjax lstm B=2 T=3 H=4 |" in out


def test_thread_study_rejects_bad_flags(capsys):
  from benchmarks import threads
  for argv, flag in ((["--shape", "2,3"], "--shape"),
                     (["--gaps", "1,-1"], "--gaps"),
                     (["--sections", "gap,nope"], "--sections")):
    with pytest.raises(SystemExit):
      threads.main(argv)
    assert f"error: {flag}" in capsys.readouterr().err


def test_thread_study_refuses_flags_no_section_reads(capsys):
  from benchmarks import threads
  for argv, msg in (
      (["--sections", "gap", "--dyck-shape", "2,3,4"],
       "--dyck-shape 2,3,4: read only by --sections spinners"),
      (["--sections", "torch,spinners", "--gaps", "1"],
       "--gaps 1: read only by --sections gap"),
      (["--gaps", ""], "--gaps: want non-negative ints")):
    with pytest.raises(SystemExit) as e:
      threads.main(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["--min-seconds", "nan"], "--min-seconds"),
    (["--rounds", "0"], "--rounds")])
def test_thread_study_rejects_bad_numbers(argv, flag, capsys):
  from benchmarks import threads
  with pytest.raises(SystemExit) as e:
    threads.main(argv)
  assert e.value.code == 2 and f"argument {flag}" in capsys.readouterr().err


@pytest.mark.parametrize("argv, msg", [
    (["--rounds", "0"], "argument --rounds"),
    (["--min-seconds", "nan"], "argument --min-seconds"),
    (["--min-seconds", "-5"], "argument --min-seconds"),
    (["--replicas", "2", "--groups", "1,3"], "--groups: want ints in 1..--"
     "replicas (2)"),
    (["--cpu-devices", "0"], "argument --cpu-devices"),
    (["nosuchconfig"], "config 'nosuchconfig': no module experiments/"
     "configs/nosuchconfig.py"),
    # these were tracebacks, the bad string's after the configs before it
    # had been timed (QA, session 43)
    (["lin_dyck.x"], "config 'lin_dyck.x': no module"),
    (["../x"], "config '../x': no module"),
    (["common"], "config 'common': experiments/configs/common.py is no "
     "config"),
    (["lin_dyck:lstm,m4", "lin_dyck:lstm,m5"], "config 'lin_dyck:lstm,m5': "
     "lin_dyck.py:'lstm,m5': bound must be one of m4, m6, m8")])
def test_replica_groups_study_rejects_bad_flags_before_compiling(
    argv, msg, capsys):
  # they failed after compiling, as a traceback, or not at all (QA,
  # session 41)
  from benchmarks import replica_groups
  with pytest.raises(SystemExit) as e:
    replica_groups.main(argv)
  assert e.value.code == 2 and msg in capsys.readouterr().err


def test_tanh_fit_and_placement_reject_bad_numbers(capsys):
  from benchmarks import placement, tanh_fit
  for main, argv, flag in ((tanh_fit.main, ["--m", "-1"], "--m"),
                           (placement.main, ["--seconds", "nan"],
                            "--seconds"),
                           (placement.main, ["--interval", "inf"],
                            "--interval")):
    with pytest.raises(SystemExit) as e:
      main(argv)
    assert e.value.code == 2 and f"argument {flag}" in (
        capsys.readouterr().err)


def test_replica_groups_study_runs(capsys):
  """benchmarks.replica_groups times a paper config's training step at
  each group size and marks the loop's default."""
  from benchmarks import replica_groups
  # as a paper run goes (optax's injected hyperparameters are not
  # strict-promotion clean)
  with jax.numpy_dtype_promotion("standard"):
    replica_groups.main(["--replicas", "2", "--groups", "1,2", "--rounds",
                         "1", "--min-seconds", "0", "lin_dyck:lstm,m4"])
  out = capsys.readouterr().out
  row = [l for l in out.splitlines() if l.startswith("| lin_dyck:lstm,m4")]
  assert len(row) == 1
  # B=10 H=12: 512 // 120 = 4, clipped to the 2 replicas
  assert re.fullmatch(r"\| lin_dyck:lstm,m4 \| 10x\d+ \| 2 \| k=1 [\d.]+ ms, "
                      r"k=2 \(rule\) [\d.]+ ms \|", row[0]), row[0]
  with pytest.raises(SystemExit):
    replica_groups.main(["--groups", "0,2"])
  assert "--groups: want ints in 1..--replicas (20)" in capsys.readouterr().err


def test_reports_are_replaced_keeping_mode_and_symlinks(tmp_path):
  # the atomic write made every report 0600 and replaced a symlinked
  # --out by a file (review, session 41)
  out = tmp_path / "r.md"
  out.write_text("old\n")
  out.chmod(0o644)
  run._replace(out, "new\n")
  assert out.read_text() == "new\n" and (out.stat().st_mode & 0o777) == 0o644
  link = tmp_path / "link.md"
  link.symlink_to(out)
  run._replace(link, "newer\n")
  assert link.is_symlink() and out.read_text() == "newer\n"
  fresh = tmp_path / "fresh.md"
  umask = os.umask(0o022)
  try:
    run._replace(fresh, "x\n")
  finally:
    os.umask(umask)
  assert (fresh.stat().st_mode & 0o777) == 0o644
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "fresh.md", "link.md", "r.md"]           # no temporary file left
