"""Trains one experiment config.

    python -m experiments.main --config=experiments/configs/demo.py \\
        --workdir=/tmp/run [--config.model.cell=mrnn ...]

Rerunning the same command resumes from the work directory's latest
checkpoint.
"""

import os
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from experiments import train
from sorjax import host_memory
from sorjax.checks import WriteError
from sorjax.training.interrupt import Interrupted
from sorjax.training.tasks.common import ConfigError

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, "
                    "figures and the resolved config.")
config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                lock_config=True)
flags.DEFINE_enum("host_malloc", "default", host_memory.MODES,
                  "CPU steps whose XLA temporaries exceed 32 MB page-fault "
                  "them in on every call (sorjax.host_memory). hugepages: "
                  "map them with transparent huge pages (512x fewer faults, "
                  "no extra memory; restarts the process once with "
                  "GLIBC_TUNABLES set); reuse: keep freed host buffers in "
                  "the process (no faults, at the cost of a heap that keeps "
                  "a few temps); default: glibc as is.")
flags.DEFINE_integer(
    "cpu_devices", 0,
    "XLA:CPU devices to make of this host's cores (0: XLA's own count, one). "
    "The loop shards the replicas over them when they divide evenly (each "
    "device's share runs concurrently; 20 small Dyck replicas measured 1.4x "
    "faster on 2), otherwise the batch.", lower_bound=0)
flags.DEFINE_bool("small_loops", False,
                  "XLA:CPU compiles each small scan whole, as one function "
                  "(sorjax.small_loops): 1.1-2.8x faster for single models "
                  "with hidden sizes around 12, slower (up to 8x) above.")
flags.mark_flags_as_required(["config", "workdir"])


def parse_flags(argv):
  """absl's parsing, with an override of a field the config lacks reported
  as a flag error that names it (`train.unknown_override`)."""
  msg = train.bad_path(argv)
  if msg is not None:
    _flag_error(msg)
  try:
    argv, literal = train.literal_overrides(argv)
  except ValueError as e:
    _flag_error(str(e))
  given, sys.argv = sys.argv, argv  # config_flags reads sys.argv itself
  try:
    rest = app.parse_flags_with_usage(argv)
  except (KeyError, AttributeError, TypeError, ValueError, IndexError):
    # Raised while --config's file was being loaded with its overrides:
    # load the file alone and find the override that names no field.
    spec = train.argument(argv, "config")
    msg = None if spec is None else train.unknown_override(
        FLAGS["config"].parser.parse(spec), argv)
    if msg is None:
      raise
    _flag_error(msg)
  finally:
    sys.argv = given  # whole, for a restart (--host_malloc=hugepages)
  for arg, path, value in literal:
    msg = train.unknown_override(FLAGS.config, ["main", arg])
    if msg is not None:
      _flag_error(msg)
    try:
      train.set_override(FLAGS.config, path, value)
    except ValueError as e:
      _flag_error(str(e))
  return rest


def _flag_error(msg: str):
  sys.stderr.write(f"FATAL Flags parsing error: {msg}\nPass --helpshort "
                   "or --helpfull to see help on flags.\n")
  sys.exit(1)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  train.prepare_or_exit(FLAGS.host_malloc, FLAGS.small_loops,
                        FLAGS.cpu_devices)
  try:
    # ~ as a shell expands it (it does not after --workdir=)
    train.train_and_evaluate(FLAGS.config, os.path.expanduser(FLAGS.workdir))
  except ConfigError as e:
    logging.error("config error: %s", e)
    sys.exit(f"config error: {e}")
  except WriteError as e:  # a full disk: names the file and what is kept
    logging.error("write error: %s", e)
    sys.exit(f"write error: {e}")
  except Interrupted as e:
    e.exit()


if __name__ == "__main__":
  jax.config.config_with_absl()  # every JAX option as a --jax_* flag
  app.run(main, flags_parser=parse_flags)
