"""What the window's end sends between replicas, in which form and order.

A window's all-reduce is its cost across hosts. It is sent in packs, in the
order the backward pass makes the gradients (`ready_order`): each pack
starts once the last micro-batch's gradients of its own variables are
accumulated, while the backward pass still computes the layers below, as
PyTorch DDP's buckets do. Two choices make it smaller:

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

from estimator_accum.distribution import replicas
from estimator_accum.window import sharded
from estimator_accum.window.accumulators import touched_rows

# "auto" sends a table by rows when its dense sum is at least this large
# and its window cannot touch every row: below it, the second round's
# latency costs more than the bytes it saves.
ROWS_THRESHOLD_BYTES = 2**20


def rows_block(kind, variable, gradient, option, num_replicas, k, dtype):
  """The number of rows a variable's window is all-reduced in, when it is
  all-reduced by its touched rows; None when it is sent whole.

  Args:
    kind: its accumulator's kind ("dense", "masked", "compact", "sharded").
    variable: the trained variable.
    gradient: a micro-batch gradient of it (tf.Tensor or tf.IndexedSlices).
    option: the `table_all_reduce` option: "auto", "rows" or "dense".
    num_replicas: the replicas in sync.
    k: micro-batches per window.
    dtype: the accumulator's tf.DType.
  """
  if num_replicas == 1 or kind != "masked" or option == "dense":
    return None
  table = variable.shape
  per_micro_batch = gradient.indices.shape.num_elements()
  block = table[0]
  if per_micro_batch is not None:
    block = min(block, num_replicas * k * per_micro_batch)
  if option == "rows":
    return block
  row_bytes = table[1:].num_elements() * tf.as_dtype(dtype).size
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


def ready_order(gradients):
  """The indices of `gradients` in the order the backward pass makes them.

  `tf.gradients` creates a gradient's ops after those of every gradient it
  depends on, from the loss down: the graph's order of the ops producing
  them is the order they can be ready in (the reverse of the forward, for
  a model of layers in sequence). Every worker builds the same graph, so
  every worker sends the same packs.

  Args:
    gradients: a list of tf.Tensor or tf.IndexedSlices of one graph.
  """
  producers = [getattr(g, "values", g).op for g in gradients]
  if not producers:
    return []
  made = {op.name: i for i, op in
          enumerate(producers[0].graph.get_operations())}
  return sorted(range(len(gradients)),
                key=lambda i: (made.get(producers[i].name, -1), i))


def sum_in_packs(cross_replica, ordered, options):
  """Sums a nest of per-replica values (None entries kept) over all
  replicas, in packs of consecutive values in the nest's order, each
  closed once it holds more than `options.bytes_per_pack`: one all-reduce
  per pack, each free to start as soon as its own values exist.

  Args:
    cross_replica: the window end's `replicas.CrossReplica`.
    ordered: the nest, in the order its values are to be sent.
    options: tf.distribute.experimental.CommunicationOptions.

  Returns:
    The same nest, each value the sum over replicas.
  """
  flat = tf.nest.flatten(ordered)
  sent = [j for j, value in enumerate(flat) if value is not None]
  sizes = [_size_in_bytes(cross_replica.first(flat[j])) for j in sent]
  for pack in packs(sizes, options.bytes_per_pack):
    reduced = cross_replica.sum([flat[sent[p]] for p in pack],
                                replicas.one_pack(options))
    for p, value in zip(pack, reduced):
      flat[sent[p]] = value
  return tf.nest.pack_sequence_as(ordered, flat)


def _size_in_bytes(tensor):
  """The bytes `tensor` (of a static shape) takes; 0 if its shape is not
  known."""
  elements = tensor.shape.num_elements()
  return 0 if elements is None else elements * tensor.dtype.size


def packs(sizes, bytes_per_pack):
  """Groups tensors of `sizes` (bytes, in the order they are sent) into
  packs of consecutive tensors, each closed once it holds more than
  `bytes_per_pack` (0: one pack), as TensorFlow's own packing does; a list
  of lists of indices."""
  groups = []
  held = 0
  for i, size in enumerate(sizes):
    if not groups or (bytes_per_pack and held > bytes_per_pack):
      groups.append([])
      held = 0
    groups[-1].append(i)
    held += size
  return groups


class Communication:
  """The window's second part: what crosses replicas, per micro-batch (a
  sharded window's gradients) and at the window's end (its sums)."""

  def __init__(self, plan, accumulation):
    self._plan = plan
    self._accumulation = accumulation

  def micro_batch(self, gradients):
    """Replica context, every micro-batch: the gradients as the
    accumulators take them. A sharded window's are summed over replicas
    and each replica keeps its slice; the others' are their own."""
    if not self._plan.sharded:
      return gradients
    return sharded.micro_batch_slices(
        self._accumulation.accumulators, gradients,
        self._plan.settings.communication_options)

  def all_reduce(self, cross_replica, accumulated):
    """Cross-replica context, at the window's end: the window's sums over
    every replica, (sums, rows, weight, statistics) per replica. A table
    sent by its rows comes back as its touched rows' sums, its `rows`
    entry the union of the rows touched (int64 indices, the same on every
    replica); a masked table sent whole, as its dense sum and its summed
    row mask.

    The sums travel in packs, in the plan's send order, the window's weight
    and statistics last: each pack starts once its own accumulators hold
    the last micro-batch, while the backward pass goes on below. The
    window's one all-reduce is made here in cross-replica context:
    ReplicaContext.all_reduce wraps itself in tf.custom_gradient, which
    looks variables up by op name and cannot find a replica's component of
    an ON_READ accumulator.
    """
    options = self._plan.settings.communication_options
    accumulators = self._accumulation.accumulators
    sums, rows, weight, statistics = cross_replica.each(
        self._accumulation.local_window, *accumulated)
    summed = [i for i in self._plan.send_order
              if accumulators[i].kind != "sharded"]
    pairs, weight, statistics = sum_in_packs(
        cross_replica, ([(sums[i], rows[i]) for i in summed],
                        weight, statistics), options)
    for i, (total, mask) in zip(summed, pairs):
      sums[i], rows[i] = total, mask
    # Each replica's slice, gathered: the window's sum, with no tensor of
    # the variable's size on any replica before it.
    for i, accumulator in enumerate(accumulators):
      if accumulator.kind == "sharded":
        sums[i] = accumulator.joined(cross_replica.gather(sums[i]))
    if any(self._plan.rows_blocks):
      self._rows_round(cross_replica, accumulated[0], sums, rows)
    return sums, rows, weight, statistics

  def _rows_round(self, cross_replica, done, sums, rows):
    """The second round, for the tables sent by their rows: the rows
    touched on any replica (the summed masks are the same on every
    replica), then their sums, into `sums` and `rows`."""
    union = {i: touched_rows(cross_replica.first(rows[i]))
             for i, block in enumerate(self._plan.rows_blocks) if block}
    touched = cross_replica.sum(
        cross_replica.each(self._accumulation.touched_rows, union, done),
        replicas.one_pack(self._plan.settings.communication_options))
    for position, i in enumerate(sorted(union)):
      sums[i], rows[i] = touched[position], union[i]
