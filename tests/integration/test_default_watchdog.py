"""The peer watchdog every multi-task job gets by default
(estimator_accum/distribution/watchdog.py), on loopback: no false failure
when tasks end at different times, a frozen peer ends a task stuck in a
step, and off when asked. The job runs with --peer_timeout 0: no
health.watch of its own, as a user's own script."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from estimator_accum.distribution import health
from harness import hosts

pytestmark = pytest.mark.slow

UPDATES = 6


def _command(model_dir, *extra):
  return [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
          "--timeout", "300", "--grace", "2", "--",
          *hosts.job_flags(model_dir, UPDATES, *extra, peer_timeout=0)]


def _env(**values):
  return dict(os.environ, ESTIMATOR_ACCUM_PEER_TIMEOUT="4", **values)


@pytest.mark.estimator
def test_a_chief_working_on_after_the_others_left_is_not_failed(tmp_path):
  # worker 1 leaves as soon as training ends; worker 0 works on for twice
  # the watchdog's timeout, its peer silent all along.
  done = subprocess.run(
      _command(tmp_path, "--chief_seconds_after", "8"), cwd=hosts.ROOT,
      capture_output=True, text=True, timeout=300, env=_env())
  output = done.stdout + done.stderr
  assert done.returncode == 0, output[-3000:]
  assert "watching this task's peers" in output
  assert "lost worker" not in output
  hosts.assert_final_weights(tmp_path, 2, UPDATES, "watched by default")


@pytest.mark.estimator
def test_a_frozen_peer_ends_a_task_stuck_in_a_step(tmp_path):
  run = hosts.Run(_command(tmp_path, "--step_seconds", "0.3", "--save_every",
                           "1"), tmp_path, "launch", env=_env())
  frozen = []
  try:
    hosts.wait_for_step(tmp_path, 3, [run.process])
    frozen = hosts.task_pids(run.process.pid, 1)
    assert frozen
    hosts.signal_all(frozen, signal.SIGSTOP)
    stopped = time.monotonic()
    code = run.wait(60)
    took = time.monotonic() - stopped
  finally:
    hosts.signal_all(frozen, signal.SIGKILL)
    run.kill()
  output = run.output()
  assert code == health.PEER_LOST_EXIT, (code, output[-3000:])
  assert took < 30, (took, output[-3000:])
  assert re.search(r"worker:0: lost worker:1 at [0-9.]+:\d+: no answer",
                   output), output[-3000:]


@pytest.mark.estimator
def test_it_is_off_when_asked(tmp_path):
  done = subprocess.run(
      _command(tmp_path), cwd=hosts.ROOT, capture_output=True, text=True,
      timeout=300, env=_env(ESTIMATOR_ACCUM_PEER_WATCHDOG="0"))
  assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
  assert "watching this task's peers" not in done.stdout + done.stderr


@pytest.mark.estimator
def test_a_task_waiting_in_a_step_on_a_peer_that_answers_says_so_once(
    tmp_path):
  # worker 0 sleeps 14 s in a hook after its first micro-batch (as a chief
  # evaluating between steps would), answering its status all along;
  # worker 1 waits in its second micro-batch's collectives for it. It says
  # so once, past ESTIMATOR_ACCUM_STALL_REPORT, with its main thread's stack,
  # and the job ends at the big batch's weights: nothing is ended.
  done = subprocess.run(
      _command(tmp_path, "--pause_at", "trained_one", "--pause_seconds", "0",
               "--first_task_lag", "14"),
      cwd=hosts.ROOT, capture_output=True, text=True, timeout=300,
      env=_env(ESTIMATOR_ACCUM_STALL_REPORT="5"))
  output = done.stdout + done.stderr
  assert done.returncode == 0, output[-3000:]
  said = re.findall(r"worker:(\d): inside one training step for 5 s or more "
                    r"while every peer answers", output)
  assert said == ["1"], output[-4000:]
  # The main thread's stack under the line: in a session's run, called
  # from the job's script.
  report = output[output.index("worker:1: inside one training step"):]
  assert re.search(r'multiworker_job\.py", line \d+ in main', report), (
      report[:3000])
  assert re.search(r'session\.py", line \d+ in run', report), report[:3000]
  assert "lost worker" not in output
  hosts.assert_final_weights(tmp_path, 2, UPDATES, "a peer late by 14 s")


def test_a_stall_report_setting_that_is_not_seconds_is_refused(tmp_path):
  # Refused where the train op is built, before any step: the user's
  # script ends with the library's ValueError naming the variable.
  done = subprocess.run(
      _command(tmp_path), cwd=hosts.ROOT, capture_output=True, text=True,
      timeout=300, env=_env(ESTIMATOR_ACCUM_STALL_REPORT="soon"))
  output = done.stdout + done.stderr
  assert done.returncode != 0
  assert ("ValueError: ESTIMATOR_ACCUM_STALL_REPORT must be a number of "
          "seconds > 0, got 'soon'") in output, output[-3000:]
  assert hosts.latest_step(tmp_path) == -1, output[-3000:]
