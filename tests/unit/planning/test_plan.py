"""The plan as a value (estimator_accum/planning/plan.py): made by hand,
asked whether it fits, described, halved, written and read back."""

import json

import pytest

from estimator_accum.planning.plan import Measurement, MicroBatchPlan


def test_a_plan_given_by_hand_fits_describes_and_halves():
  plan = MicroBatchPlan.given(32, 8)
  assert (plan.micro_batch, plan.k, plan.per_replica) == (8, 4, 32)
  assert plan.limit_bytes is None
  assert plan.fits() and plan.fits(10**12)
  assert plan.describe() == ("micro-batch plan given by hand, nothing "
                             "measured: effective batch 32 = 1 replica(s) x "
                             "micro-batch 8 x k=4")
  halved = plan.halved()
  assert (halved.micro_batch, halved.k, halved.halvings) == (4, 8, 1)
  two = MicroBatchPlan.given(32, 4, replicas=2)
  assert (two.micro_batch, two.k) == (4, 4)


def test_a_given_micro_batch_must_divide_the_share():
  with pytest.raises(ValueError, match=r"micro_batch=5 does not divide the "
                     r"32 examples per replica of effective_batch=32"):
    MicroBatchPlan.given(32, 5)
  with pytest.raises(ValueError, match=r"effective_batch=33 is not a "
                     r"multiple of the 2 replicas"):
    MicroBatchPlan.given(33, 4, replicas=2)


def _measured():
  return MicroBatchPlan(
      32, 1, 8, 4, 8, "equal micro-batches", 100 * 2**20, 0.1, "/cpu:0",
      measurements=(Measurement(16, 2, 95 * 2**20, 1.0),
                    Measurement(8, 2, 60 * 2**20, 1.0, step_seconds=0.01)))


def test_a_measured_plan_fits_by_its_budget_less_the_margin():
  plan = _measured()
  assert plan.limit_bytes == 90 * 2**20
  assert plan.fits()                       # its own micro-batch: 60 MB
  assert plan.fits(90 * 2**20) and not plan.fits(90 * 2**20 + 1)
  assert not plan.fits(None)               # out of memory
  text = plan.describe()
  assert "budget 100.0 MB, margin 10%, so a micro-batch fits under 90.0 MB" \
      in text
  assert "micro-batch   16 (k=2): peak 95.0 MB, too big" in text
  assert "micro-batch    8 (k=2): peak 60.0 MB, fits" in text


@pytest.mark.parametrize("plan", [MicroBatchPlan.given(32, 8), _measured()],
                         ids=["given", "measured"])
def test_written_and_read_back_whole(plan, tmp_path):
  path = str(tmp_path / "plan.json")
  plan.write(path)
  assert MicroBatchPlan.read(path) == plan
  assert json.loads((tmp_path / "plan.json").read_text())["k"] == 4
  # Written atomically: nothing else is left in the directory.
  assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]
