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
