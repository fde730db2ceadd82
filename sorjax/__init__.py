"""sorjax: second-order recurrent networks in JAX/Flax."""

from sorjax import cells
from sorjax.unroll import init_layers, unroll, unroll_layers


def restore(workdir, step="best", replica=0):
  """Restores a trained run from its work directory (see sorjax.runs)."""
  from sorjax.runs import restore as _restore
  return _restore(workdir, step, replica)

__version__ = "0.1.0"

__all__ = ["cells", "init_layers", "restore", "unroll", "unroll_layers"]
