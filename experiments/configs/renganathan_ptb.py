"""Renganathan & Singh, sec. 5 (Tables 1-2): character- and word-level PTB
language models at equal parameter budgets, first-order baselines next to
the second-order mRNN, mLSTM and their multi-matrix mmRNN and mmLSTM.

    python -m experiments.main \\
        --config=experiments/configs/renganathan_ptb.py:char,mm_lstm,2 \\
        --workdir=DIR

Config string `<level>,<cell>[,<layers>][,cut=<N>]`:
  level   char  PTB characters (Mikolov's; corpus ptb_char), 4.5M
                parameters, embeddings 128, BPC
          word  PTB words (corpus ptb), 2M parameters, embeddings 64
  cell    rnn, lstm, mrnn, mlstm, mm_rnn or mm_lstm
  layers  1 (default) or 2
  cut=N   sec. 6.1 / Table 3: training lines cut to their first N symbols
          (the paper: 25, 50, 75 characters, spaces included; each partial
          line keeps its end-of-line token); valid and test stay whole
          (data.train_sentence_cutoff)
Table 1 runs char: rnn 1-2, lstm 1-2, mrnn 1, mlstm 1, mm_rnn 1-2,
mm_lstm 1-2; word: rnn 1, lstm 1-2, mm_rnn 1, mm_lstm 1-2.

Sec. 5.3: Adam at 1e-3, gradients clipped to 3.5, at most 200 epochs with
early stopping (patience 5), batch 128, dropout 0.25 on the hidden state
before the softmax (output_dropout). The hidden size is solved for the
whole-model budget (model.budget), with h = m for mrnn and mlstm (Table 1).
The mmLSTM has 4 choice matrices for every gate: Table 1's sizes (512,
345; 112, 97) meet the budgets only so (eq. 14's 2 for the forget gate
would give 588, 390; 116, 102). BPTT windows (not given) are ours: 100
characters, 35 words. Differences and gaps: docs/EXPERIMENTS.md.
"""

from experiments.configs import _options, common

LEVELS = {  # corpus, budget, embed_size, bptt
    "char": ("ptb_char", 4_500_000, 128, 100),
    "word": ("ptb", 2_000_000, 64, 35),
}
CELLS = ("rnn", "lstm", "mrnn", "mlstm", "mm_rnn", "mm_lstm")
MM_LSTM_MATRICES = (4, 4, 4, 4)   # gates c, i, f, o (see the docstring)


def get_config(config_string: str = "char,lstm"):
  o = _options.Options("renganathan_ptb", config_string,
                       "<char|word>,<cell>[,<1|2>][,cut=<N>]")
  level = o.choice("level", tuple(LEVELS))
  cell = o.choice("cell", CELLS)
  layers = int(o.choice("layers", ("1", "2"), default="1"))
  cut = o.keyed_number("cut", "the training sentence cutoff")
  o.done()
  corpus, budget, embed_size, bptt = LEVELS[level]
  c = common.config(
      "lm",
      common.lm_data(corpus=corpus, batch_size=128, bptt=bptt,
                     eval_batch_size=10, eval_bptt=bptt),
      cell=cell, num_layers=layers, budget=budget, embed_size=embed_size,
      output_dropout=0.25,
      intermediate_ratio=1.0 if cell in ("mrnn", "mlstm") else None,
      num_matrices=MM_LSTM_MATRICES if cell == "mm_lstm" else None)
  c.data.train_sentence_cutoff = cut
  c.optim.name = "adam"
  c.optim.learning_rate = 1e-3
  c.optim.clip_norm = 3.5
  c.early_stopping.patience = 5
  c.train.num_epochs = 200
  c.train.log_every = 100
  c.train.checkpoint_every = 1000
  return _options.overridable(c)
