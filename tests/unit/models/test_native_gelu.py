"""estimator_accum.native's exact GELU in one pass (models.bert's
hidden_act="gelu" in a training graph): the values and gradients of
TensorFlow's own ops bit for bit under TensorFlow's default Grappler (its
constant folding turns x / sqrt(2) into a product and folds the
gradient's constants, as the kernel computes them), within float rounding
without it; a whole BERT's gradients the same with it and without it to
float rounding;
graphs to evaluate, predict or export hold TensorFlow's ops only (a
server has no kernel of ours)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from estimator_accum import native
from tests.helpers import native_kernels


def _kernel():
  native_kernels.loaded()
  return native.gelu_op()


def _tensorflows(x):
  return 0.5 * x * (1.0 + tf.math.erf(x / math.sqrt(2.0)))


def _values_and_gradients(function, values, upstream):
  """(gelu, its gradient) of fed values: placeholders, as a graph's
  activations are (a constant would be folded by Grappler at build)."""
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32)
    dy = tf.compat.v1.placeholder(tf.float32)
    y = function(x)
    dx = tf.gradients(y, x, dy)[0]
    with tf.compat.v1.Session() as session:
      return session.run([y, dx], {x: values, dy: upstream}), y.op.type


SHAPES = [[217, 1536], [8, 12, 7], [3, 1], [0, 16], [7], []]


@pytest.mark.grappler
@pytest.mark.parametrize("shape", SHAPES)
def test_one_pass_is_tensorflows_ops_bit_for_bit(shape):
  kernel = _kernel()
  rng = np.random.RandomState(len(shape))
  values = (rng.normal(size=shape) * 4).astype(np.float32)
  upstream = rng.normal(size=shape).astype(np.float32)
  (fast, kind), (plain, _) = (
      _values_and_gradients(kernel, values, upstream),
      _values_and_gradients(_tensorflows, values, upstream))
  assert kind == "EaGelu"
  for a, b in zip(fast, plain):
    assert a.shape == tuple(shape)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("shape", SHAPES)
def test_without_grappler_within_float_rounding(shape):
  # TensorFlow's ops then divide by sqrt(2) and multiply the gradient's
  # constants one at a time: u = x / sqrt(2) a unit in the last place
  # apart, and 1 + erf(u) cancels for u well below 0 (either way): the
  # values agree to float rounding of the tensor's scale.
  kernel = _kernel()
  rng = np.random.RandomState(len(shape))
  values = (rng.normal(size=shape) * 4).astype(np.float32)
  upstream = rng.normal(size=shape).astype(np.float32)
  fast, _ = _values_and_gradients(kernel, values, upstream)
  plain, _ = _values_and_gradients(_tensorflows, values, upstream)
  for a, b in zip(fast, plain):
    scale = float(np.abs(b).max()) if b.size else 0.0
    np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-7 * scale)


@pytest.mark.grappler
def test_the_tails_and_the_non_finite_as_tensorflows_ops():
  # erf saturates past |u| = 4 (Eigen clamps there); inf and NaN go
  # through as TensorFlow's ops take them.
  kernel = _kernel()
  values = np.array([-1e30, -60.0, -5.7, -4.0, -1e-30, 0.0, 1e-30, 4.0, 5.7,
                     60.0, 1e30, np.inf, -np.inf, np.nan], np.float32)
  upstream = np.linspace(-2, 2, values.size).astype(np.float32)
  (fast, _), (plain, _) = (
      _values_and_gradients(kernel, values, upstream),
      _values_and_gradients(_tensorflows, values, upstream))
  for a, b in zip(fast, plain):
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    finite = ~np.isnan(b)
    np.testing.assert_array_equal(a[finite], b[finite])


def test_a_gradient_of_another_shape_is_an_error_not_a_crash():
  _kernel()
  ops = native.load()
  with tf.Graph().as_default():
    dy = tf.compat.v1.placeholder(tf.float32)
    x = tf.compat.v1.placeholder(tf.float32)
    backprop = ops.ea_gelu_grad(dy, x)
    with tf.compat.v1.Session() as session, pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"gradients and inputs must have the same shape, got \[2,3\] "
              r"and \[3,2\]"):
      session.run(backprop, {dy: np.ones([2, 3], np.float32),
                             x: np.ones([3, 2], np.float32)})


def _bert(training):
  return native_kernels.tiny_bert(
      training, config=dict(native_kernels.NO_DROPOUT, hidden_act="gelu"))


@pytest.mark.grappler
def test_bert_trains_alike_with_the_kernel_and_without(monkeypatch):
  # Within float rounding: Grappler folds a whole BERT's graph otherwise
  # than the op's alone (a few elements a unit in the last place apart).
  _kernel()
  with_kernel, types = _bert(True)
  assert "EaGelu" in types and "EaGeluGrad" in types
  monkeypatch.setattr(native, "gelu_op", lambda: None)
  without, types = _bert(True)
  assert not {"EaGelu", "EaGeluGrad"} & types
  assert "Erf" in types
  for a, b in zip(with_kernel, without):
    np.testing.assert_allclose(a, b, rtol=1e-6,
                               atol=1e-6 * float(np.abs(b).max()))
  assert max(np.abs(g).max() for g in with_kernel) > 0


def test_a_graph_to_evaluate_predict_or_export_holds_tensorflows_ops():
  _kernel()
  pooled, types = _bert(False)
  assert "Erf" in types
  assert not any(t.startswith("Ea") for t in types), sorted(types)
  assert np.isfinite(pooled).all()
