"""The progress bound's arithmetic, its setting, and its exit (the whole
job that stands still: tests/integration/test_multiworker.py)."""

import threading
import time

import pytest

from estimator_accum.distribution import progress_bound, watchdog


def test_the_bound_follows_the_jobs_pace_above_its_floor():
  assert progress_bound.bound(300, 0.1) == 300
  assert progress_bound.bound(300, 60) == 1200  # a slow model's own pace
  assert progress_bound.bound(8, 1.5) == 30


@pytest.mark.parametrize("value, expected", [
    (None, progress_bound.DEFAULT_FLOOR), ("45", 45.0), ("0", None)])
def test_the_floor_from_the_environment(value, expected, monkeypatch):
  if value is None:
    monkeypatch.delenv(progress_bound.FLOOR_ENV, raising=False)
  else:
    monkeypatch.setenv(progress_bound.FLOOR_ENV, value)
  assert progress_bound.floor_from_environment() == expected


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_a_bad_floor_is_named_with_its_value(value, monkeypatch):
  monkeypatch.setenv(progress_bound.FLOOR_ENV, value)
  with pytest.raises(ValueError, match=f"ESTIMATOR_ACCUM_PROGRESS_BOUND must "
                     f"be a number of seconds >= 0 .*got '{value}'"):
    progress_bound.floor_from_environment()


def test_steps_measure_the_current_wait_and_the_longest_that_ended():
  steps = watchdog.Steps()
  assert steps.waiting() == (0.0, 0.0)
  steps.enter()
  time.sleep(0.05)
  waited, longest = steps.waiting()
  assert waited >= 0.05 and longest == 0.0
  steps.leave()
  waited, longest = steps.waiting()
  assert waited == 0.0 and longest >= 0.05


def test_a_wait_past_the_bound_says_where_and_exits_152(capfd):
  exited = []
  done = threading.Event()

  def exit(code):
    exited.append(code)
    done.set()

  steps = watchdog.Steps()
  steps.enter()
  thread = threading.Thread(
      target=progress_bound._watch,  # noqa: SLF001
      args=("worker:3", steps.waiting, 0.5, exit), daemon=True)
  thread.start()
  assert done.wait(10)
  assert exited == [152]
  err = capfd.readouterr().err
  assert "[tfconfig] worker:3: no progress for 1 s" in err or (
      "[tfconfig] worker:3: no progress for 0 s" in err), err
  assert "bound of 0 s" in err or "bound of 1 s" in err
  assert "Its main thread waits in:" in err


def test_no_wait_no_exit():
  exited = []
  steps = watchdog.Steps()  # never entered: building, evaluating, exporting
  thread = threading.Thread(
      target=progress_bound._watch,  # noqa: SLF001
      args=("worker:0", steps.waiting, 0.2, exited.append), daemon=True)
  thread.start()
  time.sleep(1.5)
  assert exited == []
