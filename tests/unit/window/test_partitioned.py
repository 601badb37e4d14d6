"""A partitioned embedding (tf.compat.v1.fixed_size_partitioner, as
parameter-server jobs split large tables) trains exactly as the big batch:
each part gets its own accumulator, dense or compact."""

import pytest
import tensorflow as tf

from harness import support

v1 = tf.compat.v1.train
K = 4
MICRO_BATCH = 4
UPDATES = 3
PARTS = 3


@pytest.mark.estimator
@pytest.mark.parametrize("sparse_accumulation", [False, True],
                         ids=["dense", "compact"])
@pytest.mark.parametrize("optimizer_fn", [
    lambda: v1.AdamOptimizer(0.05),
    lambda: v1.MomentumOptimizer(0.2, 0.9),
], ids=["adam", "momentum"])
def test_partitioned_embedding_equals_big_batch(optimizer_fn,
                                                sparse_accumulation,
                                                control_flow, tmp_path):
  data = support.make_data(K * MICRO_BATCH * UPDATES)
  expected = support.reference_train(optimizer_fn, data, K * MICRO_BATCH,
                                     UPDATES, embedding_partitions=PARTS)
  estimator, actual = support.estimator_train(
      tmp_path, optimizer_fn, data, MICRO_BATCH, K, K * UPDATES,
      embedding_partitions=PARTS, sparse_accumulation=sparse_accumulation)
  names = estimator.get_variable_names()
  accumulators = [n for n in names if n.startswith("embedding/part_") and
                  ("/accum" in n)]
  # One accumulator state per part: dense sums, or compact indices/values.
  assert len({n.split("/")[1] for n in accumulators}) == PARTS, names
  support.assert_trained_like_big_batch(
      estimator, actual, expected, K * UPDATES, UPDATES,
      f"partitioned embedding, {optimizer_fn().get_name()}, "
      f"sparse_accumulation={sparse_accumulation}, {control_flow}")
