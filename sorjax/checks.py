"""Argument checks shared by every sorjax module; each error names its input.

`where` is the input as its user wrote it: "Vocab.build: min_count",
"data.seq_len", "--replicas". Errors read "{where} must be ..., got {value!r}"
and are ValueErrors unless `error` says otherwise (the configs raise their
ConfigError). A bool is never a number here: True would pass as 1.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import tempfile
from typing import Any, Callable

import numpy as np


def _is_bool(value: Any) -> bool:
  return isinstance(value, (bool, np.bool_))


def is_int(value: Any) -> bool:
  """A Python or NumPy int, and not a bool."""
  return not _is_bool(value) and isinstance(value, numbers.Integral)


def check_int(where: str, value: Any, minimum: int = 0, *,
              optional: bool = False, error: type = ValueError,
              type_error: type | None = None) -> int | None:
  """`value` as an int >= minimum (Python or NumPy ints; None with
  `optional`), else `error` naming `where` (`type_error`, if given, when
  `value` is no int at all)."""
  v = check_number(where, value, f">= {minimum}", lambda v: v >= minimum,
                   integer=True, optional=optional, error=error,
                   type_error=type_error)
  return None if v is None else int(v)


def check_number(where: str, value: Any, rule: str = "",
                 ok: Callable[[Any], bool] = lambda v: True, *,
                 integer: bool = False, optional: bool = False,
                 error: type = ValueError, type_error: type | None = None):
  """`value` unchanged if it is a finite number (an int with `integer`; None
  with `optional`) for which ok(value) holds, else `error` naming `where`
  (`type_error`, if given, when `value` is no such number at all); `rule`
  says what ok checks, e.g. "> 0" or "in (0, 1]"."""
  if value is None and optional:
    return None
  is_kind = is_int(value) if integer else (
      not _is_bool(value) and isinstance(value, numbers.Real))
  if not is_kind or not (integer or math.isfinite(value)) or not ok(value):
    what = "an int" if integer else "a finite number"
    none = "None or " if optional else ""
    rule = f" {rule}" if rule else ""
    raise (error if is_kind else type_error or error)(
        f"{where} must be {none}{what}{rule}, got {value!r}")
  return value


def check_bool(where: str, value: Any, *, error: type = TypeError) -> bool:
  """`value` if a bool (a "no" string is truthy), else `error` naming
  `where`."""
  if not _is_bool(value):
    raise error(f"{where} must be a bool, got {value!r}")
  return bool(value)


def output_dir_problem(path: str) -> str | None:
  """Why `path` (after ~ expansion) cannot be, or be made, a directory to
  write into: empty, a file on the way, or an existing folder on the way
  that is not writable; None when it can."""
  if not path:
    return "empty"
  probe = os.path.abspath(os.path.expanduser(path))
  while not os.path.exists(probe) and os.path.dirname(probe) != probe:
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    return f"{probe} is a file, not a directory"
  if not os.access(probe, os.W_OK | os.X_OK):
    return f"{probe} is not writable"
  try:  # access() says yes to root, also where nothing can be made (/proc)
    made = tempfile.mkdtemp(prefix=".sorjax-probe-", dir=probe)
  except OSError as e:
    return f"cannot make a folder in {probe} ({e.strerror or e})"
  os.rmdir(made)
  return None


class WriteError(OSError):
  """A file of a run (a checkpoint, metrics.jsonl, a result) could not be
  written: a full disk, a read-only or vanished folder. Its message names
  the file and what is kept."""


def write_error(message: str, cause: BaseException) -> WriteError:
  """A WriteError reading `message`, with the errno of `cause` (an
  OSError's; None for others)."""
  err = WriteError(message)
  err.errno = getattr(cause, "errno", None)
  return err


def write_whole(path: str, write: Callable[[str], Any],
                kept: str = "") -> str:
  """Writes `path` whole or not at all: `write(tmp)` fills a temporary
  file beside it, which then replaces `path`. A full disk (or any OSError,
  or a kill) mid-write leaves an earlier `path` as it was and no temporary
  file behind; the failure is a WriteError naming `path` (and `kept`, what
  the caller keeps). Returns `path`."""
  tmp = f"{path}.{os.getpid()}.tmp"
  try:
    write(tmp)
    os.replace(tmp, path)
  except OSError as e:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    was = " (its earlier version is kept)" if os.path.exists(path) else ""
    raise write_error(f"cannot write {path}{was}: {e.strerror or e}{kept}",
                      e) from None
  return path


def write_text(path: str, text: str, kept: str = "") -> str:
  """`write_whole` of a UTF-8 text."""
  def write(tmp):
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
  return write_whole(path, write, kept)
