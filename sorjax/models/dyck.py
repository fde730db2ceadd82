"""Heads for the Dyck-language tasks, on the shared recurrent trunk.

    head="next_token"  per-step logits over the vocabulary, softmax: a
                       next-token language model (Lin et al. 3.1, the
                       m-bounded Dyck-2 LMs scored by LDPA / WCPA).
    head="admissible"  per-step logits over num_outputs symbols, each a
                       sigmoid: which symbols may come next (multi-label;
                       Mahto et al. 3.1.2 after Suzgun et al. 2019, with
                       num_outputs = 2 closing brackets).
    head="closing"     one softmax over the k = num_outputs closing brackets
                       from the hidden state of the last valid step
                       (Renganathan & Singh 4.2: "inspect ... the last hidden
                       state vector, apply an affine transformation and pass
                       it through a softmax").

Every head is an affine map [H, num_outputs] + [num_outputs] named "head"
(H: the last layer's size, or `head_units` when the head reads fewer);
`probabilities` turns its logits into the head's distribution.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sorjax.cells import base
from sorjax.layer_scan import concrete
from sorjax.models.stack import RecurrentTrunk

HEADS = ("next_token", "admissible", "closing")


class DyckModel(RecurrentTrunk):
  """Recurrent trunk + one of HEADS.

  Attributes (beyond `RecurrentTrunk`'s):
    head: one of HEADS.
    num_outputs: classes of the head; defaults to vocab_size for
      "next_token", required for "admissible" and "closing".
    head_units: the head reads the last layer's first `head_units` units
      (None: all). 1 reads a Dyck-RNN's stack top, unit 0: "we inspect the
      top element of the stack ... apply an affine transformation"
      (Renganathan & Singh 4.2).
    head_init: None (flax's Dense: lecun-normal kernel, zero bias) or
      "uniform" (kernel and bias U(-1/sqrt(n), 1/sqrt(n)) for n inputs,
      as torch's nn.Linear: Mahto et al. 3.1.2 "initialized using a
      uniform distribution").
  """
  head: str = "next_token"
  num_outputs: int | None = None
  head_units: int | None = None
  head_init: str | None = None

  def _validate(self) -> None:
    super()._validate()
    if self.head not in HEADS:
      raise self._error(f"head must be one of {HEADS}, got {self.head!r}")
    if self.head != "next_token" or self.num_outputs is not None:
      base.check_positive_int(f"{type(self).__name__} (head={self.head!r})",
                              "num_outputs", self.num_outputs)
    if self.head_init is not None:
      base.check_choice(type(self).__name__, "head_init", self.head_init,
                        ("uniform",))
    if self.head_units is not None:
      base.check_positive_int(type(self).__name__, "head_units",
                              self.head_units)
      H = self.cells[-1].hidden_size
      if self.head_units > H:
        raise self._error(f"head_units={self.head_units} exceeds the last "
                          f"layer's hidden size {H}")

  @property
  def num_classes(self) -> int:
    return self.vocab_size if self.num_outputs is None else self.num_outputs

  @nn.compact
  def __call__(self, tokens, carries=None, lengths=None, *,
               deterministic: bool = True, **aux: Any):
    """tokens int [B, T] -> (logits, carries).

    logits are [B, T, num_classes] for the per-step heads and [B,
    num_classes] for "closing" (read at step lengths - 1, or T - 1).
    """
    if self.head == "closing":  # read at lengths - 1: a length 0 read T - 1
      if jnp.ndim(tokens) == 2 and jnp.shape(tokens)[1] == 0:
        # no step to read: the gather's fill would give the bias alone
        raise self._error(
            f"head='closing' reads the last step, and tokens "
            f"{tuple(jnp.shape(tokens))} have none (T = 0)")
      v = concrete(lengths) if lengths is not None else None
      if v is not None and v.size and v.min() < 1:
        raise self._error(
            f"head='closing' reads step lengths - 1: lengths must be >= 1, "
            f"got {int(v.min())} at lengths[{int(np.argmin(v))}]")
    h, carries, _ = self._trunk(tokens, carries, lengths, deterministic, aux)
    if self.head == "closing":
      T = h.shape[1]
      last = (jnp.full(h.shape[:1], T - 1, jnp.int32) if lengths is None
              else jnp.asarray(lengths, jnp.int32) - 1)
      h = jnp.take_along_axis(h, last[:, None, None], axis=1)[:, 0]  # [B, H]
    if self.head_units is not None:
      h = h[..., :self.head_units]
    init = {}
    if self.head_init == "uniform":   # U(+-1/sqrt(n)), n = h's width
      n = h.shape[-1]
      init = dict.fromkeys(("kernel_init", "bias_init"),
                           lambda key, shape, dtype=jnp.float32:
                           base.uniform(key, shape, n, dtype))
    logits = nn.Dense(self.num_classes, param_dtype=self.param_dtype,
                      name="head", **init)(h)
    return logits, carries

  @nn.nowrap
  def probabilities(self, logits):
    """Softmax over classes, or independent sigmoids for "admissible"."""
    if self.head == "admissible":
      return jax.nn.sigmoid(logits)
    return jax.nn.softmax(logits, axis=-1)
