"""Environments for test subprocesses that need their own XLA:CPU devices."""

import os


def with_cpu_devices(n: int) -> dict:
  """This process's environment, with XLA:CPU offering n devices: the
  flag added to XLA_FLAGS (the suite's compile settings, tests/conftest.py,
  kept)."""
  flags = os.environ.get("XLA_FLAGS", "")
  return dict(os.environ, XLA_FLAGS=(
      f"{flags} --xla_force_host_platform_device_count={n}".strip()))
