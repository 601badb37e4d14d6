"""MirroredStrategy over 2 logical CPUs, in Estimator: R*k micro-batches of B
equal one device with batch R*k*B (plain TF), at <= 1e-5."""

import numpy as np
import pytest
import tensorflow as tf

from harness import support
from harness.google_style_adamw import (
  GoogleStyleAdamWeightDecay,
  MomentumClippingEachGradient,
)
from tests.integration import test_exact_optimizers as exact

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow

v1 = tf.compat.v1.train
REPLICAS = 2
K, MICRO_BATCH, UPDATES = 2, 4, 3

OPTIMIZERS = {
    "sgd": (lambda: v1.GradientDescentOptimizer(0.5), True),
    "momentum": (lambda: v1.MomentumOptimizer(0.2, 0.9), True),
    "adam": (lambda: v1.AdamOptimizer(0.05), True),
    "keras_legacy_adam": (lambda: tf.keras.optimizers.legacy.Adam(0.05),
                          False),
    # apply_gradients of their own: one never merges across replicas, one
    # transforms the gradients and then merges (the base class's).
    "google_adam_weight_decay": (
        lambda: GoogleStyleAdamWeightDecay(0.05, weight_decay_rate=0.01),
        False),
    "momentum_clipping_each": (
        lambda: MomentumClippingEachGradient(0.2, 0.9, clip_each=0.05), False),
}


def _strategy():
  return tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(REPLICAS)])


# Clipped with every optimizer (the global norm across replicas, then each
# one's update); unclipped with one minimize-built and one
# apply_gradients-built (the update code is the clipped one's, and
# test_mirrored_other_optimizers trains the rest unclipped).
@pytest.mark.estimator
@pytest.mark.parametrize("optimizer_name, clipped", [
    *[(name, True) for name in sorted(OPTIMIZERS)],
    ("adam", False), ("keras_legacy_adam", False)],
    ids=lambda value: {True: "clip", False: "noclip"}.get(value, value))
def test_mirrored_equals_one_device_big_batch(optimizer_name, clipped,
                                              control_flow, tmp_path):
  _assert_equals_the_big_batch(
      optimizer_name, REPLICAS, _strategy(), tmp_path, clipped,
      f"{optimizer_name} mirrored x{REPLICAS}, {control_flow}")


def _assert_equals_the_big_batch(optimizer_name, replicas, strategy,
                                 tmp_path, clipped, what, **params):
  """Trains `optimizer_name` in an Estimator under `strategy` (None: one
  device) with `replicas` replicas, clipped at half the big batch's first
  gradient norm or not, and compares it with the big batch of `replicas`
  x K micro-batches; `params` are the model_fn's."""
  optimizer_fn, uses_minimize = OPTIMIZERS[optimizer_name]
  big_batch = replicas * K * MICRO_BATCH
  data = support.make_data(big_batch * UPDATES)
  clip_norm = None
  if clipped:
    clip_norm = 0.5 * support.reference_gradient_norm(data, big_batch)
  expected = support.reference_train(optimizer_fn, data, big_batch, UPDATES,
                                     clip_norm=clip_norm,
                                     minimize=uses_minimize)
  estimator, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, MICRO_BATCH, K, K * UPDATES,
      train_distribute=strategy, clip_norm=clip_norm, **params)
  support.assert_trained_like_big_batch(estimator, actual, expected,
                                        K * UPDATES, UPDATES, what)


# fused_apply in an Estimator: the model's embedding has a sparse gradient
# (and MirroredStrategy its own apply), so each variable's update is
# compiled apart; tests/unit/window/test_fused_apply.py compiles it whole.
@pytest.mark.estimator
@pytest.mark.parametrize("replicas", [1, REPLICAS])
@pytest.mark.parametrize("optimizer_name",
                         ["adam", "google_adam_weight_decay"])
def test_fused_apply_equals_the_big_batch(optimizer_name, replicas,
                                          tmp_path):
  _assert_equals_the_big_batch(
      optimizer_name, replicas, _strategy() if replicas > 1 else None,
      tmp_path, True, f"{optimizer_name} fused, {replicas} replica(s)",
      fused_apply=True)


@pytest.mark.estimator
@pytest.mark.parametrize("optimizer_name", sorted(
    name for name in exact.OPTIMIZERS
    if not name.startswith("keras") and name not in {
        "proximal_adagrad", "sgd", "momentum", "adam",
        "bert_adam_weight_decay"}) + [
            "keras_legacy_adam_amsgrad", "keras_legacy_adam_decaying",
            "keras_legacy_nadam", "keras_legacy_sgd_momentum"])
def test_mirrored_other_optimizers(optimizer_name, tmp_path):
  """The v1 optimizers of test_exact_optimizers' list that the test above
  leaves out, each of which builds its own slots, and Keras legacy ones that
  add slots, a schedule or momentum to the Keras Adam above; once each
  (control flow v2, no clipping), every replica's copy updated."""
  optimizer_fn, uses_minimize = exact.OPTIMIZERS[optimizer_name]
  _check_unclipped(optimizer_fn, tmp_path, optimizer_name,
                   minimize=uses_minimize)


def _check_unclipped(optimizer_fn, tmp_path, what, **reference):
  """Mirrored training (control flow as set, no clip_norm) equals the big
  batch; `reference` goes to support.reference_train."""
  big_batch = REPLICAS * K * MICRO_BATCH
  data = support.make_data(big_batch * UPDATES)
  expected = support.reference_train(optimizer_fn, data, big_batch, UPDATES,
                                     **reference)
  estimator, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, MICRO_BATCH, K, K * UPDATES,
      train_distribute=_strategy())
  support.assert_trained_like_big_batch(
      estimator, actual, expected, K * UPDATES, UPDATES,
      f"{what} mirrored x{REPLICAS}")


@pytest.mark.estimator
@pytest.mark.parametrize("setting", sorted(exact.KERAS_CLIPPING))
def test_mirrored_keras_optimizer_clipping(setting, tmp_path):
  """Keras clipnorm / global_clipnorm / clipvalue clip the window's mean over
  both replicas, as the big batch's (duplicate rows summed: see
  test_exact_optimizers)."""
  _check_unclipped(exact.KERAS_CLIPPING[setting], tmp_path, f"Keras {setting}",
                   unique_rows=True)


def test_mirrored_without_the_replica_scaling_would_differ(tmp_path):
  """Guards the test above: one replica's data alone is not the big batch."""
  optimizer_fn = OPTIMIZERS["sgd"][0]
  data = support.make_data(REPLICAS * K * MICRO_BATCH * UPDATES)
  expected = support.reference_train(optimizer_fn, data,
                                     REPLICAS * K * MICRO_BATCH, UPDATES)
  single = support.reference_train(optimizer_fn, data, K * MICRO_BATCH,
                                   UPDATES)
  assert not np.allclose(single["dense/kernel"], expected["dense/kernel"],
                         rtol=1e-3)


@pytest.mark.estimator
def test_estimator_reports_the_replicas_mean_loss(tmp_path):
  """As with optimizer.minimize: Estimator sums the replicas' losses unless
  the graph says the optimizer averages them, which the window does."""
  data = support.make_data(REPLICAS * K * MICRO_BATCH)
  with tf.Graph().as_default():
    first = {key: tf.constant(value[:REPLICAS * MICRO_BATCH])
             for key, value in data.items()}
    loss = support.model_loss(first, first["labels"])
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      expected = session.run(loss)
  support.estimator_train(tmp_path, OPTIMIZERS["sgd"][0], data, MICRO_BATCH,
                          K, K, train_distribute=_strategy(),
                          summary_steps=100)
  reported = {}
  for path in tf.io.gfile.glob(str(tmp_path / "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == "loss":
          reported[event.step] = value.simple_value
  assert reported, "no loss summary"
  np.testing.assert_allclose(reported[min(reported)], expected, rtol=1e-5)


@pytest.mark.estimator
@pytest.mark.parametrize("setting", ["sum", "num_examples"])
def test_mirrored_other_reductions(setting, tmp_path):
  """reduction="sum" with a summed loss, and num_examples with a short last
  micro-batch (on replica 1: 30 examples, micro-batch 4), over 2 replicas
  equal one device with the big batches of the same examples."""
  sgd = OPTIMIZERS["sgd"][0]
  if setting == "sum":
    data = support.make_data(REPLICAS * K * MICRO_BATCH * UPDATES)
    expected = support.reference_train(
        lambda: v1.GradientDescentOptimizer(0.02),
        data, REPLICAS * K * MICRO_BATCH, UPDATES, loss_reduction="sum")
    estimator, actual = support.estimator_train(
        tmp_path, lambda: v1.GradientDescentOptimizer(0.02), data,
        MICRO_BATCH, K, K * UPDATES, train_distribute=_strategy(),
        reduction="sum", loss_reduction="sum")
    windows = UPDATES
  else:
    data = support.make_data(30)
    expected = support.reference_train(sgd, data, [16, 14], 2)
    estimator, actual = support.estimator_train(
        tmp_path, sgd, data, MICRO_BATCH, K, 2 * K,
        train_distribute=_strategy(), weight_by_examples=True)
    windows = 2
  support.assert_trained_like_big_batch(
      estimator, actual, expected, K * windows, windows,
      f"{setting} mirrored x{REPLICAS}")


@pytest.mark.estimator
@pytest.mark.parametrize("optimizer_name", ["adam", "momentum"])
def test_central_storage_equals_one_device_big_batch(optimizer_name,
                                                     tmp_path):
  """CentralStorageStrategy (variables and their window on one device, the
  replicas computing on 2 logical CPUs), clipped: the big batch too."""
  strategy = tf.compat.v1.distribute.experimental.CentralStorageStrategy(
      [f"/cpu:{i}" for i in range(REPLICAS)], parameter_device="/cpu:0")
  _assert_equals_the_big_batch(
      optimizer_name, REPLICAS, strategy, tmp_path, True,
      f"{optimizer_name} central storage x{REPLICAS}")
