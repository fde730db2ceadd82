"""Maupome & Meurs, sec. 4.2 (Fig. 1): the |m|/|h| sweep of the general
second-order RNN at a 500k-parameter budget on PTB characters.

    python -m experiments.main \\
        --config=experiments/configs/maupome_ratio.py:0.5 --workdir=DIR

Config string `<ratio>[,char|bigram]`: |m|/|h|, the paper's grid being
RATIOS = 0.1, 0.2, 0.5, 1, 2, 5, 10, 20 (any positive number is accepted).
The paper runs the sweep on character unigrams and on character bigrams
("state" -> st, at, e: corpus ptb_char_maupome_bigram, the same text in
pairs within words; bits per character are still per character).

Sec. 4.2 keeps sec. 4.1's setup (maupome_ablation.base: one-hot inputs,
batches of 64, Adam, <= 25 epochs) and solves |h| and |m| = ratio * |h| for
500k parameters. The model is eq. 9 without its first-order terms (use_D =
use_E = False): sec. 4.2 motivates the sweep by "the first-order terms can
be omitted", Table 1's best rows; override with --config.model.use_D=True.
"""

from experiments.configs import _options, maupome_ablation

RATIOS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0)


def get_config(config_string: str = "2"):
  o = _options.Options("maupome_ratio", config_string,
                       "<ratio>[,char|bigram]")
  ratio = o.number("|m|/|h| ratio")
  tokens = o.choice("tokenization", ("char", "bigram"), default="char")
  o.done()
  c = maupome_ablation.base(cell="general2", use_D=False, use_E=False,
                            activation="tanh", intermediate_ratio=ratio)
  if tokens == "bigram":
    c.data.corpus = "ptb_char_maupome_bigram"
  return c
