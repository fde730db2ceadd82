"""sorjax.small_loops: XLA:CPU compiles small scans whole once its flags are
set, the cells compute what they compute without them, and a setting that
would not reach XLA is refused by name. XLA reads its flags once per
process, so each mode runs in a fresh one."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import train
from sorjax import host_memory, small_loops

# one worker builds the module's fixtures (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_small_loops")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Gradients (and outputs) of `unroll` for small cells, with lengths and
# reverse, on both the fused VJPs and autodiff's scan; prints them and
# whether the compiled step holds a loop compiled whole.
_PROBE = """
import json, sys
from sorjax import small_loops
if sys.argv[1] == "whole":
  small_loops.compile_whole()
import jax, jax.numpy as jnp, numpy as np
import sorjax
B, T, D, H = 3, 7, 5, 16
out = {"probe": small_loops.compiled_whole()}
for name, fused in (("lstm", None), ("lstm", False), ("mrnn", True),
                    ("mrnn", False), ("gru", True), ("dyck_rnn", None)):
  hp = ({"intermediate_size": H} if name == "mrnn" else
        {"learn_embedding": True} if name == "dyck_rnn" else {})
  cell = sorjax.cells.make(name, hidden_size=H, **hp)
  p = cell.init(jax.random.key(0), input_size=D)
  xs = jax.random.normal(jax.random.key(1), (B, T, D))
  G = jax.random.normal(jax.random.key(2), (B, T, H))
  lengths = jnp.array([7, 4, 1])

  def step(p, xs):
    f = lambda p, xs: sorjax.unroll(cell, p, xs, lengths=lengths,
                                    reverse=True, fused_grad=fused)[1]
    ys, pull = jax.vjp(f, p, xs)
    return ys, pull(G)

  compiled = jax.jit(step).lower(p, xs).compile()
  leaves = jax.tree_util.tree_leaves(compiled(p, xs))
  out[f"{name}/{fused}"] = {
      "whole": "xla_cpu_small_call" in compiled.as_text(),
      "values": [np.asarray(a, np.float64).tolist() for a in leaves]}
print(json.dumps(out))
"""


def _env(**extra):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  return dict(env, **extra)


def _run(code, *args, env=None):
  return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=600,
                        env=env or _env())


def _printed(code, n=1):
  """The last n lines `code` printed, in a fresh process that must succeed;
  and what it logged."""
  out = _run(code)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout.strip().splitlines()[-n:], out.stderr


@pytest.fixture(scope="module")
def probes():
  res = {}
  for mode in ("default", "whole"):
    out = _run(_PROBE, mode)
    assert out.returncode == 0, out.stderr[-3000:]
    res[mode] = json.loads(out.stdout.strip().splitlines()[-1])
  return res


def test_flags_make_xla_compile_small_loops_whole(probes):
  assert probes["default"]["probe"] is False
  assert probes["whole"]["probe"] is True
  for key, r in probes["whole"].items():
    if key != "probe":
      assert r["whole"], f"{key}: no loop compiled whole"
      assert not probes["default"][key]["whole"], key


def test_values_and_gradients_unchanged(probes):
  for key, r in probes["default"].items():
    if key == "probe":
      continue
    whole = probes["whole"][key]["values"]
    assert len(whole) == len(r["values"]), key
    for a, b in zip(r["values"], whole):
      np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6, err_msg=key)


def test_after_the_backend_started_it_refuses():
  code = ("import jax; jax.devices()\n"
          "from sorjax import small_loops\n"
          "small_loops.compile_whole()\n")
  out = _run(code)
  assert out.returncode != 0
  assert "must run before JAX starts its backend" in out.stderr


def test_flags_already_in_xla_flags_are_refused(monkeypatch):
  monkeypatch.setattr(host_memory, "backend_started", lambda: False)
  given = "--xla_cpu_experimental_ynn_fusion_type=dot"
  monkeypatch.setenv("XLA_FLAGS", given)
  with pytest.raises(ValueError, match=r"XLA_FLAGS already sets "
                     r"--xla_cpu_experimental_ynn_fusion_type"):
    small_loops.compile_whole()
  assert os.environ["XLA_FLAGS"] == given


def test_flags_go_before_what_xla_flags_holds(monkeypatch):
  # XLA stops reading at a word that is not a flag
  monkeypatch.setattr(host_memory, "backend_started", lambda: False)
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                     "intra_op_parallelism_threads=1")
  small_loops.compile_whole(4096)
  assert os.environ["XLA_FLAGS"] == (
      "--xla_backend_extra_options="
      "xla_cpu_small_while_loop_byte_threshold=4096 "
      "--xla_cpu_experimental_ynn_fusion_type= "
      "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")


def test_a_second_call_with_the_same_flags_changes_nothing(monkeypatch):
  # a rerun notebook cell was refused as if XLA_FLAGS had set them itself;
  # other values are still refused (QA, session 41)
  monkeypatch.setattr(host_memory, "backend_started", lambda: False)
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
  small_loops.compile_whole(4096)
  once = os.environ["XLA_FLAGS"]
  small_loops.compile_whole(4096)
  assert os.environ["XLA_FLAGS"] == once
  with pytest.raises(ValueError, match="XLA_FLAGS already sets"):
    small_loops.compile_whole(8192)


def test_a_threshold_xla_cannot_read_is_refused():
  with pytest.raises(ValueError, match=r"max_bytes must be < 2\*\*63"):
    small_loops.xla_flags(2**63)


def test_checked_names_the_caller_when_xla_ignores_the_flags(monkeypatch):
  monkeypatch.setattr(host_memory, "backend_started", lambda: False)
  monkeypatch.setattr(small_loops, "compiled_whole", lambda: False)
  monkeypatch.setenv("XLA_FLAGS", "")
  with pytest.raises(RuntimeError, match=r"^--my_flag: XLA compiled a small "
                     r"loop as before \(XLA_FLAGS='--xla_backend_extra"):
    small_loops.compile_whole_checked("--my_flag")


def test_flags_apply_before_a_word_xla_stops_at():
  code = ("import os\n"
          "os.environ['XLA_FLAGS'] = 'intra_op_parallelism_threads=1'\n"
          "from sorjax import small_loops\n"
          "small_loops.compile_whole()\n"
          "print(small_loops.compiled_whole())\n")
  assert _printed(code)[0] == ["True"]


def test_default_limit_is_the_documented_one_mib():
  """The module doc's shell form of the settings (and its measurements:
  an LSTM iteration at B=10 H=12 < 128 KB in, at B=32 H=128 > 1 MB out)."""
  assert small_loops.MAX_BYTES == 1048576
  assert small_loops.xla_flags() == (
      "--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold="
      "1048576 --xla_cpu_experimental_ynn_fusion_type=")
  assert 'XLA_FLAGS="' + small_loops.xla_flags() + '"' in small_loops.__doc__


@pytest.mark.parametrize("bad", [0, -1, 1.5, "1"])
def test_bad_byte_limit_is_named(bad):
  with pytest.raises(ValueError, match="max_bytes must be an int >= 1"):
    small_loops.xla_flags(bad)


def test_launchers_apply_and_check_it():
  code = ("from absl import logging; logging.set_verbosity('info')\n"
          "from experiments import train\n"
          "train.prepare_process('default', True)\n"
          "from sorjax import small_loops\n"
          "import os; print(os.environ['XLA_FLAGS'])\n"
          "print(small_loops.compiled_whole())\n")
  (flags, whole), log = _printed(code, 2)
  assert flags == small_loops.xla_flags() and whole == "True"
  assert "small_loops: --xla_backend_extra_options" in log


def test_launchers_refuse_it_off_cpu():
  code = ("import jax\n"
          "jax.default_backend = lambda: 'gpu'\n"
          "from experiments import train\n"
          "train.prepare_process('default', True)\n")
  out = _run(code)
  assert out.returncode != 0
  assert "--small_loops is an XLA:CPU setting; this process computes on " \
         "gpu" in out.stderr


def test_launchers_leave_it_off_by_default(monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  train.prepare_process("default")
  assert "XLA_FLAGS" not in os.environ
