"""What a window costs, from step times (planning/window_cost.py), on
hand-computed values."""

import pytest

from estimator_accum.planning import window_cost


def test_the_end_is_the_last_step_beyond_a_micro_batch():
  # k=4: three steps of 0.25 s and one of 1.25 s per window; the first
  # window (warm-up, slower) is left out.
  times = [2.0, 2.0, 2.0, 3.0] + [0.25, 0.25, 0.25, 1.25] * 3
  cost = window_cost.measure(times, 4, first_position=0)
  assert cost.micro_batch_seconds == pytest.approx(0.25)
  assert cost.end_seconds == pytest.approx(1.0)
  assert cost.window_seconds == pytest.approx(2.0)
  assert cost.end_share == pytest.approx(0.5)
  # k=8: 8 x 0.25 + 1 = 3 s for twice the examples: 2 / 1.5 = 1.33x.
  assert cost.speedup(8) == pytest.approx(4 / 3)
  assert cost.with_k(8).end_share == pytest.approx(1 / 3)
  line = cost.describe()
  assert line.startswith("window cost: 4 micro-batches of 0.250 s, and its "
                         "end 1.000 s more")
  assert "k=8 would spend 33% there (1.33x the examples/sec)" in line
  assert "k=16 would spend 20% there (1.60x the examples/sec)" in line


def test_a_job_resumed_mid_window_counts_from_its_position():
  # Resumed at micro-batch 6 with k=4: steps 6, 7 end the first window.
  times = [9.0, 9.0] + [0.5, 0.5, 0.5, 2.5] * 2
  cost = window_cost.measure(times, 4, first_position=6)
  assert (cost.micro_batch_seconds, cost.end_seconds) == (0.5, 2.0)


def test_too_few_steps_measure_nothing():
  assert window_cost.measure([1.0, 1.0, 1.0], 4, first_position=0) is None


def test_a_window_sorted_by_length_ends_on_its_longest_micro_batch():
  # Each window's micro-batches sorted by length (run_classifier's
  # default): 400, 600, 800 and 1,000 token positions; a step takes
  # 0.05 s + 0.25 ms a position, and the window-ending one 0.1 s more.
  work = [400, 600, 800, 1000] * 4
  times = [0.05 + 0.00025 * w + (0.1 if i % 4 == 3 else 0.0)
           for i, w in enumerate(work)]
  cost = window_cost.measure(times, 4, first_position=0, work=work)
  assert cost.end_seconds == pytest.approx(0.1)
  # The micro-batch of the median work (700 positions).
  assert cost.micro_batch_seconds == pytest.approx(0.05 + 0.00025 * 700)
  # Without the work, the longest micro-batch's extra compute (0.1 s over
  # the median step's 0.2 s) is taken for the end's.
  blind = window_cost.measure(times, 4, first_position=0)
  assert blind.end_seconds == pytest.approx(0.1 + 0.00025 * (1000 - 600))


def test_equal_work_everywhere_is_the_median_as_before():
  times = [2.0, 2.0, 2.0, 3.0] + [0.25, 0.25, 0.25, 1.25] * 3
  cost = window_cost.measure(times, 4, first_position=0, work=[32] * 16)
  assert (cost.micro_batch_seconds, cost.end_seconds) == (0.25, 1.0)


def test_slow_first_runs_of_new_shapes_give_no_negative_time():
  # k=2, windows sorted by length: a step's first run of a new length is
  # slower by its one-time setup. A least-squares line through the three
  # steps that end no window (48 positions: seen before, fast; 32 and 40:
  # new, slow) sloped downwards and put the micro-batch at -0.36 s (a
  # main job's log once said "2 micro-batches of -0.271 s"). More work is
  # never faster: such a slope falls back to the median.
  work = [48, 64, 48, 64, 32, 56, 40, 64]
  times = [2.0, 2.0, 0.005, 0.3, 1.0, 0.4, 0.9, 0.3]
  cost = window_cost.measure(times, 2, first_position=0, work=work)
  assert cost.micro_batch_seconds == pytest.approx(0.9)
  assert cost.end_seconds == 0.0
  assert " of -" not in cost.describe()


def test_one_outlier_does_not_bend_the_line():
  # Steps of 0.1 s + 1 ms a position, one of them 2 s slower (its first
  # run): the line through the others is the true one.
  work = [10, 20, 30, 40] * 4
  times = [0.1 + 0.001 * w + (0.05 if i % 4 == 3 else 0.0)
           for i, w in enumerate(work)]
  times[5] += 2.0
  cost = window_cost.measure(times, 4, first_position=0, work=work)
  assert cost.end_seconds == pytest.approx(0.05)
  assert cost.micro_batch_seconds == pytest.approx(0.1 + 0.001 * 25)
