"""Token language model: embedding -> layers of cells -> vocabulary logits.

    x_t = embed(w_t);  h^l_t = cell_l(h^l_{t-1}, h^{l-1}_t);  logits_t = h^L_t W + b

The decoder is a dense layer [H, V] + [V], or, with tie_embedding, the
transposed embedding table (Press & Wolf 2017; Inan et al. 2017) plus a
bias [V]. Tying needs the last hidden size to equal E: when it differs,
`tie_projection=True` adds a bias-free projection [H, E] before the tied
decoder (as Inan et al.); without it the mismatch is an error.

Carries go in and come out, so truncated BPTT can carry state across
batches (stop their gradient between batches in the train step). Padded
steps (t >= lengths) keep each layer's carry; their logits are those of a
zero hidden state and must be masked out of the loss.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from sorjax.cells import base
from sorjax.models.stack import RecurrentTrunk


class LanguageModel(RecurrentTrunk):
  """Next-token model over a vocabulary; see `RecurrentTrunk` for the trunk.

  Attributes (beyond the trunk's):
    tie_embedding: decode with the embedding table (embedding="learned").
    tie_projection: with tie_embedding and H != E, project H -> E first.
  """
  tie_embedding: bool = False
  tie_projection: bool = False

  def _validate(self) -> None:
    super()._validate()
    if self.tie_embedding and self.embedding != "learned":
      raise self._error(
          "tie_embedding needs a trainable table (embedding='learned'), got "
          f"embedding={self.embedding!r}")
    if (self.tie_embedding and self.output_size != self.embed_size
        and not self.tie_projection):
      raise self._error(
          f"tie_embedding: the last hidden size {self.output_size} differs "
          f"from embed_size={self.embed_size}; set tie_projection=True to "
          "project it to embed_size, or match the sizes")
    if self.tie_projection and not self.tie_embedding:
      raise self._error("tie_projection is only meaningful with tie_embedding")

  @nn.compact
  def __call__(self, tokens, carries=None, lengths=None, *,
               deterministic: bool = True, **aux: Any):
    """tokens int [B, T] -> (logits [B, T, V], carries).

    Args:
      tokens: int token ids [B, T].
      carries: one carry per layer (the previous call's output), or None to
        start from each cell's initial carry.
      lengths: int [B] valid lengths, or None.
      deterministic: no dropout when True (needs an rng "dropout" if False).
      **aux: per-token [B, T] or scalar extra inputs of the cells (e.g.
        temperature, assignment); each goes to the layers that accept it.
    """
    h, carries, table = self._trunk(tokens, carries, lengths, deterministic,
                                    aux)
    V, dtype = self.vocab_size, self.param_dtype
    if not self.tie_embedding:
      return Decoder(V, param_dtype=dtype, name="decoder")(h), carries
    if self.output_size != self.embed_size:
      h = nn.Dense(self.embed_size, use_bias=False, param_dtype=dtype,
                   name="projection")(h)
    b = self.param("decoder_bias", nn.initializers.zeros_init(), (V,), dtype)
    # logits = h E^T + b, formed as Decoder forms h W + b
    return base.affine_products(h, table.T, b), carries


class Decoder(nn.Module):
  """h W + b to the vocabulary: `nn.Dense`'s parameters (kernel [H, V] and
  bias [V], its initializers, names and dtype promotion), with its
  gradients formed as one product over the rows, [dW; db] = [h^T; 1^T] dy
  from h^T in memory (`base.affine_products`). Autodiff transposed the
  [rows, V] cotangent for dW and ran db's row sum on YNNPACK; a separate
  1^T dy still transposed the cotangent under the training loop's vmap.
  At Lin et al.'s WikiText-2 sizes (V = 33,278, H = 600, B=64 T=70) on
  CPU, the first made the model's gradient 1.25x faster and the second
  the training step 1.45x (BUILD_NOTES, "The decoder's gradients as
  products" and "The decoder's two gradients as one product")."""
  features: int
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, h):
    kernel = self.param("kernel", nn.linear.default_kernel_init,
                        (h.shape[-1], self.features), self.param_dtype)
    bias = self.param("bias", nn.initializers.zeros_init(), (self.features,),
                      self.param_dtype)
    h, kernel, bias = nn.dtypes.promote_dtype(h, kernel, bias, dtype=None)
    return base.affine_products(h, kernel, bias)
