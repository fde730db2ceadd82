"""sorjax: second-order recurrent networks in JAX/Flax."""

from sorjax import cells
from sorjax.unroll import init_layers, unroll, unroll_layers

__version__ = "0.1.0"

__all__ = ["cells", "init_layers", "unroll", "unroll_layers"]
