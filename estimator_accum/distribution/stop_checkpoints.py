"""The checkpoints a stop waits for: the ones the train op's savers wrote
that are complete (the newest their directory's checkpoint state names,
written after the checkpoint's files)."""

import os

import tensorflow as tf


def savers(graph):
  """The savers of `graph` (none for None)."""
  return [] if graph is None else graph.get_collection(
      tf.compat.v1.GraphKeys.SAVERS)


def saved_checkpoint(step, graph):
  """The path of a complete checkpoint of `graph`'s savers at or after
  micro-batch `step`, or None (None for a step of None)."""
  if step is None:
    return None
  for path, saved_step in complete_checkpoints(savers(graph)):
    if saved_step >= step:
      return path
  return None


def newest_saved_step(graph_savers):
  return max((s for _, s in complete_checkpoints(graph_savers)), default=-1)


def complete_checkpoints(graph_savers):
  """[(path, global step)] of the savers' checkpoints that are complete:
  the newest one their directory's checkpoint state names."""
  found, newest = [], {}  # newest: directory -> its state's newest path
  for saver in graph_savers:
    for path in saver.last_checkpoints:
      directory = os.path.dirname(path)
      if directory not in newest:  # read once per poll, not once per path
        state = tf.train.get_checkpoint_state(directory)
        newest[directory] = state and os.path.abspath(
            state.model_checkpoint_path)
      if newest[directory] != os.path.abspath(path):
        continue
      try:
        found.append((path, int(path.rsplit("-", 1)[1])))
      except (IndexError, ValueError):
        continue
  return found
