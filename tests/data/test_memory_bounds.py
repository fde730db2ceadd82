"""Counts whose output cannot fit in memory are refused up front, naming
the argument (they ran for minutes, or failed with a bare MemoryError)."""

import numpy as np
import pytest

from sorjax.data import checks, dyck, keyword_trees, markov, pcfg

HUGE = 10**12

CASES = {
    "dyck": (lambda: dyck.DyckKM(2, 4).sample(HUGE, 1, 4), "num"),
    "pcfg": (lambda: pcfg.DyckPCFG().sample(HUGE, 2, 4), "num"),
    "keyword_trees": (lambda: keyword_trees.sample(HUGE, 1, 5), "num"),
    "markov": (lambda: markov.markov_corpus(np.arange(12) % 3, length=HUGE),
               "length"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_count_beyond_memory_is_refused_naming_it(name):
  if checks.memory_bytes() is None:
    pytest.skip("this platform does not report its physical memory")
  make, arg = CASES[name]
  with pytest.raises(ValueError, match=rf"{arg}={HUGE} needs at least"):
    make()


def test_check_fits_passes_what_fits():
  assert checks.check_fits("f", "num", 1000, 100) == 1000
  have = checks.memory_bytes()
  if have is not None:
    with pytest.raises(ValueError, match="f: num="):
      checks.check_fits("f", "num", have // 10 + 1, 10)
