"""Demo: a second-order model (mRNN) learning Dyck-(2,4) next tokens.

About 20 s on 2 CPU cores; leaves checkpoints, metrics and a figure
(the LDPA-vs-distance curve) in the work directory.

    python -m experiments.main --config=experiments/configs/demo.py \\
        --workdir=/tmp/sorjax_demo
"""

from experiments.configs import _options, common


def get_config():
  c = common.config(
      "dyck_lm",
      common.dyck_data(k=2, m=4, num_train=2000, num_dev=400, num_test=400,
                       max_length=40, batch_size=32),
      cell="mrnn", hidden_size=48, intermediate_size=48, embed_size=16)
  c.optim.name = "adam"
  c.optim.learning_rate = 1e-2
  c.optim.clip_norm = 5.0
  c.train.num_epochs = 6
  c.train.log_every = 20
  c.train.checkpoint_every = 100
  c.figures = ("ldpa",)
  return _options.overridable(c)
