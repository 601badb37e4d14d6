"""estimator_accum.native's ops after a bfloat16 product (products.cc,
models.bert's product_type=tf.bfloat16 in a training graph): `EaBiasWiden`
gives the widening cast and the bias's add bit for bit, its gradient the
cast of the incoming gradient bit for bit and the bias's sum within float
rounding; `EaBiasGelu` gives the cast, the add, EaGelu and the narrowing
cast bit for bit, its gradient (the slope kept from the forward pass times
the incoming gradient) theirs within float rounding; the bias's gradient
is the same on any number of threads; a BERT trains with them as without
them; graphs to evaluate, predict or export hold none of them."""

import math

import numpy as np
import pytest
import tensorflow as tf

from estimator_accum import native
from tests.helpers import native_kernels

BF16 = tf.bfloat16.as_numpy_dtype


def _kernel(kind="gelu"):
  native_kernels.loaded()
  return {"gelu": native.bias_gelu_op,
          "widen": native.bias_widen_op}[kind]()


def _unfused(products, bias):
  """The passes EaBiasGelu replaces: TensorFlow's casts and add, EaGelu."""
  return tf.cast(native.gelu_op()(_unfused_widen(products, bias)),
                 tf.bfloat16)


def _unfused_widen(products, bias):
  """The passes EaBiasWiden replaces: TensorFlow's cast and add."""
  return tf.cast(products, tf.float32) + bias


def _run(function, products, bias, upstream, threads=None):
  """(outputs, d products, d bias) of `function` on fed values (the
  incoming gradient `upstream` of the outputs' dtype)."""
  with tf.Graph().as_default():
    p = tf.compat.v1.placeholder(tf.bfloat16, products.shape)
    b = tf.compat.v1.placeholder(tf.float32, bias.shape)
    dy = tf.compat.v1.placeholder(upstream.dtype, upstream.shape)
    y = function(p, b)
    gradients = tf.gradients(y, [p, b], dy)
    config = native_kernels.threads_config(threads)
    with tf.compat.v1.Session(config=config) as session:
      return session.run([y, *gradients],
                         {p: products, b: bias, dy: upstream})


def _values(shape, seed=0, upstream=BF16):
  rng = np.random.RandomState(seed)
  return ((rng.normal(size=shape) * 3).astype(BF16),
          rng.normal(size=shape[-1:]).astype(np.float32),
          rng.normal(size=shape).astype(upstream))


def _bits(array):
  return np.asarray(array).view(np.uint16)


SHAPES = [[217, 1536], [3, 5, 24], [7, 13], [1, 1], [0, 8], [2, 0]]


@pytest.mark.parametrize("shape", SHAPES)
def test_widen_is_the_cast_and_the_add_bit_for_bit(shape):
  kernel = _kernel("widen")
  values = _values(shape, upstream=np.float32)
  fused, unfused = _run(kernel, *values), _run(_unfused_widen, *values)
  assert fused[0].dtype == np.float32 and fused[0].shape == tuple(shape)
  assert fused[1].dtype == BF16 and fused[2].shape == tuple(shape[-1:])
  # The outputs and the products' gradient (the incoming gradient's cast)
  # bit for bit; the bias's gradient is a sum in another order.
  for a, b in zip(fused[:2], unfused[:2]):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8),
                                  np.asarray(b).view(np.uint8))
  scale = float(np.abs(unfused[2]).max()) if unfused[2].size else 0.0
  np.testing.assert_allclose(fused[2], unfused[2], rtol=1e-5,
                             atol=1e-6 * scale)


@pytest.mark.parametrize("shape", SHAPES)
def test_outputs_are_the_unfused_passes_bit_for_bit(shape):
  kernel = _kernel()
  values = _values(shape)
  fused, unfused = _run(kernel, *values), _run(_unfused, *values)
  assert fused[0].dtype == BF16 and fused[0].shape == tuple(shape)
  np.testing.assert_array_equal(_bits(fused[0]), _bits(unfused[0]))


@pytest.mark.parametrize("shape", SHAPES)
def test_gradients_are_the_unfused_within_float_rounding(shape):
  kernel = _kernel()
  values = _values(shape, seed=1)
  _, products, bias = _run(kernel, *values)
  _, products_expected, bias_expected = _run(_unfused, *values)
  assert products.dtype == BF16 and products.shape == tuple(shape)
  assert bias.dtype == np.float32 and bias.shape == tuple(shape[-1:])
  # The float32 gradient before its rounding to bfloat16 differs in the
  # last places (a product of the slope, not EaGeluGrad's two terms): a
  # value on a rounding boundary may land one bfloat16 unit apart.
  a, b = products.astype(np.float32), products_expected.astype(np.float32)
  scale = float(np.abs(b).max()) if b.size else 0.0
  np.testing.assert_allclose(a, b, rtol=2 ** -7, atol=1e-6 * scale)
  assert (a != b).mean() < 1e-3 if a.size else True
  np.testing.assert_allclose(
      bias, bias_expected, rtol=1e-5,
      atol=1e-6 * (float(np.abs(bias_expected).max()) if bias.size else 0))


def test_gradients_against_float64():
  # The derivative of 0.5 x (1 + erf(x / sqrt 2)) at x = product + bias,
  # times the incoming gradient, in float64: the op's bfloat16 gradient
  # is that rounded (a unit at most), the bias's its sum over rows.
  kernel = _kernel()
  products, bias, upstream = _values([300, 40], seed=2)
  _, d_products, d_bias = _run(kernel, products, bias, upstream)
  x = products.astype(np.float64) + bias.astype(np.float64)
  erf = np.vectorize(math.erf)(x / np.sqrt(2))
  slope = 0.5 * (1 + erf) + x * np.exp(
      -x * x / 2) / np.sqrt(2 * np.pi)
  exact = slope * upstream.astype(np.float64)
  np.testing.assert_allclose(d_products.astype(np.float64), exact,
                             rtol=2 ** -8, atol=1e-6)
  np.testing.assert_allclose(d_bias, exact.sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["gelu", "widen"])
def test_the_bias_gradient_is_the_same_on_one_thread_and_two(kind):
  kernel = _kernel(kind)
  values = _values([1000, 96], seed=3,
                   upstream=BF16 if kind == "gelu" else np.float32)
  one, two = (_run(kernel, *values, threads=threads) for threads in (1, 2))
  for a, b in zip(one, two):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint8),
                                  np.asarray(b).view(np.uint8))


def test_non_finite_values_go_through_as_the_unfused_passes():
  kernel = _kernel()
  products = np.array([[-np.inf, np.inf, np.nan, -60.0, 0.0, 60.0, 3e38,
                        -3e38]], BF16)
  bias = np.zeros([8], np.float32)
  upstream = np.ones([1, 8], BF16)
  fused, unfused = _run(kernel, products, bias, upstream), _run(
      _unfused, products, bias, upstream)
  for a, b in zip(fused[:2], unfused[:2]):
    a, b = a.astype(np.float32), b.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_array_equal(a[~np.isnan(b)], b[~np.isnan(b)])


@pytest.mark.parametrize("kind", ["gelu", "widen"])
def test_a_bias_of_another_width_is_an_error_naming_it(kind):
  _kernel()
  op = getattr(native.load(), f"ea_bias_{kind}")
  with tf.Graph().as_default():
    p = tf.compat.v1.placeholder(tf.bfloat16)
    b = tf.compat.v1.placeholder(tf.float32)
    outputs = op(p, b)
    with tf.compat.v1.Session() as session, pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"bias must be a vector of the products' last dimension 3, "
              r"got shape \[4\]"):
      session.run(outputs, {p: np.ones([2, 3], BF16),
                            b: np.ones([4], np.float32)})
    with pytest.raises(ValueError, match="must be equal"):
      op(tf.zeros([2, 3], tf.bfloat16), tf.zeros([4]))


def test_gradients_of_another_shape_are_an_error_not_a_crash():
  _kernel()
  ops = native.load()
  with tf.Graph().as_default():
    dy = tf.compat.v1.placeholder(tf.bfloat16)
    slopes = tf.compat.v1.placeholder(tf.float32)
    backprops = ops.ea_bias_gelu_grad(dy, slopes)
    with tf.compat.v1.Session() as session, pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"gradients and slopes must have the same shape, got \[2,3\] "
              r"and \[3,2\]"):
      session.run(backprops, {dy: np.ones([2, 3], BF16),
                              slopes: np.ones([3, 2], np.float32)})


@pytest.mark.parametrize("layout", [{}, dict(unpadded=True)])
def test_bert_trains_alike_with_the_op_and_without(monkeypatch, layout):
  _kernel()
  arguments = dict(config=dict(native_kernels.NO_DROPOUT),
                   product_type=tf.bfloat16, **layout)
  fused, types = native_kernels.tiny_bert(**arguments)
  assert {"EaBiasGelu", "EaBiasGeluGrad", "EaBiasWiden",
          "EaBiasWidenGrad"} <= types
  assert "EaGelu" not in types
  monkeypatch.setattr(native, "bias_gelu_op", lambda: None)
  monkeypatch.setattr(native, "bias_widen_op", lambda: None)
  unfused, types = native_kernels.tiny_bert(**arguments)
  assert not {"EaBiasGelu", "EaBiasWiden"} & types
  assert "EaGelu" in types
  # The forward pass is the same bit for bit; the gradients differ by the
  # biases' sums' order and where a bfloat16 rounding of the GELU's
  # gradient fell otherwise (2e-8 of the largest here, 2026-12-07).
  scale = max(float(np.abs(g).max()) for g in unfused)
  assert scale > 0
  for a, b in zip(fused, unfused):
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-6 * scale)


def test_a_graph_to_evaluate_predict_or_export_holds_none_of_it():
  _kernel()
  pooled, types = native_kernels.tiny_bert(False, product_type=tf.bfloat16)
  assert "Erf" in types
  assert not any(t.startswith("Ea") for t in types), sorted(types)
  assert np.isfinite(pooled).all()
