import types

import numpy as np
import pytest

from sorjax.analysis import dyck_metrics as dm
from sorjax.training.tasks.dyck import DyckLM

K = 2  # ids: ( [ ) ] START END -> 0 1 2 3 4 5


def test_eighty_percent_rule_on_hand_set_probabilities():
  p = np.zeros((4, 6))
  p[0, [2, 3]] = [0.8, 0.2]        # exactly 80% of close mass: correct
  p[1, [2, 3]] = [0.79, 0.21]      # just below: wrong
  p[2, [0, 2, 3]] = [0.9, 0.09, 0.01]  # mass mostly on an open: still 90% of close mass
  p[3, [2, 3]] = [0.5, 0.5]
  got = dm.close_correct(p, np.array([2, 2, 2, 3]), K)
  assert got.tolist() == [True, False, True, False]
  with pytest.raises(ValueError, match="closing-bracket ids"):
    dm.close_correct(p, np.array([0, 2, 2, 2]), K)
  with pytest.raises(ValueError, match="closing-bracket ids"):  # START
    dm.close_correct(p, np.array([2, 2, 2, 2 * K]), K)


def test_no_mass_on_any_close_is_wrong():
  # 0 >= 0.8 * 0 had scored it correct (QA, session 41)
  p = np.zeros((2, 6))
  p[0, 0], p[1, [0, 2]] = 1.0, [1.0 - 1e-30, 1e-30]
  assert dm.close_correct(p, np.array([2, 2]), K).tolist() == [False, True]


def test_dyck_lm_close_probs_keep_the_ratio_of_closes_exp_underflows():
  """A model sure that no close comes (close log-probs ~ -200, 0 in
  float32 after exp) still ranks the closes: the 80% rule reads the
  ratio, which the task renormalises over the closes in log space."""
  task = types.SimpleNamespace(k=K, lang=types.SimpleNamespace(vocab_size=6))
  lp = np.full((1, 2, 6), -200.0, np.float32)
  lp[0, :, 0] = 0.0                          # all mass on "("
  lp[0, 0, [2, 3]] = [-200.0, -201.0]        # ")" 0.73 of the closes
  lp[0, 1, [2, 3]] = [-200.0, -198.0]        # "]" 0.88 of the closes
  assert not np.exp(lp[..., 2:4]).any()      # what the 80% rule had read
  probs = DyckLM.close_probs(task, lp)
  ratio = probs[0, :, 2] / probs[0, :, 2:4].sum(-1)
  np.testing.assert_allclose(ratio, [1 / (1 + np.exp(-1)),
                                     1 / (1 + np.exp(2))], rtol=1e-6)
  assert dm.close_correct(probs[0], np.array([2, 3]), K).tolist() == [
      False, True]


def test_start_and_end_mass_is_not_closing_mass():
  """Only the k closing ids count as "any closing bracket": 0.7 on the true
  close and 0.3 on END is all of the closing mass on the truth."""
  p = np.zeros((2, 6))
  p[0, [2, 5]] = [0.7, 0.3]        # END
  p[1, [3, 4]] = [0.6, 0.4]        # START
  assert dm.close_correct(p, np.array([2, 3]), K).tolist() == [True, True]


def test_ldpa_and_wcpa_by_distance():
  # START ( [ ] ) END : closes at positions 3 (distance 1) and 4 (distance 3)
  tokens = np.array([[4, 0, 1, 3, 2, 5]])
  dist = np.array([[0, 0, 0, 1, 3, 0]])
  probs = np.full((1, 5, 6), 1 / 6)
  probs[0, 2] = [0, 0, 0.05, 0.95, 0, 0]    # predicts ] at t+1=3: correct
  probs[0, 3] = [0, 0, 0.3, 0.7, 0, 0]      # predicts ) at 4 with 0.3: wrong
  counts = dm.ldpa(probs, tokens, dist, K)
  assert counts == {1: (1, 1), 3: (0, 1)}
  assert dm.wcpa(counts) == 0.0 and dm.accuracy(counts) == 0.5
  merged = dm.merge(counts, {3: (2, 2), 5: (1, 1)})
  assert merged == {1: (1, 1), 3: (2, 3), 5: (1, 1)}
  assert dm.wcpa(merged) == pytest.approx(2 / 3)
  with pytest.raises(ValueError, match="empty"):
    dm.wcpa({})
