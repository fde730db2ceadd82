"""benchmarks.train_step: a tiny run against a second checkout, and its
flags' errors."""

import pathlib

import pytest

from benchmarks import train_step

REPO = pathlib.Path(train_step.__file__).resolve().parents[1]


def test_the_demo_step_timed_in_two_checkouts(tmp_path, capsys):
  """The second checkout is this one's code under another path; each
  worker must import sorjax from its own checkout (else the run fails)."""
  other = tmp_path / "other"
  other.mkdir()
  for name in ("sorjax", "experiments", "datasets"):
    (other / name).symlink_to(REPO / name)
  assert train_step.main(["demo", "--against", str(other), "--rounds", "1",
                          "--steps", "1", "--seconds", "0",
                          "--batches", "1"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == ("| SPEC | checkout | ms a step | range | tokens/s | "
                      f"speed-up over {other} |")
  rows = [[c.strip() for c in r.split("|")[1:-1]] for r in lines[2:]]
  assert [r[:2] for r in rows] == [["demo", str(REPO)], ["demo", str(other)]]
  assert all(float(r[2]) > 0 for r in rows)
  assert rows[0][5].endswith("x") and rows[1][5] == "-"


def test_a_failing_worker_names_the_spec_and_checkout(capsys):
  assert train_step.main(["demo:nonsense", "--rounds", "1", "--steps", "1",
                          "--seconds", "0", "--batches", "1"]) == 1
  err = capsys.readouterr().err
  assert f"demo:nonsense with the sorjax of {REPO} failed" in err


def test_a_config_missing_from_another_checkout_is_named_first(tmp_path,
                                                              capsys):
  other = tmp_path / "old"
  (other / "experiments" / "configs").mkdir(parents=True)
  (other / "sorjax").symlink_to(REPO / "sorjax")
  with pytest.raises(SystemExit):
    train_step.main(["demo", "--against", str(other)])
  assert (f"SPEC 'demo': no experiments/configs/demo.py with a get_config() "
          f"in {other}") in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["nope"], "SPEC 'nope': no experiments/configs/nope.py"),
    (["common"], "SPEC 'common': no experiments/configs/common.py with a "
                 "get_config()"),
    (["../../x"], "SPEC '../../x': no experiments/configs/../../x.py"),
    (["demo", "--against", "/"], "--against '/': not a sorjax checkout"),
    (["demo", "--against", str(REPO)], "that checkout is already timed"),
    (["demo", "--rounds", "0"], "--rounds: want an int >= 1, got '0'"),
    (["demo", "--steps", "x"], "--steps: want an int >= 1, got 'x'"),
    (["demo", "--seconds", "-1"], "--seconds: want a finite number >= 0")])
def test_bad_arguments_are_named(capsys, argv, message):
  with pytest.raises(SystemExit):
    train_step.main(argv)
  assert message in capsys.readouterr().err
