"""Faults a test job injects into itself, once (a marker file remembers,
so that the restarted job runs clean): hooks for a MonitoredSession."""

import os
import time

import tensorflow as tf


class _Once(tf.compat.v1.train.SessionRunHook):
  """Counts this session's runs; `_due()` is true at the n-th run of the
  first process to reach it (the marker file is made then)."""

  def __init__(self, n, marker):
    self._n, self._marker, self._runs = n, marker, 0

  def _due(self):
    self._runs += 1
    if self._runs != self._n or os.path.exists(self._marker):
      return False
    open(self._marker, "w").close()
    return True


class AbortOnce(_Once):
  """Raises AbortedError after the n-th micro-batch: what a failed RPC
  raises into a step, which makes MonitoredSession remake its session."""

  def after_run(self, run_context, run_values):
    if self._due():
      print(f"aborting after {self._n} micro-batches", flush=True)
      raise tf.errors.AbortedError(None, None, "injected by the test's hook")


class StallOnce(_Once):
  """Sleeps an hour before the n-th micro-batch: alive and answering, this
  task never joins its peers' next collective."""

  def before_run(self, run_context):
    if self._due():
      print(f"stalling before micro-batch {self._n}", flush=True)
      time.sleep(3600)
