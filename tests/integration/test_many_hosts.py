"""Jobs across hosts: a network namespace per task, on real links.

Each task runs on a host of its own (tfconfig/testbed.py: an address on a
private /24 that exists only on veth links to a bridge, no route out),
started by `python -m tfconfig launch --netns NAME`, or one by one with no
launcher, as on Kubernetes. Faults are real: a link cut at the switch
(`ip link set ... down`), a worker frozen (SIGSTOP) or killed (SIGKILL),
packets dropped at random on a host's input (nftables). Every surviving
task must exit in bounded time naming the task it lost (estimator_accum.distribution.health,
here with an 8 s timeout), and the job started again must end equal to
the big batch. Every namespace a test makes is removed, also when it fails.

Root and iproute2 are needed (CI runs as root); random loss needs nftables.
"""

import json
import os
import re
import signal
import subprocess
import time

import pytest

from estimator_accum.distribution import health
from harness import hosts
from tests.integration.test_parameter_server import (
  check_each_worker_applied_its_own_windows,
  ps_job_command,
)
from tfconfig import testbed

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow
# Mostly waiting on other processes: run first (tests/conftest.py).
RUNS_EARLY = True

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER_TIMEOUT = 8  # hosts_support.job_flags' default
# A lost peer is noticed after PEER_TIMEOUT without an answer; probes run
# every second, and the process needs a moment to go.
EXIT_BOUND = PEER_TIMEOUT + 12


def _require_testbed():
  reason = testbed.available()
  if reason is None:
    return
  if os.environ.get("CI"):
    pytest.fail(f"the multi-host tests must run in CI: {reason}")
  pytest.skip(reason)


@pytest.fixture
def make_bed():
  """make_bed(hosts, rate=None) -> an up TestBed; all removed after."""
  _require_testbed()
  testbed.remove_leftovers(only_dead=True)
  made = []

  def make(hosts, rate=None):
    bed = testbed.TestBed(hosts, name=f"{testbed.PREFIX}{os.getpid()}"
                          f"t{len(made)}", rate=rate)
    made.append(bed)
    return bed.up()

  yield make
  for bed in made:
    bed.down()
  leftovers = [n for bed in made for n in testbed.namespaces(bed.name)]
  assert not leftovers, leftovers


# Exact across hosts ---------------------------------------------------------


@pytest.mark.estimator
@pytest.mark.grappler  # the scoped allocator's merged all-reductions
@pytest.mark.parametrize("workers, rate", [(2, None), (3, "1gbit")])
def test_mwms_across_hosts_equals_the_big_batch(workers, rate, make_bed,
                                                tmp_path):
  bed = make_bed(workers, rate=rate)
  result = subprocess.run(hosts.launch_command(bed, workers, tmp_path, 3),
                          cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
  for index in range(workers):
    assert f"worker:{index}={bed.address(index)}:2222" in result.stderr
  hosts.assert_final_weights(tmp_path, workers, 3, f"{workers} hosts")
  markers = tmp_path / health.MARKER_DIR
  for index in range(workers):
    state = json.loads((markers / f"worker-{index}.json").read_text())
    assert state["state"] == "done"


@pytest.mark.estimator
@pytest.mark.parametrize("workers, rate", [(2, "1gbit"), (3, None)])
def test_a_table_sent_by_its_touched_rows_across_hosts_is_exact(
    workers, rate, make_bed, tmp_path):
  # The embedding's window crosses the links as its row mask, then the
  # block of the rows touched on any host (window/communication.py).
  bed = make_bed(workers, rate=rate)
  result = subprocess.run(
      hosts.launch_command(bed, workers, tmp_path, 3, "--table_all_reduce",
                           "rows"),
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
  hosts.assert_final_weights(tmp_path, workers, 3,
                             f"table by rows on {workers} hosts")


@pytest.mark.estimator
def test_parameter_server_job_across_hosts(make_bed, tmp_path):
  bed = make_bed(4)
  result = subprocess.run(
      ps_job_command(tmp_path, launch_flags=("--netns", bed.name)),
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
  check_each_worker_applied_its_own_windows(tmp_path)


# Faults ---------------------------------------------------------------------

UPDATES = 30  # 60 micro-batches per worker at 0.2 s: long enough to hit.


def _fault_job(bed, tmp_path, *launch_flags):
  return hosts.Run(hosts.launch_command(
      bed, 2, tmp_path, UPDATES, "--step_seconds", "0.2", "--save_every", "2",
      launch_flags=launch_flags), tmp_path, "launch")


def _assert_exits_naming(run, lost, started, bound=EXIT_BOUND):
  """The launcher ends within `bound` s of `started`, naming the loss."""
  code = run.wait(bound + 30)
  took = time.monotonic() - started
  output = run.output()
  assert took < bound, (took, output[-3000:])
  assert code == health.PEER_LOST_EXIT, (code, output[-3000:])
  assert re.search(rf"lost {lost} at [0-9.]+:2222: no answer for \d+ s",
                   output), output[-3000:]
  assert re.search(r"task worker:\d failed with exit code 150 \(it lost a "
                   r"peer\); stopping the other tasks", output), output[-3000:]
  return took


def _rerun_and_check(bed, tmp_path, what):
  result = subprocess.run(
      hosts.launch_command(bed, 2, tmp_path, UPDATES, "--save_every", "2"),
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
  resumed = re.search(r"\[worker:0\] starting at micro-batch (\d+)",
                      result.stdout)
  assert resumed and int(resumed.group(1)) > 0, result.stdout[-2000:]
  hosts.assert_final_weights(tmp_path, 2, UPDATES, what)


@pytest.mark.estimator
def test_link_cut_mid_window_restarts_and_resumes_exactly(make_bed, tmp_path):
  """The launcher's --restart (a TFJob's restartPolicy: OnFailure): the cut
  ends both workers in bounded time; the link comes back; the job starts
  again from its last checkpoint and ends equal to the big batch."""
  bed = make_bed(2)
  run = _fault_job(bed, tmp_path, "--restart", "1")
  try:
    hosts.wait_for_step(tmp_path, 7, [run.process])
    bed.cut(1)
    cut = time.monotonic()
    while "restarting the job (1 of 1)" not in run.output():
      assert time.monotonic() - cut < EXIT_BOUND, run.output()[-3000:]
      assert run.process.poll() is None, run.output()[-3000:]
      time.sleep(0.2)
    bed.restore(1)
    output = run.output()
    assert re.search(r"lost worker:[01] at [0-9.]+:2222", output), output
    assert run.wait(300) == 0, run.output()[-3000:]
  finally:
    run.kill()
  assert "[worker:0] starting at micro-batch 0" in run.output()
  assert re.search(r"\[worker:0\] starting at micro-batch [1-9]\d*",
                   run.output())
  hosts.assert_final_weights(tmp_path, 2, UPDATES,
                             "restarted after a cut link")


@pytest.mark.estimator
def test_sigterm_across_hosts_saves_the_agreed_step_and_resumes(
    make_bed, tmp_path):
  """SIGTERM to the launcher (estimator_accum/distribution/preemption.py):
  both workers agree on one step over the links, save it and exit 143 in
  seconds; the job started again goes on from that step to the big batch."""
  bed = make_bed(2)
  run = hosts.Run(hosts.launch_command(
      bed, 2, tmp_path, UPDATES, "--step_seconds", "0.1",
      launch_flags=("--grace", "20")), tmp_path, "launch")
  try:
    hosts.wait_for_step(tmp_path, 0, [run.process])
    time.sleep(2)
    signalled = time.monotonic()
    run.process.send_signal(signal.SIGTERM)
    code = run.wait(60)
    took = time.monotonic() - signalled
  finally:
    run.kill()
  output = run.output()
  assert code == 128 + signal.SIGTERM and took < 20, (code, took,
                                                      output[-3000:])
  stopped = re.findall(r"stopped: global step (\d+) saved in", output)
  assert len(stopped) == 2 and len(set(stopped)) == 1, output[-3000:]
  assert hosts.latest_step(tmp_path) == int(stopped[0]) > 0
  result = subprocess.run(
      hosts.launch_command(bed, 2, tmp_path, UPDATES), cwd=ROOT,
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
  assert f"[worker:0] starting at micro-batch {stopped[0]}" in result.stdout
  hosts.assert_final_weights(tmp_path, 2, UPDATES, "stopped by SIGTERM")


@pytest.mark.estimator
@pytest.mark.parametrize("host, moment", [(0, "training"), (1, "save")],
                         ids=["chief_host_cut", "cut_during_a_save"])
def test_a_cut_link_ends_every_task(host, moment, make_bed, tmp_path):
  """worker:0 is MultiWorkerMirroredStrategy's chief. 'save' cuts the
  moment a checkpoint's save barrier opens: the save's collective read of
  the window never completes. Both workers exit in bounded time, and the
  job started again resumes from the last complete checkpoint."""
  bed = make_bed(2)
  run = _fault_job(bed, tmp_path)
  try:
    hosts.wait_for_step(tmp_path, 4, [run.process])
    if moment == "save":
      hosts.wait_for_save_barrier(tmp_path)
    bed.cut(host)
    _assert_exits_naming(run, "worker:[01]", time.monotonic())
  finally:
    run.kill()
  bed.restore(host)
  _rerun_and_check(bed, tmp_path, f"restarted after host {host} was cut "
                   f"during {moment}")


@pytest.mark.estimator
def test_frozen_worker_ends_the_job(make_bed, tmp_path):
  bed = make_bed(2)
  run = _fault_job(bed, tmp_path)
  frozen = []
  try:
    hosts.wait_for_step(tmp_path, 5, [run.process])
    frozen = hosts.host_pids(bed, 1)
    assert frozen
    hosts.signal_all(frozen, signal.SIGSTOP)
    _assert_exits_naming(run, "worker:1", time.monotonic())
  finally:
    hosts.signal_all(frozen, signal.SIGKILL)
    run.kill()
  _rerun_and_check(bed, tmp_path, "restarted after a frozen worker")


@pytest.mark.estimator
def test_killed_worker_ends_the_other_without_a_launcher(make_bed, tmp_path):
  """As on Kubernetes: each task started on its own host by hand, nobody
  to stop the others. worker:1 is killed; worker:0 exits by itself."""
  bed = make_bed(2)
  runs = []
  try:
    runs = hosts.start_without_launcher(
        bed, [tmp_path] * 2, UPDATES, tmp_path, "--step_seconds", "0.2",
        "--save_every", "2")
    hosts.wait_for_step(tmp_path, 5, [run.process for run in runs])
    os.killpg(runs[1].process.pid, signal.SIGKILL)
    killed = time.monotonic()
    code = runs[0].wait(EXIT_BOUND + 30)
    took = time.monotonic() - killed
    output = runs[0].output()
    assert took < EXIT_BOUND, (took, output[-3000:])
    assert code == health.PEER_LOST_EXIT, (code, output[-3000:])
    assert re.search(r"worker:0: lost worker:1 at [0-9.]+:2222: no answer "
                     r"for \d+ s \(unavailable\)", output), output[-3000:]
  finally:
    for run in runs:
      run.kill()
  _rerun_and_check(bed, tmp_path, "restarted after a killed worker")


@pytest.mark.estimator
def test_lossy_link_is_slow_not_dead(make_bed, tmp_path):
  """5% of worker:1's input dropped at random: every step is slower, no
  task is taken for lost, and the job ends equal to the big batch."""
  bed = make_bed(2)
  bed.set_loss(1, 5)
  result = subprocess.run(
      hosts.launch_command(bed, 2, tmp_path, 6, "--save_every", "2"),
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
  assert "lost" not in result.stderr
  hosts.assert_final_weights(tmp_path, 2, 6, "over a lossy link")


@pytest.mark.estimator
def test_a_model_dir_that_is_not_shared_is_one_line(make_bed, tmp_path):
  """Each host sees its own directory (as two pods without a shared
  volume): both tasks say so in one line, in bounded time, with the
  configuration error's exit code, instead of waiting in the save barrier
  for 30 minutes."""
  bed = make_bed(2)
  runs = []
  try:
    runs = hosts.start_without_launcher(
        bed, [tmp_path / "dir0", tmp_path / "dir1"], 3, tmp_path,
        "--step_seconds", "1")
    started = time.monotonic()
    for index, run in enumerate(runs):
      code = run.wait(EXIT_BOUND + 60)
      output = run.output()
      assert code == health.MODEL_DIR_NOT_SHARED_EXIT, (code, output[-3000:])
      other = 1 - index
      assert re.search(
          rf"worker:{index}: model_dir \S+dir{index} is not the one "
          rf"worker:{other} uses: worker:{other} answers at [0-9.]+:2222 but "
          rf"its marker \S+ did not change in {PEER_TIMEOUT} s", output), (
              output[-3000:])
    assert time.monotonic() - started < EXIT_BOUND + 30
  finally:
    for run in runs:
      run.kill()


# The watchdog a user's own script gets without asking (the job runs with
# --peer_timeout 0: no estimator_accum.distribution.health.watch of its own).

# The default watchdog's timeout here: 30 s (the default, 60 s, measured
# the same way: both workers out 150 within 90 s; 30 s keeps CI short).
USER_TIMEOUT = 30
DEFAULT_BOUND = USER_TIMEOUT + 30


@pytest.mark.estimator
def test_a_users_own_job_ends_in_bounded_time_and_restarts_exactly(
    make_bed, tmp_path):
  bed = make_bed(2)
  run = hosts.Run(hosts.launch_command(
      bed, 2, tmp_path, UPDATES, "--step_seconds", "0.2", "--save_every",
      "2", peer_timeout=0), tmp_path, "launch", env=dict(
          os.environ, ESTIMATOR_ACCUM_PEER_TIMEOUT=str(USER_TIMEOUT)))
  try:
    hosts.wait_for_step(tmp_path, 7, [run.process])
    bed.cut(1)
    cut = time.monotonic()
    code = run.wait(DEFAULT_BOUND + 30)
    took = time.monotonic() - cut
    output = run.output()
  finally:
    run.kill()
  assert "watching this task's peers" in output, output[-3000:]
  assert took < DEFAULT_BOUND, (took, output[-3000:])
  assert code == health.PEER_LOST_EXIT, (code, output[-3000:])
  assert re.search(r"lost worker:[01] at [0-9.]+:2222: no answer for \d+ s",
                   output), output[-3000:]
  bed.restore(1)
  result = subprocess.run(
      hosts.launch_command(bed, 2, tmp_path, UPDATES, "--save_every", "2",
                           peer_timeout=0),
      cwd=hosts.ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
  resumed = re.search(r"\[worker:0\] starting at micro-batch (\d+)",
                      result.stdout)
  assert resumed and int(resumed.group(1)) > 0, result.stdout[-2000:]
  hosts.assert_final_weights(tmp_path, 2, UPDATES,
                             "a user's own job, restarted after a cut")
