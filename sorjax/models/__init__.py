"""Sequence models (flax.linen) built on the cell zoo.

    model = LanguageModel(cells=(make("lstm", hidden_size=650),) * 2,
                          vocab_size=10_000, embed_size=650, tie_embedding=True)
    variables = model.init(key, tokens)          # {"params": ...}
    logits, carries = model.apply(variables, tokens, carries)
"""

from sorjax.models.dyck import HEADS, DyckModel
from sorjax.models.lm import LanguageModel
from sorjax.models.stack import (DROPOUT_SITES, EMBED_INITS, EMBEDDINGS,
                                 FROZEN, RecurrentTrunk)
from sorjax.models.tree_classifier import TreeClassifier, loss_and_accuracy

__all__ = ["DROPOUT_SITES", "DyckModel", "EMBED_INITS", "EMBEDDINGS", "FROZEN",
           "HEADS", "LanguageModel", "RecurrentTrunk", "TreeClassifier",
           "loss_and_accuracy"]
