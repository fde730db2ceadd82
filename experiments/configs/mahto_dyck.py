"""Mahto, Vo, Turek & Huth, sec. 3.1.2 and 3.2.3 (Fig. 2): which closing
brackets may come next in the Dyck-2 PCFG (Suzgun et al. 2019), baseline
LSTM vs multi-timescale LSTM.

    python -m experiments.main \\
        --config=experiments/configs/mahto_dyck.py:mts --workdir=DIR

Config string `baseline` or `mts` (forget/input biases fixed from
InvGamma(alpha = 1.5, beta = 1) timescales, eq. 5).

Sec. 3.1.2: p1 = p2 = q = 0.25, 10k/2k/5k sequences of at most 200
brackets (data preset mahto); one-hot inputs; one 256-unit LSTM layer and a
linear layer to 2 sigmoid outputs (one per closing bracket); MSE; Adam at
1e-4, beta1 0.9, beta2 0.999, eps 1e-8; 2000 epochs; 20 repetitions (Fig.
2; num_replicas = 20, one program). From the authors' run_dyckn.py
(HuthLab/multi-timescale-LSTM-LMs), not the paper: batch 128, gradient
norm clipped at 1.0.
"""

from experiments.configs import _options, common

ALPHA = 1.5


def get_config(config_string: str = "baseline"):
  o = _options.Options("mahto_dyck", config_string, "<baseline|mts>")
  model = o.choice("model", ("baseline", "mts"))
  o.done()
  mts = model == "mts"
  c = common.config(
      "dyck_pcfg",
      common.pcfg_data(preset="mahto", loss="mse", batch_size=128,
                       eval_batch_size=100),
      cell="mts_lstm" if mts else "lstm", hidden_size=256,
      embedding="one_hot",
      timescales=("inverse_gamma", ALPHA) if mts else None,
      bias_init="uniform")    # 3.1.2: "initialized using a uniform
                              # distribution"
  c.model.head_init = "uniform"   # the head too: "uniform distribution"
  c.num_replicas = 20
  c.optim.name = "adam"
  c.optim.learning_rate = 1e-4
  c.optim.b1, c.optim.b2, c.optim.eps = 0.9, 0.999, 1e-8
  c.optim.clip_norm = 1.0
  c.train.num_epochs = 2000
  c.train.log_every = 50
  c.train.checkpoint_every = 1000
  return _options.overridable(c)
