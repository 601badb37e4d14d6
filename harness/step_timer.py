"""The benchmarks' step timer (`harness.bench.StepTimer`)."""

import json
import time

import tensorflow as tf


class StepTimer(tf.compat.v1.train.SessionRunHook):
  """Wall time of every session.run of an Estimator; `times` holds them,
  and with `path` they are written there as JSON at the end."""

  def __init__(self, path=None):
    self.times, self._path, self._start = [], path, None

  def before_run(self, run_context):
    self._start = time.perf_counter()

  def after_run(self, run_context, run_values):
    self.times.append(time.perf_counter() - self._start)

  def end(self, session):
    if self._path:
      with open(self._path, "w") as writer:
        json.dump(self.times, writer)
