"""The zoo table (`python -m sorjax.demo`) runs every sequence cell."""

import pytest

import sorjax
from sorjax import demo


def test_zoo_table_lists_every_sequence_cell(capsys):
  demo.main(["--steps", "3", "--hidden", "6", "--batch", "2", "--input", "4"])
  out = capsys.readouterr().out
  rows = [l.split()[0] for l in out.splitlines()[2:]]
  assert rows == sorjax.cells.sequence_names()
  assert "(2, 3, 6)" in out


@pytest.mark.parametrize("flag,value", [("--hidden", "0"), ("--batch", "-2"),
                                        ("--steps", "x")])
def test_a_bad_size_names_its_flag(flag, value, capsys):
  with pytest.raises(SystemExit):
    demo.main([flag, value])
  assert (f"argument {flag}: must be a positive integer, got {value!r}"
          in capsys.readouterr().err)
