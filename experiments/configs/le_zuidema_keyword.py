"""Le & Zuidema, sec. 3: the keyword classification task over random binary
trees, recursive RNN vs recursive LSTM (Figures 3-4).

    python -m experiments.main \\
        --config=experiments/configs/le_zuidema_keyword.py:tree_lstm,depth,8 \\
        --workdir=DIR

Config string `<cell>,<experiment>,<i>`:
  cell        tree_rnn (the RNN, sec. 2) or tree_lstm (the RLSTM)
  experiment  length  Experiment 1 (3.1): dataset i has sentences of
                      10i-9..10i tokens, i = 1..10
              depth   Experiment 2 (3.2): 21..30 tokens, keyword at depth
                      i or i+1
  i           the dataset index (each 10k/1k/1k trees)
Experiment 3 (3.3) analyses Experiment 1's dataset 3 (`tree_rnn,length,3`
and `tree_lstm,length,3`).

Sec. 3: vectors and memories of dimension 50, tanh (the tree cells'
default), word vectors drawn from U(-0.0001, 0.0001), AdaGrad at 0.05,
mini-batches of 20 for the RNN and 5 for the RLSTM, early stopping after 5
epochs without improvement of the accuracy on the development set, which
also picks the best checkpoint (selection.metric = "accuracy", mode
"max"); each model is run 5 times per dataset (num_replicas = 5: five
seeds in one program).
"""

from experiments.configs import _options, common

BATCH = {"tree_rnn": 20, "tree_lstm": 5}


def get_config(config_string: str = "tree_lstm,length,1"):
  o = _options.Options("le_zuidema_keyword", config_string,
                       "<tree_rnn|tree_lstm>,<length|depth>,<i>")
  cell = o.choice("cell", tuple(BATCH))
  experiment = o.choice("experiment", ("length", "depth"))
  index = o.number("dataset index i", cast=int)
  o.done()
  c = common.config(
      "trees",
      common.tree_data(dataset="keyword", experiment=experiment, index=index,
                       batch_size=BATCH[cell], eval_batch_size=100),
      cell=cell, hidden_size=50, embedding_init="le_zuidema")
  c.num_replicas = 5
  c.optim.name = "adagrad"
  c.optim.learning_rate = 0.05
  # AdaGrad as Duchi et al. define it (accumulator from 0): with optax's
  # default 0.1 the first steps on U(+-1e-4) word vectors are ~1e-5 and the
  # scaled runs never left loss ln 10 (docs/RESULTS.md, item 5).
  c.optim.initial_accumulator = 0.0
  c.early_stopping.patience = 5
  c.selection.metric, c.selection.mode = "accuracy", "max"   # sec. 3
  c.train.num_epochs = 100   # a cap: early stopping ends the run
  c.train.log_every = 100
  c.train.checkpoint_every = 2000
  return _options.overridable(c)
