"""Strict numerics for every test: silent broadcasting or dtype promotion
in an einsum becomes an error (as in Equinox's test configuration)."""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")


SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                           "data")


@pytest.fixture(scope="session")
def shared_data():
  """Path to ../shared/data; skips the test when it is absent."""
  path = os.environ.get("SORJAX_DATA_DIR", SHARED_DATA)
  if not os.path.isdir(path):
    pytest.skip(f"real corpora not found at {os.path.abspath(path)} "
                "(set SORJAX_DATA_DIR)")
  return os.path.abspath(path)


# optax itself is not clean under strict dtype promotion (adam's bias
# correction mixes a Python float with an int32 count), so tests that run
# optimisers end to end use standard dtype promotion; rank promotion stays
# strict everywhere.
_OPTAX_DIRS = ("training", "experiments")


@pytest.fixture(autouse=True)
def _dtype_promotion_for_optax(request):
  parts = request.node.path.parts
  i = len(parts) - 1 - parts[::-1].index("tests") if "tests" in parts else -1
  if 0 <= i < len(parts) - 1 and parts[i + 1] in _OPTAX_DIRS:
    with jax.numpy_dtype_promotion("standard"):
      yield
  else:
    yield
