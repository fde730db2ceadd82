import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sorjax.training import optim


def quadratic_steps(cfg, n=3, grad=1.0):
  tx = optim.make_optimizer(cfg)
  params = {"w": jnp.zeros(2)}
  state = tx.init(params)
  traj = []
  for _ in range(n):
    updates, state = tx.update({"w": jnp.full(2, grad)}, state, params)
    params = optax.apply_updates(params, updates)
    traj.append(float(params["w"][0]))
  return traj, state, tx


def test_sgd_and_scales():
  traj, state, tx = quadratic_steps({"name": "sgd", "learning_rate": 0.1})
  np.testing.assert_allclose(traj, [-0.1, -0.2, -0.3], rtol=1e-6)
  state = optim.set_hyperparam(state, "plateau_scale", 0.5)
  state = optim.set_hyperparam(state, "step_scale", 0.5)
  updates, _ = tx.update({"w": jnp.ones(2)}, state, {"w": jnp.zeros(2)})
  np.testing.assert_allclose(updates["w"], -0.025, rtol=1e-6)
  with pytest.raises(KeyError, match="no hyperparameter 'lr'"):
    optim.set_hyperparam(state, "lr", 1.0)


def test_clipping_and_adam_first_step():
  traj, _, _ = quadratic_steps({"name": "sgd", "learning_rate": 1.0,
                                "clip_norm": 1.0}, n=1, grad=3.0)
  np.testing.assert_allclose(traj, [-1 / np.sqrt(2)], rtol=1e-6)
  traj, _, _ = quadratic_steps({"name": "adam", "learning_rate": 1e-3}, n=1)
  np.testing.assert_allclose(traj, [-1e-3], rtol=1e-4)   # adam's first step = lr
  traj, _, _ = quadratic_steps({"name": "adagrad", "learning_rate": 0.05,
                                "initial_accumulator": 0.0}, n=1)
  np.testing.assert_allclose(traj, [-0.05], rtol=1e-3)


def run_steps(cfg, w0, grads):
  """w after each update from w0 with the given gradients (floats)."""
  tx = optim.make_optimizer(cfg)
  params = {"w": jnp.array([w0], jnp.float32)}
  state = tx.init(params)
  out = []
  for g in grads:
    updates, state = tx.update({"w": jnp.array([g], jnp.float32)}, state,
                               params)
    params = optax.apply_updates(params, updates)
    out.append(float(params["w"][0]))
  return out


def test_weight_decay_adds_wd_times_w_to_the_gradient():
  # L2 as the configs mean it: g + wd * w, so w shrinks with no gradient
  got = run_steps({"name": "sgd", "learning_rate": 1.0, "weight_decay": 0.1},
                  1.0, [0.0, 0.0])
  np.testing.assert_allclose(got, [0.9, 0.81], rtol=1e-6)


def test_adam_follows_its_equations_with_the_given_b1_b2_eps():
  """Kingma & Ba's Algorithm 1 in NumPy; b1 and b2 far from their defaults
  and gradients that vary, so swapping them or ignoring one shows."""
  lr, b1, b2, eps = 0.1, 0.5, 0.9, 1e-3
  grads = [1.0, -3.0, 0.5, 2.0]
  w, m, v, want = 0.0, 0.0, 0.0, []
  for t, g in enumerate(grads, 1):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    w -= lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    want.append(w)
  got = run_steps({"name": "adam", "learning_rate": lr, "b1": b1, "b2": b2,
                   "eps": eps}, 0.0, grads)
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_schedules_with_warmup_and_floors():
  """Hand-computed values: the exponential decay starts after the warmup,
  cosine decays to alpha * lr, warmup_cosine's total counts the warmup."""
  e = optim.learning_rate_schedule({"learning_rate": 1.0,
                                    "schedule": "exponential",
                                    "warmup_steps": 3, "decay_steps": 1,
                                    "decay_rate": 0.5})
  np.testing.assert_allclose([float(e(i)) for i in (0, 3, 4, 6)],
                             [1, 1, 0.5, 0.125])
  c = optim.learning_rate_schedule({"learning_rate": 2.0, "schedule": "cosine",
                                    "total_steps": 10, "alpha": 0.1})
  # lr ((1 - alpha) (1 + cos(pi t / T)) / 2 + alpha)
  np.testing.assert_allclose([float(c(i)) for i in (0, 5, 10)],
                             [2.0, 1.1, 0.2], rtol=1e-6)
  wc = optim.learning_rate_schedule({"learning_rate": 1.0,
                                     "schedule": "warmup_cosine",
                                     "warmup_steps": 2, "total_steps": 10,
                                     "end_value": 0.0})
  np.testing.assert_allclose([float(wc(i)) for i in (0, 1, 2, 6, 10)],
                             [0, 0.5, 1, 0.5, 0], atol=1e-6)


def test_schedules():
  s = optim.learning_rate_schedule({"learning_rate": 1.0,
                                    "schedule": "warmup_constant",
                                    "warmup_steps": 4})
  np.testing.assert_allclose([float(s(i)) for i in (0, 2, 4, 10)],
                             [0.0, 0.5, 1.0, 1.0])
  # no warmup: the full rate from step 0 (step 0 ran at 0; QA, session 41)
  s0 = optim.learning_rate_schedule({"learning_rate": 1.0,
                                     "schedule": "warmup_constant",
                                     "warmup_steps": 0})
  np.testing.assert_allclose([float(s0(i)) for i in (0, 1, 5)], [1, 1, 1])
  # exponential holds the full rate over warmup_steps (no ramp)
  h = optim.learning_rate_schedule({"learning_rate": 1.0,
                                    "schedule": "exponential",
                                    "warmup_steps": 1, "decay_steps": 2,
                                    "decay_rate": 0.5})
  np.testing.assert_allclose([float(h(i)) for i in range(6)],
                             [1, 1, 1, 0.5, 0.5, 0.25])
  e = optim.learning_rate_schedule({"learning_rate": 1.0,
                                    "schedule": "exponential",
                                    "decay_steps": 2, "decay_rate": 0.5})
  np.testing.assert_allclose([float(e(i)) for i in (0, 1, 2, 4)],
                             [1, 1, 0.5, 0.25])
  c = optim.learning_rate_schedule({"learning_rate": 1.0, "schedule": "cosine",
                                    "total_steps": 10})
  assert float(c(5)) == pytest.approx(0.5)
  with pytest.raises(ValueError, match="total_steps"):
    optim.learning_rate_schedule({"learning_rate": 1.0, "schedule": "cosine"})
  with pytest.raises(ValueError, match="optim.schedule"):
    optim.learning_rate_schedule({"learning_rate": 1.0, "schedule": "step"})
  with pytest.raises(ValueError, match="optim.name"):
    optim.make_optimizer({"name": "rmsprop", "learning_rate": 1.0})


def test_nt_asgd_contains_averaging():
  from sorjax.training import asgd
  _, state, _ = quadratic_steps({"name": "nt_asgd", "learning_rate": 0.1})
  state = asgd.start_averaging(state)
  assert asgd.averaging_active(state)


def test_plateau_uses_pytorch_patience():
  p = optim.Plateau(factor=0.5, patience=2)
  st = p.init()
  scales = []
  for v in [3.0, 2.0, 2.5, 2.5, 2.5, 2.5]:
    st = p.update(st, v)
    scales.append(float(st.scale))
  # PyTorch: reduce when bad epochs > 2, i.e. on the third bad evaluation.
  assert scales == [1.0, 1.0, 1.0, 1.0, 0.5, 0.5]
  with pytest.raises(ValueError, match="non-negative loss"):
    p.update(st, -1.0)


def test_early_stopping():
  es = optim.EarlyStopping(patience=2)
  out = [es.update(v) for v in [3.0, 2.0, 2.5, 1.0, 1.5, 1.2]]
  assert out == [(True, False), (True, False), (False, False), (True, False),
                 (False, False), (False, True)]
  es2 = optim.EarlyStopping(patience=2)
  es2.load_state_dict(es.state_dict())
  assert es2.best == 1.0 and es2.bad == 2
  # a tie is no improvement, nor is a gain of min_delta or less
  es = optim.EarlyStopping(patience=3, min_delta=0.1)
  out = [es.update(v)[0] for v in [2.0, 2.0, 1.9, 1.85, 1.76]]
  assert out == [True, False, False, True, False]


def test_early_stopping_on_a_metric_to_maximise():
  es = optim.EarlyStopping(patience=2, mode="max")
  out = [es.update(v) for v in [0.1, 0.4, 0.3, 0.6, 0.6, 0.5]]
  assert out == [(True, False), (True, False), (False, False), (True, False),
                 (False, False), (False, True)]
  assert es.best == 0.6
  es = optim.EarlyStopping(patience=3, min_delta=0.1, mode="max")
  out = [es.update(v)[0] for v in [0.5, 0.55, 0.58, 0.71]]
  assert out == [True, False, False, True]   # gains of <= 0.1 do not count
  es2 = optim.EarlyStopping(patience=3, mode="max")   # a fresh one: -inf
  assert es2.update(-5.0) == (True, False)


@pytest.mark.parametrize("metric,mode,msg", [
    ("", "min", "selection.metric must be the name"),
    (None, "min", "selection.metric must be the name"),
    ("accuracy", "maximise", "selection.mode must be 'min' or 'max'"),
    ("loss", None, "selection.mode must be 'min' or 'max'")])
def test_selection_fields_are_checked(metric, mode, msg):
  with pytest.raises(ValueError, match=msg):
    optim.check_selection(metric, mode)


@pytest.mark.parametrize("field,value,msg", [
    ("learning_rate", -1.0, "optim.learning_rate must be a finite number > 0"),
    ("learning_rate", 0.0, "optim.learning_rate must be a finite number > 0"),
    ("learning_rate", float("nan"), "optim.learning_rate must be a finite number"),
    ("learning_rate", "1e-3", "optim.learning_rate must be a finite number"),
    ("clip_norm", -1.0, r"optim.clip_norm must be None or a finite number > 0, "
                        r"got -1.0"),
    ("clip_norm", 0.0, "optim.clip_norm must be None or a finite number > 0"),
    ("b1", 1.5, r"optim.b1 must be None or a finite number in \[0, 1\)"),
    ("b2", 1.0, r"optim.b2 must be None or a finite number in \[0, 1\)"),
    ("eps", -1.0, "optim.eps must be None or a finite number > 0"),
    ("eps", 0.0, "optim.eps must be None or a finite number > 0"),
    ("weight_decay", -0.1, "optim.weight_decay must be None or a finite number >= 0"),
    ("initial_accumulator", -1.0, "optim.initial_accumulator must be"),
    ("warmup_steps", -1, "optim.warmup_steps must be None or an int >= 0"),
    ("warmup_steps", 1.5, "optim.warmup_steps must be None or an int >= 0"),
    ("decay_steps", 0, "optim.decay_steps must be None or an int >= 1"),
    ("decay_rate", 0.0, "optim.decay_rate must be None or a finite number > 0"),
    ("total_steps", 0, "optim.total_steps must be None or an int >= 1"),
    ("end_value", -1.0, "optim.end_value must be None or a finite number >= 0"),
    ("staircase", "no", "optim.staircase must be a bool"),
])
def test_optim_fields_are_range_checked(field, value, msg):
  with pytest.raises(ValueError, match=msg):
    optim.make_optimizer({"name": "adam", "learning_rate": 1e-3,
                          field: value})


def test_momentum_is_checked_and_read_by_sgd_only():
  with pytest.raises(ValueError, match=r"optim.momentum must be None or a "
                                       r"finite number in \[0, 1\)"):
    optim.make_optimizer({"name": "sgd", "learning_rate": 1.0,
                          "momentum": 1.0})
  with pytest.raises(ValueError, match="optim.momentum=0.9 is read by the "
                     "optimizers sgd, nt_asgd only, not 'adam'"):
    optim.make_optimizer({"name": "adam", "learning_rate": 1.0,
                          "momentum": 0.9})
  optim.make_optimizer({"name": "sgd", "learning_rate": 1.0, "momentum": 0.9})


@pytest.mark.parametrize("cfg, msg", [
    ({"name": "adam", "initial_accumulator": 0.5},
     r"optim.initial_accumulator=0.5 is read by the optimizers adagrad only, "
     r"not 'adam': leave it at 0.1"),
    ({"name": "adagrad", "b1": 0.5}, r"optim.b1=0.5 is read by the "
                                     r"optimizers adam only, not 'adagrad'"),
    ({"name": "adagrad", "eps": 0.1}, r"optim.eps=0.1 is read by the "
                                      r"optimizers adam only"),
    ({"name": "adam", "warmup_steps": 100}, r"optim.warmup_steps=100 is "
     r"read by the schedules warmup_constant, exponential, warmup_cosine "
     r"only, not 'constant': leave it at 0"),
    ({"name": "adam", "total_steps": 10}, r"optim.total_steps=10 is read "
                                          r"by the schedules cosine"),
    ({"name": "adam", "decay_rate": 0.1}, r"optim.decay_rate=0.1 is read "
                                          r"by the schedules exponential"),
])
def test_fields_the_optimizer_or_schedule_does_not_read_are_refused(cfg,
                                                                   msg):
  """Set away from base_config's default, they would change nothing."""
  with pytest.raises(ValueError, match=msg):
    optim.make_optimizer({"learning_rate": 1e-3, **cfg})
  # at their defaults they are fine (every config carries them)
  optim.make_optimizer({"learning_rate": 1e-3, "name": "adam", "b1": 0.9,
                        "initial_accumulator": 0.1, "warmup_steps": 0,
                        "decay_steps": 1, "decay_rate": 0.5})


def test_cosine_decays_to_end_value():
  c = optim.learning_rate_schedule({"learning_rate": 2.0, "schedule": "cosine",
                                    "total_steps": 10, "end_value": 0.2})
  np.testing.assert_allclose([float(c(i)) for i in (0, 5, 10)],
                             [2.0, 1.1, 0.2], rtol=1e-6)
  with pytest.raises(ValueError, match="optim.end_value=3.0 exceeds"):
    optim.learning_rate_schedule({"learning_rate": 2.0, "schedule": "cosine",
                                  "total_steps": 10, "end_value": 3.0})


def test_warmup_cosine_total_must_exceed_warmup():
  with pytest.raises(ValueError, match="optim.total_steps=5 must exceed "
                                       "optim.warmup_steps=5"):
    optim.learning_rate_schedule({"learning_rate": 1.0,
                                  "schedule": "warmup_cosine",
                                  "warmup_steps": 5, "total_steps": 5})


def test_plateau_and_early_stopping_name_their_fields():
  for factor in (0.0, 1.0, 1.5):
    with pytest.raises(ValueError, match=r"plateau.factor must be a finite number "
                                         r"in \(0, 1\)"):
      optim.Plateau(factor=factor)
  for patience in (-1, 1.5):
    with pytest.raises(ValueError, match="plateau.patience must be an int"):
      optim.Plateau(patience=patience)
  optim.Plateau(patience=0)   # PyTorch: reduce on the first bad evaluation
  for patience in (0, -1, 2.0):
    with pytest.raises(ValueError,
                       match="early_stopping.patience must be an int >= 1"):
      optim.EarlyStopping(patience)
