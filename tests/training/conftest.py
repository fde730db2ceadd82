"""optax itself is not clean under strict dtype promotion (adam's bias
correction mixes a Python float with an int32 count), so optimiser-level
tests run under standard promotion; rank promotion stays strict."""

import jax
import pytest


@pytest.fixture(autouse=True)
def _standard_dtype_promotion():
  with jax.numpy_dtype_promotion("standard"):
    yield
