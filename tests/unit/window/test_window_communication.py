"""Which tables cross replicas by their touched rows, in blocks of which
size, and the wire dtype's checks (one process; the jobs that send them
are in tests/integration/test_multiworker.py and tests/integration/test_many_hosts.py)."""

import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum.window import communication
from estimator_accum.window.accumulators import Accumulator

v1 = tf.compat.v1


def _table(rows, width, indices):
  """(masked accumulator of a rows x width table, a gradient of it with
  `indices` indices, or of unknown length for None)."""
  with tf.Graph().as_default():
    table = v1.get_variable("table", [rows, width], tf.float32)
    ids = (v1.placeholder(tf.int64, [None]) if indices is None else
           tf.zeros([indices], tf.int64))
    gradient = tf.IndexedSlices(tf.zeros([indices or 1, width]), ids,
                                tf.constant([rows, width], tf.int64))
    return Accumulator(table, gradient, tf.float32), gradient


@pytest.mark.parametrize("rows, width, indices, option, replicas, block", [
    # MiniLM's word embeddings, 2 workers x k=4 x 8 x 128 tokens.
    (30522, 384, 1024, "auto", 2, 8192),
    (30522, 384, 1024, "auto", 3, 12288),
    # A window that may touch every row: sent whole.
    (30522, 384, 8192, "auto", 2, None),
    # Under 1 MB: one round is cheaper than two.
    (1000, 64, 8, "auto", 2, None),
    (1000, 64, 8, "rows", 2, 64),
    (30522, 384, 1024, "dense", 2, None),
    # One replica: nothing crosses.
    (30522, 384, 1024, "rows", 1, None),
    # Indices of unknown length: "rows" sends a block of the whole table.
    (30522, 384, None, "rows", 2, 30522),
    (30522, 384, None, "auto", 2, None),
])
def test_the_block_a_table_is_sent_in(rows, width, indices, option, replicas,
                                      block):
  accumulator, gradient = _table(rows, width, indices)
  assert communication.rows_block(
      accumulator.kind, accumulator.variable, gradient, option, replicas, 4,
      accumulator.total.dtype) == block


def test_a_dense_variable_is_never_sent_by_rows():
  with tf.Graph().as_default():
    variable = v1.get_variable("w", [30522, 384], tf.float32)
    accumulator = Accumulator(variable, tf.zeros([30522, 384]), tf.float32)
    assert communication.rows_block(accumulator.kind, variable, None, "rows",
                                    2, 4, tf.float32) is None


def test_the_block_holds_the_rows_first_then_zeros():
  with tf.Graph().as_default(), v1.Session() as session:
    rows = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    block = communication.in_block(rows, 4)
    assert block.shape.as_list() == [4, 2]
    assert session.run(block).tolist() == [[1, 2], [3, 4], [0, 0], [0, 0]]


@pytest.mark.parametrize("given, kept", [
    (None, None), ("bfloat16", tf.bfloat16), (tf.float16, tf.float16),
    ("float32", None)])
def test_the_wire_dtype_option(given, kept):
  settings = estimator_accum.options.WindowSettings.checked(
      2, communication_dtype=given)
  assert settings.communication_dtype == kept


@pytest.mark.parametrize("option, value", [
    ("communication_dtype", "int8"), ("communication_dtype", "float64"),
    ("table_all_reduce", "sparse")])
def test_bad_communication_options_are_named(option, value):
  with pytest.raises(ValueError, match=option):
    estimator_accum.options.WindowSettings.checked(2, **{option: value})
