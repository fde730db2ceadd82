"""sorjax: second-order recurrent networks in JAX/Flax.

    sorjax.cells      the cell zoo (pure functions), `make(name, ...)`
    sorjax.unroll     run a cell over time; `unroll_layers` for stacks
    sorjax.trees      bottom-up recursion over batches of binary trees
    sorjax.models     flax.linen models (language model, Dyck heads, trees)
    sorjax.linen      any cell as a flax.linen.RNNCellBase
    sorjax.budget     parameter counts and budget-matching sizes
    sorjax.data       synthetic languages, corpora, tokenisers, batching
    sorjax.training   the training loop, tasks, optimisers, checkpoints
    sorjax.analysis   analyses of restored runs
    sorjax.restore    a trained run from its work directory

Submodules beyond cells and unroll are imported on first use.
"""

import importlib

from sorjax import cells
from sorjax.unroll import init_layers, unroll, unroll_layers

__version__ = "0.1.0"

_LAZY = ("analysis", "budget", "data", "linen", "models", "training", "trees")


def restore(workdir, step="best", replica=0):
  """Restores a trained run from its work directory (see sorjax.runs)."""
  from sorjax.runs import restore as _restore
  return _restore(workdir, step, replica)


def __getattr__(name):
  if name in _LAZY:
    return importlib.import_module(f"sorjax.{name}")
  raise AttributeError(f"module 'sorjax' has no attribute {name!r}")


__all__ = ["cells", "init_layers", "restore", "unroll", "unroll_layers",
           *_LAZY]
