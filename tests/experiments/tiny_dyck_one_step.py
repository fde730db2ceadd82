"""tiny_dyck cut to one training step on one bucket (max_steps ends the
run before the epoch's evaluation): for tests of the binary that need a
run to start and compile, not to learn (test_train's jax flags)."""

from tests.experiments import tiny_dyck


def get_config():
  c = tiny_dyck.get_config()
  c.data.num_buckets = 1
  c.train.num_epochs = 1
  c.train.max_steps = 1
  return c
