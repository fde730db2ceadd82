"""Maupome & Meurs, sec. 4.1 (Table 1): ablation of the first-order terms
of the general second-order RNN on PTB characters,

    h_t = phi(A (B x_t * C h_{t-1}) + D x_t + E h_{t-1} + f)      # eq. 9

    python -m experiments.main \\
        --config=experiments/configs/maupome_ablation.py:D,identity \\
        --workdir=DIR

Config string `<terms>,<activation>`:
  terms       DE    both first-order terms D x_t and E h_{t-1}
              D     D x_t only (the mRNN, eq. 6)
              E     E h_{t-1} only
              none  neither (the second-order term and f alone)
              rnn     Table 1's first-order RNN (eq. 3)
              mi_rnn  Table 1's general MI-RNN (eq. 8)
  activation  tanh or identity (phi; Table 1 reports identity for the
              general2 rows only)

Sec. 4 and 4.1: PTB with every non-letter replaced by a space, spaces
squeezed, lower-cased (27 characters; corpus ptb_char_maupome), each line
a document, not trimmed (data.documents: whole lines from h_0, padded in
length buckets); 5-fold cross-validation over the lines, training on 90%
of the rest and validating on 10% (data.folds = 5; this config trains
data.fold = 0, `python -m experiments.crossval` all five and averages
them); one-hot characters in; 500k parameters per model with |m| = |h|
(sizes solved by model.budget); batches of 64; Adam; at most 25 epochs;
BPC. Where this differs from the paper: docs/EXPERIMENTS.md.
"""

from experiments.configs import _options, common

TERMS = {"DE": (True, True), "D": (True, False), "E": (False, True),
         "none": (False, False)}
REFERENCES = ("rnn", "mi_rnn")
ACTIVATIONS = ("tanh", "identity")
BUDGET = 500_000


def base(**model):
  """The shared setup of Maupome & Meurs' PTB-character experiments: each
  line a document (whole, from h_0), fold 0 of 5-fold cross-validation
  (`python -m experiments.crossval` runs the five)."""
  c = common.config(
      "lm",
      common.lm_data(corpus="ptb_char_maupome", batch_size=64, bptt=None,
                     eval_batch_size=64, eval_bptt=None, documents=True,
                     folds=5, fold=0, fold_valid_fraction=0.1),
      embedding="one_hot", budget=BUDGET, **model)
  c.optim.name = "adam"
  c.optim.learning_rate = 1e-3   # not given: Adam's default (Kingma & Ba)
  c.train.num_epochs = 25
  c.train.log_every = 100
  c.train.checkpoint_every = 1000
  return _options.overridable(c)


def get_config(config_string: str = "DE,tanh"):
  o = _options.Options("maupome_ablation", config_string,
                       "<DE|D|E|none|rnn|mi_rnn>,<tanh|identity>")
  terms = o.choice("terms", tuple(TERMS) + REFERENCES)
  activation = o.choice("activation", ACTIVATIONS, default="tanh")
  o.done()
  if terms == "rnn":
    return base(cell="rnn", activation=activation)
  if terms == "mi_rnn":
    return base(cell="mi_rnn", general=True, activation=activation)
  use_D, use_E = TERMS[terms]
  return base(cell="general2", use_D=use_D, use_E=use_E,
              activation=activation, intermediate_ratio=1.0)
