"""k micro-batches of B in an Estimator == one batch of k*B in plain TensorFlow.

For every optimizer users train with, under control flow v1 and v2, after 3
updates, at <= 1e-5 relative. The model has dense and embedding (sparse)
gradients, so the sparse path is checked for every optimizer too.
"""

import pytest
import tensorflow as tf

import estimator_accum
from harness import support
from harness.google_style_adamw import GoogleStyleAdamWeightDecay

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow

v1 = tf.compat.v1.train

OPTIMIZERS = {
    **{name: (make, True) for name, make in support.V1_OPTIMIZERS.items()},
    "keras_legacy_adam": (lambda: tf.keras.optimizers.legacy.Adam(0.05),
                          False),
    # Keras schedules count the optimizer's own iterations: one per update.
    "keras_legacy_adam_decaying": (
        lambda: tf.keras.optimizers.legacy.Adam(
            tf.keras.optimizers.schedules.ExponentialDecay(0.05, 1, 0.5)),
        False),
    "keras_legacy_sgd_momentum": (
        lambda: tf.keras.optimizers.legacy.SGD(0.2, momentum=0.9,
                                               nesterov=True), False),
    "keras_legacy_adam_amsgrad": (
        lambda: tf.keras.optimizers.legacy.Adam(0.05, amsgrad=True), False),
    "keras_legacy_rmsprop_centered_momentum": (
        lambda: tf.keras.optimizers.legacy.RMSprop(0.05, momentum=0.5,
                                                   centered=True), False),
    "keras_legacy_adagrad": (lambda: tf.keras.optimizers.legacy.Adagrad(0.3),
                             False),
    "keras_legacy_adadelta": (
        lambda: tf.keras.optimizers.legacy.Adadelta(5.0), False),
    "keras_legacy_adamax": (lambda: tf.keras.optimizers.legacy.Adamax(0.05),
                            False),
    "keras_legacy_nadam": (lambda: tf.keras.optimizers.legacy.Nadam(0.05),
                           False),
    "keras_legacy_ftrl": (lambda: tf.keras.optimizers.legacy.Ftrl(
        0.3, l1_regularization_strength=0.001,
        l2_regularization_strength=0.001), False),
    "bert_adam_weight_decay": (
        lambda: GoogleStyleAdamWeightDecay(
            0.05, weight_decay_rate=0.01,
            exclude_from_weight_decay=["bias"]), False),
}

K = 4
MICRO_BATCH = 4
UPDATES = 3


# Keras optimizers that clip in apply_gradients: they clip the window's mean.
KERAS_CLIPPING = {
    "clipnorm": lambda: tf.keras.optimizers.legacy.Adam(0.05, clipnorm=0.05),
    "global_clipnorm": lambda: tf.keras.optimizers.legacy.Adam(
        0.05, global_clipnorm=0.05),
    "clipvalue": lambda: tf.keras.optimizers.legacy.SGD(0.5, clipvalue=0.01),
}

@pytest.mark.estimator
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_accumulation_equals_big_batch(optimizer_name, control_flow,
                                       tmp_path):
  optimizer_fn, uses_minimize = OPTIMIZERS[optimizer_name]
  data = support.make_data(K * MICRO_BATCH * UPDATES)
  expected = support.reference_train(
      optimizer_fn, data, K * MICRO_BATCH, UPDATES, minimize=uses_minimize)
  estimator, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, MICRO_BATCH, K, K * UPDATES)

  what = f"{optimizer_name} under {control_flow}"
  support.assert_trained_like_big_batch(estimator, actual, expected,
                                        K * UPDATES, UPDATES, what)


@pytest.mark.estimator
def test_adagrad_da_counting_updates_equals_big_batch(control_flow, tmp_path):
  """AdagradDA's update reads a step count: given update_count it sees the
  count big-batch training shows it, and the weights agree."""
  data = support.make_data(K * MICRO_BATCH * UPDATES)
  expected = support.reference_train(
      lambda: v1.AdagradDAOptimizer(
          0.5, tf.compat.v1.train.get_or_create_global_step(),
          l1_regularization_strength=0.001, l2_regularization_strength=0.01),
      data, K * MICRO_BATCH, UPDATES)
  estimator, actual = support.estimator_train(
      tmp_path,
      lambda: v1.AdagradDAOptimizer(
          0.5, estimator_accum.update_count(K),
          l1_regularization_strength=0.001, l2_regularization_strength=0.01),
      data, MICRO_BATCH, K, K * UPDATES)
  support.assert_trained_like_big_batch(
      estimator, actual, expected, K * UPDATES, UPDATES,
      f"AdagradDA under {control_flow}")


@pytest.mark.estimator
@pytest.mark.parametrize("k", [1, 3])
def test_other_window_sizes(k, tmp_path):
  optimizer_fn = lambda: v1.AdamOptimizer(0.05)  # noqa: E731
  data = support.make_data(k * 2 * 3)
  expected = support.reference_train(optimizer_fn, data, k * 2, 3)
  _, actual = support.estimator_train(tmp_path, optimizer_fn, data, 2, k,
                                      k * 3)
  support.assert_weights_close(actual, expected, what=f"k={k}")


@pytest.mark.estimator
@pytest.mark.parametrize("setting", sorted(KERAS_CLIPPING))
def test_keras_optimizer_clipping_equals_big_batch(setting, control_flow,
                                                   tmp_path):
  """Keras clips in apply_gradients, so it clips the window's mean: the big
  batch's gradient. (Compared with its duplicate embedding rows summed:
  Keras clipping raw tf.IndexedSlices clips each occurrence on its own.)"""
  optimizer_fn = KERAS_CLIPPING[setting]
  data = support.make_data(K * MICRO_BATCH * UPDATES)
  expected = support.reference_train(
      optimizer_fn, data, K * MICRO_BATCH, UPDATES, unique_rows=True)
  estimator, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, MICRO_BATCH, K, K * UPDATES)
  support.assert_trained_like_big_batch(
      estimator, actual, expected, K * UPDATES, UPDATES,
      f"Keras {setting}, control flow {control_flow}")
