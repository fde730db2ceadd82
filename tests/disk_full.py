"""A full disk, simulated without root or a mount: files opened for writing
keep the first few characters of a write, then raise ENOSPC."""

import builtins
import os


def no_space() -> OSError:
  return OSError(28, "No space left on device")


class _Torn:
  """A file whose writes store `keep` characters, then fail."""

  def __init__(self, f, keep: int):
    self.f, self.keep = f, keep

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.f.close()

  def write(self, text):
    self.f.write(text[:self.keep])
    raise no_space()


def fill_disk(monkeypatch, keep: int = 5, only: str | None = None) -> None:
  """From now on (until `monkeypatch.undo()`), `open(..., "w"...)` of a file
  (whose name starts with `only`, if given) returns a file whose first write
  keeps `keep` characters and raises ENOSPC; reads are untouched."""
  real_open = builtins.open

  def open_(file, mode="r", *args, **kwargs):
    f = real_open(file, mode, *args, **kwargs)
    if "w" in mode and (only is None
                        or os.path.basename(str(file)).startswith(only)):
      return _Torn(f, keep)
    return f
  monkeypatch.setattr(builtins, "open", open_)
