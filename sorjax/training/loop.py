"""The training loop shared by every task.

- replicas: `num_replicas` independent seeds (params, optimizer, RNG, carry)
  trained by one compiled step over a leading replica axis, vmapped
  `replica_batch_size` at a time (a loop over such groups when fewer than
  all; None: `replica_batch_for`, which vmaps small models together and
  runs large ones one after another);
- devices: with a number of replicas divisible by the local devices'
  count (> 1), the replica axis of the train state is sharded over them
  (each device trains its replicas on the whole batch: replicas are
  independent, so nothing crosses devices); otherwise the batch axis is
  sharded (data parallelism with `jax.sharding`) and the train state is
  replicated. One process (a multi-process `jax.distributed` run is
  refused);
- resume: everything the future depends on (state, epoch, data position,
  plateau / early-stopping / NT-ASGD bookkeeping) is checkpointed, so a killed
  run restarted with the same command ends where an uninterrupted one would;
- a non-finite loss leaves the state untouched inside the step and stops
  the run at the next check with a message; no bad state is ever saved.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sorjax.checks import write_text
from sorjax.training import asgd, interrupt, workdir_lock
from sorjax.training.checkpoint import Checkpointer
from sorjax.training.config import base_config, fields_set
from sorjax.training.metrics import MetricWriter, json_lines
from sorjax.training.optim import EarlyStopping, Plateau, better, \
    make_optimizer, selection_of, set_hyperparam, worst
from sorjax.training.schedules import TemperatureSchedule
from sorjax.training.tasks import added_fields, as_trained


@flax.struct.dataclass
class TrainState:
  step: jax.Array          # [R] int32
  params: Any              # leaves [R, ...]
  opt_state: Any
  rng: jax.Array           # [R] keys (raw uint32 data for checkpointing)
  carry: Any               # TBPTT carry, leaves [R, ...]
  nonfinite: jax.Array     # [R] bool: a non-finite loss was seen


class NonFiniteLossError(FloatingPointError):
  pass


def _to_dict(cfg) -> dict:
  return cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)


# What a resumed run may change in its config: how long it trains and how it
# logs and checkpoints (train.*), the figures drawn after it, options that
# change speed or memory but not the model or its updates, and where the
# corpora are read from (their content is checked by checksum). Anything
# else would continue the saved weights as another model or another run.
RESUMABLE = ("train", "figures", "replica_batch_size", "model.remat",
             "model.unroll", "model.hoist", "model.fused_grad",
             "data.data_dir", "data.manual_dir")


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
  """Dotted paths to leaves; a list of dicts (model.layers) by index,
  `layers[0].cell`, so that a layer field one side lacks is read as one
  added since, not as the whole list differing."""
  if isinstance(d, list) and d and all(isinstance(x, dict) for x in d):
    return {k: v for i, x in enumerate(d)
            for k, v in _flat(x, f"{prefix}[{i}]").items()}
  if not isinstance(d, dict):
    return {prefix: d}
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f"{prefix}.{k}" if prefix else k))
  return out


# How `config_changes` shows a field one of the two configs lacks.
ABSENT = "(absent)"


class Change(str):
  """One entry of `config_changes`: the text 'path: saved -> given' (what
  the error messages show), with its parts as attributes, so that readers
  need not parse the text. `saved` is ABSENT for a field the saved config
  lacks and nothing says what that run did; `predates` says so."""

  path: str
  saved: Any
  given: Any

  def __new__(cls, path: str, saved: Any, given: Any, note: str = ""):
    self = super().__new__(cls, f"{path}: {saved!r}{note} -> {given!r}")
    self.path, self.saved, self.given = path, saved, given
    return self

  @property
  def predates(self) -> bool:
    """Whether the run predates the field (the saved config lacks it)."""
    return isinstance(self.saved, str) and self.saved == ABSENT


def config_changes(saved: dict, given: dict,
                   added: dict[str, Any] | None = None) -> list[Change]:
  """The fields, outside RESUMABLE, whose values differ between the saved
  config and the given one, as `Change`s ('path: saved -> given'). A field that the
  saved config lacks (one added since that run) reads as what that run
  did: `base_config()`'s default for its fields (selection.*), `added`'s
  value for a task's fields added since ('data.documents': False for the
  lm task), and for any other field None, "not set", the default of every
  optional field (such as data.test_batch_size). A field the saved
  version read otherwise than it is written (`tasks.as_trained`) compares
  as that run read it."""
  saved, why = as_trained(saved)
  a = _flat(saved)
  b = _flat(json.loads(json.dumps(given)))  # tuples as the saved lists
  absent = ABSENT
  defaults = {**_flat(json.loads(json.dumps(base_config().to_dict()))),
              **(added or {})}
  out = []
  for path in sorted(set(a) | set(b)):
    if any(path == r or path.startswith(r + ".") for r in RESUMABLE):
      continue
    was = a.get(path, defaults.get(path, absent))
    if was == absent and b.get(path) is None:
      continue
    if was != b.get(path, absent):
      note = f" ({why[path]})" if path in why else ""
      out.append(Change(path, was, b.get(path, absent), note))
  return out


def shown_changes(changes: list[str], most: int = 8) -> str:
  """`config_changes`' first `most` entries for an error message."""
  return "; ".join(changes[:most]) + (
      f"; and {len(changes) - most} more" if len(changes) > most else "")


def check_resumable(workdir: str, config, ckpt: Checkpointer) -> None:
  """Refuses to resume the checkpoints in `workdir` with a config that
  differs from the one they were trained with (its config.json, or the
  latest checkpoint's copy when that file is gone), naming the fields;
  ConfigError before anything is written."""
  from sorjax.runs import read_config_json
  from sorjax.training.tasks.common import ConfigError
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    try:
      saved = read_config_json(path)
    except ValueError as e:
      raise ConfigError(f"cannot read the config this run was trained with: "
                        f"{e}; its checkpoints cannot be resumed safely"
                        ) from None
  else:
    step, meta = ckpt.restore_meta("latest")
    path = os.path.join(workdir, "checkpoints", str(step))
    saved = meta.get("config")
    if saved is None:  # written before checkpoints held their config
      logging.warning("%s holds no config to compare with", path)
      return
  changes = config_changes(saved, _to_dict(config),
                           added_fields(config.get("task")))
  _check_not_shortened(workdir, config, ckpt)
  if changes:
    shown = shown_changes(changes)
    # fields added since the run was saved: None reads as what it did
    added = [c.path for c in changes if c.predates]
    given_none = (" (a field the run predates: " if len(added) == 1 else
                  " (fields the run predates: ") + ", ".join(
                      f"--config.{f}=None" for f in added) + ")"
    raise ConfigError(
        f"{workdir} holds checkpoints trained with another config ({path}): "
        f"{shown} (saved -> given). Resuming would continue those weights "
        "under the new values. Give the saved values"
        f"{given_none if added else ''}, or train in a new "
        f"--workdir; only {', '.join(RESUMABLE)} may change on resume")


def _check_same_vocab(workdir: str, vocab) -> None:
  """The corpus read now must give the vocabulary the run was trained
  with (its vocab.json): data.data_dir / manual_dir may change on resume,
  and a dataset built from other text would otherwise map the ids to
  other symbols (or other sizes, refused later by the restore). A
  ConfigError naming the first difference; nothing when the run has no
  vocab.json (non-text tasks)."""
  path = os.path.join(workdir, "vocab.json")
  if vocab is None or not hasattr(vocab, "symbols") or not os.path.exists(
      path):
    return
  from sorjax.data.vocab import Vocab
  from sorjax.training.tasks.common import ConfigError
  saved = Vocab.load(path)
  if tuple(saved.symbols) == tuple(vocab.symbols):
    return
  first = next((i for i, (a, b) in enumerate(zip(saved.symbols,
                                                  vocab.symbols)) if a != b),
               min(len(saved.symbols), len(vocab.symbols)))
  raise ConfigError(
      f"{path} holds the {len(saved.symbols)}-symbol vocabulary this run "
      f"was trained with; the corpus read now (data.corpus, data_dir) gives "
      f"{len(vocab.symbols)} symbols, differing from id {first} on. Give "
      "the data the run was trained on, or train in a new --workdir")


def _check_not_shortened(workdir: str, config, ckpt: Checkpointer) -> None:
  """train.num_epochs / max_steps may grow on resume, or stay, but not fall
  below what the latest checkpoint has trained: its config.json would then
  claim a shorter run than its weights and metrics hold. ConfigError."""
  from sorjax.training.tasks.common import ConfigError
  step, meta = ckpt.restore_meta("latest")
  epochs, mid = int(meta.get("epoch", 0)), meta.get("position") is not None
  num_epochs, max_steps = config.train.num_epochs, config.train.get(
      "max_steps")
  over = []
  if epochs > num_epochs or (epochs == num_epochs and mid):
    over.append(f"train.num_epochs={num_epochs} (it has run {epochs} "
                f"epochs{' and part of the next' if mid else ''})")
  if max_steps and step > max_steps:
    over.append(f"train.max_steps={max_steps} (it is at step {step})")
  if over:
    raise ConfigError(
        f"{workdir}/checkpoints/{step} has trained beyond "
        f"{' and '.join(over)}; a run cannot be shortened. Give at least "
        "what it has run, or train in a new --workdir")


# The default group of vmapped replicas: as many as keep rows * width (batch
# rows times the cells' state width, summed over layers) within this many
# elements, at least one. Whole training steps of the paper configs, 20
# replicas, one device (`benchmarks.replica_groups`, run RG1 in
# benchmarks/RESULTS.md): vmap of all 20 was the fastest only for Lin et
# al.'s m = 4 (B=10 H=12: 8.9 ms, 10.2 ms 4 at a time); at m = 8 (H=24)
# 2 at a time took 36 ms and all 20 64 ms, at Mahto et al.'s B=128 H=256
# one at a time 3.6 s and all 20 8.6 s, and Renganathan & Singh's B=512
# Dyck-RNN 303 ms one at a time and 585 ms all 20.
REPLICA_GROUP_WIDTH = 512


def replica_batch_for(replicas: int, rows: int | None,
                      width: int | None) -> int:
  """Replicas vmapped at a time by default: `REPLICA_GROUP_WIDTH` //
  (rows * width) clipped to [1, replicas]; all of them when rows or width
  is unknown."""
  if not rows or not width:
    return replicas
  return max(1, min(replicas, REPLICA_GROUP_WIDTH // (rows * width)))


def _rows(config) -> int | None:
  """The training batch's rows (config.data.batch_size), if the config
  has them."""
  data = config.get("data")
  rows = data.get("batch_size") if data is not None else None
  return rows if isinstance(rows, int) and rows > 0 else None


def replica_width(cells) -> int | None:
  """The summed state width of a model's cells (hidden_size, times
  num_cells for the cell-mixture LSTMs), the width `replica_batch_for`
  reads; None without cells (a task that has none, e.g. the tree tasks)."""
  if not cells:
    return None
  return sum(c.hidden_size * getattr(c, "num_cells", 1) for c in cells)


def map_replicas(f, tree, batch: int, shards: int = 1):
  """f over the leading replica axis of `tree`'s leaves, `batch` replicas
  at a time: `jax.vmap` when batch covers a shard's replicas, else
  `jax.lax.map` (a loop over groups of `batch` vmapped replicas). With
  shards > 1 the axis is split as [shards, R / shards]: vmap over the
  shards (the devices' part of a replica-sharded state), then the same
  choice over each shard's replicas."""
  def local(t):
    r = jax.tree_util.tree_leaves(t)[0].shape[0]
    if batch >= r:
      return jax.vmap(f)(t)
    return jax.lax.map(f, t, batch_size=None if batch == 1 else batch)
  if shards == 1:
    return local(tree)
  split = jax.tree_util.tree_map(
      lambda a: a.reshape(shards, a.shape[0] // shards, *a.shape[1:]), tree)
  return jax.tree_util.tree_map(lambda a: a.reshape(-1, *a.shape[2:]),
                                jax.vmap(local)(split))


def batch_tokens(batch: dict) -> int:
  """The tokens a training batch holds, for the logged tokens/s: the sum
  of its `lengths` where it has them (padded positions are no tokens),
  else the size of its first array (a full stream batch; a tree batch's
  padded leaf slots)."""
  if "lengths" in batch:
    return int(np.sum(batch["lengths"]))
  return int(np.size(batch[next(iter(batch))]))


def _tree_index(tree, r):
  return jax.tree_util.tree_map(lambda a: a[r], tree)


class Trainer:
  """Builds the step and runs epochs for a task and a config.

  config fields read here: seed, num_replicas, optim.*, plateau.*,
  selection.* (the first eval split's metric that picks `best/`),
  early_stopping.patience (epochs without improving that metric) and
  .stop_below (stop once the loss is below, every replica),
  nt_asgd.nonmono, temperature.*, train.*
  (num_epochs, max_steps, log_every, checkpoint_every, keep_checkpoints).
  """

  def __init__(self, task, config, workdir: str):
    self.task, self.config, self.workdir = task, config, workdir
    # (metric, mode) that pick the best checkpoint and drive early stopping
    self.selection = selection_of(config)
    self.R = int(config.num_replicas)
    self.tx = make_optimizer(_to_dict(config.optim))
    t = config.temperature
    self.temperature = TemperatureSchedule(
        init=t.init, decay=t.decay, per=t.per, floor=t.floor,
        eval_value=t.get("eval_value"))
    self.plateau = (Plateau(config.plateau.factor, config.plateau.patience)
                    if config.plateau.enabled else None)
    if jax.process_count() > 1:
      raise RuntimeError(
          f"sorjax's training loop shards over one host's devices, but this "
          f"is process {jax.process_index()} of {jax.process_count()} "
          f"(jax.distributed is initialised): every process would train the "
          f"same model on the same batches and write the same files to "
          f"{workdir}. Start one process per run; it uses every local GPU "
          f"or TPU chip.")
    self.devices = jax.local_devices()
    # One axis over the local devices: it shards the batch, or the replicas.
    self.mesh = Mesh(np.array(self.devices), ("devices",))
    n = len(self.devices)
    # Replica parallelism where the replicas divide evenly: no gradient
    # all-reduce, and each device holds only its replicas' state.
    self.replica_parallel = n > 1 and self.R % n == 0
    self.state_sharding = NamedSharding(
        self.mesh, P("devices") if self.replica_parallel else P())
    # The replica axis's shards (one a device when replica-parallel).
    self.replica_shards = n if self.replica_parallel else 1
    k = config.get("replica_batch_size")
    local = self.R // self.replica_shards
    self.replica_batch = (
        replica_batch_for(local, _rows(config),
                          replica_width(getattr(task, "cells", None)))
        if k is None else int(k))
    logging.info("%d replicas: %d vmapped at a time, %s", self.R,
                 min(self.replica_batch, local),
                 f"sharded over {n} devices" if self.replica_parallel else
                 f"on {n} device(s)")
    self._step_fn = self._build_step()

  # ------------------------------------------------------------ state
  def init_state(self) -> TrainState:
    """Every replica's initial params, optimiser state and carry, built
    by one compiled program: eagerly, each draw of every parameter and
    each op of the dummy forward pass flax's init runs is a dispatch (and
    on first use a compile) of its own."""
    return jax.jit(self._initial_state)()

  def _initial_state(self) -> TrainState:
    seeds = jnp.arange(self.R, dtype=jnp.uint32) + jnp.uint32(self.config.seed)
    keys = jax.vmap(jax.random.key)(seeds)
    k_init, k_run = jax.vmap(lambda k: tuple(jax.random.split(k)))(keys)
    params = jax.vmap(self.task.init_params)(k_init)
    opt_state = jax.vmap(self.tx.init)(params)
    carry = jax.vmap(self.task.init_carry)(params)
    return TrainState(step=jnp.zeros((self.R,), jnp.int32), params=params,
                      opt_state=opt_state, rng=jax.random.key_data(k_run),
                      carry=carry, nonfinite=jnp.zeros((self.R,), bool))

  def _place_state(self, tree):
    """State leaves (leading replica axis) on the devices:
    `state_sharding`."""
    return jax.device_put(tree, self.state_sharding)

  def _shard_batch(self, batch):
    n = len(self.devices)
    replicated = set(getattr(self.task, "replicated_keys", ()))

    def put(k, a):
      a = np.asarray(a)
      if (a.ndim == 0 or n == 1 or k in replicated
          or self.replica_parallel):
        return jax.device_put(a, NamedSharding(self.mesh, P()))
      if a.shape[0] % n:
        raise ValueError(
            f"batch axis {a.shape[0]} is not divisible by the {n} devices "
            "(set the batch size to a multiple of jax.local_device_count())")
      return jax.device_put(a, NamedSharding(self.mesh, P("devices")))
    return {k: put(k, v) for k, v in batch.items()}

  # ------------------------------------------------------------ step
  def _build_step(self):
    task, tx = self.task, self.tx

    def one(state_r, batch, temperature):
      step, params, opt_state, rng, carry, nonfinite = state_r
      rng = jax.random.wrap_key_data(rng)
      rng, sub = jax.random.split(rng)
      (loss, (new_carry, metrics)), grads = jax.value_and_grad(
          task.loss, has_aux=True)(params, carry, batch, sub, temperature, True)
      if "lr_scale" in batch:
        opt_state = set_hyperparam(opt_state, "step_scale", batch["lr_scale"])
      updates, new_opt = tx.update(grads, opt_state, params)
      new_params = jax.tree_util.tree_map(lambda p, u: p + u, params, updates)
      gnorm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in
                           jax.tree_util.tree_leaves(grads)))
      ok = jnp.isfinite(loss) & jnp.isfinite(gnorm)
      keep = lambda new, old: jax.tree_util.tree_map(
          lambda n, o: jnp.where(ok, n, o), new, old)
      out = (step + ok.astype(jnp.int32), keep(new_params, params),
             keep(new_opt, opt_state), jax.random.key_data(rng),
             keep(new_carry, carry), nonfinite | ~ok)
      return out, dict(metrics, loss=loss, grad_norm=gnorm)

    n, k = self.replica_shards, self.replica_batch
    sharding = self.state_sharding

    def step_fn(state: TrainState, batch, temperature):
      fields = (state.step, state.params, state.opt_state, state.rng,
                state.carry, state.nonfinite)
      out, metrics = map_replicas(lambda f: one(f, batch, temperature),
                                  fields, k, n)
      # The state leaves as it came (`state_sharding`): left to XLA, a
      # data-parallel step's carry came out sharded along the batch, so
      # the next call compiled the step again and could not reuse the
      # donated buffers.
      return jax.lax.with_sharding_constraint(TrainState(*out),
                                              sharding), metrics

    return jax.jit(step_fn, donate_argnums=0)

  # ------------------------------------------------------------ loop
  def run(self) -> TrainState:
    """Trains (or resumes) into the work directory, which no other process
    may train into meanwhile (`workdir_lock`)."""
    self._check_selection_metric()
    os.makedirs(self.workdir, exist_ok=True)
    with workdir_lock.held(self.workdir):
      return self._run()

  def _run(self) -> TrainState:
    cfg, task = self.config, self.task
    tcfg = cfg.train
    _, mode = self.selection
    ckpt = Checkpointer(self.workdir, keep=tcfg.keep_checkpoints)
    resuming = ckpt.latest_step() is not None
    try:
      if resuming:
        check_resumable(self.workdir, cfg, ckpt)
        _check_same_vocab(self.workdir, task.vocab)
      else:  # a new run (one that trained before these checks resumes)
        self._check_temperature_is_read()
        self._check_schedules_are_read()
    except Exception:
      ckpt.close()
      raise

    state = self.init_state()
    # best_mean: the best mean over replicas of the selection metric
    meta = {"epoch": 0, "position": None, "stopped_early": False,
            "early": [None] * self.R, "plateau": None,
            "asgd_losses": [[] for _ in range(self.R)],
            "best_loss": [math.inf] * self.R, "best_mean": worst(mode)}
    if resuming:
      try:
        step0, state, meta = ckpt.restore(state, "latest")
      except Exception:
        ckpt.close()
        raise
    # Written once the checkpoint has been read: a resume refused on the
    # way leaves the run's files as they were (sorjax.restore reads them).
    # Whole or not at all: a failed rewrite (a full disk) keeps the one
    # the checkpoints were trained with.
    write_text(os.path.join(self.workdir, "config.json"), json.dumps(
        _to_dict(cfg), indent=2, sort_keys=True))
    if task.vocab is not None and hasattr(task.vocab, "save"):
      task.vocab.save(os.path.join(self.workdir, "vocab.json"))
    if resuming:
      logging.info("resumed from %s/checkpoints/%d (epoch %d)",
                   self.workdir, step0, meta["epoch"])
      _truncate_metrics(self.workdir, step0, meta["position"] is not None)
    else:
      _truncate_metrics(self.workdir, 0)
    if meta["stopped_early"]:
      logging.info("run in %s stopped early before; nothing to do",
                   self.workdir)
      ckpt.close()
      return state

    early = [EarlyStopping(cfg.early_stopping.patience, mode=mode)
             if cfg.early_stopping.patience else None for _ in range(self.R)]
    for e, d in zip(early, meta["early"]):
      if e is not None and d is not None:
        e.load_state_dict(d)
    triggers = [asgd.NonMonotoneTrigger(cfg.nt_asgd.nonmono, list(l))
                for l in meta["asgd_losses"]]
    plateau_state = None
    if self.plateau is not None:
      plateau_state = [self.plateau.init() for _ in range(self.R)]
      if meta["plateau"] is not None:
        # Saved as JSON floats: back in init's dtypes (optax's counters are
        # int32, and its cond refuses a float32 one)
        plateau_state = [type(s)(**{
            k: jnp.asarray(v, jnp.asarray(getattr(s, k)).dtype)
            for k, v in d.items()})
                         for s, d in zip(plateau_state, meta["plateau"])]

    state = self._place_state(state)
    writer = MetricWriter(self.workdir, tensorboard=tcfg.get("tensorboard",
                                                             True))
    epoch, position = meta["epoch"], meta["position"]
    n_batches = task.num_train_batches()
    max_steps = tcfg.get("max_steps")
    step = int(state.step[0])
    stop = bool(max_steps) and step >= max_steps
    t_last, tok_last = time.perf_counter(), 0

    def save():
      if bool(jnp.any(state.nonfinite)):
        raise NonFiniteLossError(
            f"non-finite loss or gradient before step {int(state.step.max())}"
            f" (replicas {np.flatnonzero(np.asarray(state.nonfinite)).tolist()}"
            f"); the run stops here and {self.workdir}/checkpoints keeps the "
            "last good state")
      m = dict(meta, epoch=epoch, position=position,
               early=[e.state_dict() if e else None for e in early],
               asgd_losses=[t.losses for t in triggers],
               plateau=None if plateau_state is None else
               [{k: float(v) for k, v in s._asdict().items()}
                for s in plateau_state],
               config=_to_dict(cfg))
      ckpt.save(step, jax.device_get(state), m)
      saved[0] = step

    saved = [None]

    def stop_if_signalled():
      """After a whole step: on a received SIGINT / SIGTERM, save this
      step (the data position matches the state here) and stop."""
      if not signalled:
        return
      if saved[0] != step:
        save()
      ckpt.wait()
      raise interrupt.Interrupted(signalled[0], (
          f"{signal.Signals(signalled[0]).name} at step {step}: saved "
          f"{self.workdir}/checkpoints/{step}; the same command resumes "
          "the run"))

    signals = contextlib.ExitStack()
    signalled = signals.enter_context(interrupt.deferred())
    try:
      while epoch < tcfg.num_epochs and not stop:
        tau = self.temperature(step, epoch)
        batches = iter(task.train_batches(epoch, position))
        for batch, position in batches:
          if self.temperature.per == "step":
            tau = self.temperature(step, epoch)
          state, metrics = self._step_fn(state, self._shard_batch(batch),
                                         jnp.float32(tau))
          step += 1
          tok_last += batch_tokens(batch)
          if step % tcfg.log_every == 0:
            m = jax.device_get(metrics)
            if not np.all(np.isfinite(m["loss"])):
              save_err = step
              raise NonFiniteLossError(
                  f"non-finite training loss at step {save_err} (epoch "
                  f"{epoch}); {self.workdir}/checkpoints keeps the last good "
                  "state")
            dt = time.perf_counter() - t_last
            rate = tok_last * self.R / max(dt, 1e-9)
            eta = ""
            if n_batches:
              left = (tcfg.num_epochs - epoch) * n_batches - (
                  position or {}).get("batch", 0)
              eta = f" eta {left * dt / tcfg.log_every / 60:.1f} min"
            logging.info("step %d epoch %d loss %s tau %.3g %.0f tokens/s%s",
                         step, epoch, np.round(m["loss"], 4).tolist(),
                         float(tau), rate, eta)
            for r in range(self.R):
              writer.write(step, "train", {
                  **{k: v[r] for k, v in m.items()}, "replica": r,
                  "epoch": epoch, "temperature": tau,
                  "tokens_per_s": rate})
            t_last, tok_last = time.perf_counter(), 0
          if step % tcfg.checkpoint_every == 0:
            save()
          stop_if_signalled()
          if max_steps and step >= max_steps:
            stop = True
            break
        if stop and next(batches, None) is not None:
          break  # max_steps inside the epoch; at its last batch it ends it
        # ---- end of epoch: evaluate, schedule, select, stop
        epoch += 1
        position = None
        early_stop, start_avg = self._end_of_epoch(
            state, step, epoch, writer, ckpt, early, triggers,
            plateau_state, meta)
        state = self._apply_epoch_decisions(state, plateau_state, start_avg)
        meta["stopped_early"] = early_stop
        stop = stop or early_stop
        save()
        stop_if_signalled()
      save()
      if position is not None and stop:
        logging.warning(
            "stopped by train.max_steps=%d at step %d, inside epoch %d: that "
            "epoch is not evaluated%s", max_steps, step, epoch + 1,
            "" if ckpt.best_step() is not None else
            " and no epoch has been (best/ is empty: read its last state "
            "with sorjax.restore(workdir, step='latest') or "
            "experiments.analyze --step=latest)")
    finally:
      signals.close()
      ckpt.wait()
      ckpt.close()
      writer.close()
    return state

  def _check_temperature_is_read(self) -> None:
    """temperature.* set on a model none of whose cells takes a temperature
    (only the attention LSTMs do) would schedule nothing: a ConfigError
    naming the fields. Tasks that declare their models' aux inputs
    (`aux`) are checked."""
    aux = getattr(self.task, "aux", None)
    if aux is None or "temperature" in aux:
      return
    changed = fields_set(self.config.get("temperature") or {},
                         base_config().temperature)
    if changed:
      from sorjax.training.tasks.common import ConfigError
      raise ConfigError(
          f"temperature.{', temperature.'.join(changed)} set, but no cell of "
          f"this {self.task.name} model takes a temperature (the attention "
          f"LSTMs' softmax does); leave temperature.* at its defaults")

  def _check_schedules_are_read(self) -> None:
    """plateau.factor / patience set with plateau.enabled False, or
    nt_asgd.nonmono with another optimizer than nt_asgd, would do nothing:
    a ConfigError naming them."""
    from sorjax.training.tasks.common import ConfigError
    cfg, base = self.config, base_config()
    plateau = cfg.get("plateau") or {}
    if not plateau.get("enabled", False):
      changed = fields_set(plateau, base.plateau, ("factor", "patience"))
      if changed:
        raise ConfigError(
            f"plateau.{', plateau.'.join(changed)} set with plateau.enabled "
            f"False: set plateau.enabled=True for the learning-rate decay")
    nonmono = (cfg.get("nt_asgd") or {}).get("nonmono",
                                             base.nt_asgd.nonmono)
    if cfg.optim.name != "nt_asgd" and nonmono != base.nt_asgd.nonmono:
      raise ConfigError(
          f"nt_asgd.nonmono={nonmono} is read by optim.name='nt_asgd' only "
          f"(optim.name is {cfg.optim.name!r})")

  def _check_selection_metric(self) -> None:
    """selection.metric against the task's `metric_names()` (when it
    declares them), before any training: a ConfigError naming the field."""
    names = getattr(self.task, "metric_names", None)
    metric = self.selection[0]
    if names is not None and metric not in names():
      from sorjax.training.tasks.common import ConfigError
      raise ConfigError(
          f"selection.metric={metric!r} is not among the metrics "
          f"{self.task.name} evaluates: {sorted(names())}")

  def _end_of_epoch(self, state, step, epoch, writer, ckpt, early, triggers,
                    plateau_state, meta) -> tuple[bool, list[bool]]:
    """Evaluates every replica; returns (stop, start NT-ASGD per replica)."""
    cfg, task = self.config, self.task
    metric, mode = self.selection
    tau_eval = float(self.temperature.evaluation(step, epoch - 1))
    stops, start_avg, selected = [], [], []
    host = jax.device_get(state)
    for r in range(self.R):
      params_r = _tree_index(host.params, r)
      opt_r = _tree_index(host.opt_state, r)
      if cfg.optim.name == "nt_asgd":
        params_r = asgd.averaged_params(opt_r, params_r)
      # On the loop's first device once: the tasks' jitted evaluation runs
      # per batch, and host (NumPy) params would be copied to a GPU / TPU
      # on every call.
      params_r = jax.device_put(params_r, self.devices[0])
      results = {}
      for split in task.eval_splits():
        res = task.evaluate(params_r, split, tau_eval)
        results[split] = res
        writer.write(step, split, {**res, "replica": r, "epoch": epoch,
                                   "temperature": tau_eval})
      if hasattr(task, "epoch_metrics"):   # e.g. gradient ratios per epoch
        extra = task.epoch_metrics(params_r, epoch)
        if extra:
          writer.write(step, "epoch_metrics", {**extra, "replica": r,
                                               "epoch": epoch})
      first = results[task.eval_splits()[0]]
      main = first["loss"]
      logging.info("epoch %d replica %d: %s", epoch, r,
                   {s: {k: round(float(v), 4) for k, v in d.items()}
                    for s, d in results.items()})
      if not math.isfinite(main):
        raise NonFiniteLossError(
            f"non-finite validation loss after epoch {epoch} (replica {r})")
      chosen = _selected(first, metric, task.eval_splits()[0])
      if not math.isfinite(chosen):
        raise NonFiniteLossError(
            f"non-finite validation {metric} (selection.metric) after epoch "
            f"{epoch} (replica {r})")
      selected.append(chosen)
      meta["best_loss"][r] = min(meta["best_loss"][r], main)
      if plateau_state is not None:
        plateau_state[r] = self.plateau.update(plateau_state[r], main)
      fire = (cfg.optim.name == "nt_asgd"
              and not asgd.averaging_active(opt_r)
              and triggers[r].observe(main))
      if fire:
        logging.info("replica %d: NT-ASGD starts averaging at epoch %d",
                     r, epoch)
      start_avg.append(fire)
      stop_r = early[r].update(chosen)[1] if early[r] else False
      below = cfg.early_stopping.get("stop_below")
      stops.append(stop_r or (below is not None and main < below))
    # Best checkpoint: this epoch's selection metric (the loss unless
    # selection.metric says otherwise), averaged over replicas.
    mean_now = float(np.mean(selected))
    if better(mode, mean_now, meta["best_mean"]):
      meta["best_mean"] = mean_now
      ckpt.save_best(step, host, dict(meta, epoch=epoch, position=None,
                                      config=_to_dict(cfg)))
    return all(stops), start_avg

  def _apply_epoch_decisions(self, state, plateau_state, start_avg):
    if plateau_state is not None:
      scales = jnp.stack([s.scale for s in plateau_state])
      state = state.replace(opt_state=self._place_state(set_hyperparam(
          state.opt_state, "plateau_scale", scales)))
    if any(start_avg):
      host = jax.device_get(state.opt_state)
      per = [asgd.start_averaging(_tree_index(host, r)) if s else
             _tree_index(host, r) for r, s in enumerate(start_avg)]
      state = state.replace(opt_state=self._place_state(
          jax.tree_util.tree_map(lambda *a: jnp.stack(a), *per)))
    return state


def _selected(results: dict, metric: str, split: str) -> float:
  """results[metric], or a ConfigError naming selection.metric and the
  metrics the split has."""
  if metric not in results:
    from sorjax.training.tasks.common import ConfigError
    raise ConfigError(f"selection.metric={metric!r} is not among the metrics "
                      f"of the {split!r} evaluation: {sorted(results)}")
  return float(results[metric])


def _truncate_metrics(workdir: str, step: int, mid_epoch: bool = False
                      ) -> None:
  """Drops metric records written after the checkpoint at `step` (they
  are recomputed): those of later steps, and, when that checkpoint was
  saved before its epoch's end (`mid_epoch`), the evaluations logged at
  `step` itself (an epoch ending at a checkpoint_every step evaluates
  after that save). A new run (step 0) drops every record, e.g. of a run
  killed before its first checkpoint."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return
  with open(path, encoding="utf-8") as f:
    lines = f.readlines()

  def kept(rec):
    if rec["step"] != step:
      return rec["step"] < step
    return step > 0 and (not mid_epoch or rec.get("split") == "train")

  # a last line cut short (a full disk) was written after the run's last
  # checkpoint, as every line that run wrote after it: dropped
  keep = [line for line, rec in json_lines(
              path, lines, drop_cut_last=True,
              remedy="; repair or delete that line to resume the run")
          if kept(rec)]
  if keep != lines:  # written whole: a failed write keeps the old file
    write_text(path, "".join(keep), "; the run has not resumed")
