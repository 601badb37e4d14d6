"""Parameter-server (between-graph) training from TF_CONFIG: chief, 2
workers and a ps on loopback. Each worker keeps its own window (accumulators
and micro-batch counter on the worker) and applies to the shared variables
every k of its own micro-batches, a table's window kept compactly (the rows
touched only) on the worker too, and a batch_norm layer's window too."""

import json
import subprocess
import sys

import numpy as np

from tests.ps_job import BATCH_NORM_MOMENTUM, PATTERN, PLAN, ROWS, SHARED_ROW, K


def test_each_worker_applies_its_own_windows(tmp_path):
  command = [sys.executable, "-m", "tfconfig", "launch", "--chief",
             "--workers", "2", "--ps", "1", "--timeout", "240", "--",
             sys.executable, "tests/ps_job.py", "--model_dir", str(tmp_path)]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stdout[-5000:]
  final = json.loads((tmp_path / "final.json").read_text())
  done = {task: json.loads((tmp_path / f"done_{task}.json").read_text())
          for task in PLAN}
  counts = {task: report["micro_batches"] for task, report in done.items()}
  for task, report in done.items():
    job, index = task.split(":")
    assert report["accumulator_devices"] == [f"/job:{job}/task:{index}"]
    assert report["batch_norm_window_devices"] == [f"/job:{job}/task:{index}"]
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
  # the pattern's (every task's window has the same statistics).
  keep = BATCH_NORM_MOMENTUM ** final["updates"]
  pattern = np.array(PATTERN)
  np.testing.assert_allclose(final["bn/moving_mean"],
                             pattern.mean(0) * (1 - keep), rtol=1e-5)
  np.testing.assert_allclose(final["bn/moving_variance"],
                             keep + pattern.var(0) * (1 - keep), rtol=1e-5)
