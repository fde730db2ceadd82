"""Renganathan & Singh, sec. 4.2 and 6.2: the Dyck-RNN predicting closing
brackets of m-bounded Dyck-2 (Table 2: WCPA 100 for m = 4, 6, 8).

    python -m experiments.main \\
        --config=experiments/configs/renganathan_dyck.py:m6 --workdir=DIR

Config string `m<m>[,learn_embedding]`:
  m<m>             4, 6 or 8: Hewitt's 24,000 sequences per m (sec. 5.1;
                   data preset lin_m<m>: 10k train, 4k dev, 10k test)
  learn_embedding  sec. 6.2's variant: a trained 2-d embedding and
                   hidden 2m instead of the fixed 1-d one and hidden m

At every closing bracket the top of the stack (unit 0 of the hidden state,
`model.head_units = 1`) after the prefix before it goes through an affine
map and a softmax over the k closing brackets, trained by cross-entropy
(sec. 4.2; task dyck_closing). Sec. 5.3: batch 512, Adam
(sec. 5.3: "for all our models") at 0.01; h = m (Table 1); training stops
when the dev loss falls below 1e-5 (`early_stopping.stop_below`), here
within at most 100 epochs, and the best checkpoint is kept. Table 1's "4, 2
and 1 epochs to converge" (3, 6 and 10 minutes) fall with m while the time
grows, which fits epochs over (prefix, closing bracket) examples -- several
hundred updates each at batch 512 -- rather than over sequences as here
(20 updates per epoch), so an epoch here is far fewer updates than theirs.
"""

from experiments.configs import _options, common

BOUNDS = ("m4", "m6", "m8")


def get_config(config_string: str = "m4"):
  o = _options.Options("renganathan_dyck", config_string,
                       "<m4|m6|m8>[,learn_embedding]")
  m = int(o.choice("bound", BOUNDS)[1:])
  learn = o.flag("learn_embedding")
  o.done()
  data = common.dyck_data(k=2, m=m, preset=f"lin_m{m}", batch_size=512,
                          eval_batch_size=512)
  if learn:
    c = common.config("dyck_closing", data, cell="dyck_rnn",
                      hidden_size=2 * m, learn_embedding=True,
                      embedding="learned", embed_size=2)
  else:
    c = common.config("dyck_closing", data, cell="dyck_rnn", hidden_size=m,
                      learn_embedding=False, embedding="cell")
  # 4.2: "we inspect the top element of the stack ... apply an affine
  # transformation": the head reads unit 0
  c.model.head_units = 1
  c.optim.name = "adam"
  c.optim.learning_rate = 1e-2
  c.early_stopping.stop_below = 1e-5
  c.train.num_epochs = 100
  c.train.log_every = 10
  c.train.checkpoint_every = 100
  return _options.overridable(c)
