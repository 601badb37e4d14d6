"""Per-replica sums as Keras 3 variables, for the Keras 3 optimizer's
window and `WindowBatchNormalization`'s: each replica adds to its own copy,
and reading across replicas (or saving) sums the copies."""

import functools
import inspect

import keras

__all__ = ["replica_sum", "takes_synchronization"]


@functools.cache
def takes_synchronization():
  """Whether this Keras makes variables synchronized on read (3.6+)."""
  return "synchronization" in inspect.signature(keras.Variable).parameters


def replica_sum(owner, shape, dtype, name):
  """A zero Keras variable in `owner`'s name scope (a layer or an
  optimizer, which tracks it), summed over the replicas when read or saved
  where this Keras synchronizes on read; else a plain variable (one
  device)."""
  options = {"synchronization": "on_read"} if takes_synchronization() else {}
  with keras.name_scope(owner.name, caller=owner):
    variable = keras.Variable(
        initializer="zeros", shape=shape, dtype=dtype, trainable=False,
        aggregation="sum", name=name, **options)
  return variable
