"""Le & Zuidema 3.3's ||dJ/dx_keyword|| / ||dJ/dx_root|| against a float64
NumPy backpropagation through the recursive RNN, and per-depth statistics."""

import types

import jax
import numpy as np
import pytest

from sorjax.analysis import tree_gradients as tg
from sorjax.analysis.common import AnalysisError
from sorjax.training.tasks.trees import TreeTask
from tests.experiments import tiny_trees


def _np_ratio(tree, p, label, keyword_index):
  """Forward p = tanh([x; y] W + b) (sec. 2) bottom-up, softmax at the
  root, then backward by hand; returns the two gradient norms."""
  E = np.asarray(p["embedding"], np.float64)
  W = np.asarray(p["cell"]["W"], np.float64)
  b = np.asarray(p["cell"]["b"], np.float64)
  K = np.asarray(p["classifier"]["kernel"], np.float64)
  c = np.asarray(p["classifier"]["bias"], np.float64)
  H = W.shape[1]
  leaves = []

  def forward(node):
    if isinstance(node, tuple):
      l, r = forward(node[0]), forward(node[1])
      xy = np.concatenate([l["p"], r["p"]])
      return {"p": np.tanh(xy @ W + b), "kids": (l, r)}
    leaves.append({"p": E[node]})
    return leaves[-1]

  root = forward(tree)
  z = root["p"] @ K + c
  soft = np.exp(z - z.max())
  soft /= soft.sum()
  g_root = (soft - np.eye(len(c))[label]) @ K.T            # dJ/dp_root

  def backward(node, g):
    node["g"] = g
    if "kids" in node:
      gz = g * (1.0 - node["p"] ** 2)
      gxy = gz @ W.T
      backward(node["kids"][0], gxy[:H])
      backward(node["kids"][1], gxy[H:])

  backward(root, g_root)
  return (np.linalg.norm(leaves[keyword_index]["g"]),
          np.linalg.norm(g_root))


def test_ratios_match_numpy_backpropagation_through_the_tree():
  cfg = tiny_trees.get_config()
  cfg.model.cell = "tree_rnn"
  cfg.data.scale = 0.01
  cfg.data.eval_batch_size = 4
  task = TreeTask(cfg)
  params = task.init_params(jax.random.key(0))
  # Larger word vectors than U(+-1e-4) so tanh is not linear.
  params["embedding"] = params["embedding"] * 5e3
  n = 6                                        # two batches, one padded
  depth, num, den = tg.tree_ratios(task, params, "train", max_trees=n)
  examples = task.examples["train"][:n]
  assert depth.tolist() == [ex.keyword_depth for ex in examples]
  for i, ex in enumerate(examples):
    want_num, want_den = _np_ratio(ex.tree, params, ex.label,
                                   ex.keyword_index)
    assert num[i] == pytest.approx(want_num, rel=2e-4)
    assert den[i] == pytest.approx(want_den, rel=2e-4)


def test_depth_statistics_by_hand():
  depth = np.array([1, 1, 1, 3, 3])
  ratio = np.array([1.0, 4.0, 16.0, 2.0, np.inf])
  out = tg.depth_stats(depth, ratio)
  assert out[1]["trees"] == 3 and out[1]["median"] == 4.0
  assert out[1]["geometric_mean"] == pytest.approx(4.0)
  assert (out[1]["q25"], out[1]["q75"]) == (2.5, 10.0)
  assert out[3] == {"trees": 2, "non_finite": 1, "q25": 2.0, "median": 2.0,
                    "q75": 2.0, "mean": 2.0, "geometric_mean": 2.0}


def _run(task_name, dataset="keyword"):
  return types.SimpleNamespace(
      task=types.SimpleNamespace(name=task_name), workdir="/fake",
      config=types.SimpleNamespace(data=types.SimpleNamespace(
          dataset=dataset)))


def test_wrong_runs_are_an_error():
  with pytest.raises(AnalysisError, match="needs a 'trees' run; this run's "
                     "task is 'dyck_lm'"):
    tg.gradient_ratio(_run("dyck_lm"))
  with pytest.raises(AnalysisError, match="needs the keyword-tree task .* "
                     "data.dataset='sst'"):
    tg.gradient_ratio(_run("trees", "sst"))


def test_plot_reads_json_keys(tmp_path):
  res = {"split": "train", "dev_accuracy": {"1": 0.3, "2": 0.6},
         "epochs": [{"epoch": e, "step": 10 * e, "trees": 4, "depths": {
             str(d): {"trees": 2, "non_finite": 0, "q25": 0.1 * d * (e + 1),
                      "median": 0.2 * d * (e + 1), "q75": 0.3 * d * (e + 1),
                      "mean": 0.2, "geometric_mean": 0.2}
             for d in (1, 2, 4)}} for e in range(3)]}
  tg.plot_gradient_ratio(res, str(tmp_path / "g.png"))
  assert (tmp_path / "g.png").stat().st_size > 0
