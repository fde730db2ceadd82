"""Lin, Benditshtull & Spinner, sec. 4: next-token LMs on m-bounded Dyck-2.

    python -m experiments.main \\
        --config=experiments/configs/lin_dyck.py:attention,m6 --workdir=DIR

Config string `<model>,m<m>`:
  model  lstm        the baseline, one LSTM (sec. 3.1, Hewitt's model)
         attention   2 LSTM cells mixed by softmax(V x / tau) (sec. 3.2.2)
         assignment  2 LSTM cells, type-a brackets -> cell 0, type-b -> cell 1
                     (sec. 3.2.1; START/END -> cell 0)
  m      4, 6 or 8   the bound; data preset lin_m<m> (Hewitt's 10k/4k/10k,
                     sec. 4.1)

Sec. 4.3: embeddings 30, hidden 3m, batch 10, no dropout, initial state 0;
Adam at 1e-4; the learning rate halves when the validation loss has not
improved for 3 epochs; training stops after 6 epochs without improvement;
tau starts at 1 and is multiplied by 0.9 every epoch, and is "set
arbitrarily low" at test time (0.01 here). Reports perplexity, its ratio to
the oracle's, WCPA (sec. 4.2) and writes the LDPA curve (Fig. 2).
"""

from experiments.configs import _options, common

MODELS = {"lstm": "lstm", "attention": "attention_lstm",
          "assignment": "assignment_lstm"}
BOUNDS = ("m4", "m6", "m8")


def get_config(config_string: str = "lstm,m4"):
  o = _options.Options("lin_dyck", config_string, "<lstm|attention|"
                       "assignment>,<m4|m6|m8>")
  model = o.choice("model", tuple(MODELS))
  m = int(o.choice("bound", BOUNDS)[1:])
  o.done()
  second_order = model != "lstm"
  c = common.config(
      "dyck_lm",
      common.dyck_data(k=2, m=m, preset=f"lin_m{m}", batch_size=10),
      cell=MODELS[model], hidden_size=3 * m, embed_size=30,
      num_cells=2 if second_order else None)
  if model == "assignment":
    c.model.assignment = "bracket_type"
  common.lin_training(c, temperature=model == "attention")
  c.figures = ("ldpa",)
  return _options.overridable(c)
