"""The window itself, on hand-computed values, in milliseconds.

Modelled on optax's accumulation tests: the loss of micro-batch i is
g_i * w, so its gradient is g_i; with SGD at learning rate 1 the update
after k micro-batches is w -= mean(g), and w does not move in between.
"""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum

v1 = tf.compat.v1


class _Window:
  """A train op over one scalar weight w (initially 10) whose micro-batch
  gradient is fed."""

  def __init__(self, k, optimizer=None, **options):
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.gradient = v1.placeholder(tf.float32, [])
      self.w = v1.get_variable("w", [], initializer=v1.constant_initializer(10))
      optimizer = optimizer or v1.train.GradientDescentOptimizer(1.0)
      self.train_op = estimator_accum.build_accumulating_train_op(
          self.gradient * self.w, optimizer, k, summaries=False,
          log_every_n_micro_batches=None, **options)
      self.state = estimator_accum.get_accumulation_state()
      self.session = v1.Session()
      self.session.run(v1.global_variables_initializer())

  def step(self, gradient):
    self.session.run(self.train_op, {self.gradient: gradient})
    return self.session.run(self.w)

  def read(self, variable):
    return self.session.run(variable)


def test_mean_of_the_window_and_frozen_in_between():
  window = _Window(k=4)
  assert [window.step(g) for g in (1.0, 2.0, 3.0)] == [10.0, 10.0, 10.0]
  assert window.step(4.0) == pytest.approx(10.0 - 2.5)
  assert window.read(window.state.global_step) == 4
  assert window.read(window.state.updates_applied) == 1


def test_sum_reduction_applies_the_sum():
  window = _Window(k=4, reduction="sum")
  for g in (1.0, 2.0, 3.0):
    window.step(g)
  assert window.step(4.0) == pytest.approx(10.0 - 10.0)


def test_the_window_starts_empty_after_an_update():
  window = _Window(k=2)
  window.step(1.0)
  assert window.step(3.0) == pytest.approx(8.0)
  window.step(10.0)
  assert window.step(20.0) == pytest.approx(8.0 - 15.0)


def test_clip_norm_clips_the_mean_not_each_micro_batch():
  # Micro-batches 3 and -1 have norms 3 and 1; their mean is 1, under 1.5.
  window = _Window(k=2, clip_norm=1.5)
  window.step(3.0)
  assert window.step(-1.0) == pytest.approx(9.0)
  # Mean 4, clipped to 1.5.
  window.step(4.0)
  assert window.step(4.0) == pytest.approx(7.5)


def test_a_non_finite_micro_batch_skips_its_whole_window():
  window = _Window(k=2)
  window.step(np.inf)
  assert window.step(1.0) == 10.0
  assert window.read(window.state.skipped_windows) == 1
  # The next window is whole again.
  window.step(2.0)
  assert window.step(4.0) == pytest.approx(7.0)


def test_num_examples_weights_each_micro_batch_by_its_size():
  with tf.Graph().as_default():
    gradient = v1.placeholder(tf.float32, [])
    examples = v1.placeholder(tf.float32, [])
    w = v1.get_variable("w", [], initializer=v1.constant_initializer(10))
    train_op = estimator_accum.build_accumulating_train_op(
        gradient * w, v1.train.GradientDescentOptimizer(1.0), 2,
        num_examples=examples, summaries=False,
        log_every_n_micro_batches=None)
    with v1.Session() as session:
      session.run(v1.global_variables_initializer())
      # 3 examples of mean gradient 2, then 1 example of gradient 6: the
      # big batch's mean is (3*2 + 1*6) / 4 = 3.
      session.run(train_op, {gradient: 2.0, examples: 3.0})
      session.run(train_op, {gradient: 6.0, examples: 1.0})
      assert session.run(w) == pytest.approx(7.0)


def test_momentum_moves_once_per_window():
  # Momentum 0.5, lr 1: updates are m1 = g1, m2 = 0.5 m1 + g2.
  window = _Window(k=2, optimizer=v1.train.MomentumOptimizer(1.0, 0.5))
  window.step(1.0)
  assert window.step(3.0) == pytest.approx(8.0)        # m = 2
  window.step(0.0)
  assert window.step(0.0) == pytest.approx(8.0 - 1.0)  # m = 0.5 * 2 + 0


def test_running_mean_holds_the_mean_so_far_and_applies_it():
  window = _Window(k=4, reduction="running_mean")
  accumulator = window.state.accumulators[0].total
  held = []
  for g in (1.0, 2.0, 3.0):
    window.step(g)
    held.append(float(window.read(accumulator)))
  assert held == pytest.approx([1.0, 1.5, 2.0])
  assert window.step(4.0) == pytest.approx(10.0 - 2.5)
  assert window.read(accumulator) == 0.0


def test_running_mean_with_num_examples_weights_by_examples():
  graph = tf.Graph()
  with graph.as_default():
    gradient = v1.placeholder(tf.float32, [])
    examples = v1.placeholder(tf.float32, [])
    w = v1.get_variable("w", [], initializer=v1.constant_initializer(10))
    train_op = estimator_accum.build_accumulating_train_op(
        gradient * w, v1.train.GradientDescentOptimizer(1.0), 2,
        reduction="running_mean", num_examples=examples, summaries=False,
        log_every_n_micro_batches=None)
    with v1.Session() as session:
      session.run(v1.global_variables_initializer())
      session.run(train_op, {gradient: 1.0, examples: 3.0})
      session.run(train_op, {gradient: 5.0, examples: 1.0})
      # (3 x 1 + 1 x 5) / 4 = 2.
      assert session.run(w) == pytest.approx(8.0)


@pytest.mark.parametrize("option, examples, chosen, state", [
    ("mean", False, "Mean", ["window_micro_batches", "window_divisor"]),
    ("mean", True, "WeightedMean", ["window_examples"]),
    ("sum", False, "Sum", []),
    ("running_mean", False, "RunningMean", ["window_micro_batches"]),
    ("running_mean", True, "RunningMean", ["window_examples"]),
])
def test_the_option_picks_its_reduction_once(option, examples, chosen, state):
  from estimator_accum.window import reductions  # noqa: PLC0415
  with tf.Graph().as_default():
    count = tf.constant(4.0) if examples else None
    reduction = reductions.for_options(option, count)
    assert type(reduction).__name__ == chosen
    reduction.build("window", 8, None)
    names = [v.name.split(":")[0] for v in reduction.state_variables()]
    assert [name.split("/")[-1] for name in names] == state


def test_the_sum_refuses_num_examples_naming_both():
  from estimator_accum.window import reductions  # noqa: PLC0415
  with pytest.raises(ValueError, match="num_examples.*reduction='sum'"):
    reductions.for_options("sum", tf.constant(4.0))
