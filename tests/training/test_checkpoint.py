import os
import re
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from sorjax.training.checkpoint import Checkpointer


def state(v):
  return {"params": {"w": jnp.full((3,), v, jnp.float32)},
          "step": jnp.int32(int(v))}


def test_latest_n_and_best(tmp_path):
  ck = Checkpointer(str(tmp_path), keep=2)
  for s in range(1, 6):
    ck.save(s, state(s), {"epoch": s, "data": {"pos": 10 * s}})
    if s in (2, 3):
      ck.save_best(s, state(s), {"epoch": s, "valid_loss": 1.0 / s})
  ck.wait()
  assert ck.latest_step() == 5 and ck.best_step() == 3
  s, st, meta = ck.restore(state(0), "latest")
  assert s == 5 and meta == {"epoch": 5, "data": {"pos": 50}}
  np.testing.assert_array_equal(st["params"]["w"], 5.0)
  s, st, meta = ck.restore(state(0), "best")
  assert s == 3 and meta["valid_loss"] == pytest.approx(1 / 3)
  assert ck.restore(state(0), 4)[0] == 4
  ck.close()
  # a fresh reader in another "process" sees the same
  ro = Checkpointer(str(tmp_path), read_only=True)
  assert ro.restore_meta("latest") == (5, {"epoch": 5, "data": {"pos": 50}})


def test_missing_checkpoints_are_reported(tmp_path):
  ck = Checkpointer(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="no checkpoint 'latest'"):
    ck.restore(state(0))
  ck.save(7, state(7), {})
  ck.wait()
  with pytest.raises(FileNotFoundError, match=r"available steps: \[7\]"):
    ck.restore(state(0), 3)
  with pytest.raises(ValueError, match="step must be"):
    ck.restore(state(0), "newest")


def test_damaged_checkpoint_is_named_with_the_other_steps(tmp_path):
  import shutil
  ck = Checkpointer(str(tmp_path))
  for s in (1, 2):
    ck.save(s, state(s), {"epoch": s})
  ck.wait()
  ck.close()
  shutil.rmtree(tmp_path / "checkpoints" / "2" / "meta")
  ck = Checkpointer(str(tmp_path), read_only=True)
  where = str(tmp_path / "checkpoints" / "2")
  with pytest.raises(ValueError, match=(
      rf"checkpoint {where} cannot be read; it is incomplete or damaged "
      r"\(Item \"meta\" was not found.*Other steps: \[1\]")):
    ck.restore(state(0), "latest")
  assert ck.restore(state(0), 1)[0] == 1


def test_arrays_of_other_shapes_than_the_target_are_refused(tmp_path):
  """A config edited after training builds a target of other shapes; the
  restored arrays must not come back silently in the stored shapes."""
  ck = Checkpointer(str(tmp_path))
  ck.save(1, state(1), {})
  ck.wait()
  other = {"params": {"w": jnp.zeros((4,), jnp.float32)}, "step": jnp.int32(0)}
  with pytest.raises(ValueError, match=re.escape(
      "holds arrays of other shapes than the config makes")):
    ck.restore(other, "latest")


def test_only_the_single_best_is_kept_and_every_step_is_listed(tmp_path):
  """best/ holds one checkpoint (the previous best is dropped, even with
  keep > 1); errors list the steps of checkpoints/ and best/ together."""
  ck = Checkpointer(str(tmp_path), keep=3)
  ck.save(1, state(1), {"epoch": 1})
  for s in (2, 3, 4):
    ck.save_best(s, state(s), {"epoch": s})
  ck.wait()
  assert sorted(p.name for p in (tmp_path / "best").iterdir()
                if p.name.isdigit()) == ["4"]
  assert ck.best_step() == 4 and ck.restore(state(0), 4)[0] == 4
  with pytest.raises(FileNotFoundError, match=r"no checkpoint 3 .*available "
                     r"steps: \[1, 4\]"):
    ck.restore(state(0), 3)
  ck.close()


def test_a_numpy_int_step_restores(tmp_path):
  # steps read from metrics or np.argmin arrive as NumPy ints
  ck = Checkpointer(str(tmp_path), keep=3)
  ck.save(5, state(5), {"epoch": 1})
  ck.wait()
  assert ck.restore(state(0), np.int64(5))[0] == 5
  with pytest.raises(ValueError, match="step must be 'latest', 'best' or an "
                     "int, got np.True_"):
    ck.restore(state(0), np.bool_(True))
  ck.close()


def test_reading_a_run_logs_no_warnings(tmp_path, caplog):
  # six orbax warnings that the folders are read only (as asked) came with
  # every sorjax.restore (QA, session 41)
  ck = Checkpointer(str(tmp_path))
  ck.save_best(3, state(3), {"epoch": 1})
  ck.close()
  with caplog.at_level("WARNING"):
    ro = Checkpointer(str(tmp_path), read_only=True)
    step, _, meta = ro.restore(state(0), "best")
    ro.close()
  assert (step, meta["epoch"]) == (3, 1)
  assert [r.getMessage() for r in caplog.records
          if r.levelname == "WARNING"] == []


def test_saving_a_step_again_replaces_it_and_a_failure_keeps_it(
    tmp_path, monkeypatch):
  """A step saved again (an epoch's end after a periodic save) replaces
  the earlier save once the new one is complete; a save that fails (a
  full disk) keeps it, as a WriteError naming the folder and the last
  complete checkpoint. The earlier save waits aside while the new one is
  written; a process killed meanwhile leaves it there, and the next
  writer puts it back (or drops it beside a complete new save)."""
  import orbax.checkpoint as ocp
  from sorjax.checks import WriteError
  ck = Checkpointer(str(tmp_path), keep=1)
  ck.save(4, state(4), {"epoch": 0})
  ck.save(4, state(5), {"epoch": 1})
  ck.wait()
  assert ck.restore(state(0))[2] == {"epoch": 1}
  folder = tmp_path / "checkpoints"
  assert os.listdir(folder) == ["4"]

  def full(self, step, *args, **kwargs):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(ocp.CheckpointManager, "save", full)
  with pytest.raises(WriteError, match=(
      rf"saving a checkpoint in {folder} failed \(\[Errno 28\] No space left "
      rf"on device\); the run stops here and {folder}/4 is its last "
      "complete checkpoint: free space")):
    ck.save(4, state(6), {"epoch": 2})
  monkeypatch.undo()
  s, st, meta = ck.restore(state(0))
  assert (s, meta) == (4, {"epoch": 1})
  np.testing.assert_array_equal(st["params"]["w"], 5.0)
  assert os.listdir(folder) == ["4"]
  ck.close()
  os.rename(folder / "4", folder / ".replaced-4")     # killed mid-save
  ck = Checkpointer(str(tmp_path), keep=1)
  assert ck.restore_meta("latest") == (4, {"epoch": 1})
  ck.save(4, state(7), {"epoch": 3})
  ck.wait()
  ck.close()
  shutil.copytree(folder / "4", folder / ".replaced-4")  # killed after it
  assert Checkpointer(str(tmp_path)).restore_meta() == (4, {"epoch": 3})
  assert os.listdir(folder) == ["4"]


def test_a_damaged_meta_is_named_when_only_the_meta_is_read(tmp_path):
  """restore_meta (a resume's first read) of a meta cut short raised a
  bare JSONDecodeError naming no checkpoint."""
  ck = Checkpointer(str(tmp_path))
  for s in (1, 2):
    ck.save(s, state(s), {"epoch": s, "config": {"x": "y" * 100}})
  ck.wait()
  ck.close()
  os.truncate(tmp_path / "checkpoints" / "2" / "meta" / "metadata", 30)
  ck = Checkpointer(str(tmp_path), read_only=True)
  with pytest.raises(ValueError, match=(
      rf"checkpoint {tmp_path}/checkpoints/2 cannot be read; it is "
      r"incomplete or damaged \(.*\). Other steps: \[1\]")):
    ck.restore_meta("latest")
