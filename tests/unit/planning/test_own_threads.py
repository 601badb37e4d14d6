"""A session asked for one inter-op thread runs on one, in a process whose
first session made TensorFlow's process-wide pool larger: measure_peak's
sessions (own_threads). Without it the planner's one-thread peaks moved
with whatever test had run first in the worker (CI of stop 58)."""

import os
import subprocess
import sys

import tensorflow as tf

import estimator_accum

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "helpers",
                      "session_threads.py")


def test_one_thread_is_one_thread_after_a_larger_first_session():
  done = subprocess.run(
      [sys.executable, SCRIPT], capture_output=True, text=True, timeout=120,
      env=dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true"),
      cwd=os.path.join(os.path.dirname(__file__), "..", "..", ".."))
  assert done.returncode == 0, done.stderr[-3000:]
  counts = dict(zip(*[iter(done.stdout.split())] * 2))
  # TensorFlow's own behaviour, which own_threads is there for: the plain
  # session ran on the first session's pool.
  assert int(counts["plain"]) > 1, done.stdout
  assert int(counts["own_threads"]) == 1, done.stdout
  assert int(counts["measure_peak"]) == 1, done.stdout


def test_own_threads_copies_and_leaves_other_pools_alone():
  asked = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1)
  own = estimator_accum.own_threads(asked)
  assert own.use_per_session_threads and not asked.use_per_session_threads
  assert not estimator_accum.own_threads(None).use_per_session_threads
  pools = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
  pools.session_inter_op_thread_pool.add(num_threads=2)
  assert not estimator_accum.own_threads(pools).use_per_session_threads
