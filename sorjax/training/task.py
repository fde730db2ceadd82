"""What the training loop needs from a task (lm, dyck_lm, trees, ...).

A task owns its data, model and loss; the loop (`sorjax.training.loop`)
owns replicas, devices, the optimizer, schedules, checkpoints and metrics.
Everything a task returns for one replica; the loop vmaps over replicas.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol

import jax

Batch = dict[str, Any]  # NumPy arrays; a leading batch axis unless noted


class Task(Protocol):
  name: str
  vocab: Any                    # saved with the run; None if not applicable

  def init_params(self, rng: jax.Array) -> Any:
    """Trainable parameters of one replica."""

  def init_carry(self, params: Any) -> Any:
    """State carried across training batches (TBPTT hidden state), or ()."""

  def num_train_batches(self) -> int | None:
    """Batches per epoch when known in advance (for ETA), else None."""

  def train_batches(self, epoch: int, position: dict | None
                    ) -> Iterator[tuple[Batch, dict]]:
    """Yields (batch, position after it) for one epoch, resuming from
    `position` (a JSON-able dict from an earlier yield) when given. Must be
    deterministic given the config and epoch."""

  def loss(self, params: Any, carry: Any, batch: Batch, rng: jax.Array,
           temperature: jax.Array, train: bool
           ) -> tuple[jax.Array, tuple[Any, dict[str, jax.Array]]]:
    """(mean loss to minimise, (new carry, metrics)) of one replica on one
    batch; pure and jittable. `batch["lr_scale"]`, when present, scales the
    learning rate of this step (AWD-LSTM's variable bptt)."""

  def evaluate(self, params: Any, split: str, temperature: float
               ) -> dict[str, float]:
    """Metrics of one replica on a split, "loss" among them (lower is
    better; plateau, NT-ASGD and early_stopping.stop_below monitor it, the
    best checkpoint and early stopping's patience follow config.selection,
    the loss by default)."""

  # Optional: metric_names() -> the keys evaluate returns; the loop checks
  # selection.metric against them before training (else at the first
  # evaluation).
  # Optional: epoch_metrics(params, epoch) -> dict of scalars, computed
  # after each epoch's evaluation and written to metrics.jsonl with split
  # "epoch_metrics" (the trees task records Le & Zuidema's gradient ratios).

  def eval_splits(self) -> tuple[str, ...]:
    """Splits evaluated after every epoch; the first one selects the best
    checkpoint (by config.selection) and drives plateau / early
    stopping."""
