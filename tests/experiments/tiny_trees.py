"""A seconds-long keyword-tree config (Le & Zuidema 3, lengths 1..10)."""

from experiments.configs import common


def get_config():
  c = common.config("trees", common.tree_data(dataset="keyword",
                                              experiment="length", index=1,
                                              scale=0.02, batch_size=20,
                                              eval_batch_size=20),
                    cell="tree_lstm", hidden_size=16)
  c.optim.name = "adagrad"
  c.optim.learning_rate = 0.05
  c.train.num_epochs = 2
  c.train.log_every = 5
  c.train.checkpoint_every = 50
  c.train.tensorboard = False
  return c
