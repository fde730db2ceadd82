"""Adding flags to this process's XLA_FLAGS, which XLA reads once, when
JAX starts its backend: what `sorjax.small_loops` and the launchers'
`--cpu_devices` share."""

from __future__ import annotations

import os

from sorjax import host_memory


def prepend(who: str, words: str, flags: tuple[str, ...]) -> None:
  """Puts `words` (the `flags`, each given as flag=value) at the front of
  XLA_FLAGS: XLA ignores what follows a word that is not a flag, such as
  TF's `intra_op_parallelism_threads=1`.

  Raises:
    RuntimeError: JAX's backend has started (XLA has read its flags).
    ValueError: XLA_FLAGS already sets one of `flags` (it would be given
      twice) to other values; the same `words` again change nothing.
    Both name `who`.
  """
  if host_memory.backend_started():
    raise RuntimeError(
        f"{who} must run before JAX starts its backend (the first "
        "computation or jax.devices()): XLA reads XLA_FLAGS once; call it "
        "first in main()")
  current = os.environ.get("XLA_FLAGS", "")
  if f" {words} " in f" {current} ":   # set so before (a rerun cell)
    return
  for flag in flags:
    if flag + "=" in current:
      raise ValueError(
          f"{who}: XLA_FLAGS already sets {flag} ({current!r}); set "
          f"{words} there instead")
  os.environ["XLA_FLAGS"] = f"{words} {current}".strip()
