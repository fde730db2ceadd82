"""The LSTM and multi-timescale LSTM's bias initialisation."""

import jax
import numpy as np
import pytest

import sorjax

@pytest.mark.parametrize("name, kw, bias", [
    ("lstm", {}, "b"),
    ("mts_lstm", {"timescales": ("inverse_gamma", 0.56)}, "b_go")])
def test_bias_init_uniform_draws_the_bias_from_the_weights_range(
    name, kw, bias):
  # Mahto et al. 3.1.1 draw every bias but eq. 5's uniformly; the bias
  # started at 0 (QA, session 41)
  H, D = 16, 3
  zero = sorjax.cells.make(name, hidden_size=H, **kw).init(
      jax.random.key(0), D)
  uni = sorjax.cells.make(name, hidden_size=H, bias_init="uniform",
                          **kw).init(jax.random.key(0), D)
  assert not np.any(np.asarray(zero[bias]))
  b = np.asarray(uni[bias])
  assert np.all(np.abs(b) <= 1 / np.sqrt(H)) and np.std(b) > 0.1 / np.sqrt(H)
  for k in zero:            # the weights drawn beside it are unchanged
    if k != bias:
      np.testing.assert_array_equal(zero[k], uni[k])
  with pytest.raises(ValueError, match=r"bias_init must be one of "
                     r"\('zeros', 'uniform'\), got 'normal'"):
    sorjax.cells.make(name, hidden_size=H, bias_init="normal", **kw)
