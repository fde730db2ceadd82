"""sorjax.checks: the one rule behind every int / number argument check."""

import math

import numpy as np
import pytest

from sorjax import checks


class Custom(ValueError):
  pass


@pytest.mark.parametrize("value", [3, np.int32(3), np.int64(7), 10**30])
def test_int_accepts_python_and_numpy_ints(value):
  out = checks.check_int("f: n", value, 3)
  assert out == value and type(out) is int


@pytest.mark.parametrize("value", [True, np.bool_(True), 3.0, "3", None,
                                   np.float32(3), [3]])
def test_int_refuses_non_ints_naming_the_input(value):
  # True would pass as 1 under isinstance(value, int)
  with pytest.raises(ValueError,
                     match=r"^f: n must be an int >= 1, got "):
    checks.check_int("f: n", value, 1)


def test_int_minimum_optional_and_error_classes():
  with pytest.raises(ValueError, match=r"^--replicas must be an int >= 1, "
                                       r"got 0$"):
    checks.check_int("--replicas", 0, 1)
  assert checks.check_int("data.pad_to", None, 1, optional=True) is None
  with pytest.raises(Custom, match=r"^data.pad_to must be None or an int "
                                   r">= 1, got 0$"):
    checks.check_int("data.pad_to", 0, 1, optional=True, error=Custom)
  # type_error: a value of the wrong type, error: a bad value
  with pytest.raises(TypeError):
    checks.check_int("n", "2", 1, type_error=TypeError)
  with pytest.raises(ValueError):
    checks.check_int("n", 0, 1, type_error=TypeError)


@pytest.mark.parametrize("value", [0.5, 1, np.float32(0.25), np.int8(1)])
def test_number_returns_the_value_unchanged(value):
  assert checks.check_number("p", value, "in (0, 1]",
                             lambda v: 0 < v <= 1) is value


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True,
                                   np.bool_(False), "0.5", None, 1 + 0j,
                                   np.array([0.5])])
def test_number_refuses_non_finite_and_non_numbers(value):
  with pytest.raises(ValueError, match=r"^p must be a finite number, got "):
    checks.check_number("p", value)


def test_number_rule_optional_integer():
  with pytest.raises(ValueError, match=r"^optim.b1 must be None or a finite "
                                       r"number in \[0, 1\), got 1.0$"):
    checks.check_number("optim.b1", 1.0, "in [0, 1)", lambda v: 0 <= v < 1,
                        optional=True)
  assert checks.check_number("optim.b1", None, "in [0, 1)",
                             lambda v: 0 <= v < 1, optional=True) is None
  with pytest.raises(ValueError, match=r"^k must be an int >= 1, got 2.0$"):
    checks.check_number("k", 2.0, ">= 1", lambda v: v >= 1, integer=True)
  # no float conversion of a huge int (math.isfinite would overflow)
  assert checks.check_number("k", 10**400, integer=True) == 10**400


def test_bool():
  assert checks.check_bool("f: flag", np.bool_(True)) is True
  with pytest.raises(TypeError, match=r"^f: flag must be a bool, got 'no'$"):
    checks.check_bool("f: flag", "no")
  with pytest.raises(ValueError, match="must be a bool, got 1"):
    checks.check_bool("f: flag", 1, error=ValueError)
