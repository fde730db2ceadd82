"""The softmax-temperature schedule of the attention LSTM (Lin et al. 3.2.2).

tau starts "hot" at 1 and is multiplied by a constant (0.9) every epoch, so
each token ends up assigned to one cell; at test time tau is set low.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from sorjax.checks import check_number


@dataclasses.dataclass(frozen=True)
class TemperatureSchedule:
  """tau(step, epoch) = max(floor, init * decay ** units), units = epoch or step.

  Attributes:
    init: tau at the start (Lin et al.: 1).
    decay: multiplier per unit (Lin et al.: 0.9 per epoch); 1 keeps tau fixed.
    per: "epoch" or "step": what one unit of decay is.
    floor: tau never falls below this.
    eval_value: tau used for evaluation and analysis (Lin et al.: "set
      arbitrarily low"); None evaluates at the current training value.
  """
  init: float = 1.0
  decay: float = 1.0
  per: str = "epoch"
  floor: float = 0.0
  eval_value: float | None = None

  def __post_init__(self):
    check_number("temperature.init", self.init, "> 0", lambda v: v > 0)
    check_number("temperature.decay", self.decay, "in (0, 1]",
                 lambda v: 0 < v <= 1)
    if self.per not in ("epoch", "step"):
      raise ValueError(
          f"temperature.per must be 'epoch' or 'step', got {self.per!r}")
    check_number("temperature.floor", self.floor, f"in [0, init={self.init}]",
                 lambda v: 0 <= v <= self.init)
    check_number("temperature.eval_value", self.eval_value, "> 0",
                 lambda v: v > 0, optional=True)

  def __call__(self, step, epoch):
    """Training temperature (works on Python ints and traced arrays)."""
    units = epoch if self.per == "epoch" else step
    tau = self.init * jnp.power(jnp.float32(self.decay), jnp.float32(units))
    return jnp.maximum(tau, jnp.float32(self.floor))

  def evaluation(self, step, epoch):
    """Temperature for evaluation."""
    if self.eval_value is None:
      return self(step, epoch)
    return jnp.float32(self.eval_value)
