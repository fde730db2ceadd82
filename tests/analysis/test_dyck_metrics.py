import numpy as np
import pytest

from sorjax.analysis import dyck_metrics as dm

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
