"""AccumulatingOptimizer: code that calls an optimizer itself (canned
estimators, tf-slim) trains k micro-batches of B with the wrapper as the same
code trains one batch of k*B with the plain optimizer, at <= 1e-5."""

import logging
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_slim as slim

import estimator_accum as ea
from harness import support
from tests.jobs import canned_job

v1 = tf.compat.v1.train
K, MICRO_BATCH, UPDATES = 3, 4, 4
OPTIMIZERS = canned_job.V1_OPTIMIZERS
KERAS = canned_job.KERAS_OPTIMIZERS
_X, _Y = canned_job.X, canned_job.Y


def _canned(kind, optimizer, batch, steps, model_dir, loss_reduction=None,
            train_distribute=None, canned=None):
  """Trains a canned regressor (tf.compat.v1's, or `canned`'s); returns its
  weights and it."""
  estimator = canned_job.canned_estimator(
      kind, optimizer, model_dir, loss_reduction, train_distribute, canned,
      session_config=tf.compat.v1.ConfigProto(device_count={"CPU": 2}))
  estimator.train(canned_job.input_fn(batch), max_steps=steps)
  return canned_job.trained_weights(estimator), estimator


@pytest.mark.estimator
@pytest.mark.parametrize("kind, optimizer_name, loss_reduction", [
    ("dnn", "adam", None),  # The canned default sums the batch's losses.
    ("dnn", "sgd", None),
    ("dnn", "sgd", tf.compat.v1.losses.Reduction.SUM_OVER_BATCH_SIZE),
    ("wide_deep", "ftrl+adam", None),
])
def test_canned_estimator_equals_big_batch(kind, optimizer_name,
                                           loss_reduction, tmp_path):
  makes = [OPTIMIZERS[name] for name in optimizer_name.split("+")]
  plain = [make() for make in makes]
  wrapped = [ea.AccumulatingOptimizer(make(), K) for make in makes]
  if kind == "dnn":
    (plain,), (wrapped,) = plain, wrapped
  expected, _ = _canned(kind, plain, K * MICRO_BATCH, UPDATES,
                        str(tmp_path / "big"), loss_reduction)
  actual, estimator = _canned(kind, wrapped, MICRO_BATCH, K * UPDATES,
                              str(tmp_path / "accumulated"), loss_reduction)
  assert len(expected) >= 3, sorted(expected)
  support.assert_weights_close(actual, expected, what=kind)
  assert estimator.get_variable_value("global_step") == K * UPDATES
  # Wide and deep's second window takes the next default name.
  for name in ["gradient_accumulation", "gradient_accumulation_1"][
      :len(makes)]:
    assert estimator.get_variable_value(f"{name}/updates_applied") == UPDATES


@pytest.mark.estimator
def test_summed_loss_averaged_would_differ(tmp_path):
  """The control for the canned default: a summed loss averaged over the
  window (reduction="mean") moves the weights a k-th as far."""
  expected, _ = _canned("dnn", OPTIMIZERS["sgd"](), K * MICRO_BATCH, UPDATES,
                        str(tmp_path / "big"))
  averaged, _ = _canned(
      "dnn", ea.AccumulatingOptimizer(OPTIMIZERS["sgd"](), K,
                                      reduction="mean"),
      MICRO_BATCH, K * UPDATES, str(tmp_path / "averaged"))
  worst = max(np.max(np.abs(averaged[n] - expected[n]) /
                     (np.abs(expected[n]) + 1e-6)) for n in expected)
  assert worst > 1e-2


@pytest.mark.estimator
def test_canned_estimator_under_mirrored_strategy(tmp_path):
  make = OPTIMIZERS["adam"]
  replicas = 2
  expected, _ = _canned("dnn", make(), replicas * K * MICRO_BATCH, UPDATES,
                        str(tmp_path / "big"))
  actual, estimator = _canned(
      "dnn", ea.AccumulatingOptimizer(make(), K), MICRO_BATCH, K * UPDATES,
      str(tmp_path / "accumulated"),
      train_distribute=tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
  support.assert_weights_close(actual, expected, what="mirrored")
  assert estimator.get_variable_value(
      "gradient_accumulation/updates_applied") == UPDATES


@pytest.mark.estimator
@pytest.mark.parametrize("kind, optimizer_name, reduction, replicas", [
    ("dnn", "adam", "mean", 2),
    ("dnn", "sgd", "sum", 1),
    ("linear", "ftrl", "mean", 1),
])
def test_keras_canned_estimator_equals_big_batch(kind, optimizer_name,
                                                 reduction, replicas,
                                                 tmp_path):
  """TF 2's canned estimators (Keras optimizers, get_updates, a head that
  divides a mean loss by the replicas)."""
  make = KERAS[optimizer_name]
  loss_reduction = {"mean": None, "sum": tf.keras.losses.Reduction.SUM}[
      reduction]
  expected, _ = _canned(kind, make, replicas * K * MICRO_BATCH, UPDATES,
                        str(tmp_path / "big"), loss_reduction,
                        canned=tf.estimator)
  actual, estimator = _canned(
      kind, lambda: ea.AccumulatingKerasOptimizer(make(), K,
                                                  reduction=reduction),
      MICRO_BATCH, K * UPDATES, str(tmp_path / "accumulated"), loss_reduction,
      train_distribute=(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
                        if replicas > 1 else None), canned=tf.estimator)
  assert len(expected) >= 3, sorted(expected)
  support.assert_weights_close(actual, expected, what=kind)
  assert estimator.get_variable_value("global_step") == K * UPDATES
  assert estimator.get_variable_value(
      "gradient_accumulation/updates_applied") == UPDATES


@pytest.mark.estimator
@pytest.mark.slow  # a two-process cluster
@pytest.mark.parametrize("api, optimizer_name", [
    ("keras", "sgd"), ("v1", "sgd"), ("keras", "adam")])
def test_canned_estimator_on_two_workers(api, optimizer_name, tmp_path):
  """DNNRegressor with a wrapper under MultiWorkerMirroredStrategy, 2 worker
  processes from TF_CONFIG, each on its shard: TF 2's with the Keras
  wrapper (a mean loss the head divides by the replicas), tf.compat.v1's
  with the v1 wrapper (the canned summed loss, summed over the window and
  the replicas). SGD, whose step scales with the gradient: a factor of 2 or
  of k would show (Adam's would not); Adam for its slots, which must move
  once per window on both workers alike."""
  workers = 2
  plain, canned = ((KERAS[optimizer_name], tf.estimator) if api == "keras"
                   else (OPTIMIZERS[optimizer_name](), tf.compat.v1.estimator))
  expected, _ = _canned("dnn", plain, workers * K * MICRO_BATCH, UPDATES,
                        str(tmp_path / "big"), canned=canned)
  job = tmp_path / "job"
  result = subprocess.run(
      [sys.executable, "-m", "tfconfig", "launch", "--workers", str(workers),
       "--timeout", "240", "--", sys.executable, "tests/jobs/canned_job.py",
       "--model_dir", str(job), "--api", api, "--optimizer", optimizer_name,
       "--k", str(K), "--micro_batch", str(MICRO_BATCH),
       "--updates", str(UPDATES)],
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  final = dict(np.load(job / "final_weights.npz"))
  assert final.pop("global_step") == K * UPDATES
  assert final.pop("updates_applied") == UPDATES
  assert len(expected) >= 3, sorted(expected)
  support.assert_weights_close(final, expected, what="two workers")


def _slim_train(optimizer, batch, steps):
  """tf-slim's create_train_op (compute_gradients, then apply_gradients),
  run one batch at a time; returns the weights and the global step."""
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None, 4])
    y = tf.compat.v1.placeholder(tf.float32, [None, 1])
    hidden = slim.fully_connected(
        x, 8, weights_initializer=tf.compat.v1.constant_initializer(0.2))
    out = slim.fully_connected(
        hidden, 1, activation_fn=None,
        weights_initializer=tf.compat.v1.constant_initializer(-0.1))
    tf.compat.v1.losses.mean_squared_error(y, out)
    train_op = slim.learning.create_train_op(
        tf.compat.v1.losses.get_total_loss(), optimizer)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for step in range(steps):
        rows = slice(step * batch, (step + 1) * batch)
        session.run(train_op, {x: _X[rows], y: _Y[rows]})
      weights = session.run({v.op.name: v
                             for v in tf.compat.v1.trainable_variables()})
      return weights, session.run(tf.compat.v1.train.get_global_step())


def test_slim_create_train_op_equals_big_batch():
  expected, _ = _slim_train(v1.MomentumOptimizer(0.05, 0.9),
                            K * MICRO_BATCH, UPDATES)
  actual, global_step = _slim_train(
      ea.AccumulatingOptimizer(v1.MomentumOptimizer(0.05, 0.9), K),
      MICRO_BATCH, K * UPDATES)
  support.assert_weights_close(actual, expected, what="slim")
  assert global_step == K * UPDATES


def test_without_global_step_it_counts_its_own_micro_batches():
  """minimize(loss) without global_step leaves the graph's global step
  alone, as TensorFlow's optimizers do, and still ends windows every k."""
  with tf.Graph().as_default():
    global_step = tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable("w", [2], initializer=tf.ones_initializer())
    train_op = ea.AccumulatingOptimizer(
        v1.GradientDescentOptimizer(0.1), K).minimize(tf.reduce_sum(w * w))
    counter = ea.get_accumulation_state().global_step
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(2 * K):
        session.run(train_op)
      assert session.run(global_step) == 0
      assert counter.name == "gradient_accumulation/micro_batches:0"
      assert session.run(counter) == 2 * K
      np.testing.assert_allclose(session.run(w), [0.64, 0.64], rtol=1e-6)


def _loss():
  w = tf.compat.v1.get_variable("w", [2], initializer=tf.ones_initializer())
  return w, tf.reduce_sum(w * w)


@pytest.mark.keras2
@pytest.mark.parametrize("make, error, text", [
    (lambda: ea.AccumulatingOptimizer(v1.AdamOptimizer(0.1), 0), ValueError,
     "k must be >= 1"),
    (lambda: ea.AccumulatingOptimizer("adam", 2), TypeError,
     "optimizer must be"),
    (lambda: ea.AccumulatingOptimizer(v1.AdamOptimizer(0.1), 2,
                                      reduction="avg"),
     ValueError, "reduction must be one of"),
    (lambda: ea.AccumulatingOptimizer(v1.AdamOptimizer(0.1), 2,
                                      clip_norm=-1.0),
     ValueError, "clip_norm"),
    (lambda: ea.build_accumulating_train_op(
        _loss()[1], ea.AccumulatingOptimizer(v1.AdamOptimizer(0.1), 2), 2),
     TypeError, "already accumulates"),
    (lambda: ea.AccumulatingOptimizer(v1.AdamOptimizer(0.1), 2,
                                      loss_scale=128.0).apply_gradients(
                                          [(tf.ones([2]), _loss()[0])]),
     ValueError, "loss_scale needs the loss"),
    (lambda: ea.AccumulatingOptimizer(v1.AdamOptimizer(0.1), 2)
     .apply_gradients([(None, _loss()[0])]), ValueError, "has no gradient"),
    (lambda: ea.AccumulatingOptimizer(v1.AdamOptimizer(0.1), 2)
     .apply_gradients([tf.ones([2])]), TypeError,
     "grads_and_vars[0] must be a (gradient, variable) pair"),
    (lambda: ea.AccumulatingOptimizer(v1.AdamOptimizer(0.1), 2)
     .minimize(_loss()[1], gate_gradients=5), ValueError, "gate_gradients"),
    (lambda: ea.AccumulatingKerasOptimizer(
        tf.keras.optimizers.legacy.Adam(0.1), "4"), TypeError,
     "k must be a Python int"),
    (lambda: ea.AccumulatingKerasOptimizer(
        tf.keras.optimizers.legacy.Adam(0.1), 2, reduction=None), ValueError,
     "reduction must be one of"),
], ids=["k", "optimizer", "reduction", "clip_norm", "twice", "loss_scale",
        "all_none", "pairs", "gate", "keras_k", "keras_reduction"])
def test_bad_input_is_named(make, error, text):
  with tf.Graph().as_default(), pytest.raises(error) as raised:
    make()
  assert text in str(raised.value)


@pytest.mark.parametrize("reduction, warned", [
    (tf.compat.v1.losses.Reduction.SUM, True),
    (tf.compat.v1.losses.Reduction.SUM_OVER_BATCH_SIZE, False)])
def test_averaging_a_summed_loss_is_warned_about(caplog, reduction, warned):
  with tf.Graph().as_default(), caplog.at_level(logging.WARNING,
                                                logger="absl"):
    w, _ = _loss()
    loss = tf.compat.v1.losses.mean_squared_error(
        tf.zeros([2]), w, reduction=reduction)
    ea.build_accumulating_train_op(loss, v1.AdamOptimizer(0.1), K)
  messages = [r.getMessage() for r in caplog.records
              if "is summed over its batch" in r.getMessage()]
  assert len(messages) == warned, messages


@pytest.mark.keras2
@pytest.mark.parametrize("path", ["minimize", "apply_gradients"])
def test_keras_wrapper_counts_micro_batches_and_its_optimizer_updates(path):
  """In a plain graph: its iterations count micro-batches, the inner Keras
  optimizer's count updates (what a LearningRateSchedule reads)."""
  with tf.Graph().as_default():
    inner = tf.keras.optimizers.legacy.SGD(0.1)
    optimizer = ea.AccumulatingKerasOptimizer(inner, K)
    w, loss = _loss()
    if path == "minimize":
      train_op = optimizer.minimize(lambda: loss, [w])
    else:
      train_op = optimizer.apply_gradients(
          zip(optimizer.get_gradients(loss, [w]), [w]))
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(2 * K):
        session.run(train_op)
      assert session.run(optimizer.iterations) == 2 * K
      assert session.run(inner.iterations) == 2
      np.testing.assert_allclose(session.run(w), [0.64, 0.64], rtol=1e-6)
