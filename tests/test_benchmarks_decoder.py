"""benchmarks.decoder: a tiny run's table, and its flags' errors."""

import pytest

from benchmarks import decoder


def test_a_tiny_run_prints_both_decoders_and_their_ratio(capsys):
  assert decoder.main(["--rounds", "1", "--shapes", "2,3,4,7;1,2,3,5"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == ("| B, T, H, V | form | nn.Dense ms | lm.Decoder ms | "
                      "speed-up |")
  rows = lines[2:]
  assert [[c.strip() for c in r.split("|")[1:3]] for r in rows] == [
      [shape, form] for shape in ("2, 3, 4, 7", "1, 2, 3, 5")
      for form in ("grad", "vmap(grad), 1 replica")]
  for r in rows:
    dense, dec, ratio = (c.strip() for c in r.split("|")[3:6])
    assert float(dense) > 0 and float(dec) > 0 and ratio.endswith("x")
    # one round: the median of the ratios is the ratio of the times
    assert float(ratio[:-1]) == pytest.approx(float(dense) / float(dec),
                                              abs=0.01, rel=0.01)


@pytest.mark.parametrize("vmapped", [False, True])
def test_the_two_decoders_compute_the_same_gradient(vmapped):
  import jax
  import numpy as np
  dense, dec = decoder.cases(2, 3, 4, 7, vmapped=vmapped)
  assert (dense.label, dec.label) == ("nn.Dense", "lm.Decoder")
  for x, y in zip(jax.tree_util.tree_leaves(dense.compiled(*dense.args)),
                  jax.tree_util.tree_leaves(dec.compiled(*dec.args))):
    assert x.shape[:1] == ((1,) if vmapped else x.shape[:1])
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("argv,message", [
    (["--rounds", "0"], "--rounds: want an int >= 1, got '0'"),
    (["--shapes", "2,3,4"], "--shapes: want B,T,H,V quadruples"),
    (["--shapes", "2,3,4,0"], "got '2,3,4,0'"),
    (["--shapes", "a,b,c,d"], "got 'a,b,c,d'")])
def test_bad_flags_are_named(capsys, argv, message):
  with pytest.raises(SystemExit):
    decoder.main(argv)
  assert message in capsys.readouterr().err
