"""Orbax checkpoints of a run: the latest N, and the best by validation.

Two CheckpointManagers under the work directory:

    <workdir>/checkpoints/<step>/   the latest `keep` checkpoints (resume)
    <workdir>/best/<step>/          the single best by validation (analysis)

Each checkpoint holds `state` (a pytree: params, optimizer state, RNG, ...)
and `meta` (JSON: epoch, data-iterator position, metrics, the resolved
config). The trainer decides what "best" is and calls `save_best` only on
improvement, which keeps the rule explicit (orbax's own best-N bookkeeping
mixes with latest-N in ways that are hard to read).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from typing import Any

import jax
import orbax.checkpoint as ocp

from sorjax.checks import check_int, is_int, write_error

# <dir>/.replaced-<step>: a step's earlier save, kept while the step is
# saved again (orbax saves no step twice) and dropped once the new save is
# complete; orbax lists no such folder as a step.
_REPLACED = ".replaced-"


def _reason(e: BaseException) -> str:
  """An orbax / tensorstore error's message without tensorstore's ~1 KB
  spec."""
  reason = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
  return str(reason).split(" [tensorstore_spec=")[0][:300]


def complete_steps(folder: str) -> list[int]:
  """The steps orbax finished saving in `folder` (its int-named folders;
  a save in progress or cut short is named `<step>.orbax-checkpoint-tmp`)."""
  try:
    return sorted(int(n) for n in os.listdir(folder) if n.isdigit())
  except OSError:
    return []


def _put_back_replaced(folder: str) -> None:
  """Finishes a save of an existing step that was cut short (a kill): the
  step's earlier save goes back where it was unless the new one is there."""
  try:
    names = [n for n in os.listdir(folder) if n.startswith(_REPLACED)]
  except OSError:
    return
  for name in names:
    aside, step = os.path.join(folder, name), name[len(_REPLACED):]
    if os.path.isdir(os.path.join(folder, step)):
      shutil.rmtree(aside, ignore_errors=True)
    else:
      os.rename(aside, os.path.join(folder, step))


def _entries(tree: Any) -> dict[str, tuple | None]:
  """{dotted path: shape} of a pytree's leaves, named as orbax stores them
  (dict keys, dataclass fields and sequence indices alike)."""
  def name(k):
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        return str(getattr(k, attr))
    return str(k)
  return {".".join(name(k) for k in path): (
      tuple(leaf.shape) if hasattr(leaf, "shape") else None)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


class _ReadOnlyNotice(logging.Filter):
  """Drops orbax's warning that a read-only manager's folder is read only
  (what was asked for): three per restore in a notebook's output."""

  def filter(self, record):
    return not record.getMessage().startswith("Given directory is read only")


def _manager(path: str, keep: int, read_only: bool = False):
  if not read_only:
    _put_back_replaced(path)
    return ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=True))
  # what orbax sets (and warns about) for read_only, set here
  options = ocp.CheckpointManagerOptions(
      max_to_keep=None, save_interval_steps=0, create=False, read_only=True)
  quiet, log = _ReadOnlyNotice(), logging.getLogger("absl")
  log.addFilter(quiet)
  try:
    return ocp.CheckpointManager(path, options=options)
  finally:
    log.removeFilter(quiet)


class Checkpointer:
  """Saves and restores (state pytree, meta JSON) pairs in a work directory."""

  def __init__(self, workdir: str, keep: int = 3, read_only: bool = False):
    check_int("Checkpointer: keep", keep, 1)
    self.workdir = os.path.abspath(workdir)
    self._latest = _manager(os.path.join(self.workdir, "checkpoints"), keep,
                            read_only)
    self._best = _manager(os.path.join(self.workdir, "best"), 1, read_only)

  # ------------------------------------------------------------------ save
  @staticmethod
  def _args(state, meta):
    return ocp.args.Composite(state=ocp.args.StandardSave(state),
                              meta=ocp.args.JsonSave(meta))

  def save(self, step: int, state: Any, meta: dict) -> None:
    """Saves a resumable checkpoint (replacing one at the same step, e.g.
    at an epoch's end after a periodic save), once any best save has
    completed: its meta records that best (best_mean), and a resume from
    it after a best save failed in the background kept an older best/
    for good, unnamed."""
    with self._saving(self._best):
      self._best.wait_until_finished()
    self._save(self._latest, step, state, meta)

  def save_best(self, step: int, state: Any, meta: dict) -> None:
    """Saves `state` as the best so far (the previous best is dropped)."""
    self._save(self._best, step, state, meta)

  def _save(self, mngr, step: int, state: Any, meta: dict) -> None:
    """Saves in the background; a step saved before is saved again while
    its earlier save waits aside (`_REPLACED`), then dropped, so a save
    that fails (a full disk) keeps it: deleting it first left a run with
    keep=1 no checkpoint, and its rerun started over."""
    with self._saving(mngr):
      if step not in mngr.all_steps():
        mngr.save(step, args=self._args(state, meta))
        return
      mngr.wait_until_finished()
      folder = str(mngr.directory)
      path = os.path.join(folder, str(step))
      aside = os.path.join(folder, f"{_REPLACED}{step}")
      os.rename(path, aside)
      mngr.reload()
      try:
        mngr.save(step, args=self._args(state, meta))
        mngr.wait_until_finished()
      except BaseException:
        if not os.path.isdir(path):
          os.rename(aside, path)
          mngr.reload()
        raise
      shutil.rmtree(aside, ignore_errors=True)

  @contextlib.contextmanager
  def _saving(self, mngr):
    """Orbax's error for a save that failed (raised by the next save or
    wait, as saves run in the background), as a WriteError naming the
    folder and the last complete checkpoint there."""
    try:
      yield
    except (OSError, ValueError, RuntimeError) as e:
      latest = os.path.join(self.workdir, "checkpoints")
      steps = complete_steps(latest)
      kept = (f"{latest}/{steps[-1]} is its last complete checkpoint: free "
              "space (or make the folder writable) and run the same "
              "command again to resume from it" if steps else
              f"{latest} holds no complete checkpoint: the same command "
              "starts it again")
      raise write_error(
          f"saving a checkpoint in {mngr.directory} failed ({_reason(e)}); "
          f"the run stops here and {kept}", e) from None

  def wait(self) -> None:
    with self._saving(self._latest):
      self._latest.wait_until_finished()
    with self._saving(self._best):
      self._best.wait_until_finished()

  def close(self) -> None:
    self._latest.close()
    self._best.close()

  # --------------------------------------------------------------- restore
  def latest_step(self) -> int | None:
    return self._latest.latest_step()

  def best_step(self) -> int | None:
    return self._best.latest_step()

  def _steps(self) -> list[int]:
    return sorted(set(self._latest.all_steps()) | set(self._best.all_steps()))

  def _resolve(self, step):
    if step == "latest":
      s = self.latest_step()
      mngr = self._latest
    elif step == "best":
      s = self.best_step()
      mngr = self._best
    elif is_int(step):
      s = step = int(step)
      mngr = (self._latest if step in self._latest.all_steps() else
              self._best if step in self._best.all_steps() else None)
    else:
      raise ValueError(f"step must be 'latest', 'best' or an int, got {step!r}")
    available = self._steps()
    if s is None or mngr is None:
      hint = ("; best/ is written when an epoch is evaluated, and this run "
              "has evaluated none (step 'latest' reads its last state)"
              if step == "best" and available else "")
      raise FileNotFoundError(
          f"no checkpoint {step!r} in {self.workdir} (available steps: "
          f"{available or 'none'}){hint}")
    return mngr, s

  def restore_meta(self, step="latest") -> tuple[int, dict]:
    """(step, meta) without touching the arrays."""
    mngr, s = self._resolve(step)
    try:
      out = mngr.restore(s, args=ocp.args.Composite(
          meta=ocp.args.JsonRestore()))
    except (KeyError, ValueError, OSError) as e:  # meta cut short, missing
      raise self._damaged(mngr, s, e) from None
    return s, out["meta"]

  def restore(self, target: Any, step="latest") -> tuple[int, Any, dict]:
    """(step, state, meta); `target` gives the state's structure, shapes,
    dtypes and shardings (arrays or jax.ShapeDtypeStruct)."""
    mngr, s = self._resolve(step)
    where = os.path.join(str(mngr.directory), str(s))
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, target)
    self._check_entries(where, mngr.directory / str(s) / "state", abstract)
    try:
      out = mngr.restore(s, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract),
          meta=ocp.args.JsonRestore()))
    except (KeyError, ValueError, OSError) as e:
      # orbax names a missing item, tensorstore a missing or short file
      # (after a ~1 KB spec); neither says which checkpoint.
      reason = _reason(e)
      if "not compatible with the stored shape" in reason:
        raise self._other_shapes(where, reason.split(". Truncating")[0])
      raise self._damaged(mngr, s, e) from None
    wrong = [f"{jax.tree_util.keystr(k)} {tuple(g.shape)} (expected "
             f"{tuple(w.shape)})" for (k, g), w in zip(
                 jax.tree_util.tree_leaves_with_path(out["state"]),
                 jax.tree_util.tree_leaves(abstract)) if g.shape != w.shape]
    if wrong:  # an abstract target without shardings restores any shape
      raise self._other_shapes(where, "; ".join(wrong[:4]))
    return s, out["state"], out["meta"]

  def _check_entries(self, where: str, path, abstract: Any) -> None:
    """The stored state's entries and shapes (its metadata, not its arrays)
    against the target's: a config edited after training (another cell)
    makes other entries, which orbax reports as a tree that does not
    match, read above as a damaged checkpoint. Nothing when the metadata
    cannot be read (the restore then names the damage)."""
    handler = ocp.PyTreeCheckpointHandler()
    try:
      stored = _entries(handler.metadata(path).tree)
    except Exception:  # unreadable: the restore below names the damage
      return
    finally:
      handler.close()
    want = _entries(abstract)
    missing = [k for k in want if k not in stored]
    extra = [k for k in stored if k not in want]
    if missing or extra:
      first = (f"the config's model has {missing[0]}, which the checkpoint "
               f"does not hold" if missing else f"the checkpoint holds "
               f"{extra[0]}, which the config's model does not have")
      more = len(missing) + len(extra) - 1
      raise ValueError(
          f"{self.workdir}/config.json disagrees with checkpoint {where}: "
          f"{first}{f' ({more} more entries differ)' if more else ''}. The "
          "config is not the one this run was trained with (each "
          "checkpoint's meta keeps a copy of that one under 'config')")
    wrong = [f"{k} {stored[k]} (expected {want[k]})" for k in want
             if stored[k] is not None and stored[k] != want[k]]
    if wrong:
      raise self._other_shapes(where, "; ".join(wrong[:4]))

  def _damaged(self, mngr, s: int, e: BaseException) -> ValueError:
    """Checkpoint `s` of `mngr` cannot be read: a ValueError naming it,
    orbax's reason and the other steps."""
    others = [t for t in self._steps() if t != s]
    return ValueError(
        f"checkpoint {os.path.join(str(mngr.directory), str(s))} cannot be "
        f"read; it is incomplete or damaged ({_reason(e)}). Other steps: "
        f"{others or 'none'} (restore one of them, or delete this one to "
        "resume training from them)")

  def _other_shapes(self, where: str, detail: str) -> ValueError:
    return ValueError(
        f"checkpoint {where} holds arrays of other shapes than the config "
        f"makes ({self.workdir}/config.json): {detail}. The config is not "
        "the one this run was trained with")
