"""Temperature schedule values and NT-ASGD against hand-computed cases."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sorjax.training import asgd
from sorjax.training.schedules import TemperatureSchedule


def test_lin_et_al_temperature_per_epoch():
  s = TemperatureSchedule(init=1.0, decay=0.9, per="epoch", floor=0.05,
                          eval_value=0.01)
  vals = [float(s(step=123, epoch=e)) for e in range(4)]
  np.testing.assert_allclose(vals, [1.0, 0.9, 0.81, 0.729], rtol=1e-6)
  assert float(s(step=0, epoch=100)) == pytest.approx(0.05)   # floor
  assert float(s.evaluation(step=0, epoch=2)) == pytest.approx(0.01)
  per_step = TemperatureSchedule(init=2.0, decay=0.5, per="step")
  assert float(per_step(step=3, epoch=0)) == pytest.approx(0.25)
  assert float(per_step.evaluation(3, 0)) == pytest.approx(0.25)
  assert float(jax.jit(s)(jnp.int32(5), jnp.int32(2))) == pytest.approx(0.81)


@pytest.mark.parametrize("kwargs,field", [
    (dict(init=0.0), "init"), (dict(decay=1.5), "decay"),
    (dict(per="batch"), "per"), (dict(floor=2.0), "floor"),
    (dict(eval_value=-1.0), "eval_value")])
def test_temperature_schedule_errors(kwargs, field):
  with pytest.raises(ValueError, match=f"temperature.{field}"):
    TemperatureSchedule(**kwargs)


def test_non_monotone_trigger_matches_awd_lstm_rule():
  trig = asgd.NonMonotoneTrigger(n=2)
  # val > min(losses[:-2]) only once more than 2 losses are recorded.
  fired = [trig.observe(v) for v in [5.0, 4.0, 3.0, 3.5, 2.0, 4.5]]
  # step 3 (3.5): losses=[5,4,3], min([5])=5 -> no; step 5 (4.5): min([5,4,3])=3 -> yes
  assert fired == [False, False, False, False, False, True]
  # AWD-LSTM's test is strict: a loss equal to that minimum does not fire
  trig = asgd.NonMonotoneTrigger(n=2)
  fired = [trig.observe(v) for v in [5.0, 4.0, 3.0, 3.5, 2.0, 3.0, 3.01]]
  assert fired == [False] * 6 + [True]


def test_iterate_averaging_is_the_mean_of_iterates_after_the_switch():
  params = {"w": jnp.array([1.0, -2.0])}
  opt = optax.chain(optax.sgd(0.5), asgd.iterate_averaging())
  state = opt.init(params)
  grads = [jnp.array([1.0, 0.0]), jnp.array([0.0, 2.0]),
           jnp.array([2.0, 2.0]), jnp.array([-1.0, 4.0])]
  iterates = []
  for k, g in enumerate(grads):
    if k == 2:
      state = asgd.start_averaging(state)
      assert asgd.averaging_active(state)
    updates, state = opt.update({"w": g}, state, params)
    params = optax.apply_updates(params, updates)
    iterates.append(np.asarray(params["w"]))
  # SGD itself is untouched by the averaging.
  np.testing.assert_allclose(params["w"], [1.0 - 0.5 * 2, -2.0 - 0.5 * 8])
  avg = asgd.averaged_params(state, params)
  np.testing.assert_allclose(avg["w"], np.mean(iterates[2:], 0), rtol=1e-6)


def test_averaged_params_before_switch_are_the_params():
  params = {"w": jnp.ones(3)}
  opt = optax.chain(optax.sgd(0.1), asgd.iterate_averaging())
  state = opt.init(params)
  assert not asgd.averaging_active(state)
  np.testing.assert_array_equal(asgd.averaged_params(state, params)["w"], 1.0)
  with pytest.raises(ValueError, match="one iterate_averaging state"):
    asgd.averaged_params(optax.sgd(0.1).init(params), params)
