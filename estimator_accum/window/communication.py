"""What the window's end sends between replicas, and in which form.

A window's all-reduce is its cost across hosts. Two choices make it smaller:

- **Tables by their touched rows** (`table_all_reduce`). A masked table's
  window is a dense sum the size of the table, of which a window touches
  few rows (a BERT word-embedding table: 30,522 rows, of which a window of
  4 x 8 x 128 tokens touches at most 4,096). Sent by rows, the table's row
  mask travels with the dense gradients (one float per row), which gives
  every replica the same union of the rows touched anywhere; then only
  those rows' sums are all-reduced, in a second, smaller round. Exact: the
  sum over replicas of each touched row, and zero elsewhere.

  A graph's collective keeps the shape it first ran with (TensorFlow
  checks it per collective instance), so the rows travel in a block of a
  fixed number of rows: as many as the window can touch at most
  (replicas x k x the indices of one micro-batch's gradient), the union's
  rows first and zeros after them.
- **A narrower wire dtype** (`communication_dtype`): the gradient sums
  are cast to bfloat16 or float16 for the all-reduce and back to float32
  after it; accumulation, the weights and counts, clipping and the apply
  stay float32. Off by default: it rounds the window's gradient.
"""

import tensorflow as tf

# "auto" sends a table by rows when its dense sum is at least this large
# and its window cannot touch every row: below it, the second round's
# latency costs more than the bytes it saves.
ROWS_THRESHOLD_BYTES = 2**20


def rows_block(accumulator, gradient, option, num_replicas, k):
  """The number of rows `accumulator`'s window is all-reduced in, when it
  is all-reduced by its touched rows; None when it is sent whole.

  Args:
    accumulator: the trained variable's `Accumulator` (or compact one).
    gradient: a micro-batch gradient of it (tf.Tensor or tf.IndexedSlices).
    option: the `table_all_reduce` option: "auto", "rows" or "dense".
    num_replicas: the replicas in sync.
    k: micro-batches per window.
  """
  if (num_replicas == 1 or accumulator.kind != "masked" or
      option == "dense"):
    return None
  table = accumulator.variable.shape
  per_micro_batch = gradient.indices.shape.num_elements()
  block = table[0]
  if per_micro_batch is not None:
    block = min(block, num_replicas * k * per_micro_batch)
  if option == "rows":
    return block
  row_bytes = table[1:].num_elements() * accumulator.total.dtype.size
  if table[0] * row_bytes < ROWS_THRESHOLD_BYTES or block >= table[0]:
    return None
  return block


def in_block(rows, block):
  """`rows` ([n] + row shape, n <= block) followed by zero rows: [block] +
  row shape."""
  padded = tf.pad(rows, [[0, block - tf.shape(rows)[0]]] +
                  [[0, 0]] * (rows.shape.rank - 1))
  return tf.ensure_shape(padded, [block] + rows.shape.as_list()[1:])


def to_wire(values, dtype):
  """`values` (a list of float tensors or None, in replica context) cast to
  the wire `dtype` (None: as they are)."""
  if dtype is None:
    return values
  return [None if v is None else tf.cast(v, dtype) for v in values]
