"""Unit timescales (Mahto et al.): traces vs a NumPy LSTM loop, eq. 2-3 on
hand-set gates, KS fits, heatmap grouping, word-ablation decay e^{-t/T}."""

import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from sorjax import cells
from sorjax.analysis import timescales as ts, traces
from sorjax.analysis.common import AnalysisError
from sorjax.cells import mts_lstm
from sorjax.models import LanguageModel
from sorjax.training.tasks.base import ModelTask
from tests.cells.reference import sigmoid


class _Task(ModelTask):
  """A token-model task around a given model, with hand-made splits."""

  def __init__(self, model, name="dyck_pcfg", splits=None):
    self.name = name
    self.splits = splits or {}
    self.eval_batch_size = 3
    self._setup_model(model, None)


def _run(task, params):
  return types.SimpleNamespace(task=task, params=params, workdir="/fake",
                               eval_temperature=lambda: 1.0,
                               config=types.SimpleNamespace(
                                   model=types.SimpleNamespace(cell="?")))


def _model(layers, V=7, E=5):
  return LanguageModel(cells=tuple(layers), vocab_size=V, embed_size=E)


def _np_lstm(p, xs, lengths, forget_bias, bias=None):
  """Float64 loop of Mahto eq. (sec. 2.1) with gate order i, f, g, o;
  padded steps keep the state. Returns f [B, T, H], c [B, T, H], h."""
  W_x, W_h = (np.asarray(p[k], np.float64) for k in ("W_x", "W_h"))
  b = np.asarray(p["b"] if bias is None else bias, np.float64)
  B, T, _ = xs.shape
  H = W_h.shape[0]
  h, c = np.zeros((B, H)), np.zeros((B, H))
  F, C, Hs = (np.zeros((B, T, H)) for _ in range(3))
  for t in range(T):
    z = xs[:, t] @ W_x + h @ W_h + b
    i, f = sigmoid(z[:, :H]), sigmoid(z[:, H:2 * H] + forget_bias)
    g, o = np.tanh(z[:, 2 * H:3 * H]), sigmoid(z[:, 3 * H:])
    c_new = f * c + i * g
    h_new = o * np.tanh(c_new)
    live = (t < lengths)[:, None]
    c, h = np.where(live, c_new, c), np.where(live, h_new, h)
    F[:, t], C[:, t], Hs[:, t] = f, c, h
  return F, C, Hs


def test_trace_forget_gates_and_memory_match_a_numpy_lstm_loop():
  lstm = cells.make("lstm", hidden_size=4, forget_bias=1.0)
  mts = cells.make("mts_lstm", hidden_size=3,
                   timescales=(("groups", (("constant", 2.0, 1),
                                           ("inverse_gamma", 1.5, 2)))))
  task = _Task(_model([lstm, mts]))
  params = task.init_params(jax.random.key(0))
  params = jax.tree_util.tree_map(lambda a: a + 0.1, params)  # b != 0
  tokens = np.array([[1, 2, 3, 4, 5], [6, 0, 2, 2, 0]])
  lengths = np.array([5, 3])
  out = traces.trace(task, params, tokens, lengths)
  x = np.asarray(params["embedding"], np.float64)[tokens]
  # The model itself sows its embedded inputs: ours must equal them.
  _, sown = task.model.apply({"params": params}, jnp.asarray(tokens),
                             mutable=["intermediates"])
  np.testing.assert_allclose(traces.embed(task, params, tokens),
                             sown["intermediates"]["embedded"][0], atol=1e-6)
  F0, C0, H0 = _np_lstm(params["layer_0"], x, lengths, 1.0)
  p1 = params["layer_1"]
  F1, C1, _ = _np_lstm(p1, H0, lengths, 0.0,
                       bias=np.asarray(mts.bias(p1), np.float64))
  for got, want in ((out.layers[0].f, F0), (out.layers[0].c, C0),
                    (out.layers[1].f, F1), (out.layers[1].c, C1)):
    np.testing.assert_allclose(np.asarray(got)[0], want[0], atol=1e-5)
    np.testing.assert_allclose(np.asarray(got)[1, :3], want[1, :3],
                               atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.final[1].c), C1[:, -1],
                             atol=1e-5)   # final carry: the last valid step
  # ablate=2 (word ablation): the loop's input x_2 set to 0, and only it
  xa = x.copy()
  xa[:, 2] = 0.0
  _, Ca, _ = _np_lstm(params["layer_0"], xa, lengths, 1.0)
  abl = traces.trace(task, params, tokens, lengths, ablate=2)
  np.testing.assert_allclose(np.asarray(abl.layers[0].c)[0], Ca[0],
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(abl.layers[0].c)[0, :2], C0[0, :2],
                             atol=1e-5)
  # The trace's last layer decodes to the model's own logits.
  logits, _ = task.model.apply({"params": params}, jnp.asarray(tokens),
                               None, jnp.asarray(lengths))
  dec = params["decoder"]
  np.testing.assert_allclose(
      np.asarray(out.layers[1].h) @ np.asarray(dec["kernel"])
      + np.asarray(dec["bias"]), logits, atol=1e-5)


def test_split_traces_carry_an_lm_stream_across_its_windows():
  # An LM split's TBPTT windows continue each other: their traces equal one
  # NumPy loop over each whole stream row (batchify: row i = ids[12i:12i+12]).
  task = _Task(_model([cells.make("lstm", hidden_size=4, forget_bias=1.0)]),
               name="lm")
  task.data_cfg = types.SimpleNamespace(eval_batch_size=2, eval_bptt=4)
  task.eval_streams = lambda split: 2        # the LM task's, for "test"
  task.documents = False                     # streams, not lines
  ids = np.array([1, 2, 3, 4, 5, 6, 0, 2, 2, 0, 3, 1,
                  6, 5, 4, 3, 2, 1, 0, 1, 4, 4, 2, 6], np.int32)
  task.split_ids = {"test": ids}
  params = task.init_params(jax.random.key(1))
  params = jax.tree_util.tree_map(lambda a: 2.0 * a + 0.1, params)
  out = list(traces.split_traces(task, params, "test"))
  assert [m.sum(1).tolist() for _, m in out] == [[4, 4], [4, 4], [3, 3]]
  got_c = np.concatenate([np.asarray(t.layers[0].c)[:, m[0]]
                          for t, m in out], 1)
  got_h = np.concatenate([np.asarray(t.layers[0].h)[:, m[0]]
                          for t, m in out], 1)
  x = np.asarray(params["embedding"], np.float64)[ids.reshape(2, 12)[:, :11]]
  _, C, H = _np_lstm(params["layer_0"], x, np.array([11, 11]), 1.0)
  np.testing.assert_allclose(got_c, C, atol=1e-5)
  np.testing.assert_allclose(got_h, H, atol=1e-5)


def test_equations_2_and_3_on_hand_values():
  T = np.array([1.0, 5.0, 300.0])
  np.testing.assert_allclose(ts.timescale_from_forget(np.exp(-1 / T)), T)
  assert ts.timescale_from_forget(1.0) == np.inf
  lstm = cells.make("lstm", hidden_size=3, forget_bias=0.5)
  b = np.zeros(12)
  b[3:6] = mts_lstm.forget_bias(T) - 0.5     # b_f + forget_bias = eq. 5
  np.testing.assert_allclose(ts.bias_timescales(lstm, {"b": b}), T)


def _free_input_run(T_units, splits, V=4, E=3):
  """An mts_lstm whose forget gate sees no input and no h (W_x, W_h = 0
  except x -> g): f_t = sigma(b_f) = e^{-1/T}, the free-input regime."""
  H = len(T_units)
  cell = cells.make("mts_lstm", hidden_size=H, timescales=tuple(T_units))
  task = _Task(_model([cell], V=V, E=E), splits=splits)
  params = task.init_params(jax.random.key(1))
  W_x = np.zeros((E, 4 * H), np.float32)
  W_x[:, 2 * H:3 * H] = np.random.default_rng(0).normal(size=(E, H))
  params["layer_0"] = {"W_x": jnp.asarray(W_x),
                       "W_h": jnp.zeros((H, 4 * H)),
                       "b_go": jnp.zeros((2 * H,))}
  return _run(task, params)


def test_estimate_recovers_assigned_timescales_in_the_free_input_regime():
  T = [2.0, 2.0, 9.0, 9.0]
  seqs = [np.array([1, 2, 3, 1, 0]), np.array([3, 3]), np.array([2, 1, 0])]
  run = _free_input_run(T, {"test": seqs, "train": seqs})
  res = ts.estimate(run, "test")
  assert res["steps"] == 10
  layer = res["layers"][0]
  np.testing.assert_allclose(layer["mean_forget"], np.exp(-1 / np.array(T)),
                             rtol=1e-6)
  np.testing.assert_allclose(layer["T_est"], T, rtol=1e-4)
  assert layer["correlation"]["pearson_log10"] == pytest.approx(1.0)
  assert layer["correlation"]["spearman"] == pytest.approx(1.0)


def test_correlation_is_none_when_undefined():
  assert ts.correlation([3.0, 3.0], [2.0, 5.0])["pearson_log10"] is None
  out = ts.correlation([1.0, 10.0, np.inf], [2.0, 20.0, 5.0])
  assert out["units"] == 2 and out["pearson_log10"] == pytest.approx(1.0)


def test_correlation_by_hand():
  """Spearman's rho is of ranks (1 for any increasing pair), Pearson's r
  of log10 T."""
  a, b = [1.0, 10.0, 100.0], [1.0, 10.0, 1e5]
  out = ts.correlation(a, b)
  assert out["spearman"] == pytest.approx(1.0)
  x, y = np.log10(a), np.log10(b)        # [0, 1, 2] and [0, 1, 5]
  r = np.sum((x - x.mean()) * (y - y.mean())) / math.sqrt(
      np.sum((x - x.mean()) ** 2) * np.sum((y - y.mean()) ** 2))
  assert out["pearson_log10"] == pytest.approx(r) and r < 0.97


def test_ks_statistic_by_hand_and_best_families():
  one = ts.ks_fit([1.0], alphas=(1.0,), mus=(1.0, 3.0))
  # One point at the Gaussian's median: the empirical CDF jumps 0 -> 1
  # where the model's is 0.5.
  assert one["narrow_gaussian"]["ks"][0] == pytest.approx(0.5)
  assert one["narrow_gaussian"]["ks"][1] == pytest.approx(1.0)
  ig = scipy.stats.invgamma(1.0).cdf(1.0)      # = e^{-1}
  assert one["inverse_gamma"]["ks"][0] == pytest.approx(max(ig, 1 - ig))
  q = np.linspace(0, 1, 202)[1:-1]
  heavy = ts.ks_fit(scipy.stats.invgamma(1.5).ppf(q))
  assert heavy["best_family"] == "inverse_gamma"
  assert heavy["inverse_gamma"]["best_alpha"] == pytest.approx(1.5)
  narrow = ts.ks_fit(scipy.stats.norm(2.0, 0.1).ppf(q))
  assert narrow["best_family"] == "narrow_gaussian"
  assert narrow["narrow_gaussian"]["best_mu"] == pytest.approx(2.0)
  with pytest.raises(ValueError, match="no finite"):
    ts.ks_fit([np.inf])


def test_group_rows_sorts_then_averages():
  v = np.array([[4.0], [1.0], [3.0], [2.0], [9.0]])
  order = np.argsort(v[:, 0])
  np.testing.assert_allclose(ts.group_rows(v, order, 2), [[1.5], [3.5], [9]])


def test_forget_heatmap_and_word_ablation_decay_as_e_to_minus_t_over_T(
    tmp_path):
  T = [2.0, 2.0, 8.0, 8.0]
  seqs = [np.array([1, 2, 3, 1, 2, 3, 1, 2]), np.array([3, 1, 2, 3, 1, 2])]
  run = _free_input_run(T, {"test": seqs})
  heat = ts.forget_heatmap(run, "test", group=2)
  g = np.asarray(heat["layers"][0]["gates"])
  assert g.shape == (2, 8)
  np.testing.assert_allclose(g[0], np.exp(-1 / 2), rtol=1e-6)
  np.testing.assert_allclose(g[1], np.exp(-1 / 8), rtol=1e-6)
  np.testing.assert_allclose(heat["layers"][0]["assigned"], [2.0, 8.0])
  ab = ts.word_ablation(run, "test", position=1, group_size=2)
  layer = ab["layers"][0]
  assert ab["sequences"] == 2
  tau = np.arange(7)
  groups = {round(g["mean_timescale"]): g["curve"] for g in layer["groups"]}
  np.testing.assert_allclose(groups[2]["mean"], np.exp(-tau / 2.0),
                             rtol=1e-4)      # Mahto eq. 1: e^{-t/T}
  np.testing.assert_allclose(groups[8]["mean"], np.exp(-tau / 8.0),
                             rtol=1e-4)
  assert groups[2]["sequences"].tolist() == [2, 2, 2, 2, 2, 1, 1]
  assert ts.plot_forget_heatmap(heat, str(tmp_path / "h.png"))
  assert (tmp_path / "h.png").stat().st_size > 0
  assert ts.plot_ablation(ab, str(tmp_path / "a.png"))
  assert (tmp_path / "a.png").stat().st_size > 0


def test_decay_curve_normalises_per_sequence_and_skips_zero_starts():
  delta = np.zeros((3, 3, 2))
  delta[0, :, 0] = [2.0, 1.0, 0.5]
  delta[1, :, 1] = [4.0, 4.0, 0.0]
  valid = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 1]], bool)   # seq 2: zero
  out = ts.decay_curve(delta, valid)
  np.testing.assert_allclose(out["mean"], [1.0, 0.75, 0.25])
  assert out["sequences"].tolist() == [2, 2, 1] and out["skipped"] == 1


def test_models_without_forget_gates_are_an_error():
  task = _Task(_model([cells.make("mrnn", hidden_size=4,
                                  intermediate_size=3)]),
               splits={"test": [np.array([1, 2])]})
  run = _run(task, task.init_params(jax.random.key(0)))
  for fn in (ts.estimate, ts.forget_heatmap, ts.word_ablation):
    with pytest.raises(AnalysisError, match=r"needs a layer of lstm or "
                       r"mts_lstm for its forget gates; this model's cells "
                       r"are \['mrnn'\]"):
      fn(run, "test")
  run = _free_input_run([2.0], {"test": [np.array([1, 2])]})
  with pytest.raises(AnalysisError, match="unknown split 'dev'"):
    ts.estimate(run, "dev")


def test_correlation_leaves_out_non_positive_timescales():
  """A unit whose f_bar is 0 has T_est = 0 (eq. 3), and log10 0 = -inf:
  like an infinite T it is left out, not fed to the fits."""
  assert ts.timescale_from_forget(0.0) == 0.0
  out = ts.correlation([1.0, 10.0, 100.0, 7.0], [2.0, 20.0, 200.0, 0.0])
  assert out["units"] == 3
  assert out["pearson_log10"] == pytest.approx(1.0)
  assert out["spearman"] == pytest.approx(1.0)
  out = ts.correlation([0.0, 1.0, 10.0], [5.0, 3.0, 30.0])
  assert out["units"] == 2 and out["pearson_log10"] == pytest.approx(1.0)


def test_narrow_gaussian_ks_uses_sigma_as_the_standard_deviation():
  """One point one sigma above mu: the model's CDF there is Phi(1), so
  KS = Phi(1) (the empirical CDF jumps 0 -> 1)."""
  phi1 = 0.5 * (1.0 + math.erf(1.0 / math.sqrt(2.0)))         # 0.8413
  out = ts.ks_fit([2.1], alphas=(1.0,), mus=(2.0,))
  assert out["narrow_gaussian"]["sigma"] == 0.1
  assert out["narrow_gaussian"]["ks"][0] == pytest.approx(phi1)
  out = ts.ks_fit([2.5], alphas=(1.0,), mus=(2.0,), sigma=1.0)
  phi_half = 0.5 * (1.0 + math.erf(0.5 / math.sqrt(2.0)))
  assert out["narrow_gaussian"]["ks"][0] == pytest.approx(phi_half)


def test_forget_heatmap_groups_ten_units_from_100_units():
  """Default group: 10 units at H >= 100 ("1 below 100 units")."""
  T = list(np.repeat(np.geomspace(2.0, 50.0, 10), 10))      # 100 units
  run = _free_input_run(T, {"test": [np.array([1, 2, 3])]})
  heat = ts.forget_heatmap(run, "test")
  layer = heat["layers"][0]
  assert layer["group"] == 10
  g = np.asarray(layer["gates"])
  assert g.shape == (10, 3)
  want = np.exp(-1 / np.geomspace(2.0, 50.0, 10))           # sorted by f
  np.testing.assert_allclose(g, np.repeat(want[:, None], 3, 1), rtol=1e-5)


def test_word_ablation_of_an_lstm_groups_units_by_t_est_over_valid_steps():
  """An lstm (no assigned timescales) groups its units by T_est, f_bar
  averaged over the valid steps only: with the forget gate's input and h
  weights zero, f_t = sigma(b_f + forget_bias) = e^{-1/T} at every step,
  and the groups' timescales are exactly T however much padding there is;
  the decay is e^{-t/T} as for mts_lstm."""
  T = np.array([8.0, 2.0, 8.0, 2.0])
  H, E, fb = 4, 3, 1.0
  cell = cells.make("lstm", hidden_size=H, forget_bias=fb)
  seqs = [np.array([1, 2, 3, 1, 2, 3, 1, 2]), np.array([3, 1, 2])]
  task = _Task(_model([cell], V=4, E=E), splits={"test": seqs})
  params = task.init_params(jax.random.key(1))
  W_x = np.zeros((E, 4 * H), np.float32)
  W_x[:, 2 * H:3 * H] = np.random.default_rng(0).normal(size=(E, H))
  b = np.zeros(4 * H, np.float32)
  b[H:2 * H] = mts_lstm.forget_bias(T) - fb
  params["layer_0"] = {"W_x": jnp.asarray(W_x), "W_h": jnp.zeros((H, 4 * H)),
                       "b": jnp.asarray(b)}
  ab = ts.word_ablation(_run(task, params), "test", position=1, group_size=2)
  layer = ab["layers"][0]
  assert layer["group_by"] == "T_est"
  groups = layer["groups"]
  assert [sorted(g["units"].tolist()) for g in groups] == [[1, 3], [0, 2]]
  assert [g["mean_timescale"] for g in groups] == [pytest.approx(2.0, 1e-4),
                                                   pytest.approx(8.0, 1e-4)]
  np.testing.assert_allclose(groups[1]["curve"]["mean"],
                             np.exp(-np.arange(7) / 8.0), rtol=1e-4)


def test_word_ablation_skips_batches_that_end_before_the_position():
  """Batches of short sequences (a documents bucket of short lines) do not
  reach the ablated position: they are skipped, not an error, and the
  curve comes from the sequences that do; a position beyond every
  sequence is an error naming the longest."""
  T = [2.0, 8.0]
  short = [np.array([1, 2, 3, 1, 2])] * 3      # one batch of 3, 16 steps
  seqs = short + [np.tile([1, 2, 3], 9)[:25]]  # then one of 32 steps
  run = _free_input_run(T, {"test": seqs})
  ab = ts.word_ablation(run, "test", position=17, group_size=1)
  assert ab["sequences"] == 1
  groups = {round(g["mean_timescale"]): g["curve"]
            for g in ab["layers"][0]["groups"]}
  np.testing.assert_allclose(groups[8]["mean"], np.exp(-np.arange(8) / 8.0),
                             rtol=1e-4)
  assert groups[8]["sequences"].tolist() == [1] * 8
  with pytest.raises(ValueError, match=r"word_ablation: position 25 is "
                     r"beyond every sequence read of split 'test' \(the "
                     r"longest has 25 steps\)"):
    ts.word_ablation(run, "test", position=25)
