"""A bfloat16 (or float16) product's gradient added into its float32
accumulator in one pass (estimator_accum.native's `EaAccumulate`): the
kernel reads the narrow gradient itself where TensorFlow's ops write a
float32 copy (the cast) and read it back (the add). The same values bit
for bit: the kernel against the cast and the add, and a window trained
with it against the same window with the native kernels off
(`ESTIMATOR_ACCUM_NATIVE=0`, in a fresh process), on one device and under
MirroredStrategy."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from harness import support
from tests.helpers import native_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
NARROW = {"bfloat16": tf.bfloat16, "float16": tf.float16}


def _values(shape, dtype, seed):
  """Random values of every size bfloat16 and float16 hold, their
  subnormals, both zeros, infinities and a NaN among them."""
  rng = np.random.RandomState(seed)
  values = (rng.normal(size=shape) *
            np.exp(rng.uniform(-20, 20, size=shape))).astype(np.float32)
  flat = values.reshape(-1)
  specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3e-39, 6e-8]
  flat[:min(len(specials), flat.size)] = specials[:flat.size]
  return tf.cast(tf.constant(values), dtype)


@pytest.mark.parametrize("dtype", sorted(NARROW))
@pytest.mark.parametrize("shape", [[384, 1536], [7], [], [0, 3]])
@pytest.mark.parametrize("weight", [None, 0.25, 1 / 3, -2.0])
def test_the_kernel_is_the_cast_and_the_add_bit_for_bit(dtype, shape, weight):
  add = native_kernels.loaded().ea_accumulate
  with tf.Graph().as_default():
    start = tf.constant(np.random.RandomState(1).normal(size=shape)
                        .astype(np.float32))
    ours, theirs = tf.Variable(start), tf.Variable(start)
    steps = []
    for step in range(3):
      value = _values(shape, NARROW[dtype], seed=step)
      widened = tf.cast(value, tf.float32)
      if weight is None:
        plain = theirs.assign_add(widened, read_value=False)
        one_pass = add(ours.handle, value, tf.ones([]))
      else:
        plain = tf.raw_ops.ResourceApplyGradientDescent(
            var=theirs.handle, alpha=-tf.constant(weight, tf.float32),
            delta=widened)
        one_pass = add(ours.handle, value, tf.constant(weight, tf.float32))
      steps.append((plain, one_pass))
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for plain, one_pass in steps:
        session.run([plain, one_pass])
      expected, actual = session.run([theirs, ours])
  np.testing.assert_array_equal(actual.view(np.uint32),
                                expected.view(np.uint32))
  if np.size(expected) > 5:  # the specials were among the values
    assert np.isnan(expected).any() and not np.isnan(expected).all()


def test_a_reader_of_the_sum_keeps_what_it_read():
  add = native_kernels.loaded().ea_accumulate
  with tf.Graph().as_default():
    total = tf.Variable(tf.ones([1000]))
    before = total.read_value()
    with tf.control_dependencies([before]):
      added = add(total.handle, tf.ones([1000], tf.bfloat16),
                  tf.constant(2.0))
    with tf.control_dependencies([added]):
      after = total.read_value()
    with tf.compat.v1.Session() as session:
      session.run(total.initializer)
      read_before, read_after = session.run([before, after])
  np.testing.assert_array_equal(read_before, np.ones(1000, np.float32))
  np.testing.assert_array_equal(read_after, np.full(1000, 3.0, np.float32))


@pytest.mark.parametrize("total, value, weight, said", [
    (([3], np.float32), [4], 1.0,
     "the accumulator's shape [3] is not the value's [4]"),
    (([3], np.float64), [3], 1.0,
     "the accumulator must be float32, got double"),
    (([3], np.float32), [3], [1.0, 2.0],
     "weight must be a scalar, got shape [2]"),
], ids=["shape", "dtype", "weight"])
def test_bad_input_is_an_error_naming_it(total, value, weight, said):
  add = native_kernels.loaded().ea_accumulate
  with tf.Graph().as_default():
    variable = tf.Variable(np.zeros(*total))
    op = add(variable.handle, tf.zeros(value, tf.bfloat16),
             tf.constant(weight, tf.float32))
    with tf.compat.v1.Session() as session:
      session.run(variable.initializer)
      with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        session.run(op)
  assert said in str(raised.value)


# Trains the test model's window with its forward pass in DTYPE through the
# library (one graph, or Estimator under MirroredStrategy on two CPUs) and
# saves the weights and the graph's op types.
_TRAIN = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    import estimator_accum
    from harness import support

    dtype, replicas, model_dir, out = sys.argv[1:5]
    replicas = int(replicas)
    K, MICRO_BATCH, UPDATES = 4, 8, 3
    compute = tf.as_dtype(dtype)
    loss_scale = 128.0 if compute == tf.float16 else None
    optimizer_fn = lambda: tf.compat.v1.train.AdamOptimizer(0.05)
    data = support.make_data(replicas * K * MICRO_BATCH * UPDATES, seed=5)
    if replicas == 1:
      tf.compat.v1.disable_eager_execution()
      graph = tf.Graph()
      with graph.as_default():
        tf.compat.v1.train.get_or_create_global_step()
        inputs = {key: tf.constant(value) for key, value in data.items()}
        position = tf.compat.v1.placeholder(tf.int32, [])
        rows = {key: value[position * MICRO_BATCH:
                           (position + 1) * MICRO_BATCH]
                for key, value in inputs.items()}
        loss = support.model_loss(rows, rows["labels"], compute_dtype=compute)
        train_op = estimator_accum.build_accumulating_train_op(
            loss, optimizer_fn(), K, loss_scale=loss_scale, summaries=False,
            log_every_n_micro_batches=None)
        with tf.compat.v1.Session() as session:
          session.run(tf.compat.v1.global_variables_initializer())
          for step in range(K * UPDATES):
            session.run(train_op, {position: step})
          weights = {v.op.name: session.run(v)
                     for v in tf.compat.v1.trainable_variables()}
      kinds = sorted({op.type for op in graph.get_operations()})
    else:
      KINDS = set()

      class Kinds(tf.compat.v1.train.SessionRunHook):
        def begin(self):
          KINDS.update(op.type for op in
                       tf.compat.v1.get_default_graph().get_operations())

      strategy = tf.distribute.MirroredStrategy(
          [f"/cpu:{i}" for i in range(replicas)])
      _, weights = support.estimator_train(
          model_dir, optimizer_fn, data, MICRO_BATCH, K, K * UPDATES,
          train_distribute=strategy, compute_dtype=compute,
          loss_scale=loss_scale, training_hooks=[Kinds()])
      kinds = sorted(KINDS)
    np.savez(out, **weights)
    print(json.dumps(kinds))
""")


def _trained(tmp_path, dtype, replicas, native):
  name = f"{dtype}_{replicas}_{native}"
  out = tmp_path / f"{name}.npz"
  result = subprocess.run(
      [sys.executable, "-c", _TRAIN, dtype, str(replicas),
       str(tmp_path / name), str(out)],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT,
               ESTIMATOR_ACCUM_NATIVE=native))
  assert result.returncode == 0, result.stderr[-3000:]
  with np.load(out) as weights:
    return dict(weights), result.stdout.strip().splitlines()[-1]


def _assert_the_same_training(tmp_path, dtype, replicas):
  native_kernels.loaded()
  one_pass, kinds = _trained(tmp_path, dtype, replicas, "1")
  plain, plain_kinds = _trained(tmp_path, dtype, replicas, "0")
  assert "EaAccumulate" in kinds and "EaAccumulate" not in plain_kinds
  support.assert_weights_moved(plain, f"{dtype}, {replicas} replica(s)")
  support.assert_weights_identical(one_pass, plain,
                                   f"{dtype}, {replicas} replica(s)")


@pytest.mark.parametrize("dtype", sorted(NARROW))
def test_a_window_trains_the_same_bit_for_bit(tmp_path, dtype):
  _assert_the_same_training(tmp_path, dtype, 1)


@pytest.mark.estimator
@pytest.mark.slow
def test_a_mirrored_window_trains_the_same_bit_for_bit(tmp_path):
  _assert_the_same_training(tmp_path, "bfloat16", 2)
