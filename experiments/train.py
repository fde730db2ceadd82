"""train_and_evaluate(config, workdir): build the task, run the loop,
write the figures the config asks for."""

from __future__ import annotations

import ast
import contextlib
import difflib
import importlib.util
import inspect
import logging as std_logging
import json
import os
import re
import sys
import time
from typing import Any

import jax
from absl import logging

from sorjax import host_memory, small_loops, xla_flags
from sorjax.checks import (check_bool, check_int, check_number,
                           output_dir_problem, write_text)
from sorjax.training.loop import Trainer
from sorjax.training.tasks import make_task
from sorjax.training.tasks.common import ConfigError, check_ints, check_layers


class _QuietLibraries(std_logging.Filter):
  """Keeps orbax's per-save INFO chatter out of the progress log."""

  def filter(self, record):
    return record.levelno >= std_logging.WARNING or (
        "orbax" not in record.pathname)


CPU_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def force_cpu_devices(n: int) -> None:
  """Puts `--xla_force_host_platform_device_count=n` at the front of
  XLA_FLAGS: XLA:CPU then offers n devices, over which the training loop
  shards the replicas when they divide evenly (each device's share runs
  concurrently) and otherwise the batch.

  Raises:
    ValueError: n < 1, or XLA_FLAGS already sets the flag.
    RuntimeError: JAX's backend has started (XLA has read its flags).
  """
  check_int("--cpu_devices", n, 1)
  xla_flags.prepend("--cpu_devices", f"{CPU_DEVICES_FLAG}={n}",
                    (CPU_DEVICES_FLAG,))


def _cpu_only(flag: str) -> None:
  if jax.default_backend() != "cpu":
    raise ValueError(f"{flag} is an XLA:CPU setting; this process computes "
                     f"on {jax.default_backend()}")


def prepare_process(host_malloc: str, whole_small_loops: bool = False,
                    cpu_devices: int = 0) -> None:
  """What both launchers do first: their log without orbax's INFO lines
  (warnings stay), then `--host_malloc` (`sorjax.host_memory.configure`,
  which may restart the process), logged when it applies and warned
  about, with the reason, when this machine cannot apply it, then
  `--cpu_devices` (`force_cpu_devices`; 0 leaves XLA's count), checked to
  apply, then `--small_loops` (`sorjax.small_loops.compile_whole`, checked).

  Raises:
    ValueError: `--small_loops` or `--cpu_devices` in a process that
      computes on a GPU or TPU, or whose XLA_FLAGS already set their flags.
    RuntimeError: `--small_loops` set, but XLA compiled a small loop as
      before; `--cpu_devices` set, but XLA made another number of devices.
  """
  logging.get_absl_handler().addFilter(_QuietLibraries())
  if host_memory.configure(host_malloc):
    logging.info("host_malloc: %s", host_memory.APPLIED[host_malloc])
  elif host_malloc != "default":       # asked for, and not possible here
    logging.warning("--host_malloc=%s is not applied: %s", host_malloc,
                    host_memory.why_not(host_malloc))
  # Both sets of XLA flags before anything starts JAX's backend (the
  # device count below does): XLA reads XLA_FLAGS once.
  if cpu_devices:
    force_cpu_devices(cpu_devices)
  if whole_small_loops:
    small_loops.compile_whole()
  if cpu_devices:
    _cpu_only("--cpu_devices")
    if jax.device_count() != cpu_devices:
      raise RuntimeError(
          f"--cpu_devices={cpu_devices}: XLA made {jax.device_count()} "
          f"devices (XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r})")
    logging.info("cpu_devices: %d", cpu_devices)
  if whole_small_loops:
    small_loops.check_compiled_whole("--small_loops")
    _cpu_only("--small_loops")
    logging.info("small_loops: %s", small_loops.xla_flags())


def prepare_or_exit(host_malloc: str, whole_small_loops: bool = False,
                    cpu_devices: int = 0) -> None:
  """`prepare_process`, its errors (which name the flags) as the
  launcher's exit message rather than a traceback."""
  try:
    prepare_process(host_malloc, whole_small_loops, cpu_devices)
  except (ValueError, RuntimeError) as e:
    logging.error("flag error: %s", e)
    sys.exit(f"flag error: {e}")


def unknown_override(config, argv, name: str = "config") -> str | None:
  """The first `--<name>.<path>` override in argv whose path names no field
  of config, as an error that names the flag, the missing field and the
  fields there; None when every override names one. ml_collections raises
  a bare KeyError for such a path from inside absl's flag parsing, which
  names neither the flag nor the fields."""
  for arg in argv[1:]:
    flag = arg.split("=", 1)[0]
    path = next((flag[len(p):] for p in (f"--{name}.", f"-{name}.",
                                         f"--no{name}.")
                 if flag.startswith(p)), None)
    if path is None:
      continue
    node, parts, where = config, path.split("."), "the config"
    for part in parts:
      m = re.fullmatch(r"([^\[\]]+)((?:\[-?\d+\])*)", part)
      if m is None:
        return f"flag {arg}: {part!r} is neither a field nor field[index]"
      part, indices = m.group(1), re.findall(r"\[(-?\d+)\]", m.group(2))
      if not hasattr(node, "keys"):
        return (f"flag {arg}: {where} is a {type(node).__name__}, not a "
                f"group of fields, so it has no field {part!r}")
      if part not in node:
        close = difflib.get_close_matches(part, list(node.keys()), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return (f"flag {arg}: {where} has no field {part!r}{hint} (its "
                f"fields: {', '.join(sorted(node.keys()))})")
      node = node[part]
      where = part if where == "the config" else f"{where}.{part}"
      for i in map(int, indices):  # into a sequence field (model.layers)
        if not isinstance(node, (list, tuple)):
          return (f"flag {arg}: {where} is a {type(node).__name__}, not a "
                  "sequence to index")
        if not 0 <= i < len(node):
          return (f"flag {arg}: {where} holds {len(node)} entries "
                  f"(indices 0..{len(node) - 1})")
        node, where = node[i], f"{where}[{i}]"
  return None


def argument(argv, name: str) -> str | None:
  """The last value argv gives flag --name (as --name=v or --name v)."""
  value = None
  for i, arg in enumerate(argv[1:], 1):
    for dash in ("--", "-"):
      if arg.startswith(f"{dash}{name}="):
        value = arg.split("=", 1)[1]
      elif arg == f"{dash}{name}" and i + 1 < len(argv):
        value = argv[i + 1]
  return value


# Fields whose values are tuples, specs or either of two types: ml_collections
# parses an override with the field's current type (None has none), so they
# are read here as Python literals instead.
LITERAL_FIELDS = ("model.layers", "model.num_matrices", "model.timescales",
                  "model.locked_dropout")


def literal_overrides(argv) -> tuple[list[str], list[tuple[str, str, Any]]]:
  """argv without the overrides set here, and those as (arg, path, value):
  `--config.<path>=None` (an int field could not be unset from the command
  line, e.g. the demo's intermediate_size, to train an lstm; nor a field
  of a layer, `model.layers[0].bias_init`, which ml_collections set to the
  string 'None'), and any value of LITERAL_FIELDS, read with
  `ast.literal_eval` (a ValueError naming the flag when it is not a Python
  literal). A later override of the same path wins, as absl's
  last-flag-wins."""
  kept, literal = [argv[0]], {}
  for arg in argv[1:]:
    flag, eq, text = arg.partition("=")
    path = flag[len("--config."):] if flag.startswith("--config.") else None
    if path is not None and eq and (
        text == "None" or "[" not in path and path in LITERAL_FIELDS):
      try:
        value = ast.literal_eval(text)
      except (ValueError, SyntaxError):
        raise ValueError(f"flag {arg}: {path} takes a Python literal, e.g. "
                         "--config.model.timescales=\"('inverse_gamma', "
                         "0.56)\" (quoted for the shell)") from None
      literal[path] = (arg, value)
      continue
    if path is not None:
      literal.pop(path, None)
    kept.append(arg)
  return kept, [(arg, path, v) for path, (arg, v) in literal.items()]


def set_override(config, path: str, value) -> None:
  """config's field at dotted `path` (parts may index a sequence field:
  `model.layers[0].bias_init`) set to `value`, whatever the field's type
  (an int field's parser would refuse None)."""
  *parents, leaf = re.findall(r"[^.\[\]]+|\[-?\d+\]", path)
  node = config
  for part in parents:
    node = node[int(part[1:-1])] if part.startswith("[") else node[part]
  if leaf.startswith("["):
    raise ValueError(f"--config.{path}: give a field of the entry, not "
                     "the entry")
  if hasattr(node, "ignore_type"):
    with node.ignore_type():
      node[leaf] = value
  else:   # a layer of model.layers: a dict in a tuple
    node[leaf] = value


def bad_path(argv) -> str | None:
  """What is wrong with --config's file or variant, or --workdir, before
  ml_collections defers a missing file to a later traceback, or reports a
  variant given to a config without one as get_config's TypeError."""
  workdir = argument(argv, "workdir")
  problem = None if workdir is None else output_dir_problem(workdir)
  if problem is not None:
    return f"flag --workdir={workdir}: {problem}"
  spec = argument(argv, "config")
  if not spec:
    return None
  path, _, variant = spec.partition(":")
  if not os.path.isfile(path):
    return f"flag --config={spec}: no such file {path!r}"
  if variant:
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_file_location("_config_to_check", path))
    try:
      module.__spec__.loader.exec_module(module)
    except Exception:  # pylint: disable=broad-except
      return None  # ml_collections reports the file's own error
    get_config = getattr(module, "get_config", None)
    if get_config is None:
      return None
    if not inspect.signature(get_config).parameters:
      return (f"flag --config={spec}: {os.path.basename(path)} takes no "
              f"variant (after ':'); give --config={path}")
    try:
      get_config(variant)
    except ConfigError as e:  # the variant's usage, without a traceback
      return f"flag --config={spec}: {e}"
  return None


def validate(config) -> None:
  """Checks the loop's fields; the task checks its own when built."""
  _check_sections(config)
  check_int("num_replicas", config.num_replicas, 1, error=ConfigError)
  check_int("replica_batch_size", config.get("replica_batch_size"), 1,
            optional=True, error=ConfigError)
  check_ints(config.train, dict.fromkeys(
      ("num_epochs", "log_every", "checkpoint_every", "keep_checkpoints"), 1),
             section="train")
  try:
    from sorjax.training.optim import make_optimizer
    from sorjax.training.schedules import TemperatureSchedule
    make_optimizer(config.optim.to_dict())
    TemperatureSchedule(**config.temperature.to_dict())
    _check_stopping(config)
    from sorjax.analysis import figures
    figures.check(config.get("figures", ()) or (), config.get("task"))
  except ValueError as e:
    raise ConfigError(str(e)) from None
  _check_batch_sharding(config)
  if "model" in config:
    check_layers(config.model)


def _check_sections(config) -> None:
  """Every field of `base_config()` present, groups as groups: a config
  built without it failed as a bare AttributeError ("'num_replicas'")."""
  from sorjax.training.config import base_config
  for name, default in base_config().items():
    group = hasattr(default, "keys")
    if name not in config or group and not hasattr(config[name], "keys"):
      raise ConfigError(
          f"the config has no {'group' if group else 'field'} {name!r}: "
          "build it on sorjax.training.config.base_config() (as "
          "experiments/configs/common.config does)")
    if group:
      missing = [k for k in default if k not in config[name]]
      if missing:
        raise ConfigError(f"{name} lacks the fields {missing} of "
                          "sorjax.training.config.base_config()")


def _check_stopping(config) -> None:
  """selection.*, plateau.*, early_stopping.*, nt_asgd.nonmono,
  train.max_steps (each a ValueError naming the field)."""
  from sorjax.training.optim import EarlyStopping, Plateau, check_selection
  check_selection(config.selection.metric, config.selection.mode)
  check_bool("plateau.enabled", config.plateau.enabled, error=ValueError)
  Plateau(config.plateau.factor, config.plateau.patience)
  es = config.early_stopping
  # None or 0: no early stopping (0 as docs/RESULTS.md and reproduce use
  # it, settable from the command line where None was not)
  check_number("early_stopping.patience", es.patience,
               ">= 0 (0: no early stopping)", lambda v: v >= 0,
               integer=True, optional=True)
  if es.patience:
    EarlyStopping(es.patience)
  check_number("early_stopping.stop_below", es.get("stop_below"),
               optional=True)
  check_number("nt_asgd.nonmono", config.nt_asgd.nonmono, ">= 1",
               lambda v: v >= 1, integer=True)
  check_number("train.max_steps", config.train.get("max_steps"), ">= 1",
               lambda v: v >= 1, integer=True, optional=True)


def _check_batch_sharding(config) -> None:
  """The loop splits each train batch over the local devices unless it
  shards the replicas (their number divisible by the devices'); evaluation
  is not sharded."""
  n = jax.local_device_count()
  b = config.get("data", {}).get("batch_size")
  if (n > 1 and config.num_replicas % n and isinstance(b, int)
      and b % n):
    raise ConfigError(
        f"data.batch_size={b} must be a multiple of the {n} local devices "
        f"(the loop splits each batch over them; num_replicas="
        f"{config.num_replicas} is not a multiple of {n})")


def recorded_wall_s(path: str) -> float:
  """The wall_s a JSON record at `path` holds, 0 without one."""
  if not os.path.isfile(path):
    return 0.0
  try:
    with open(path) as f:
      return float(json.load(f).get("wall_s", 0.0))
  except (OSError, ValueError, AttributeError, TypeError):
    return 0.0


@contextlib.contextmanager
def time_kept(partial: str, before: float = 0.0, unless=()):
  """Times a training call that may be interrupted: yields a function of
  the seconds so far plus `before` (earlier invocations'); an exception
  (but one of `unless`: refusals that trained nothing) leaves that sum in
  `partial` for the rerun that finishes the run. The caller removes
  `partial` once it has recorded the total."""
  t0 = time.perf_counter()
  total = lambda: before + time.perf_counter() - t0  # noqa: E731
  try:
    yield total
  except unless:
    raise
  except BaseException:
    if os.path.isdir(os.path.dirname(partial)):
      try:  # whole or not at all; a failure (a full disk) hides no error
        write_text(partial, json.dumps({"wall_s": total()}))
      except OSError as e:
        logging.warning("training seconds not kept: %s", e)
    raise


def train_and_evaluate(config, workdir: str):
  """Trains `config` in `workdir` (resuming if it holds a checkpoint);
  returns the final train state."""
  validate(config)
  task = make_task(config)
  state = Trainer(task, config, workdir).run()
  figures = tuple(config.get("figures", ()) or ())
  if figures:
    from sorjax.analysis import figures as figs
    for name in figures:
      path = figs.make(name, task, state, config, workdir)
      logging.info("figure %s -> %s", name, path)
  return state
