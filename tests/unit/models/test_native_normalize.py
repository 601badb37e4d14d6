"""estimator_accum.native's layer normalization (models.bert's
normalize_last_axis with one_pass=True, as a training graph's layer norms
run it): its values TensorFlow's ops' bit for bit (the same Eigen
reductions and functors), its gradient within float rounding (the closed
form); odd shapes and bad ones; a whole BERT's gradients alike with the
kernels and without them."""

import numpy as np
import pytest
import tensorflow as tf

from estimator_accum import native
from models.bert import modeling
from tests.helpers import native_kernels

_loaded = native_kernels.loaded


def _values_and_gradients(one_pass, values, upstream, epsilon=1e-12):
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None] * values.ndim)
    dy = tf.compat.v1.placeholder(tf.float32)
    y = modeling.normalize_last_axis(x, epsilon, one_pass=one_pass)
    dx = tf.gradients(y, x, dy)[0]
    types = {op.type for op in tf.compat.v1.get_default_graph()
             .get_operations()}
    with tf.compat.v1.Session() as session:
      return session.run([y, dx], {x: values, dy: upstream}), types


@pytest.mark.parametrize("grappler", [
    False, pytest.param(True, marks=pytest.mark.grappler)])
@pytest.mark.parametrize("shape", [[217, 384], [3, 5, 384], [4, 7], [2, 1],
                                   [5], [0, 384]])
def test_values_bit_for_bit_and_gradients_to_float_rounding(shape, grappler):
  del grappler  # (the mark sets it)
  _loaded()
  rng = np.random.RandomState(len(shape) + shape[-1])
  values = (rng.normal(size=shape) * 3 + 1).astype(np.float32)
  upstream = rng.normal(size=shape).astype(np.float32)
  (fast, fast_gradient), types = _values_and_gradients(True, values,
                                                       upstream)
  (plain, plain_gradient), plain_types = _values_and_gradients(
      False, values, upstream)
  assert "EaNormalize" in types and "EaNormalizeGrad" in types
  assert not any(t.startswith("Ea") for t in plain_types)
  np.testing.assert_array_equal(fast.view(np.uint32), plain.view(np.uint32))
  scale = float(np.abs(plain_gradient).max()) if plain_gradient.size else 0.
  np.testing.assert_allclose(fast_gradient, plain_gradient, rtol=1e-5,
                             atol=1e-6 * scale)


def test_an_epsilon_that_matters_and_a_constant_row():
  # A constant row: variance 0, the output 0 and finite with epsilon.
  _loaded()
  values = np.array([[2.0] * 8, np.linspace(-1e-3, 1e-3, 8)], np.float32)
  upstream = np.ones_like(values)
  (fast, fast_gradient), _ = _values_and_gradients(True, values, upstream,
                                                   epsilon=1e-3)
  (plain, plain_gradient), _ = _values_and_gradients(False, values, upstream,
                                                     epsilon=1e-3)
  np.testing.assert_array_equal(fast, plain)
  assert not fast[0].any() and np.isfinite(fast_gradient).all()
  np.testing.assert_allclose(fast_gradient, plain_gradient, rtol=1e-5,
                             atol=1e-6)


def test_bad_shapes_are_an_error_not_a_crash():
  ops = _loaded()
  with tf.Graph().as_default():
    args = [tf.compat.v1.placeholder(tf.float32) for _ in range(4)]
    backprop = ops.ea_normalize_grad(*args)
    scalar = ops.ea_normalize(args[0], epsilon=1e-12)[0]
    with tf.compat.v1.Session() as session:
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=r"gradients and inputs must have the same "
                               r"shape, got \[2,3\] and \[3,2\]"):
        session.run(backprop, dict(zip(args, [
            np.ones([2, 3], np.float32), np.ones([3, 2], np.float32),
            np.ones([3, 1], np.float32), np.ones([3, 1], np.float32)])))
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=r"mean and rstd must have the shape \[2,1\] "
                               r"of inputs' rows, got \[2,3\] and \[2,1\]"):
        session.run(backprop, dict(zip(args, [
            np.ones([2, 3], np.float32), np.ones([2, 3], np.float32),
            np.ones([2, 3], np.float32), np.ones([2, 1], np.float32)])))
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=r"inputs must have rank >= 1, got shape \[\]"):
        session.run(scalar, {args[0]: np.float32(1.0)})


def test_bert_trains_alike_with_the_kernels_and_without(monkeypatch):
  _loaded()
  def gradients():
    return native_kernels.tiny_bert(config=native_kernels.NO_DROPOUT,
                                    unpadded=True)

  with_kernels, types = gradients()
  assert {"EaLayerNorm", "EaLayerNormGrad", "EaGelu", "EaAttention",
          "EaAttentionGrad"} <= types
  monkeypatch.setattr(native, "layer_norm_op", lambda: None)
  monkeypatch.setattr(native, "normalize_op", lambda: None)
  monkeypatch.setattr(native, "gelu_op", lambda: None)
  monkeypatch.setattr(native, "attention_op", lambda: None)
  without, types = gradients()
  assert not any(t.startswith("Ea") for t in types), sorted(types)
  # Against the largest gradient: some (a layer norm's sum of normalized
  # values) are zero but for rounding either way.
  largest = max(float(np.abs(g).max()) for g in without)
  assert largest > 0
  for a, b in zip(with_kernels, without):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * largest)
