"""Lin, Benditshtull & Spinner, sec. 4: word-level LMs on WikiText-2
(Table 2: the baseline LSTM, and the attention LSTM with 2 and 5 cells).

    python -m experiments.main \\
        --config=experiments/configs/lin_wikitext2.py:attention,5 \\
        --workdir=DIR

Config string `lstm` or `attention,<S>` (S cells; the paper trains 2 and 5).

Sec. 4.1 and 4.3: the corpus is one continuous stream, cut into batches of
64 streams whose hidden state carries over from batch to batch, BPTT 70;
embeddings 300, hidden 600; dropout 0.5 on the input and on the output;
Adam at 1e-4, the learning rate halved after 3 epochs without improvement,
early stopping after 6; for the attention LSTM tau = 1, times 0.9 per
epoch, and low (0.01) for evaluation. Table 2's parameter counts (2.2M,
4.4M, 11M) are those of the recurrent layer alone.
"""

from experiments.configs import _options, common


def get_config(config_string: str = "lstm"):
  o = _options.Options("lin_wikitext2", config_string, "lstm | attention,<S>")
  model = o.choice("model", ("lstm", "attention"))
  cells = o.number("number of cells S", cast=int) if model == "attention" \
      else None
  o.done()
  c = common.config(
      "lm",
      common.lm_data(corpus="wikitext2", batch_size=64, bptt=70,
                     eval_batch_size=10, eval_bptt=70),
      cell="attention_lstm" if cells else "lstm", num_cells=cells,
      hidden_size=600, embed_size=300, input_dropout=0.5, output_dropout=0.5)
  common.lin_training(c, temperature=bool(cells))
  return _options.overridable(c)
