"""BERT's AdamWeightDecay and LAMB against numpy and Google-style references,
alone and under accumulation (one device and MirroredStrategy)."""

import numpy as np
import pytest
import tensorflow as tf

from harness import support
from harness.google_style_adamw import GoogleStyleAdamWeightDecay
from models.bert import optimization

LR, DECAY = 0.05, 0.01
BETA_1, BETA_2, EPS = 0.9, 0.999, 1e-6
STEPS = 4


def _numpy_optimizer_run(name, start, target, decayed):
  """STEPS updates on loss 0.5*||w - target||^2 (gradient w - target)."""
  w = {key: value.astype(np.float64) for key, value in start.items()}
  m = {key: np.zeros_like(value) for key, value in w.items()}
  v = {key: np.zeros_like(value) for key, value in w.items()}
  for step in range(1, STEPS + 1):
    for key in w:
      grad = w[key] - target[key]
      m[key] = BETA_1 * m[key] + (1 - BETA_1) * grad
      v[key] = BETA_2 * v[key] + (1 - BETA_2) * grad ** 2
      if name == "lamb":
        m_hat, v_hat = m[key] / (1 - BETA_1 ** step), v[key] / (
            1 - BETA_2 ** step)
      else:
        m_hat, v_hat = m[key], v[key]
      update = m_hat / (np.sqrt(v_hat) + EPS)
      if key in decayed:
        update = update + DECAY * w[key]
      ratio = 1.0
      if name == "lamb":
        w_norm, u_norm = np.linalg.norm(w[key]), np.linalg.norm(update)
        ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
      w[key] = w[key] - LR * ratio * update
  return w


def _tf_optimizer_run(optimizer, start, target):
  with tf.Graph().as_default():
    variables = {key: tf.compat.v1.get_variable(key, initializer=value)
                 for key, value in start.items()}
    loss = tf.add_n([0.5 * tf.reduce_sum(tf.square(variables[key] - value))
                     for key, value in target.items()])
    train_op = optimizer.minimize(
        loss, tf.compat.v1.train.get_or_create_global_step())
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(STEPS):
        session.run(train_op)
      return session.run(variables)


@pytest.mark.parametrize("name", optimization.OPTIMIZERS)
def test_optimizer_matches_numpy_reference(name):
  rng = np.random.default_rng(0)
  start = {"layer/kernel": rng.normal(size=(5, 3)).astype(np.float32),
           "layer/bias": rng.normal(size=3).astype(np.float32),
           "layer/LayerNorm/gamma": np.ones(3, np.float32)}
  target = {key: rng.normal(size=value.shape).astype(np.float32)
            for key, value in start.items()}
  actual = _tf_optimizer_run(
      optimization.make_optimizer(name, LR, DECAY), start, target)
  expected = _numpy_optimizer_run(name, start, target, {"layer/kernel"})
  for key in start:
    np.testing.assert_allclose(actual[key], expected[key], rtol=1e-5,
                               atol=1e-6, err_msg=f"{name} {key}")
    assert not np.allclose(actual[key], start[key])


def test_adamw_equals_google_style_copy_on_sparse_model():
  data = support.make_data(48)
  ours = support.reference_train(
      lambda: optimization.AdamWeightDecayOptimizer(
          LR, DECAY, exclude_from_weight_decay=["bias"]), data, 16, 3)
  google = support.reference_train(
      lambda: GoogleStyleAdamWeightDecay(
          LR, DECAY, exclude_from_weight_decay=["bias"]), data, 16, 3,
      minimize=False)
  support.assert_weights_close(ours, google, what="adamw vs google copy")


@pytest.mark.estimator
@pytest.mark.parametrize("name", optimization.OPTIMIZERS)
def test_bert_optimizers_accumulate_like_big_batch(name, tmp_path):
  k, micro_batch, updates = 4, 4, 3
  data = support.make_data(k * micro_batch * updates)

  def optimizer_fn():
    return optimization.make_optimizer(name, LR, DECAY)

  expected = support.reference_train(optimizer_fn, data, k * micro_batch,
                                     updates)
  estimator, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, micro_batch, k, k * updates)
  support.assert_trained_like_big_batch(estimator, actual, expected,
                                        k * updates, updates, name)


@pytest.mark.estimator
@pytest.mark.parametrize("name", optimization.OPTIMIZERS)
def test_bert_optimizers_under_mirrored_strategy(name, tmp_path):
  k, micro_batch, updates, replicas = 2, 4, 3, 2
  data = support.make_data(replicas * k * micro_batch * updates)

  def optimizer_fn():
    return optimization.make_optimizer(name, LR, DECAY)

  expected = support.reference_train(
      optimizer_fn, data, replicas * k * micro_batch, updates)
  strategy = tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(replicas)])
  estimator, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, micro_batch, k, k * updates,
      train_distribute=strategy)
  support.assert_trained_like_big_batch(estimator, actual, expected,
                                        k * updates, updates,
                                        f"{name} mirrored")


def test_schedule_warms_up_then_decays_linearly():
  with tf.Graph().as_default():
    count = tf.compat.v1.placeholder(tf.int64, [])
    lr = optimization.learning_rate_schedule(1.0, count, 10, 4)
    with tf.compat.v1.Session() as session:
      values = [session.run(lr, {count: i}) for i in (0, 2, 4, 7, 10, 12)]
  np.testing.assert_allclose(values, [0.0, 0.5, 0.6, 0.3, 0.0, 0.0],
                             atol=1e-7)


@pytest.mark.parametrize("kwargs, match", [
    ({"num_train_updates": 0, "num_warmup_updates": 0}, "num_train_updates"),
    ({"num_train_updates": 5, "num_warmup_updates": 6}, "num_warmup_updates"),
])
def test_schedule_rejects_bad_counts(kwargs, match):
  with pytest.raises(ValueError, match=match):
    optimization.learning_rate_schedule(1.0, tf.constant(0), **kwargs)


def test_unknown_optimizer_name():
  with pytest.raises(ValueError, match="optimizer.*'sgd'"):
    optimization.make_optimizer("sgd", 0.1)


def test_google_signature_create_optimizer_accumulates():
  """create_optimizer(loss, init_lr, num_train_steps, num_warmup_steps,
  use_tpu) as in google-research/bert, plus k: nothing moves until the k-th
  micro-batch, then the weights do; global_step counts micro-batches."""
  with tf.Graph().as_default():
    w = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0])
    loss = tf.reduce_sum(tf.square(w - 3.0))
    train_op = optimization.create_optimizer(
        loss, 0.1, num_train_steps=10, num_warmup_steps=0, use_tpu=False,
        gradient_accumulation_multiplier=4)
    step = tf.compat.v1.train.get_global_step()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(3):
        session.run(train_op)
      np.testing.assert_array_equal(session.run(w), [1.0, -2.0])
      session.run(train_op)
      assert not np.allclose(session.run(w), [1.0, -2.0])
      assert session.run(step) == 4
  with tf.Graph().as_default(), pytest.raises(ValueError, match="use_tpu"):
    w = tf.compat.v1.get_variable("w", initializer=1.0)
    optimization.create_optimizer(w * w, 0.1, 10, 0, use_tpu=True)


def test_create_optimizer_counts_steps_as_googles_script_does():
  """Google's run_classifier.py passes num_train_steps as Estimator's
  max_steps too: micro-batches here. With k=4, 32 steps are 8 updates and
  the schedule ends at the last of them (warmup 4 steps: 1 update)."""
  k, steps, warmup, lr = 4, 32, 4, 0.1
  with tf.Graph().as_default():
    w = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0])
    train_op = optimization.create_optimizer(
        tf.reduce_sum(tf.square(w - 3.0)), lr, steps, warmup, False,
        gradient_accumulation_multiplier=k)
    rate = tf.compat.v1.get_default_graph().get_tensor_by_name(
        "learning_rate:0")
    seen = []
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for step in range(steps):
        if step % k == k - 1:  # the micro-batch that applies an update
          seen.append(session.run(rate))
        session.run(train_op)
  updates = steps // k
  expected = [lr * u / 1 if u < 1 else lr * (1 - u / updates)
              for u in range(updates)]
  np.testing.assert_allclose(seen, expected, rtol=1e-6, atol=1e-9)
  assert seen[-1] == pytest.approx(lr / updates)
