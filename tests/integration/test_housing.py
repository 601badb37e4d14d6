"""The housing data reader and the main housing job, end to end."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from data import housing
from tests.helpers import small_disk

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow


def test_reads_the_packaged_csv():
  features, prices = housing.read_csv(housing.default_csv_path())
  assert features.shape == (506, 13) and prices.shape == (506,)
  # First row of the Boston data set: CRIM 0.00632, price 24.0.
  np.testing.assert_allclose([features[0, 0], prices[0]], [0.00632, 24.0])
  train, evaluation = housing.load_housing()
  assert len(train["price"]) + len(evaluation["price"]) == 506
  np.testing.assert_allclose(train["x"].mean(0), 0, atol=1e-4)


@pytest.mark.parametrize("text, message", [
    ("1,2,3\n", ":1: expected 14 comma-separated numbers, got 3"),
    (",".join(["1"] * 14) + "\n" + ",".join(["x"] * 14) + "\n",
     ":2: could not convert string to float: 'x'"),
    ("", ": no rows"),
])
def test_malformed_csv_names_file_and_line(tmp_path, text, message):
  path = tmp_path / "bad.csv"
  path.write_text(text)
  with pytest.raises(ValueError) as raised:
    housing.read_csv(str(path))
  assert str(raised.value) == str(path) + message


@pytest.mark.estimator
def test_main_job_trains_and_matches_big_batch(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "models.housing", "--epochs", "5",
       "--model_dir", str(tmp_path)],
      capture_output=True, text=True, timeout=300, check=True)
  lines = result.stdout.splitlines()
  assert any("effective batch 32 = micro-batch 8 x k=4" in line for line in lines)
  difference = float(lines[-1].split(":")[1])
  assert difference <= 1e-5, result.stdout
  assert "micro-batch 200 | update 50 (k=4)" in result.stderr


def test_main_job_rejects_bad_k():
  result = subprocess.run([sys.executable, "-m", "models.housing", "--k", "0"],
                          capture_output=True, text=True, timeout=120)
  assert result.returncode != 0
  assert "--k must be >= 1, got 0" in result.stderr


@pytest.mark.estimator
def test_two_workers_train_and_evaluate(tmp_path):
  command = [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
             "--timeout", "240", "--", sys.executable, "-m", "models.housing",
             "--strategy", "multi_worker", "--k", "2", "--batch", "8",
             "--epochs", "2", "--model_dir", str(tmp_path)]
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stdout[-3000:]
  assert ("[worker:0] housing: effective batch 32 = 2 worker(s) x "
          "micro-batch 8 x k=2") in result.stdout
  # 2 epochs x (405 train rows // 32) windows x k=2 micro-batches.
  assert "[worker:0] eval RMSE" in result.stdout
  assert "after 48 micro-batches" in result.stdout


@pytest.mark.estimator
def test_a_diverged_run_exits_non_zero_with_one_line(tmp_path):
  message = ("housing: error: training diverged: 25 windows in a row were "
             "skipped for non-finite gradients (NaN/Inf); lower the learning "
             "rate or clip.")
  result = subprocess.run(
      [sys.executable, "-m", "models.housing", "--epochs", "20",
       "--learning_rate", "1e30", "--model_dir", str(tmp_path)],
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 3, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  errors = [line for line in result.stderr.splitlines()
            if line.startswith("housing: error")]
  assert errors == [message], result.stderr[-3000:]


@pytest.mark.estimator
def test_checkpoints_every_n_micro_batches_and_keeps_the_last(tmp_path):
  subprocess.run(
      [sys.executable, "-m", "models.housing", "--epochs", "3",
       "--save_checkpoints_steps", "20", "--keep_checkpoint_max", "2",
       "--model_dir", str(tmp_path)],
      capture_output=True, text=True, timeout=300, check=True)
  run = next(tmp_path.glob("accumulated_*"))
  kept = sorted(int(p.name.split("-")[1].split(".")[0])
                for p in run.glob("model.ckpt-*.index"))
  assert len(kept) == 2, kept
  assert kept[0] % 20 == 0 and kept[0] > 0, kept


@pytest.mark.estimator
def test_a_cut_checkpoint_is_skipped_and_none_complete_exits_4(tmp_path):
  command = [sys.executable, "-m", "models.housing", "--epochs", "3",
             "--save_checkpoints_steps", "20", "--keep_checkpoint_max", "2",
             "--model_dir", str(tmp_path)]
  subprocess.run(command, capture_output=True, text=True, timeout=300,
                 check=True)
  run = next(tmp_path.glob("accumulated_*"))
  newest = tf.train.latest_checkpoint(str(run))
  data, = run.glob(f"{os.path.basename(newest)}.data-*")
  os.truncate(data, data.stat().st_size // 2)
  again = subprocess.run(command, capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"skipping checkpoint {newest}: its data is cut short" in again.stdout
  for path in run.glob("model.ckpt-*.data-*"):
    os.truncate(path, path.stat().st_size // 2)
  broken = subprocess.run(command, capture_output=True, text=True, timeout=300)
  assert broken.returncode == 4, broken.stderr[-3000:]
  assert "Traceback" not in broken.stderr
  assert broken.stderr.strip().splitlines()[-1].startswith(
      f"housing: error: --model_dir: no checkpoint in {run} is complete (")


@pytest.mark.estimator
def test_a_live_runs_directory_is_refused_in_one_line(tmp_path):
  """Another live process holds the run's directory (its lock taken
  through run_lock, as a housing run takes it): exit 1, one line naming
  it; once that process has released it, the same command trains."""
  run = tmp_path / "accumulated_b8_k4"
  run.mkdir()
  holder = subprocess.Popen(
      [sys.executable, "-c",
       "import sys, time\n"
       "from estimator_accum.checkpoints import run_lock\n"
       f"lock = run_lock.hold({str(run)!r})\n"
       "print('held', flush=True)\n"
       "sys.stdin.readline()\n"
       "lock.release()\n"],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    command = [sys.executable, "-m", "models.housing", "--epochs", "1",
               "--model_dir", str(tmp_path)]
    refused = subprocess.run(command, capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith(
        f"housing: error: --model_dir={run} is in use by another run (pid "
        f"{holder.pid} on host "), refused.stderr[-2000:]
  finally:
    holder.communicate("\n", timeout=60)
  again = subprocess.run(command, capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert not (run / ".run.lock").exists()


@pytest.mark.estimator
def test_a_full_disk_is_one_line_and_exit_5(tmp_path):
  """The run's disk is full from the start (a 4 MB tmpfs, filled): one
  line naming the directory and what the file system said, exit 5."""
  with small_disk.mounted(tmp_path / "disk", "4m") as disk:
    model_dir = disk / "runs"
    model_dir.mkdir()
    small_disk.fill(disk / "filler")
    full = subprocess.run(
        [sys.executable, "-m", "models.housing", "--epochs", "1",
         "--model_dir", str(model_dir)], capture_output=True, text=True,
        timeout=300)
    left = sorted(p.name for p in model_dir.rglob(".run.lock*"))
  assert full.returncode == 5, (full.returncode, full.stderr[-3000:])
  assert "Traceback" not in full.stderr
  last = full.stderr.strip().splitlines()[-1]
  assert last.startswith(f"housing: error: --model_dir={model_dir}/"), last
  assert "the disk is full (No space left on device)" in last, last
  # Nothing of the lock left behind (its file, or the one written first).
  assert not left, left
