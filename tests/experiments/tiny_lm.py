"""A seconds-long PTB-word LM config for the training tests (needs the
PTB files: ../shared/data or $SORJAX_DATA_DIR)."""

from experiments.configs import common


def get_config():
  c = common.config(
      "lm", common.lm_data(corpus="ptb", batch_size=8, bptt=12,
                           variable_bptt=True, pad_to=20, eval_batch_size=4,
                           eval_bptt=20, max_train_tokens=4000,
                           max_eval_tokens=800),
      cell="lstm", hidden_size=16, embed_size=16, tie_embedding=True)
  c.optim.learning_rate = 3e-3
  c.train.num_epochs = 2
  c.train.log_every = 10
  c.train.checkpoint_every = 20
  c.train.tensorboard = False
  return c
