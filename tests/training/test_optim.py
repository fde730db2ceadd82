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


def test_schedules():
  s = optim.learning_rate_schedule({"learning_rate": 1.0,
                                    "schedule": "warmup_constant",
                                    "warmup_steps": 4})
  np.testing.assert_allclose([float(s(i)) for i in (0, 2, 4, 10)],
                             [0.0, 0.5, 1.0, 1.0])
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
