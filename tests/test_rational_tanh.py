"""sorjax.rational_tanh: accuracy against float64 tanh, its derivative, the
dtypes and platforms that keep jnp.tanh, and the fit that made it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import tanh_fit
from sorjax import fused_lstm, rational_tanh
from sorjax.rational_tanh import tanh


def test_float32_close_to_float64_tanh():
  """Within 4e-7 of float64 tanh on a dense grid (XLA:CPU's own float32
  tanh: 2.6e-7), relatively accurate near 0, constant past the clamp at
  tanh(9) rounded (1 - 2^-24), odd, never beyond +-1."""
  x = np.linspace(-20, 20, 400_001, dtype=np.float32)
  r = np.asarray(jax.jit(tanh)(x), np.float64)
  ref = np.tanh(x.astype(np.float64))
  assert np.abs(r - ref).max() < 4e-7
  small = np.abs(x) < 0.1
  rel = np.abs(r - ref)[small] / np.abs(ref[small]).clip(1e-30)
  assert rel.max() < 4e-7
  assert np.all(r[x >= 9] == np.float32(1 - 2.0**-24))
  np.testing.assert_array_equal(r[x <= -9], -np.float32(1 - 2.0**-24))
  np.testing.assert_array_equal(r, -r[::-1])
  assert np.all(np.abs(r) <= 1.0)
  tiny = np.float32([0.0, 1e-30, -1e-20, 1e-8])
  np.testing.assert_allclose(jax.jit(tanh)(tiny), tiny, rtol=1e-7)


def test_cpu_float32_is_the_rational_form():
  """On CPU, float32 lowers to arithmetic (no tanh op), and equals
  `rational` to the last bit."""
  x = jnp.linspace(-3, 3, 101, dtype=jnp.float32)
  text = jax.jit(tanh).lower(x).as_text()
  assert "tanh" not in text.replace("jit_tanh", "").replace("@tanh", "")
  assert "divide" in text
  np.testing.assert_array_equal(jax.jit(tanh)(x),
                                jax.jit(rational_tanh.rational)(x))


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.bfloat16, jnp.float16])
def test_other_dtypes_keep_jnp_tanh(dtype):
  with jax.enable_x64(True):
    x = jnp.linspace(-3, 3, 101).astype(dtype)
    assert x.dtype == dtype
    np.testing.assert_array_equal(jax.jit(tanh)(x), jax.jit(jnp.tanh)(x))


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_accelerators_get_their_own_tanh(platform):
  """Lowered for an accelerator, the module holds a tanh op and none of
  the rational form's divides."""
  x = jax.ShapeDtypeStruct((8,), jnp.float32)
  text = jax.export.export(jax.jit(tanh), platforms=[platform])(x)
  text = text.mlir_module()
  assert "stablehlo.tanh" in text
  assert "stablehlo.divide" not in text


def test_derivative_is_one_minus_square():
  x = jnp.linspace(-6, 6, 241, dtype=jnp.float32)
  g = jax.vmap(jax.grad(tanh))(x)
  t = tanh(x)
  np.testing.assert_allclose(g, 1 - t * t, rtol=0, atol=1e-7)
  np.testing.assert_allclose(g, 1 - np.tanh(np.float64(x)) ** 2, atol=1e-6)
  # second derivative through the custom JVP: -2 t (1 - t^2)
  g2 = jax.vmap(jax.grad(jax.grad(tanh)))(x)
  np.testing.assert_allclose(g2, -2 * t * (1 - t * t), atol=1e-6)


def test_fit_reproduces_the_shipped_coefficients():
  """benchmarks/tanh_fit.py makes the library's P and Q, and its error
  figures hold."""
  p, q, rel64 = tanh_fit.fit()
  # The 60 reweighted least-squares solves amplify rounding: OpenBLAS's
  # kernels for different CPUs (OPENBLAS_CORETYPE Haswell, Zen, SkylakeX,
  # Sandybridge, Nehalem, Prescott) give coefficients up to 7.6e-8 apart
  # relative to one another (the last one a float32 ulp), so the fit is
  # reproducible to that, not to float64's precision.
  np.testing.assert_allclose(p, rational_tanh.P, rtol=2e-7)
  np.testing.assert_allclose(q, rational_tanh.Q, rtol=2e-7)
  assert rel64 < 3e-8
  for coeffs in ((p, q), (rational_tanh.P, rational_tanh.Q)):
    ab, rel = tanh_fit.float32_errors(*coeffs, num=200_001)
    assert ab < 4e-7 and rel < 4e-7


def test_fit_main_prints(capsys):
  tanh_fit.main(["--m", "3", "--n", "3"])
  out = capsys.readouterr().out
  assert out.startswith("P = (") and "float32 on [-12, 12]" in out


@pytest.mark.parametrize("B,H,rational", [
    (10, 12, True), (10, 24, True), (32, 256, True), (64, 512, True),
    (32, 12, False), (32, 64, False), (32, 128, False), (128, 64, False)])
def test_lstm_layer_picks_by_shape(B, H, rational):
  """The LSTM layer's rule: the rational form from H = 256 and for gate maps
  of at most 1024 elements (fused_lstm.tanh_for)."""
  assert (fused_lstm.tanh_for(B, H) is tanh) == rational
  assert (fused_lstm.tanh_for(B, H) is jnp.tanh) == (not rational)
