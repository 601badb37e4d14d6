"""The multi-worker save barrier, on its own: no worker passes a save
before every worker has reached it, whatever an earlier run left."""

import threading
import time

from estimator_accum.checkpoints.ordered_saves import (
  BARRIER_DIRECTORY,
  SaveBarrier,
)

TASKS = ["worker_0", "worker_1"]


def _arrive(barrier, step, prefix, passed):
  barrier.wait(step, prefix)
  passed.append(time.monotonic())


def test_no_worker_passes_before_the_other_arrives(tmp_path):
  first, second = (SaveBarrier(TASKS, task, timeout_seconds=30)
                   for task in TASKS)
  passed = []
  early = threading.Thread(target=_arrive, args=(
      first, 6, str(tmp_path / "model.ckpt-6"), passed))
  early.start()
  time.sleep(0.5)
  assert not passed, "worker 0 passed before worker 1 reached the save"
  arrived = time.monotonic()
  # Worker 1 saves into its own subdirectory, as Estimator has it do.
  second.wait(6, str(tmp_path / "tmp_worker_1" / "model.ckpt-6"))
  early.join(10)
  assert passed and passed[0] >= arrived


def test_an_earlier_runs_markers_do_not_open_a_barrier(tmp_path):
  barrier_dir = tmp_path / BARRIER_DIRECTORY
  barrier_dir.mkdir()
  # Worker 1's last barrier of an earlier run, named as this run's second
  # save at step 6 will be.
  (barrier_dir / "step_6_save_2.worker_1").write_text("{}")
  first, second = (SaveBarrier(TASKS, task, timeout_seconds=30)
                   for task in TASKS)
  prefix = str(tmp_path / "model.ckpt-6")
  both = [threading.Thread(target=b.wait, args=(6, prefix))
          for b in (first, second)]
  for thread in both:
    thread.start()
  for thread in both:
    thread.join(10)
  passed = []
  late = threading.Thread(target=_arrive, args=(first, 6, prefix, passed))
  late.start()
  time.sleep(0.5)
  assert not passed, "an old marker let worker 0 through"
  second.wait(6, prefix)
  late.join(10)
  assert passed


def test_a_worker_that_never_comes_is_one_line(tmp_path):
  lonely = SaveBarrier(TASKS, "worker_0", timeout_seconds=0.2)
  try:
    lonely.wait(3, str(tmp_path / "model.ckpt-3"))
  except RuntimeError as error:
    assert str(error).startswith("checkpoint at step 3: worker_1 did not "
                                 "reach it within 0.2 s")
  else:
    raise AssertionError("the barrier opened without worker 1")
