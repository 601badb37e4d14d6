"""estimator_accum.native's whole layer norm (`EaLayerNorm`, normalize.cc;
models.bert's layer norms in a training graph): its output is
EaNormalize's times gamma plus beta bit for bit, its bfloat16 twin the
Cast's bit for bit; its gradient takes both outputs' gradients, gives the
input's as the unfused ops do bit for bit and gamma's and beta's within
float rounding (summed in double, the same on one thread and two); bad
shapes and attributes are errors naming them; a BERT whose products are
bfloat16 reads the twin and trains as without the op."""

import numpy as np
import pytest
import tensorflow as tf

from estimator_accum import native
from tests.helpers import native_kernels

BF16 = tf.bfloat16.as_numpy_dtype
EPSILON = 1e-12


def _fused(x, gamma, beta, narrow):
  return native.layer_norm_op()(x, gamma, beta, EPSILON, narrow=narrow)


def _unfused(x, gamma, beta, narrow):
  """What EaLayerNorm replaces: EaNormalize, TensorFlow's Mul and AddV2,
  and the Cast a bfloat16 product reads."""
  y = native.normalize_op()(x, EPSILON) * gamma + beta
  return (y, tf.cast(y, tf.bfloat16)) if narrow else y


def _run(function, values, narrow=True, threads=None):
  """(output, twin or None, d inputs, d gamma, d beta) of `function` on
  `values` (inputs, gamma, beta, the output's and the twin's incoming
  gradients)."""
  x_value, gamma_value, beta_value, dy_value, dn_value = values
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, x_value.shape)
    gamma = tf.compat.v1.placeholder(tf.float32, gamma_value.shape)
    beta = tf.compat.v1.placeholder(tf.float32, beta_value.shape)
    dy = tf.compat.v1.placeholder(tf.float32, x_value.shape)
    dn = tf.compat.v1.placeholder(tf.bfloat16, x_value.shape)
    outputs = function(x, gamma, beta, narrow)
    y, twin = outputs if narrow else (outputs, None)
    gradients = tf.gradients([y] + ([twin] if narrow else []),
                             [x, gamma, beta], [dy] + ([dn] if narrow else []))
    types = {op.type for op in tf.compat.v1.get_default_graph()
             .get_operations()}
    config = native_kernels.threads_config(threads)
    with tf.compat.v1.Session(config=config) as session:
      done = session.run([y] + ([twin] if narrow else []) + gradients,
                         {x: x_value, gamma: gamma_value, beta: beta_value,
                          dy: dy_value, dn: dn_value})
  if not narrow:
    done.insert(1, None)
  return done, types


def _values(shape, seed=0):
  rng = np.random.RandomState(seed)
  width = shape[-1:]
  return ((rng.normal(size=shape) * 3 + 1).astype(np.float32),
          rng.normal(1.0, 0.3, size=width).astype(np.float32),
          rng.normal(0.0, 0.3, size=width).astype(np.float32),
          rng.normal(size=shape).astype(np.float32),
          rng.normal(size=shape).astype(BF16))


def _same_bits(a, b):
  np.testing.assert_array_equal(np.asarray(a).view(np.uint8),
                                np.asarray(b).view(np.uint8))


SHAPES = [[217, 384], [3, 5, 13], [300, 40], [2, 1], [5], [0, 384]]


@pytest.mark.parametrize("grappler", [
    False, pytest.param(True, marks=pytest.mark.grappler)])
@pytest.mark.parametrize("narrow", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_outputs_and_input_gradient_bit_for_bit(shape, narrow, grappler):
  del grappler  # (the mark sets it)
  native_kernels.loaded()
  values = _values(shape, seed=len(shape) + shape[-1])
  (y, twin, dx, dgamma, dbeta), types = _run(_fused, values, narrow)
  (y0, twin0, dx0, dgamma0, dbeta0), types0 = _run(_unfused, values, narrow)
  assert {"EaLayerNorm", "EaLayerNormGrad"} <= types
  assert "EaLayerNorm" not in types0
  _same_bits(y, y0)
  _same_bits(dx, dx0)
  if narrow:
    _same_bits(twin, twin0)
  # gamma's and beta's: a sum over rows, in double here, in float there.
  for ours, theirs in ((dgamma, dgamma0), (dbeta, dbeta0)):
    scale = float(np.abs(theirs).max()) if theirs.size else 0.0
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6 * scale)


def test_gradients_against_float64():
  native_kernels.loaded()
  x, gamma, beta, dy, dn = _values([217, 384], seed=7)
  (_, _, dx, dgamma, dbeta), _ = _run(_fused, (x, gamma, beta, dy, dn))
  c = x.astype(np.float64) - x.mean(-1, keepdims=True, dtype=np.float64)
  rstd = 1 / np.sqrt((c ** 2).mean(-1, keepdims=True) + EPSILON)
  normalized = c * rstd
  g = dy.astype(np.float64) + dn.astype(np.float64)  # both outputs'
  h = g * gamma
  exact_dx = rstd * (h - h.mean(-1, keepdims=True) -
                     normalized * (h * normalized).mean(-1, keepdims=True))
  np.testing.assert_allclose(dx, exact_dx, rtol=1e-4,
                             atol=1e-5 * np.abs(exact_dx).max())
  np.testing.assert_allclose(dgamma, (g * normalized).sum(0), rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(dbeta, g.sum(0), rtol=1e-5, atol=1e-5)


def test_gamma_and_beta_gradients_are_the_same_on_one_thread_and_two():
  native_kernels.loaded()
  values = _values([1000, 96], seed=3)
  one, two = (_run(_fused, values, threads=threads)[0]
              for threads in (1, 2))
  for a, b in zip(one, two):
    _same_bits(a, b)


def test_non_finite_values_go_through_as_the_unfused_ops():
  native_kernels.loaded()
  x = np.array([[np.inf, 1.0, 2.0, 3.0], [np.nan, 1.0, 2.0, 3.0],
                [3e38, -3e38, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
  gamma = np.array([1.0, np.inf, 2.0, 0.5], np.float32)
  beta = np.zeros([4], np.float32)
  values = (x, gamma, beta, np.ones_like(x), np.ones(x.shape, BF16))
  fused, _ = _run(_fused, values)
  unfused, _ = _run(_unfused, values)
  for a, b in zip(fused, unfused):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_array_equal(a[~np.isnan(b)], b[~np.isnan(b)])


def test_bad_shapes_and_attributes_are_errors_naming_them():
  ops = native_kernels.loaded()
  with tf.Graph().as_default():
    x, gamma, beta = (tf.compat.v1.placeholder(tf.float32)
                      for _ in range(3))
    forward = ops.ea_layer_norm(x, gamma, beta, epsilon=EPSILON, twins=1)
    dn = tf.compat.v1.placeholder(tf.bfloat16)
    statistics = [tf.compat.v1.placeholder(tf.float32) for _ in range(2)]
    backward = ops.ea_layer_norm_grad(x, [dn], x, gamma, *statistics)
    three = np.ones([2, 3], np.float32)
    with tf.compat.v1.Session() as session:
      for name in ("gamma", "beta"):
        fed = {x: three, gamma: np.ones([3], np.float32),
               beta: np.ones([3], np.float32)}
        fed[{"gamma": gamma, "beta": beta}[name]] = np.ones([4], np.float32)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"{name} must be a vector of the inputs' "
                                 rf"last dimension 3, got shape \[4\]"):
          session.run(forward, fed)
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=r"narrow_gradients and inputs must have the "
                               r"same shape, got \[3,2\] and \[2,3\]"):
        session.run(backward, {x: three, dn: np.ones([3, 2], BF16),
                               gamma: np.ones([3], np.float32),
                               statistics[0]: np.ones([2, 1], np.float32),
                               statistics[1]: np.ones([2, 1], np.float32)})
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=r"mean and rstd must have the shape \[2,1\] "
                               r"of inputs' rows, got \[2,3\] and \[2,1\]"):
        session.run(backward, {x: three, dn: np.ones([2, 3], BF16),
                               gamma: np.ones([3], np.float32),
                               statistics[0]: three,
                               statistics[1]: np.ones([2, 1], np.float32)})
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=r"inputs must have rank >= 1, got shape \[\]"):
        session.run(forward, {x: np.float32(1), gamma: np.ones([1]),
                              beta: np.ones([1])})
    twins = ops.ea_layer_norm(tf.ones([2, 3]), tf.ones([3]), tf.ones([3]),
                              epsilon=EPSILON, twins=2)
    with tf.compat.v1.Session() as session, pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"twins must be 0 or 1 \(a bfloat16 copy of the output or "
              r"none\), got 2"):
      session.run(twins)
    with pytest.raises(ValueError, match="must be equal"):
      ops.ea_layer_norm(tf.zeros([2, 3]), tf.zeros([4]), tf.zeros([4]),
                        epsilon=EPSILON)


@pytest.mark.parametrize("layout", [{}, dict(unpadded=True)])
def test_bert_reads_the_twin_and_trains_alike_without_the_op(monkeypatch,
                                                             layout):
  native_kernels.loaded()
  arguments = dict(config=dict(native_kernels.NO_DROPOUT),
                   product_type=tf.bfloat16, **layout)
  fused, types = native_kernels.tiny_bert(**arguments)
  assert {"EaLayerNorm", "EaLayerNormGrad"} <= types
  assert "EaNormalize" not in types
  monkeypatch.setattr(native, "layer_norm_op", lambda: None)
  unfused, types = native_kernels.tiny_bert(**arguments)
  assert not {"EaLayerNorm", "EaLayerNormGrad"} & types
  # The forward pass is the same bit for bit; the gradients differ by
  # gamma's and beta's sums' order.
  scale = max(float(np.abs(g).max()) for g in unfused)
  assert scale > 0
  for a, b in zip(fused, unfused):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * scale)


def test_the_twin_is_the_intermediate_products_operand():
  native_kernels.loaded()
  norms = []
  native_kernels.tiny_bert(product_type=tf.bfloat16, unpadded=True,
                           inspect=lambda graph: norms.extend(
                               op for op in graph.get_operations()
                               if op.type == "EaLayerNorm"))
  twins = [op for op in norms if op.get_attr("twins") == 1]
  # One a layer: the attention's output, read by the feed-forward block.
  assert len(twins) == 2, [op.name for op in norms]
  for op in twins:
    assert "attention/output" in op.name
    readers = {consumer.type for consumer in op.outputs[1].consumers()}
    assert readers and "Cast" not in readers, readers
