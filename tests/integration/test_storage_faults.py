"""run_classifier.py on storage faults, made for real in the checkpoints a
run wrote: a newest checkpoint cut short or with a flipped bit is skipped
with one line naming it, and the run resumes from the newest complete one
to the weights of a run that never had the bad one; none complete is one
line and exit code 4; an emptied state file resumes from the newest; every
worker of a two-worker job and every task of a parameter-server job skip a
bad checkpoint alike; a
disk that fills during the run is one line and exit code 5, and freeing it
resumes exactly; a second run on a live run's directory is refused in one
line naming it, and a killed run's lock is taken over."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from estimator_accum.checkpoints import integrity, run_lock
from tests.helpers import small_disk as small_disk_helper
from tests.integration import test_run_classifier as runs

# Whole jobs: not the fast tier. run_classifier trains through Estimator.
pytestmark = [pytest.mark.slow, pytest.mark.estimator]

# 40 examples x 3 epochs / (4 x k=2) = 15 updates, 30 micro-batches; a
# checkpoint every 6 (the newest three kept: 18, 24, 30); resumed to 6
# epochs (60 micro-batches).
FIRST = dict(num_train_epochs=3, save_checkpoints_steps=6, do_eval=False,
             classifier_dropout=0, keep_checkpoint_max=3)
RESUMED = dict(FIRST, num_train_epochs=6)

tiny_model = runs.tiny_model  # the module's tiny BERT, made once here too


@pytest.fixture(scope="module")
def first_run(tiny_model, tmp_path_factory):
  """(model, data, output_dir) of a run stopped at micro-batch 30, with
  checkpoints at 18, 24 and 30; and (weights) of the same directory resumed
  to 60 with the checkpoint at 30 never written."""
  root = tmp_path_factory.mktemp("storage")
  model = runs._no_dropout_model(tiny_model, root)
  data = runs._write_sst2(root / "data")
  output_dir = root / "first"
  done = runs._run(runs._flags(model, data, output_dir, **FIRST))
  assert done.returncode == 0, done.stderr[-3000:]
  assert sorted(p.name for p in output_dir.glob("model.ckpt-*.index")) == [
      "model.ckpt-18.index", "model.ckpt-24.index", "model.ckpt-30.index"]
  without = root / "without_30"
  shutil.copytree(output_dir, without)
  for path in without.glob("model.ckpt-30.*"):
    path.unlink()
  (without / "checkpoint").write_text(
      'model_checkpoint_path: "model.ckpt-24"\n'
      'all_model_checkpoint_paths: "model.ckpt-18"\n'
      'all_model_checkpoint_paths: "model.ckpt-24"\n')
  resumed = runs._run(runs._flags(model, data, without, **RESUMED))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "at micro-batch 24" in resumed.stdout
  assert re.search(r"^trained 36 micro-batches \(resumed: the last 36 of "
                   r"60\) in [\d.]+ s", resumed.stdout, re.M), resumed.stdout
  return model, data, output_dir, _weights(without)


def _weights(directory, steps=60):
  reader = tf.train.load_checkpoint(str(directory))
  assert reader.get_tensor("global_step") == steps
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if name.startswith(("bert/", "output_"))}


def _copy(first_run, tmp_path):
  _, _, output_dir, _ = first_run
  target = tmp_path / "run"
  shutil.copytree(output_dir, target)
  return target


def _cut_to_half(path):
  """As a copy or a save stopped half way leaves a file."""
  os.truncate(path, path.stat().st_size // 2)


def _flip(path, at):
  data = bytearray(path.read_bytes())
  data[at] ^= 0x10
  path.write_bytes(bytes(data))


FAULTS = {
    "truncated_data": lambda d: _cut_to_half(
        d / "model.ckpt-30.data-00000-of-00001"),
    "index_bit_flip": lambda d: _flip(
        d / "model.ckpt-30.index", (d / "model.ckpt-30.index").stat(
            ).st_size // 2),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_bad_newest_checkpoint_is_skipped_and_the_run_resumes_exactly(
    first_run, tmp_path, fault):
  model, data, _, expected = first_run
  output_dir = _copy(first_run, tmp_path)
  FAULTS[fault](output_dir)
  result = runs._run(runs._flags(model, data, output_dir, **RESUMED))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  skipped = [line for line in result.stdout.splitlines()
             if line.startswith("skipping checkpoint")]
  assert len(skipped) == 1, result.stdout[-3000:]
  assert skipped[0].startswith(
      f"skipping checkpoint {output_dir / 'model.ckpt-30'}: "), skipped
  assert "at micro-batch 24" in result.stdout
  actual = _weights(output_dir)
  for name, value in expected.items():
    np.testing.assert_allclose(actual[name], value, rtol=1e-5, atol=1e-6,
                               err_msg=name)


def test_no_complete_checkpoint_is_one_line_and_exit_4(first_run, tmp_path):
  model, data, _, _ = first_run
  output_dir = _copy(first_run, tmp_path)
  for path in output_dir.glob("model.ckpt-*.data-*"):
    _cut_to_half(path)
  result = runs._run(runs._flags(model, data, output_dir, **RESUMED))
  assert result.returncode == 4, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"run_classifier: error: --output_dir: no checkpoint "
                         f"in {output_dir} is complete ("), last
  for step in (18, 24, 30):
    assert f"model.ckpt-{step}: its data is cut short" in last


def test_an_empty_state_file_resumes_from_the_newest(first_run, tmp_path):
  model, data, _, _ = first_run
  output_dir = _copy(first_run, tmp_path)
  (output_dir / "checkpoint").write_text("")
  result = runs._run(runs._flags(model, data, output_dir, **RESUMED))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "at micro-batch 30" in result.stdout
  assert tf.train.load_checkpoint(str(output_dir)).get_tensor(
      "global_step") == 60
  # Run again on the finished directory: nothing is trained, and the line
  # says so (not "trained 60 micro-batches in 0.1 s").
  again = runs._run(runs._flags(model, data, output_dir, **RESUMED))
  assert again.returncode == 0, again.stderr[-3000:]
  assert "nothing left to train: the run is at micro-batch 60 of 60" in (
      again.stdout), again.stdout
  assert "trained 60 micro-batches" not in again.stdout


@pytest.fixture
def small_disk(tmp_path):
  """A 32 MB tmpfs mounted for the test (root only), unmounted after."""
  with small_disk_helper.mounted(tmp_path / "disk", "32m") as mount:
    yield mount


def test_a_full_disk_is_named_and_freeing_it_resumes_exactly(
    first_run, small_disk, tmp_path):
  """The disk fills while the run trains (a file takes what is left once
  its first checkpoint is written): one line naming the directory, the
  bytes a checkpoint takes and the bytes free, exit 5, no save cut short
  left behind, the state naming complete checkpoints only; with the file
  removed, the same command resumes to the weights of a run that never
  stopped."""
  model, data, _, _ = first_run
  # 1,000 micro-batches: seconds of training, so that the disk fills while
  # it trains (60 took a tenth of a second, which a loaded machine's
  # polling could miss, and the checkpoint at 6 is deleted soon after).
  flags = dict(RESUMED, num_train_epochs=100)
  whole = runs._run(runs._flags(model, data, tmp_path / "whole", **flags))
  assert whole.returncode == 0, whole.stderr[-3000:]
  output_dir = small_disk / "run"
  command = [sys.executable, "run_classifier.py",
             *runs._flags(model, data, output_dir, **flags)]
  # Its lines to files: a pipe nobody reads until the end would fill.
  with open(tmp_path / "stdout", "w") as out, \
       open(tmp_path / "stderr", "w") as err:
    process = subprocess.Popen(command, stdout=out, stderr=err)
  deadline = time.monotonic() + runs.TIMEOUT
  while not list(output_dir.glob("model.ckpt-*.index")):
    assert process.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
    assert time.monotonic() < deadline
    time.sleep(0.01)
  filler = small_disk / "filler"
  small_disk_helper.fill(filler)
  process.wait(timeout=runs.TIMEOUT)
  stderr = (tmp_path / "stderr").read_text()
  assert process.returncode == 5, stderr[-3000:]
  assert "Traceback" not in stderr and "out of memory" not in stderr
  last = stderr.strip().splitlines()[-1]
  assert re.match(
      rf"run_classifier: error: --output_dir={re.escape(str(output_dir))}: "
      r"the disk is full \(No space left on device\): a checkpoint takes "
      r"\d+\.\d MB \(model\.ckpt-\d+\), \d+\.\d MB free; free space and run "
      r"again to resume from .*model\.ckpt-\d+\.$", last), last
  assert not list(output_dir.glob("*_temp")), list(output_dir.iterdir())
  assert not list(output_dir.glob("*.tempstate*"))
  state = tf.train.get_checkpoint_state(str(output_dir))
  for path in state.all_model_checkpoint_paths:
    assert integrity.problem(path) is None, path
  filler.unlink()
  resumed = runs._run(runs._flags(model, data, output_dir, **flags))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  expected = _weights(tmp_path / "whole", 1000)
  actual = _weights(output_dir, 1000)
  for name, value in expected.items():
    np.testing.assert_allclose(actual[name], value, rtol=1e-5, atol=1e-6,
                               err_msg=name)


@pytest.mark.parametrize("room_kb", [0, 8, 48],
                         ids=["full", "fills_writing_features",
                              "fills_starting"])
def test_a_disk_full_before_the_first_checkpoint_is_named_too(
    first_run, small_disk, room_kb):
  """The disk has no room (the run directory's own marker cannot be
  written), room for the marker but not the cached features, or room for
  the marker and the features but not for what the run writes next (its
  events file, its first checkpoint): the same one line naming the disk
  full and exit 5, never "not writable", never a traceback; nothing of the
  lock or the marker left half written."""
  model, data, _, _ = first_run
  filler = small_disk / "filler"
  small_disk_helper.fill(filler)
  if room_kb:
    with open(filler, "r+b") as file:
      file.truncate(filler.stat().st_size - room_kb * 1024)
  output_dir = small_disk / "run"
  full = runs._run(runs._flags(model, data, output_dir, **RESUMED))
  assert full.returncode == 5, full.stderr[-3000:]
  assert "Traceback" not in full.stderr
  last = full.stderr.strip().splitlines()[-1]
  assert last.startswith(
      f"run_classifier: error: --output_dir={output_dir}: the disk is full "
      "(No space left on device)"), last
  assert not list(small_disk.rglob(".run.lock*"))
  # Nothing half written left behind: the run's marker is whole or absent.
  assert not [p.name for p in small_disk.rglob(".run_info.json*")]


def _start_long_run(model, data, output_dir):
  """A run of 100 epochs (1,000 micro-batches), once it holds its
  directory's lock: (the process, the lock's JSON)."""
  process = subprocess.Popen(
      [sys.executable, "run_classifier.py",
       *runs._flags(model, data, output_dir, **dict(RESUMED,
                                                    num_train_epochs=100))],
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  lock = output_dir / run_lock.LOCK_NAME
  deadline = time.monotonic() + runs.TIMEOUT
  while not (lock.exists() and lock.read_text()):
    assert process.poll() is None, process.communicate()[1][-3000:]
    assert time.monotonic() < deadline
    time.sleep(0.02)
  return process, json.loads(lock.read_text())


def test_a_second_run_on_a_live_runs_directory_is_refused(first_run,
                                                          tmp_path):
  model, data, _, _ = first_run
  output_dir = tmp_path / "shared"
  first, held = _start_long_run(model, data, output_dir)
  try:
    second = runs._run(runs._flags(model, data, output_dir, **RESUMED))
    assert first.poll() is None, "the first run ended before the second"
  finally:
    first_stderr = first.communicate(timeout=runs.TIMEOUT)[1]
  assert second.returncode == 1, second.stderr[-3000:]
  assert "Traceback" not in second.stderr
  assert second.stderr.strip().splitlines()[-1].startswith(
      f"run_classifier: error: --output_dir={output_dir} is in use by "
      f"another run (pid {held['pid']} on host {held['host']}, started ")
  assert first.returncode == 0, first_stderr[-3000:]
  assert not (output_dir / run_lock.LOCK_NAME).exists()


def test_the_lock_of_a_killed_run_is_taken_over(first_run, tmp_path):
  model, data, _, _ = first_run
  output_dir = tmp_path / "killed"
  first, held = _start_long_run(model, data, output_dir)
  first.send_signal(signal.SIGKILL)
  first.communicate()
  again = runs._run(runs._flags(model, data, output_dir, **RESUMED))
  assert again.returncode == 0, again.stderr[-3000:]
  assert (f"--output_dir={output_dir}: taking over the lock of a run that "
          f"ended without releasing it: its process (pid {held['pid']} on "
          f"host {held['host']}, started ") in again.stdout
  assert not (output_dir / run_lock.LOCK_NAME).exists()


def test_every_worker_of_a_job_skips_a_bad_checkpoint_alike(first_run,
                                                            tmp_path):
  """Two MultiWorkerMirroredStrategy workers (tfconfig launch) share the
  directory: each names the cut checkpoint, both resume from the newest
  complete one, and the job ends at the weights of a job that never wrote
  the bad one."""
  model, data, _, _ = first_run
  first = dict(num_train_epochs=2, save_checkpoints_steps=2, do_eval=False,
               classifier_dropout=0, keep_checkpoint_max=3)
  resumed = dict(first, num_train_epochs=4)
  # 40 x 2 / (2 workers x 4 x k=2) = 5 updates, 10 micro-batches.
  base = tmp_path / "base"
  runs._two_workers(model, data, base, **first)
  bad, without = tmp_path / "bad", tmp_path / "without_10"
  shutil.copytree(base, bad)
  shutil.copytree(base, without)
  _cut_to_half(bad / "model.ckpt-10.data-00000-of-00001")
  for path in without.glob("model.ckpt-10.*"):
    path.unlink()
  (without / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-8"\n')
  expected = runs._two_workers(model, data, without, **resumed)
  result = runs._two_workers(model, data, bad, **resumed)
  for worker in (0, 1):
    assert (f"[worker:{worker}] skipping checkpoint "
            f"{bad / 'model.ckpt-10'}: its data is cut short") in result.stdout
    assert (f"[worker:{worker}] resuming from {bad / 'model.ckpt-8'} at "
            "micro-batch 8") in result.stdout
    assert f"[worker:{worker}] resuming from" in expected.stdout
  want = tf.train.load_checkpoint(str(without))
  got = tf.train.load_checkpoint(str(bad))
  assert got.get_tensor("global_step") == want.get_tensor("global_step") == 20
  for name in want.get_variable_to_shape_map():
    if name.startswith(("bert/", "output_")):
      np.testing.assert_allclose(got.get_tensor(name), want.get_tensor(name),
                                 rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_parameter_server_job_skips_a_bad_checkpoint(first_run, tmp_path):
  """A chief, a worker and a ps (tfconfig launch) on a directory whose
  newest checkpoint is cut: each task names it, and the job trains on from
  the newest complete one to its end. (Parameter-server workers apply their
  windows asynchronously: the end is not one fixed set of weights.)"""
  model, data, _, _ = first_run
  output_dir = tmp_path / "ps"
  first = dict(num_train_epochs=2, save_checkpoints_steps=2, do_eval=False,
               keep_checkpoint_max=3, distribution_strategy="parameter_server")

  def launch(**extra):
    result = subprocess.run(
        [sys.executable, "-m", "tfconfig", "launch", "--chief", "--workers",
         "1", "--ps", "1", "--timeout", str(runs.TIMEOUT), "--",
         sys.executable, "run_classifier.py",
         *runs._flags(model, data, output_dir, **dict(first, **extra))],
        capture_output=True, text=True, timeout=runs.TIMEOUT + 30)
    assert result.returncode == 0, (result.stdout[-3000:] +
                                    result.stderr[-3000:])
    return result

  launch()
  newest = tf.train.latest_checkpoint(str(output_dir))
  before = int(tf.train.load_checkpoint(newest).get_tensor("global_step"))
  _cut_to_half(next(output_dir.glob(
      f"{os.path.basename(newest)}.data-*")))
  result = launch(num_train_epochs=4)
  for task in ("chief:0", "worker:0", "ps:0"):
    assert (f"[{task}] skipping checkpoint {newest}: its data is cut short"
            in result.stdout), result.stdout[-3000:]
  after = tf.train.latest_checkpoint(str(output_dir))
  assert integrity.problem(after) is None
  assert tf.train.load_checkpoint(after).get_tensor("global_step") > before
