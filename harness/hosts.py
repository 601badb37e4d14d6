"""Running harness/multiworker_job.py on the test bed (tfconfig/testbed.py),
for tests/integration/test_many_hosts.py and benchmarks/network_faults.py."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

from harness import support
from harness.multiworker_job import OPTIMIZERS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
K, MICRO_BATCH = 2, 4


def expected_weights(workers, updates):
  big_batch = workers * K * MICRO_BATCH
  data = support.make_data(big_batch * updates)
  return support.reference_train(OPTIMIZERS["adam"], data, big_batch,
                                 updates)


def job_flags(model_dir, updates, *extra, peer_timeout=8):
  return [sys.executable, "harness/multiworker_job.py", "--model_dir",
          str(model_dir), "--optimizer", "adam", "--k", str(K),
          "--micro_batch", str(MICRO_BATCH), "--updates", str(updates),
          "--peer_timeout", str(peer_timeout), "--peer_interval", "1",
          *extra]


def launch_command(bed, workers, model_dir, updates, *extra, launch_flags=(),
                   peer_timeout=8):
  return [sys.executable, "-m", "tfconfig", "launch", "--workers",
          str(workers), "--netns", bed.name, "--timeout", "600", "--grace",
          "2", *launch_flags, "--",
          *job_flags(model_dir, updates, *extra, peer_timeout=peer_timeout)]


def assert_final_weights(model_dir, workers, updates, what):
  saved = np.load(os.path.join(model_dir, "final_weights.npz"))
  actual = {n: saved[n.replace("/", "__")] for n in support.weight_names()}
  support.assert_weights_close(actual, expected_weights(workers, updates),
                               what=what)
  assert int(saved["global_step"]) == K * updates


def latest_step(model_dir):
  try:
    with open(os.path.join(model_dir, "checkpoint")) as reader:
      match = re.search(r'model_checkpoint_path: "model\.ckpt-(\d+)"',
                        reader.read())
  except OSError:
    return -1
  return int(match.group(1)) if match else -1


def wait_for_step(model_dir, step, processes, seconds=120):
  deadline = time.monotonic() + seconds
  while latest_step(model_dir) < step:
    for process in processes:
      assert process.poll() is None, f"exited early: {process.returncode}"
    assert time.monotonic() < deadline, f"no checkpoint {step} in {seconds} s"
    time.sleep(0.2)


class Run:
  """A launcher (or tasks) in the background, output to files."""

  def __init__(self, command, tmp_path, name, env=None):
    self.stdout_path = tmp_path / f"{name}.out"
    self.stderr_path = tmp_path / f"{name}.err"
    self.process = subprocess.Popen(
        command, cwd=ROOT, stdout=open(self.stdout_path, "w"),
        stderr=open(self.stderr_path, "w"), env=env, start_new_session=True)

  def wait(self, seconds):
    return self.process.wait(timeout=seconds)

  def output(self):
    return self.stdout_path.read_text() + self.stderr_path.read_text()

  def kill(self):
    if self.process.poll() is None:
      os.killpg(self.process.pid, signal.SIGKILL)
      self.process.wait()


def signal_all(pids, signum):
  """Sends `signum` to each of `pids`, those already gone skipped."""
  for pid in pids:
    try:
      os.kill(pid, signum)
    except ProcessLookupError:
      pass


def task_pids(launcher_pid, index, task_type="worker"):
  """The pids of the task `task_type`:`index` a launcher started (found by
  the TF_CONFIG in each descendant's environment)."""
  kind, number = rf'"type":\s*"{task_type}"', rf'"index":\s*{index}\b'
  pattern = re.compile(rf"{kind},\s*{number}|{number},\s*{kind}")
  found = []
  for pid, forked in _descendants(launcher_pid):
    if forked is not None:
      command = " ".join(forked["argv"])
      environ = forked["TF_CONFIG"] or ""
    else:
      try:
        with open(f"/proc/{pid}/environ") as reader:
          environ = reader.read()
        with open(f"/proc/{pid}/cmdline") as reader:
          command = reader.read()
      except OSError:
        continue
    if "--model_dir" in command and pattern.search(environ):
      found.append(pid)
  return found


# The test suite's fork server (tests/helpers/fork_start.py, which harness
# does not import) records each child it forks as
# $ESTIMATOR_ACCUM_TEST_FORK_DIR/children/<pid>.json:
# {"pid", "requester", "argv", "TF_CONFIG"}, removed once it is reaped.
_FORK_DIR_ENV = "ESTIMATOR_ACCUM_TEST_FORK_DIR"


def _forked_children(pid):
  """The records of the running children the test suite's fork server
  started for `pid`: /proc shows them as the server's children, with its
  environment and command line."""
  directory = os.environ.get(_FORK_DIR_ENV)
  if not directory:
    return []
  directory = os.path.join(directory, "children")
  try:
    names = os.listdir(directory)
  except OSError:
    return []
  found = []
  for name in names:
    if not name.endswith(".json"):
      continue
    try:
      with open(os.path.join(directory, name)) as record:
        child = json.load(record)
    except (OSError, ValueError):
      continue  # reaped meanwhile
    if child.get("requester") == pid:
      found.append(child)
  return found


def _descendants(root):
  """(pid, None) of each exec'd descendant of `root`, and (pid, record) of
  each forked one."""
  found, frontier = [], [root]
  while frontier:
    pid = frontier.pop()
    try:
      with open(f"/proc/{pid}/task/{pid}/children") as reader:
        children = [(int(c), None) for c in reader.read().split()]
    except OSError:
      continue
    children += [(child["pid"], child) for child in _forked_children(pid)]
    found += children
    frontier += [child for child, _ in children]
  return found


def host_pids(bed, index):
  result = subprocess.run(["ip", "netns", "pids", bed.host(index)],
                          capture_output=True, text=True, check=True)
  return [int(pid) for pid in result.stdout.split()]




def wait_for_save_barrier(model_dir, seconds=60):
  """Returns as soon as a new marker appears in the save barrier's directory
  (ordered_saves): a checkpoint's save has begun."""
  directory = os.path.join(model_dir, ".estimator_accum_saves")
  seen = set(os.listdir(directory)) if os.path.isdir(directory) else set()
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    if os.path.isdir(directory):
      now = set(os.listdir(directory))
      if now - seen:
        return
      seen = now
    time.sleep(0.002)
  raise AssertionError(f"no save began in {seconds} s")


def start_without_launcher(bed, model_dirs, updates, log_dir, *extra,
                           peer_timeout=8):
  """Starts one multiworker_job.py worker per host by hand, each with its
  own TF_CONFIG, as an engine starts pods (nobody stops the others when one
  fails). `model_dirs`: one per worker. Returns their `Run`s."""
  from clusterspec import config as tfc

  cluster = bed.cluster(len(model_dirs))
  runs = []
  for index, model_dir in enumerate(model_dirs):
    env = dict(os.environ, TF_CONFIG=json.dumps(
        tfc.for_task(cluster, "worker", index)))
    runs.append(Run(
        bed.exec_prefix(index) + job_flags(model_dir, updates, *extra,
                                           peer_timeout=peer_timeout),
        log_dir, f"worker{index}", env=env))
  return runs
