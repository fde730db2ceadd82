"""Mahto, Vo, Turek & Huth, sec. 3.1.1 (Tables 1-3, Fig. 1): the AWD-LSTM
language model (Merity et al. 2018) and its multi-timescale version on PTB
and WikiText-2, and the Markov-PTB control (sec. 3.2.1, Fig. 1).

    python -m experiments.main \\
        --config=experiments/configs/mahto_lm.py:mts,ptb --workdir=DIR

Config string `<model>,<corpus>[,sizes=<H1>-<H2>-<H3>]`:
  model   baseline  three LSTM layers
          mts       layer 1: half the units T = 3, half T = 4; layer 2:
                    timescales from InvGamma(alpha = 0.56, beta = 1); both
                    with fixed forget/input biases (eq. 5); layer 3 a plain,
                    trained LSTM (sec. 3.1.1)
  corpus  ptb, wikitext2, or markov_ptb: tokens drawn from PTB's bigram
          chain, as many per split as PTB's (sec. 3.1.1), trained with
          PTB's settings; Fig. 1 fits the baseline's unit timescales on it
          and on PTB (`timescales` analysis)
  sizes   the three hidden sizes (default 1150-1150-400); the embedding
          size follows the last (tied embeddings), e.g. sizes=32-32-16 for
          a CPU-scale run

Sec. 3.1.1: 3 layers of 1150, 1150 and 400 units, embeddings 400, input
and output embeddings tied; SGD then non-monotonically triggered ASGD, 1000
epochs; training windows of 70 tokens w.p. 0.95 and 35 w.p. 0.05 (AWD-LSTM's
variable BPTT, lr scaled by length / 70); evaluation windows of 70. The
settings the paper leaves to its AWD-LSTM code (HuthLab/multi-timescale-
LSTM-LMs, run.sh and train_mts.py defaults): lr 30, clip 0.25, weight decay
1.2e-6, non-monotone interval 5; locked dropout 0.4 on the output, word
(embedding) dropout 0.1; PTB: batch 20, input dropout 0.4, between-layer
dropout 0.25, seed 141; WikiText-2: batch 80, input dropout 0.65,
between-layer dropout 0.2, seed 1882; weight drop 0.5 on every layer's W_h
(`model.weight_drop`), activation and temporal activation regularisation
alpha 2, beta 1 (`model.activation_reg`, `model.temporal_activation_reg`);
embedding weights from U(-0.1, 0.1) (`model.embedding_init`); validation
in 10 streams, test in 1 (AWD-LSTM's eval / test batch sizes: one stream
whose state carries through the whole test set).
"""

from experiments.configs import _options, common

SIZES = (1150, 1150, 400)
LAYER2_ALPHA = 0.56
CORPORA = {  # AWD-LSTM settings per corpus (HuthLab run.sh / ReadMe)
    "ptb": dict(batch_size=20, input_dropout=0.4, hidden_dropout=0.25,
                seed=141),
    "wikitext2": dict(batch_size=80, input_dropout=0.65, hidden_dropout=0.2,
                      seed=1882),
}
CORPORA["markov_ptb"] = CORPORA["ptb"]  # the paper trains "the same model"


def layers(model: str, sizes=SIZES) -> tuple:
  """config.model.layers of the baseline or the multi-timescale LM; every
  bias but eq. 5's starts uniform (3.1.1: "All weights and biases of the
  LSTM layers ... uniformly initialized")."""
  h1, h2, h3 = sizes
  u = {"bias_init": "uniform"}
  if model == "baseline":
    return tuple({"cell": "lstm", "hidden_size": h, **u} for h in sizes)
  layer1 = ("groups", (("constant", 3.0, h1 // 2),
                       ("constant", 4.0, h1 - h1 // 2)))
  return ({"cell": "mts_lstm", "hidden_size": h1, "timescales": layer1,
           **u},
          {"cell": "mts_lstm", "hidden_size": h2,
           "timescales": ("inverse_gamma", LAYER2_ALPHA), **u},
          {"cell": "lstm", "hidden_size": h3, **u})


def _sizes(o: _options.Options, value: str | None) -> tuple[int, int, int]:
  if value is None:
    return SIZES
  try:
    sizes = tuple(int(s) for s in value.split("-"))
  except ValueError:
    sizes = ()
  if len(sizes) != 3 or min(sizes) < 2:
    raise o.error(f"sizes must be three ints >= 2 joined by '-', got "
                  f"{value!r}")
  return sizes


def get_config(config_string: str = "baseline,ptb"):
  o = _options.Options("mahto_lm", config_string,
                       "<baseline|mts>,<ptb|wikitext2|markov_ptb>"
                       "[,sizes=H1-H2-H3]")
  model = o.choice("model", ("baseline", "mts"))
  corpus = o.choice("corpus", tuple(CORPORA))
  sizes = _sizes(o, o.keyed("sizes"))
  o.done()
  awd = CORPORA[corpus]
  c = common.config(
      "lm",
      common.lm_data(corpus=corpus, batch_size=awd["batch_size"], bptt=70,
                     variable_bptt=True, eval_batch_size=10, eval_bptt=70,
                     test_batch_size=1),
      cell=None, hidden_size=None, layers=layers(model, sizes),
      embed_size=sizes[-1], tie_embedding=True, embedding_dropout=0.1,
      input_dropout=awd["input_dropout"],
      hidden_dropout=awd["hidden_dropout"], output_dropout=0.4,
      locked_dropout=True, weight_drop=0.5, activation_reg=2.0,
      temporal_activation_reg=1.0, embedding_init="uniform_0.1")
  c.seed = awd["seed"]
  c.optim.name = "nt_asgd"
  c.optim.learning_rate = 30.0
  c.optim.clip_norm = 0.25
  c.optim.weight_decay = 1.2e-6
  c.nt_asgd.nonmono = 5
  c.train.num_epochs = 1000
  c.train.log_every = 200
  c.train.checkpoint_every = 2000
  return _options.overridable(c)
