"""A seconds-long Dyck-(2,3) config for the training tests."""

from experiments.configs import common


def get_config():
  c = common.config(
      "dyck_lm",
      common.dyck_data(k=2, m=3, num_train=240, num_dev=40, num_test=40,
                       max_length=16, batch_size=16, eval_batch_size=40,
                       num_buckets=2),
      cell="mrnn", hidden_size=12, intermediate_size=12, embed_size=8)
  c.optim.learning_rate = 1e-2
  c.train.num_epochs = 3
  c.train.log_every = 5
  c.train.checkpoint_every = 5
  c.train.tensorboard = False
  return c
