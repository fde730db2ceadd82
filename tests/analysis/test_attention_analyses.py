"""Principal angles between W_hh subspaces on hand-built matrices, and the
attention heatmap's alpha_t against softmax(x V / tau) in NumPy."""

import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sorjax import cells
from sorjax.analysis import attention
from sorjax.analysis.common import AnalysisError
from sorjax.data.dyck import DyckKM
from sorjax.models import LanguageModel
from sorjax.training.tasks.base import ModelTask

SEQS = [np.array([4, 0, 1, 3, 2, 5]), np.array([4, 1, 3, 5])]


class _DyckTask(ModelTask):
  name = "dyck_lm"

  def __init__(self, cell):
    self.lang, self.k = DyckKM(2, 3), 2
    self.splits = {"dev": (SEQS, 1, 6), "test": (SEQS, 1, 6)}
    self.eval_batch_size = 4
    self._setup_model(LanguageModel(cells=(cell,), vocab_size=6,
                                    embed_size=5), None)


def _run(task, params):
  return types.SimpleNamespace(
      task=task, params=params, workdir="/fake",
      eval_temperature=lambda: 1.0, encode=task.lang.encode,
      config=types.SimpleNamespace(model=types.SimpleNamespace(cell="?")))


def _e(*idx, n=8):
  v = np.zeros(n)
  for i in idx:
    v[i] = 1.0
  return v


def test_principal_angles_of_hand_built_subspaces(tmp_path):
  np.testing.assert_allclose(attention.pabs(_e(0)[None], (_e(0) + _e(1))[None]
                                            ), [45.0], atol=1e-9)
  cell = cells.make("attention_lstm", hidden_size=2, num_cells=3)
  task = _DyckTask(cell)
  params = task.init_params(jax.random.key(0))
  W_h = np.stack([np.stack([_e(0), _e(1)]),         # span{e0, e1}
                  np.stack([_e(0), _e(2)]),         # span{e0, e2}
                  np.stack([_e(0, 2), 3 * _e(3)])])  # span{e0 + e2, e3}
  params["layer_0"]["W_h"] = jnp.asarray(W_h, jnp.float32)
  res = attention.principal_angles(_run(task, params))
  deg = res["layers"][0]["degrees"]
  np.testing.assert_allclose(deg["0-1"], [0.0, 90.0], atol=1e-5)
  np.testing.assert_allclose(deg["0-2"], [45.0, 90.0], atol=1e-5)
  np.testing.assert_allclose(deg["1-2"], [0.0, 90.0], atol=1e-5)
  assert res["layers"][0]["num_cells"] == 3
  # the smallest angle over every pair: cells 0 and 1 share e0
  assert res["layers"][0]["min_degrees"] == pytest.approx(0.0, abs=1e-5)
  params["layer_0"]["W_h"] = jnp.asarray(np.stack([
      np.stack([_e(0), _e(1)]),                     # span{e0, e1}
      np.stack([_e(0, 2), _e(3)]),                  # span{e0 + e2, e3}
      np.stack([_e(1, 3), _e(2)])]), jnp.float32)   # span{e1 + e3, e2}
  two = attention.principal_angles(_run(task, params))["layers"][0]
  # 0-1 and 0-2: one shared direction at cos 1/sqrt 2, one orthogonal;
  # 1-2: cross products [[0, 1/sqrt 2], [1/sqrt 2, 0]], cos 1/sqrt 2 twice
  np.testing.assert_allclose(two["degrees"]["0-1"], [45.0, 90.0], atol=1e-5)
  np.testing.assert_allclose(two["degrees"]["0-2"], [45.0, 90.0], atol=1e-5)
  np.testing.assert_allclose(two["degrees"]["1-2"], [45.0, 45.0], atol=1e-5)
  assert two["min_degrees"] == pytest.approx(45.0, abs=1e-5)
  attention.plot_principal_angles(res, str(tmp_path / "pabs.png"))
  assert (tmp_path / "pabs.png").stat().st_size > 0


def test_heatmap_weights_are_softmax_of_xV_over_tau(tmp_path):
  cell = cells.make("attention_lstm", hidden_size=3, num_cells=2)
  task = _DyckTask(cell)
  params = task.init_params(jax.random.key(1))
  run = _run(task, params)
  tau = 0.5
  res = attention.attention_map(run, "test", num=2, tau=tau)
  seqs = res["layers"][0]["sequences"]
  assert [s["tokens"] for s in seqs] == [
      ["START", "(", "[", "]", ")"], ["START", "[", "]"]]
  E = np.asarray(params["embedding"], np.float64)
  V = np.asarray(params["layer_0"]["V"], np.float64)
  for s, ids in zip(seqs, ([4, 0, 1, 3, 2], [4, 1, 3])):
    e = E[ids] @ V / tau                               # Lin eq. (a)-(b)
    want = np.exp(e - e.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(s["alpha"], want, atol=1e-5)
  page = attention.heatmap_html(res)
  spans = re.findall(r"title='cell (\d): ([0-9.]+)'[^>]*>([^<]*)</span>",
                     page)
  a0 = np.asarray(seqs[0]["alpha"])
  assert [(int(c), t) for c, _, t in spans[:5]] == [
      (int(np.argmax(a)), t) for a, t in zip(a0, seqs[0]["tokens"])]
  assert float(spans[0][1]) == pytest.approx(a0[0].max(), abs=1e-3)
  attention.plot_heatmap(res, str(tmp_path / "heat.png"))
  assert (tmp_path / "heat.png").stat().st_size > 0
  text = attention.attention_map(run, text="( ( ) )")
  assert text["layers"][0]["sequences"][0]["tokens"] == ["(", "(", ")", ")"]


def test_runs_without_multi_cell_lstms_are_an_error():
  task = _DyckTask(cells.make("lstm", hidden_size=3))
  run = _run(task, task.init_params(jax.random.key(0)))
  for fn in (attention.principal_angles, attention.attention_map):
    with pytest.raises(AnalysisError, match=r"needs a layer of "
                       r"attention_lstm or assignment_lstm for its S "
                       r"hidden-to-hidden matrices .* cells are \['lstm'\]"):
      fn(run)


def test_heatmap_png_heads_each_layers_rows(tmp_path, monkeypatch):
  """Two attention layers: each layer's sequences under "layer l", as in
  the HTML (the rows of both layers read alike without it)."""
  cell = cells.make("attention_lstm", hidden_size=5, num_cells=2)
  task = _DyckTask(cell)
  task._setup_model(LanguageModel(cells=(cell, cell), vocab_size=6,
                                  embed_size=5), None)
  run = _run(task, task.init_params(jax.random.key(2)))
  res = attention.attention_map(run, "test", num=2)
  assert list(res["layers"]) == [0, 1]
  figs = []
  monkeypatch.setattr(attention, "save", lambda fig, path: figs.append(fig))
  attention.plot_heatmap(res, str(tmp_path / "heat.png"))
  texts = [(t.get_text(), t.get_position()[1]) for t in figs[0].axes[0].texts]
  heads = [(s, y) for s, y in texts if s.startswith("layer")]
  assert [s for s, _ in heads] == ["layer 0", "layer 1"]
  first = [s for s, y in texts if heads[0][1] < y < heads[1][1]]
  second = [s for s, y in texts if y > heads[1][1]]
  assert first == second == ["START", "(", "[", "]", ")", "START", "[", "]"]
