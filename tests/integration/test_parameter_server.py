"""Parameter-server (between-graph) training from TF_CONFIG: chief, 2
workers and a ps on loopback. Each worker keeps its own window (accumulators
and micro-batch counter on the worker) and applies to the shared variables
every k of its own micro-batches, a table's window kept compactly (the rows
touched only) on the worker too, and a batch_norm layer's window and the
last finite loss `reportable_loss` keeps too."""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from harness.ps_job import (
  BATCH_NORM_MOMENTUM,
  PATTERN,
  PLAN,
  ROWS,
  SHARED_ROW,
  K,
)

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow


def ps_job_command(model_dir, placement="estimator", launch_flags=()):
  """The launch of harness/ps_job.py: chief, 2 workers, 1 ps."""
  command = [sys.executable, "-m", "tfconfig", "launch", "--chief",
             "--workers", "2", "--ps", "1", "--timeout", "240",
             *launch_flags, "--", sys.executable, "harness/ps_job.py",
             "--model_dir", str(model_dir)]
  if placement == "strategy":
    command.append("--parameter_server_strategy")
  return command


@pytest.mark.estimator
@pytest.mark.parametrize("placement", ["estimator", "strategy"])
def test_each_worker_applies_its_own_windows(placement, tmp_path):
  """`placement`: Estimator's replica_device_setter, or a v1
  ParameterServerStrategy as train_distribute (which puts every variable it
  creates on the ps: the windows then mixed the tasks' micro-batches)."""
  result = subprocess.run(ps_job_command(tmp_path, placement),
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-5000:]
  check_each_worker_applied_its_own_windows(tmp_path)


def check_each_worker_applied_its_own_windows(tmp_path):
  """The final state of a finished ps_job.py job (see its docstring)."""
  final = json.loads((tmp_path / "final.json").read_text())
  done = {task: json.loads((tmp_path / f"done_{task}.json").read_text())
          for task in PLAN}
  counts = {task: report["micro_batches"] for task, report in done.items()}
  for task, report in done.items():
    job, index = task.split(":")
    for devices in (report["accumulator_devices"],
                    report["worker_state_devices"]):
      assert len(devices) == 1, devices
      device = tf.DeviceSpec.from_string(devices[0])
      assert (device.job, device.task) == (job, int(index)), devices
  assert counts == {task: n for task, (_, n) in PLAN.items()}
  windows = {task: n // K for task, n in counts.items()}
  assert final["updates"] == sum(windows.values())  # 3 + 4 + 2
  assert final["global_step"] == sum(counts.values())
  assert final["w"] == -sum(PLAN[task][0] * windows[task] for task in PLAN)
  assert final["compact"] == ["table"]
  table = final["table"]
  assert table[SHARED_ROW] == [final["w"]] * 2
  for task, row in ROWS.items():
    assert table[row] == [-PLAN[task][0] * windows[task]] * 2, task
  assert not any(any(r) for i, r in enumerate(table) if i > SHARED_ROW)
  # Each completed window moved the shared moving statistics once toward
  # the pattern's (every task's window has the same statistics), without a
  # lock, as asynchronous training updates shared variables: two windows
  # ending at the same instant on two tasks may both read the statistics
  # before either writes, and one move is lost (seen about once in ten
  # runs). So n moves, n at most the windows and at most two fewer; the
  # mean and the variance are two variables, each moved by its own read and
  # write, so a race may cost one of them a move and not the other (seen
  # once in CI: the mean moved 8 times, the variance 9, in 9 windows).
  pattern = np.array(PATTERN)
  possible = range(final["updates"] - 2, final["updates"] + 1)

  def moves(name, target, start):
    return [n for n in possible if np.allclose(
        final[name], start * BATCH_NORM_MOMENTUM ** n +
        target * (1 - BATCH_NORM_MOMENTUM ** n), rtol=1e-5, atol=0)]

  assert moves("bn/moving_mean", pattern.mean(0), 0.0), (
      final["bn/moving_mean"], final["updates"])
  assert moves("bn/moving_variance", pattern.var(0), 1.0), (
      final["bn/moving_variance"], final["updates"])
