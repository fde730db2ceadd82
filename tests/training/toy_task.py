"""A tiny regression task that exercises every hook of the loop: an epoch
shuffle, a resumable position, a carry across batches, a dropout-like RNG."""

import jax
import jax.numpy as jnp
import numpy as np

from sorjax.training.config import base_config


class ToyTask:
  name = "toy"
  vocab = None

  def __init__(self, n=48, batch=8, nan_at_batch=None):
    rs = np.random.RandomState(0)
    self.x = rs.randn(n, 3).astype(np.float32)
    self.y = (self.x @ np.array([1.0, -2.0, 0.5], np.float32)).astype(
        np.float32)
    self.batch, self.nan_at_batch = batch, nan_at_batch

  def init_params(self, rng):
    return {"w": 0.1 * jax.random.normal(rng, (3,))}

  def init_carry(self, params):
    return {"seen": jnp.zeros((), jnp.float32)}

  def num_train_batches(self):
    return len(self.x) // self.batch

  def train_batches(self, epoch, position):
    order = np.random.RandomState(100 + epoch).permutation(len(self.x))
    start = position["batch"] if position else 0
    for i in range(start, self.num_train_batches()):
      idx = order[i * self.batch:(i + 1) * self.batch]
      y = self.y[idx]
      if self.nan_at_batch is not None and epoch * 100 + i == self.nan_at_batch:
        y = np.full_like(y, np.nan)
      yield {"x": self.x[idx], "y": y}, {"batch": i + 1}

  def loss(self, params, carry, batch, rng, temperature, train):
    noise = 0.01 * jax.random.normal(rng, ())
    pred = batch["x"] @ params["w"] + noise
    loss = jnp.mean((pred - batch["y"]) ** 2)
    return loss, ({"seen": carry["seen"] + 1.0}, {"seen": carry["seen"]})

  def evaluate(self, params, split, temperature):
    pred = self.x @ np.asarray(params["w"])
    return {"loss": float(np.mean((pred - self.y) ** 2))}

  def eval_splits(self):
    return ("valid",)


def toy_config(**train):
  c = base_config()
  c.task = "toy"
  c.optim.name = "sgd"
  c.optim.learning_rate = 0.05
  c.train.num_epochs = 3
  c.train.log_every = 2
  c.train.checkpoint_every = 4
  c.train.tensorboard = False
  c.train.update(train)
  return c
