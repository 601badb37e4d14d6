"""accumulator_placement='sharded': each replica keeps 1/N of the window's
dense sums, all-reduced every micro-batch; the weights equal plain
big-batch TensorFlow (1e-5) under MirroredStrategy (2 logical CPUs) and
MultiWorkerMirroredStrategy (2 processes); a run resumed inside a window
fails in one line; what cannot be sharded is refused."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from harness import support
from tests.integration import test_recompute_strategies as strategies

pytestmark = pytest.mark.slow

# The same job and helpers as the recomputation's strategy tests.
K, MICRO_BATCH, UPDATES, REPLICAS = strategies.K, strategies.MICRO_BATCH, (
    strategies.UPDATES), strategies.REPLICAS
BIG_BATCH = strategies.BIG_BATCH
_adam, _mirrored = strategies._adam, strategies._mirrored  # noqa: SLF001


@pytest.mark.estimator
@pytest.mark.parametrize("optimizer_fn", [
    _adam, lambda: tf.compat.v1.train.MomentumOptimizer(0.2, 0.9)],
    ids=["adam", "momentum"])
def test_mirrored_sharded_window_equals_the_big_batch(optimizer_fn, tmp_path):
  data = support.make_data(BIG_BATCH * UPDATES)
  clip_norm = 0.5 * support.reference_gradient_norm(data, BIG_BATCH)
  expected = support.reference_train(optimizer_fn, data, BIG_BATCH, UPDATES,
                                     clip_norm=clip_norm)
  estimator, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, MICRO_BATCH, K, K * UPDATES,
      train_distribute=_mirrored(), clip_norm=clip_norm,
      accumulator_placement="sharded")
  support.assert_trained_like_big_batch(estimator, actual, expected,
                                        K * UPDATES, UPDATES, "sharded")
  # Each dense variable's accumulator is a slice: ceil(size / 2) values.
  shards = {name: estimator.get_variable_value(name)
            for name in estimator.get_variable_names()
            if name.endswith("/accum_shard")}
  sizes = {name: value.size for name, value in support.initial_weights().items()
           if name != "embedding"}
  assert {n[:-len("/accum_shard")]: v.size for n, v in shards.items()} == {
      name: -(-size // REPLICAS) for name, size in sizes.items()}
  assert "embedding/accum" in estimator.get_variable_names()


@pytest.mark.estimator
def test_a_run_resumed_inside_a_sharded_window_fails_in_one_line(tmp_path):
  data = support.make_data(BIG_BATCH * UPDATES)
  support.estimator_train(tmp_path, _adam, data, MICRO_BATCH, K, K + 1,
                          train_distribute=_mirrored(),
                          accumulator_placement="sharded")
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="this run starts at micro-batch.*inside a window"):
    support.estimator_train(tmp_path, _adam, data, MICRO_BATCH, K, K * 2,
                            train_distribute=_mirrored(),
                            accumulator_placement="sharded")


@pytest.mark.estimator
def test_resumed_at_a_window_end_it_equals_the_big_batch(tmp_path):
  data = support.make_data(BIG_BATCH * UPDATES)
  expected = support.reference_train(_adam, data, BIG_BATCH, UPDATES)
  support.estimator_train(tmp_path, _adam, data, MICRO_BATCH, K, K,
                          train_distribute=_mirrored(),
                          accumulator_placement="sharded")
  estimator = support.make_estimator(
      tmp_path, dict(optimizer_fn=_adam, k=K, accumulator_placement="sharded"),
      train_distribute=_mirrored())
  estimator.train(support.micro_batch_input_fn(data, MICRO_BATCH,
                                               skip=K * REPLICAS),
                  max_steps=K * UPDATES)
  actual = {n: estimator.get_variable_value(n) for n in support.weight_names()}
  support.assert_weights_close(actual, expected, what="sharded, resumed")


@pytest.mark.estimator
def test_multiworker_sharded_window_equals_the_big_batch(tmp_path):
  from harness.multiworker_job import OPTIMIZERS
  data = support.make_data(BIG_BATCH * UPDATES)
  expected = support.reference_train(OPTIMIZERS["adam"], data, BIG_BATCH,
                                     UPDATES)
  command = [
      sys.executable, "-m", "tfconfig", "launch", "--workers", str(REPLICAS),
      "--timeout", "240", "--", sys.executable, "harness/multiworker_job.py",
      "--model_dir", str(tmp_path), "--optimizer", "adam", "--k", str(K),
      "--micro_batch", str(MICRO_BATCH), "--updates", str(UPDATES),
      "--accumulator_placement", "sharded"]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
  saved = np.load(tmp_path / "final_weights.npz")
  actual = {n: saved[n.replace("/", "__")] for n in support.weight_names()}
  support.assert_weights_moved(actual, "multi-worker sharded")
  support.assert_weights_close(actual, expected, what="multi-worker sharded")


@pytest.mark.parametrize("replicas, options, message", [
    (1, {}, "splits the window among the replicas of a collective strategy; "
     "this train op has 1 replica"),
    (2, {"reduction": "running_mean"}, "needs one weight for every replica"),
])
def test_refused_where_it_cannot_be_exact(replicas, options, message):
  strategy = tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(replicas)])
  with tf.Graph().as_default(), strategy.scope():
    def step():
      variable = tf.compat.v1.get_variable("v", [3])
      tf.compat.v1.train.get_or_create_global_step()
      return estimator_accum.build_accumulating_train_op(
          tf.reduce_sum(variable), tf.compat.v1.train.GradientDescentOptimizer(
              0.1), 2, accumulator_placement="sharded", **options)

    with pytest.raises(ValueError, match=message):
      strategy.extended.call_for_each_replica(step)
