"""The planner weighs recomputation: it measures two small micro-batches
with and without it, models the rest, and chooses recomputation exactly
when nothing without it fits (or, never here, when it models 10% faster);
every plan is checked by a measurement that fits."""

import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum.planning import planner

# Peaks read from the allocator: CI runs these under both oneDNN paths.
# Each measures several builds: not the fast tier.
pytestmark = [pytest.mark.memory, pytest.mark.slow]

BLOCKS, TOKENS, WIDTH, INNER = 6, 64, 32, 2048
EFFECTIVE = 8
MB = 2**20


def build(micro_batch, k, recompute=False):
  """A residual MLP over TOKENS tokens: 8 MB of weights and, without
  recomputation, about 6 MB of activations per example."""
  tf.compat.v1.train.get_or_create_global_step()
  h = tf.random.normal([micro_batch, TOKENS, WIDTH])
  for index in range(BLOCKS):
    def block(x, index=index):
      with tf.compat.v1.variable_scope(f"block_{index}"):
        up = tf.compat.v1.get_variable("up", [WIDTH, INNER])
        down = tf.compat.v1.get_variable("down", [INNER, WIDTH])
      inner = tf.nn.relu(tf.einsum("btw,wi->bti", x, up))
      return x + tf.einsum("bti,iw->btw", tf.nn.dropout(inner, 0.1), down)
    h = (estimator_accum.recompute(block) if recompute else block)(h)
  return estimator_accum.build_accumulating_train_op(
      tf.reduce_mean(tf.square(h)),
      tf.compat.v1.train.GradientDescentOptimizer(0.01), k,
      log_every_n_micro_batches=None)


@pytest.fixture(scope="module")
def peaks():
  return {(recompute, m): estimator_accum.measure_peak(
      build, m, 2, "CPU:0", recompute=recompute).peak_bytes
          for recompute in (False, True) for m in (1, 8)}


def _budget(limit_bytes):
  return limit_bytes / (1 - planner.DEFAULT_MARGIN) / MB


def test_recomputation_lowers_the_peak(peaks):
  assert peaks[True, 8] < 0.5 * peaks[False, 8], peaks
  assert peaks[True, 1] < peaks[False, 1], peaks


def test_recompute_is_chosen_when_nothing_else_fits(peaks):
  budget = _budget((peaks[True, 1] + peaks[False, 1]) / 2)
  plan = estimator_accum.plan_micro_batch(
      build, EFFECTIVE, device="CPU:0", memory_budget_mb=budget)
  assert plan.recompute, plan.describe()
  assert plan.fits(plan.peaks[plan.micro_batch]) or any(
      m.recompute and m.micro_batch == plan.micro_batch and
      plan.fits(m.peak_bytes) for m in plan.measurements), plan.describe()
  text = plan.describe()
  assert "no option that saves less memory fits" in text, text
  assert "(k=1): peak" in text and "(k=1, recompute): peak" in text, text
  assert "ms/example" in text, text
  assert "<- chosen" in text, text


def test_without_need_recompute_is_not_chosen(peaks):
  plan = estimator_accum.plan_micro_batch(
      build, EFFECTIVE, device="CPU:0",
      memory_budget_mb=_budget(peaks[False, 8] * 1.5))
  assert not plan.recompute, plan.describe()
  assert plan.micro_batch == 8, plan.describe()
  assert "it fits without saving more memory" in plan.describe()
  # The largest micro-batch fits plain: recomputation is not even measured.
  assert not any(m.recompute for m in plan.measurements), plan.describe()


def test_the_choice_is_checked_and_in_budget(peaks):
  # Between the two at micro-batch 8: the model picks the largest
  # micro-batch that fits, for each option, and the check measures it.
  budget = _budget((peaks[True, 8] + peaks[False, 8]) / 2)
  plan = estimator_accum.plan_micro_batch(
      build, EFFECTIVE, device="CPU:0", memory_budget_mb=budget)
  chosen = [m for m in plan.measurements
            if (m.micro_batch, m.recompute) == (plan.micro_batch,
                                                plan.recompute)]
  assert len(chosen) == 1 and plan.fits(chosen[0].peak_bytes), plan.describe()
  # Four points modelled (two per option) and at most a few checks.
  assert len(plan.measurements) <= 4 + 4, plan.describe()


def test_nothing_fits_says_so_in_one_line(peaks):
  # Plain training is modelled there (its points are 2 and 8), and
  # recomputation measured (the check of its modelled choice).
  with pytest.raises(ValueError, match=r"even micro-batch 1 needs about "
                     r"[\d.]+ MB, over .* margin\); with recompute it "
                     r"needs (about )?[\d.]+ MB"):
    estimator_accum.plan_micro_batch(
        build, EFFECTIVE, device="CPU:0",
        memory_budget_mb=_budget(peaks[True, 1] * 0.8))


def test_recompute_can_be_fixed_either_way(peaks):
  plan = estimator_accum.plan_micro_batch(
      build, EFFECTIVE, device="CPU:0", recompute=False,
      memory_budget_mb=_budget(peaks[False, 8] * 1.5))
  assert not plan.recompute and not plan.reason
  assert {m.recompute for m in plan.measurements} == {False}
  with pytest.raises(ValueError, match="build takes no recompute keyword"):
    estimator_accum.plan_micro_batch(
        lambda m, k: build(m, k), EFFECTIVE, device="CPU:0", recompute=True,
        memory_budget_mb=100)


def _memory_lines(lines):
  return [line for line in lines if "timed" not in line]


def test_fastest_measures_memory_once_when_the_largest_fits(peaks):
  # "largest" models both options from two points, then checks; "fastest"
  # times from the largest that fits down, so it measures the largest
  # without recomputation first, and that fits: one build, no model.
  budget = _budget(peaks[False, 8] * 1.5)
  largest = estimator_accum.plan_micro_batch(
      build, EFFECTIVE, device="CPU:0", memory_budget_mb=budget)
  assert len(largest.measurements) >= 2, largest.describe()
  lines = []
  plan = estimator_accum.plan_micro_batch(
      build, EFFECTIVE, device="CPU:0", memory_budget_mb=budget,
      objective="fastest", speed_windows=2, log=lines.append)
  assert _memory_lines(lines) == [lines[0]], lines
  assert lines[0].startswith(f"micro-batch {EFFECTIVE} (k=1): "), lines
  assert not plan.recompute and plan.micro_batch in _timed(plan), (
      plan.describe())


def test_fastest_models_from_the_largest_when_it_does_not_fit(peaks):
  # Between the options' peaks at 8: the largest measured first does not
  # fit, and the model goes on from it without measuring it again.
  budget = _budget((peaks[True, 8] + peaks[False, 8]) / 2)
  lines = []
  plan = estimator_accum.plan_micro_batch(
      build, EFFECTIVE, device="CPU:0", memory_budget_mb=budget,
      objective="fastest", speed_windows=2, log=lines.append)
  memory = _memory_lines(lines)
  assert memory[0].startswith(f"micro-batch {EFFECTIVE} (k=1): "), lines
  measured = [line.split(":")[0] for line in memory]
  assert len(measured) == len(set(measured)) > 1, lines
  chosen = [m for m in plan.measurements if m.micro_batch == plan.micro_batch
            and m.recompute == plan.recompute and not m.peak_timed]
  assert len(chosen) == 1 and plan.fits(chosen[0].peak_bytes), (
      plan.describe())


def _timed(plan):
  return {m.micro_batch for m in plan.measurements
          if m.window_seconds is not None}
