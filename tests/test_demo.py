"""The zoo table (`python -m sorjax.demo`) runs every sequence cell."""

import sorjax
from sorjax import demo


def test_zoo_table_lists_every_sequence_cell(capsys):
  demo.main(["--steps", "3", "--hidden", "6", "--batch", "2", "--input", "4"])
  out = capsys.readouterr().out
  rows = [l.split()[0] for l in out.splitlines()[2:]]
  assert rows == sorjax.cells.sequence_names()
  assert "(2, 3, 6)" in out
