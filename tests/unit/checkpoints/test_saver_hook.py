"""LeanCheckpointSaverHook saves as TensorFlow's CheckpointSaverHook does,
every `save_steps` and at the end, but not at the start of a run at global
step 0; the events file still gets the graph, and a resumed run goes on
from the saved values. Real Sessions, Saver files and events files."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum.estimator import runner as session_runner


def _steps(directory):
  return sorted(int(path.rsplit("-", 1)[1].split(".")[0])
                for path in glob.glob(os.path.join(directory,
                                                   "model.ckpt-*.index")))


def _graph_events(directory):
  kinds = []
  for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      kinds.append(event.WhichOneof("what"))
  return kinds.count("graph_def")


def _train(directory, last_step, hook_class):
  """Trains w += 1 a step to `last_step` in a MonitoredTrainingSession
  saving with `hook_class` every 3 steps; returns w."""
  with tf.Graph().as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    w = tf.compat.v1.get_variable("w", initializer=tf.zeros([4]))
    train = tf.group(w.assign_add(tf.ones([4])), step.assign_add(1))
    hook = hook_class(str(directory), save_steps=3)
    with tf.compat.v1.train.MonitoredTrainingSession(
        checkpoint_dir=str(directory), save_checkpoint_steps=None,
        save_checkpoint_secs=None, save_summaries_steps=None,
        log_step_count_steps=None,
        hooks=[hook, tf.compat.v1.train.StopAtStepHook(
            last_step=last_step)]) as session:
      while not session.should_stop():
        session.run(train)
    return tf.train.load_variable(str(directory), "w")


def test_no_save_at_step_zero_and_the_same_later_saves(tmp_path):
  lean, plain = tmp_path / "lean", tmp_path / "plain"
  np.testing.assert_array_equal(
      _train(lean, 7, estimator_accum.LeanCheckpointSaverHook), [7] * 4)
  _train(plain, 7, tf.compat.v1.train.CheckpointSaverHook)
  assert _steps(plain) == [0, 3, 6, 7]
  # max_to_keep 5 keeps all: only step 0's is missing.
  assert _steps(lean) == [3, 6, 7]
  # TensorBoard's graph: written by the summary writer when it was made
  # (TensorFlow's hook writes it twice more, and a MetaGraphDef).
  assert _graph_events(lean) == 1 < _graph_events(plain)


def test_a_resumed_run_goes_on_from_its_checkpoint(tmp_path):
  _train(tmp_path, 4, estimator_accum.LeanCheckpointSaverHook)
  assert _steps(tmp_path) == [3, 4]
  # Resumed at step 4: TensorFlow's behaviour (it saves the step it
  # restored), then 3 steps on and at the end.
  np.testing.assert_array_equal(
      _train(tmp_path, 9, estimator_accum.LeanCheckpointSaverHook), [9] * 4)
  assert _steps(tmp_path) == [3, 4, 7, 9]


def _model_fn(features, labels, mode):
  del labels, mode
  w = tf.compat.v1.get_variable("w", initializer=tf.zeros([2]))
  loss = tf.reduce_sum(tf.square(features["x"] - w))
  step = tf.compat.v1.train.get_or_create_global_step()
  train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, global_step=step)
  return session_runner.model_spec(session_runner.TRAIN, loss=loss,
                                   train_op=train)


def _input_fn():
  return tf.data.Dataset.from_tensors({"x": tf.ones([2])}).repeat()


@pytest.mark.estimator
def test_estimator_takes_it_for_its_own_saver(tmp_path):
  estimator = tf.estimator.Estimator(_model_fn, config=tf.estimator.RunConfig(
      model_dir=str(tmp_path), save_checkpoints_steps=2,
      save_summary_steps=None, log_step_count_steps=None))
  estimator.train(_input_fn, max_steps=5, hooks=[
      estimator_accum.LeanCheckpointSaverHook(str(tmp_path), save_steps=2)])
  # One saver only (Estimator's own would have saved step 0).
  assert _steps(tmp_path) == [2, 4, 5]


def test_session_estimator_without_save_at_start(tmp_path):
  for save_at_start, directory in ((True, tmp_path / "a"),
                                   (False, tmp_path / "b")):
    session_runner.SessionEstimator(_model_fn, session_runner.RunSettings(
        model_dir=str(directory), save_checkpoints_steps=2,
        save_summary_steps=None, save_at_start=save_at_start)).train(
            _input_fn, max_steps=5)
  assert _steps(tmp_path / "a") == [0, 2, 4, 5]
  assert _steps(tmp_path / "b") == [2, 4, 5]
