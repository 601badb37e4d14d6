"""Prints how many threads ran a graph's ops: in a plain session asking for
one inter-op thread, in one from estimator_accum.own_threads, and in
measure_peak's, all after a first session made TensorFlow's process-wide
inter-op pool with 4 threads (tests/unit/planning/test_own_threads.py)."""

import threading
import time

import tensorflow as tf

import estimator_accum

ONE_THREAD = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1,
                                      intra_op_parallelism_threads=1)
PARALLEL_OPS = 8


def recording(thread_ids):
  """A planner build: eight independent ops, each noting its thread."""
  def build(micro_batch, k):
    del micro_batch, k

    def record(x):
      thread_ids.add(threading.get_ident())
      time.sleep(0.01)  # Let a second thread, if any, take the next op.
      return x

    return tf.group([
        tf.numpy_function(record, [tf.constant(float(i))], tf.float32)
        for i in range(PARALLEL_OPS)])
  return build


def session_threads(config):
  thread_ids = set()
  with tf.Graph().as_default():
    fetch = recording(thread_ids)(1, 1)
    with tf.compat.v1.Session(config=config) as session:
      session.run(fetch)
  return len(thread_ids)


def main():
  first = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
  with tf.compat.v1.Session(graph=tf.Graph(), config=first) as session:
    session.run(tf.constant(1.0))
  measured = set()
  estimator_accum.measure_peak(recording(measured), 1, 1, "CPU:0",
                               session_config=ONE_THREAD)
  print(f"plain {session_threads(ONE_THREAD)} "
        f"own_threads {session_threads(estimator_accum.own_threads(ONE_THREAD))} "
        f"measure_peak {len(measured)}")


if __name__ == "__main__":
  main()
