"""AWD-LSTM's activation regularisation (AR) and temporal activation
regularisation (TAR) in the LM task, against hand-computed values."""

import jax.numpy as jnp
import numpy as np
import pytest

from sorjax.training.tasks.common import ConfigError, activation_regs, \
    model_config, trunk_kwargs
from sorjax.training.tasks.lm import activation_penalties


def test_penalties_by_hand():
  # B = 2, T = 3, H = 2; example 1 has length 2 (its step 2 is padding).
  raw = np.array([[[1., 0.], [3., 2.], [3., 4.]],
                  [[0., 2.], [2., 2.], [9., 9.]]], np.float32)
  dropped = 2.0 * raw
  dropped[0, 1] = 0.0           # a dropped unit pair
  mask = jnp.asarray([[True, True, True], [True, True, False]])
  sown = {"last_outputs": (jnp.asarray(raw),),
          "last_outputs_dropped": (jnp.asarray(dropped),)}
  ar, tar = activation_penalties(sown, mask)
  # AR: mean over the 5 valid tokens of mean_h(dropped^2).
  per_token = [(4 + 0) / 2, 0.0, (36 + 64) / 2, (0 + 16) / 2, (16 + 16) / 2]
  np.testing.assert_allclose(ar, np.mean(per_token), rtol=1e-6)
  # TAR: pairs (t-1, t) with t valid: ex 0 t=1,2; ex 1 t=1.
  pairs = [((3 - 1) ** 2 + 2 ** 2) / 2, (0 + 2 ** 2) / 2,
           (2 ** 2 + 0) / 2]
  np.testing.assert_allclose(tar, np.mean(pairs), rtol=1e-6)


def test_one_step_windows_have_no_temporal_term():
  x = jnp.ones((2, 1, 3))
  sown = {"last_outputs": (x,), "last_outputs_dropped": (x,)}
  ar, tar = activation_penalties(sown, jnp.ones((2, 1), bool))
  assert float(ar) == 1.0 and float(tar) == 0.0


def test_only_the_lm_task_reads_them():
  m = model_config(activation_reg=2.0, temporal_activation_reg=1.0)
  assert activation_regs(m) == (2.0, 1.0)
  trunk_kwargs(m, activation_reg=True)
  with pytest.raises(ConfigError, match="read by the lm task only"):
    trunk_kwargs(m)             # e.g. a Dyck task
  m.temporal_activation_reg = -1.0
  with pytest.raises(ConfigError,
                     match="model.temporal_activation_reg must be a finite number"):
    activation_regs(m)
  # An older config.json without the fields: no regularisation.
  old = model_config()
  del old["activation_reg"], old["temporal_activation_reg"]
  assert activation_regs(old) == (0.0, 0.0)


def test_embedding_init_reaches_the_trunk_of_a_learned_table():
  m = model_config(cell="lstm", hidden_size=4, embedding_init="uniform_0.1")
  assert trunk_kwargs(m)["embed_init"] == "uniform_0.1"
  assert "embed_init" not in trunk_kwargs(model_config(cell="lstm",
                                                       hidden_size=4))
  with pytest.raises(ConfigError, match=r"model.embedding_init must be None "
                     r"or one of \('normal', 'uniform_0.1'\) for the token "
                     r"models .* got 'le_zuidema'"):
    trunk_kwargs(model_config(cell="lstm", hidden_size=4,
                              embedding_init="le_zuidema"))
  with pytest.raises(ConfigError, match="initialises a learned table; "
                     "model.embedding is 'one_hot'"):
    trunk_kwargs(model_config(cell="lstm", hidden_size=4,
                              embedding="one_hot",
                              embedding_init="uniform_0.1"))


@pytest.mark.parametrize("field", ["tie_embedding", "tie_projection"])
def test_output_layer_ties_are_refused_outside_the_lm_task(field):
  from sorjax.training.tasks import make_task
  from tests.experiments import tiny_dyck
  cfg = tiny_dyck.get_config()
  cfg.model[field] = True
  with pytest.raises(ConfigError, match=f"model.{field}=True is read by the "
                     "lm task only .* the dyck_lm task's model does not"):
    make_task(cfg)
