"""Under NT-ASGD the loop evaluates (and picks best/ by) the average of the
iterates once averaging starts; sorjax.restore returned the raw iterate
(QA, session 41), so analyses described weights the metrics never saw."""

import jax
import numpy as np

import sorjax
from sorjax.training import asgd
from sorjax.training.checkpoint import Checkpointer
from sorjax.training.loop import Trainer
from sorjax.training.metrics import read_metrics
from sorjax.training.tasks import make_task
from tests.experiments import tiny_dyck


def test_restore_gives_the_averaged_weights_the_run_was_evaluated_with(
    tmp_path, monkeypatch):
  cfg = tiny_dyck.get_config()
  cfg.optim.name, cfg.optim.learning_rate = "nt_asgd", 0.5
  cfg.data.num_buckets = 1
  # averaging starts after the first epoch, whatever the losses
  monkeypatch.setattr(asgd.NonMonotoneTrigger, "observe",
                      lambda self, loss: True)
  task = make_task(cfg)
  Trainer(task, cfg, str(tmp_path)).run()
  run = sorjax.restore(str(tmp_path), step="latest")
  ck = Checkpointer(str(tmp_path), read_only=True)
  trainer = Trainer(task, cfg, str(tmp_path))
  _, state, _ = ck.restore(jax.eval_shape(trainer.init_state), "latest")
  ck.close()
  avg = asgd._find(jax.tree_util.tree_map(lambda a: a[0], state.opt_state))
  assert bool(avg.active) and int(avg.count) > 1
  for got, want in zip(jax.tree_util.tree_leaves(run.params),
                       jax.tree_util.tree_leaves(avg.average)):
    np.testing.assert_array_equal(got, want)
  assert not all(np.array_equal(a[0], b) for a, b in zip(   # raw != avg
      jax.tree_util.tree_leaves(state.params),
      jax.tree_util.tree_leaves(avg.average)))
  logged = [r for r in read_metrics(str(tmp_path), "dev")][-1]
  ours = task.evaluate(run.params, "dev", run.eval_temperature())["loss"]
  np.testing.assert_allclose(ours, logged["loss"], rtol=1e-5)
