"""estimator_accum.native's residual layer norm (`EaResidualLayerNorm`,
normalize.cc; models.bert's two residual blocks a layer in a training
graph with keyed dropout): the layer norm of keyed dropout of a product
(bfloat16 widened with its bias, or float32) plus the residual is the
unfused ops' (EaBiasWiden, EaKeyedDropout, AddV2, EaLayerNorm) bit for bit,
forward and backward, on one thread and two; bad shapes and attributes are
errors naming them; a BERT trains to the same gradients with it and
without it, and only its training graphs hold it."""

import numpy as np
import pytest
import tensorflow as tf

from estimator_accum import native
from estimator_accum.window import keyed_dropout
from tests.helpers import native_kernels

BF16 = tf.bfloat16.as_numpy_dtype
EPSILON = 1e-12
RATE = 0.1
SITE = "bert/encoder/layer_0/output/"


def _fused(products, bias, residual, gamma, beta, keys, narrow):
  rows, columns, threshold = keyed_dropout.words(
      RATE, keys, tf.shape(products)[-1], seed=5, site=SITE)
  return native.residual_layer_norm_op()(
      products, bias, residual, gamma, beta, EPSILON,
      (rows, columns, threshold, 1.0 / (1.0 - RATE)), narrow=narrow)


def _unfused(products, bias, residual, gamma, beta, keys, narrow):
  """What EaResidualLayerNorm replaces: EaBiasWiden (a bfloat16 product)
  or BiasAdd (float32), EaKeyedDropout, AddV2 and EaLayerNorm."""
  if bias is not None:
    products = (native.bias_widen_op()(products, bias)
                if products.dtype == tf.bfloat16
                else tf.nn.bias_add(products, bias))
  dropped = keyed_dropout.keyed_dropout(products, RATE, keys, seed=5,
                                        site=SITE)
  return native.layer_norm_op()(dropped + residual, gamma, beta, EPSILON,
                                narrow=narrow)


def _values(shape, dtype, seed=0):
  rng = np.random.RandomState(seed)
  width = shape[-1:]
  return dict(
      products=(rng.normal(size=shape) * 2).astype(dtype),
      bias=rng.normal(size=width).astype(np.float32),
      residual=rng.normal(1.0, 2.0, size=shape).astype(np.float32),
      gamma=rng.normal(1.0, 0.3, size=width).astype(np.float32),
      beta=rng.normal(0.0, 0.3, size=width).astype(np.float32),
      keys=rng.randint(0, 2**40, size=shape[:-1]).astype(np.int64),
      dy=rng.normal(size=shape).astype(np.float32),
      dn=rng.normal(size=shape).astype(BF16))


def _run(function, values, biased=True, narrow=True, threads=None):
  """([output, twin or None, d products, d bias or None, d residual,
  d gamma, d beta], the graph's op types) of `function` on `values`."""
  with tf.Graph().as_default():
    fed = {name: tf.compat.v1.placeholder(tf.as_dtype(value.dtype),
                                          value.shape)
           for name, value in values.items()}
    bias = fed["bias"] if biased else None
    outputs = function(fed["products"], bias, fed["residual"], fed["gamma"],
                       fed["beta"], fed["keys"], narrow)
    y, twin = outputs if narrow else (outputs, None)
    wrt = [fed["products"], bias, fed["residual"], fed["gamma"], fed["beta"]]
    gradients = tf.gradients(
        [y] + ([twin] if narrow else []), [x for x in wrt if x is not None],
        [fed["dy"]] + ([fed["dn"]] if narrow else []))
    if not biased:
      gradients.insert(1, None)
    types = {op.type for op in tf.compat.v1.get_default_graph()
             .get_operations()}
    fetches = [y, twin] + gradients
    with tf.compat.v1.Session(
        config=native_kernels.threads_config(threads)) as session:
      done = session.run([f for f in fetches if f is not None],
                         {fed[name]: value for name, value in values.items()})
  done = iter(done)
  return [None if f is None else next(done) for f in fetches], types


def _same_bits(a, b):
  np.testing.assert_array_equal(np.asarray(a).view(np.uint8),
                                np.asarray(b).view(np.uint8))


SHAPES = [[217, 384], [3, 5, 13], [300, 40], [2, 1], [5], [0, 384]]
# (products' dtype, with a bias): the bfloat16 product before its widening
# and bias; the float32 product with its bias added (BiasAdd, fused into
# the product by Grappler).
KINDS = [(BF16, True), (np.float32, False)]


@pytest.mark.parametrize("grappler", [
    False, pytest.param(True, marks=pytest.mark.grappler)])
@pytest.mark.parametrize("narrow", [True, False])
@pytest.mark.parametrize("kind", KINDS, ids=["bfloat16", "float32"])
@pytest.mark.parametrize("shape", SHAPES)
def test_outputs_and_gradients_bit_for_bit(shape, kind, narrow, grappler):
  del grappler  # (the mark sets it)
  native_kernels.loaded()
  dtype, biased = kind
  values = _values(shape, dtype, seed=len(shape) + shape[-1])
  fused, types = _run(_fused, values, biased, narrow)
  unfused, types0 = _run(_unfused, values, biased, narrow)
  assert {"EaResidualLayerNorm", "EaResidualLayerNormGrad"} <= types
  assert not {"EaKeyedDropout", "EaLayerNorm", "EaBiasWiden"} & types
  assert "EaResidualLayerNorm" not in types0
  for name, ours, theirs in zip(
      ["output", "twin", "d products", "d bias", "d residual", "d gamma",
       "d beta"], fused, unfused):
    assert (ours is None) == (theirs is None), name
    if ours is not None:
      _same_bits(ours, theirs)


def test_dropout_drops_and_scales_as_asked():
  # Where gamma is 1 and beta 0 the sum's dropped elements are the
  # residual's: about RATE of them, the others the scaled product's.
  native_kernels.loaded()
  values = _values([400, 64], BF16, seed=11)
  with tf.Graph().as_default():
    products = tf.constant(values["products"])
    bias, residual = (tf.constant(values[name]) for name in
                      ("bias", "residual"))
    rows, columns, threshold = keyed_dropout.words(
        RATE, tf.constant(values["keys"]), 64, seed=5, site=SITE)
    op = native.residual_layer_norm_op()(
        products, bias, residual, tf.ones([64]), tf.zeros([64]), EPSILON,
        (rows, columns, threshold, 1.0 / (1.0 - RATE))).op
    with tf.compat.v1.Session() as session:
      sums = session.run(op.outputs[-1])
  widened = values["products"].astype(np.float32) + values["bias"]
  kept = sums != values["residual"]
  assert 0.08 < 1 - kept.mean() < 0.12, 1 - kept.mean()
  np.testing.assert_array_equal(
      sums[kept], (widened * np.float32(1 / (1 - RATE)))[kept] +
      values["residual"][kept])


def test_float32_products_with_a_bias_as_bias_add():
  native_kernels.loaded()
  values = _values([217, 96], np.float32, seed=4)
  fused, _ = _run(_fused, values, biased=True, narrow=False)
  unfused, _ = _run(_unfused, values, biased=True, narrow=False)
  for index, (ours, theirs) in enumerate(zip(fused, unfused)):
    if index == 3:  # the bias's: in double here, BiasAddGrad's in float
      np.testing.assert_allclose(ours, theirs, rtol=1e-5,
                                 atol=1e-6 * np.abs(theirs).max())
    elif ours is not None:
      _same_bits(ours, theirs)


def test_the_same_on_one_thread_and_two():
  native_kernels.loaded()
  values = _values([1000, 96], BF16, seed=3)
  one, two = (_run(_fused, values, threads=threads)[0]
              for threads in (1, 2))
  for a, b in zip(one, two):
    _same_bits(a, b)


def test_bad_shapes_and_attributes_are_errors_naming_them():
  ops = native_kernels.loaded()
  with tf.Graph().as_default():
    p, b, r, g, be = (tf.compat.v1.placeholder(tf.float32)
                      for _ in range(5))
    rows, columns = (tf.compat.v1.placeholder(tf.uint32) for _ in range(2))
    forward = ops.ea_residual_layer_norm(
        p, [b], r, g, be, rows, columns, epsilon=EPSILON, threshold=7,
        scale=2.0).outputs
    dn = tf.compat.v1.placeholder(tf.bfloat16)
    mean, rstd = (tf.compat.v1.placeholder(tf.float32) for _ in range(2))
    backward = ops.ea_residual_layer_norm_grad(
        p, [dn], r, g, mean, rstd, rows, columns, T=tf.bfloat16, biases=1,
        threshold=7, scale=2.0)
    good = {p: np.ones([2, 3], np.float32), b: np.ones([3], np.float32),
            r: np.ones([2, 3], np.float32), g: np.ones([3], np.float32),
            be: np.ones([3], np.float32), rows: np.ones([2], np.uint32),
            columns: np.ones([3], np.uint32)}
    bad_forward = [
        (b, np.ones([4], np.float32),
         r"bias must be a vector of the products' last dimension 3, got "
         r"shape \[4\]"),
        (r, np.ones([3, 2], np.float32),
         r"residual and products must have the same shape, got \[3,2\] "
         r"and \[2,3\]"),
        (g, np.ones([2], np.float32),
         r"gamma must be a vector of the products' last dimension 3"),
        (be, np.ones([1, 3], np.float32),
         r"beta must be a vector of the products' last dimension 3"),
        (rows, np.ones([3], np.uint32),
         r"rows must have the shape of products without its last axis, "
         r"got \[3\] for \[2,3\]"),
        (columns, np.ones([2], np.uint32),
         r"columns must hold one word a column of products, got shape "
         r"\[2\]"),
        (p, np.float32(1), r"products must have rank >= 1, got shape \[\]"),
    ]
    stats = {mean: np.ones([2, 1], np.float32),
             rstd: np.ones([2, 1], np.float32),
             dn: np.ones([2, 3], BF16)}
    bad_backward = [
        (dn, np.ones([3, 2], BF16),
         r"narrow_gradients and sums must have the same shape, got \[3,2\] "
         r"and \[2,3\]"),
        (mean, np.ones([2, 3], np.float32),
         r"mean and rstd must have the shape \[2,1\] of inputs' rows, got "
         r"\[2,3\] and \[2,1\]"),
        (rows, np.ones([2, 1], np.uint32),
         r"rows must have the shape of sums without its last axis"),
    ]
    with tf.compat.v1.Session() as session:
      session.run(forward, good)  # the good values run
      session.run(backward, {**good, **stats})
      for placeholder, value, message in bad_forward:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
          session.run(forward, {**good, placeholder: value})
      for placeholder, value, message in bad_backward:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
          session.run(backward, {**good, **stats, placeholder: value})
    for attributes, message in (
        (dict(twins=2), r"twins must be 0 or 1"),
        (dict(threshold=2**32), r"threshold must be in \[0, 2\*\*32\), got "
                                r"4294967296"),
        (dict(threshold=-1), r"threshold must be in \[0, 2\*\*32\), got -1")):
      op = ops.ea_residual_layer_norm(
          tf.ones([2, 3]), [], tf.ones([2, 3]), tf.ones([3]), tf.ones([3]),
          tf.ones([2], tf.uint32), tf.ones([3], tf.uint32), epsilon=EPSILON,
          **dict(dict(threshold=7, scale=2.0), **attributes))
      with tf.compat.v1.Session() as session, pytest.raises(
          tf.errors.InvalidArgumentError, match=message):
        session.run(op)
    with pytest.raises(ValueError, match="must be equal"):
      ops.ea_residual_layer_norm(
          tf.zeros([2, 3]), [], tf.zeros([2, 3]), tf.zeros([4]),
          tf.zeros([4]), tf.ones([2], tf.uint32), tf.ones([3], tf.uint32),
          epsilon=EPSILON, threshold=7, scale=2.0)


KEYS = np.arange(3, dtype=np.int64) * 7919


@pytest.mark.parametrize("layout", [
    {}, dict(unpadded=True), dict(unpadded=True, pooled_only=True)],
    ids=["padded", "unpadded", "pooled_only"])
@pytest.mark.parametrize("product_type", [tf.bfloat16, None],
                         ids=["bfloat16", "float32"])
def test_bert_trains_to_the_same_gradients_without_the_op(
    monkeypatch, product_type, layout):
  native_kernels.loaded()
  arguments = dict(product_type=product_type, dropout_keys=KEYS, **layout)
  fused, types = native_kernels.tiny_bert(**arguments)
  assert {"EaResidualLayerNorm", "EaResidualLayerNormGrad"} <= types
  monkeypatch.setattr(native, "residual_layer_norm_op", lambda: None)
  unfused, types = native_kernels.tiny_bert(**arguments)
  assert "EaResidualLayerNorm" not in types
  assert max(float(np.abs(g).max()) for g in unfused) > 0
  for a, b in zip(fused, unfused):
    _same_bits(a, b)


def test_two_a_layer_in_training_graphs_only():
  native_kernels.loaded()
  found = []
  native_kernels.tiny_bert(product_type=tf.bfloat16, unpadded=True,
                           dropout_keys=KEYS,
                           inspect=lambda graph: found.extend(
                               op for op in graph.get_operations()
                               if op.type == "EaResidualLayerNorm"))
  # The attention's output (its twin the feed-forward product's operand)
  # and the layer's output, in each of the 2 layers.
  assert sorted(op.name.split("/")[2:4] for op in found) == [
      ["layer_0", "attention"], ["layer_0", "output"],
      ["layer_1", "attention"], ["layer_1", "output"]]
  for op in found:
    assert op.get_attr("twins") == int("attention" in op.name)
    assert op.get_attr("biases") == 1 and op.get_attr("T") == tf.bfloat16
  for arguments in (dict(training=False, dropout_keys=KEYS),
                    dict(config=dict(native_kernels.NO_DROPOUT),
                         dropout_keys=KEYS),
                    dict()):  # tf.nn.dropout
    _, types = native_kernels.tiny_bert(product_type=tf.bfloat16,
                                        **arguments)
    assert "EaResidualLayerNorm" not in types, arguments
