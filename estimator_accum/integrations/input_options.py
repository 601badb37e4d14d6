"""An input pipeline that lets a session close at once.

tf.data's autotuning runs a model thread per iterator that sleeps between
optimizations, its period doubling up to 60 s as a run goes on. On
TensorFlow 2.15 an iterator's destructor joins that thread, and the
iterator is destroyed when its session closes: a multi-worker job's end
(`MonitoredSession.__exit__`, `BaseSession.close`) then waited up to a
minute for the thread to wake, 30-90 s in a one-minute job (py-spy and
gdb: the main thread in `LocalMaster::CloseSession`, a closure thread in
`~RootDataset::Iterator` -> `~LogicalThreadWrapper`, the model thread in
`Model::OptimizeLoop`). With autotuning off there is no such thread; an
`AUTOTUNE` argument then means as many parallel calls as cores and a
prefetch of one element.
"""

import tensorflow as tf

from estimator_accum import runtime_private

__all__ = ["without_autotune"]

# A distribution strategy's per-device datasets carry their own
# autotuning thread, which no input_fn reaches: off, on import.
runtime_private.per_device_datasets_without_autotune()


def without_autotune(dataset):
  """`dataset` with tf.data's autotuning off: its session closes at once.

  Use it on what an `input_fn` returns in a job whose end should take
  seconds (every MultiWorkerMirroredStrategy job):

    def input_fn(params):
      dataset = ...
      return estimator_accum.without_autotune(dataset)

  Raises:
    TypeError: `dataset` is not a tf.data.Dataset (named, with its type).
  """
  if not isinstance(dataset, tf.data.Dataset):
    raise TypeError("without_autotune: dataset must be a tf.data.Dataset, "
                    f"got {type(dataset).__name__}")
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)
