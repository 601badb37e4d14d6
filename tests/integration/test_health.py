"""estimator_accum.distribution.health's watchdog against real TensorFlow servers on loopback.

Each peer is a `tf.distribute.Server` in a process of its own; a fault is a
signal to that process. The watchdog's exit is recorded instead of taken.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from clusterspec import config as tfc
from estimator_accum.distribution import health
from tfconfig.launch import free_ports

# Whole jobs, processes or clusters: not the fast tier.
pytestmark = pytest.mark.slow

SERVER = """
import os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
cluster = {"worker": sys.argv[1].split(",")}
tf.distribute.Server(cluster, "worker", int(sys.argv[2]))
print("up", flush=True)
time.sleep(600)
"""


class _Exits:
  def __init__(self):
    self.codes = []

  def __call__(self, code):
    self.codes.append(code)

  def wait(self, seconds):
    deadline = time.monotonic() + seconds
    while not self.codes and time.monotonic() < deadline:
      time.sleep(0.1)
    return self.codes[0] if self.codes else None


@pytest.fixture
def servers():
  """servers(n) -> (cluster dict, processes), every process killed after."""
  started = []

  def start(count):
    addresses = [f"127.0.0.1:{port}" for port in free_ports(count)]
    processes = []
    for index in range(count):
      process = subprocess.Popen(
          [sys.executable, "-c", SERVER, ",".join(addresses), str(index)],
          stdout=subprocess.PIPE, text=True)
      started.append(process)
      processes.append(process)
    for process in processes:
      assert process.stdout.readline().strip() == "up"
    return {"cluster": {"worker": addresses}}, processes

  yield start
  for process in started:
    process.kill()
    process.wait()


def _watchdog(cluster, index, exits, model_dir=None, timeout=2.0,
              startup_timeout=30):
  config = dict(cluster, task={"type": "worker", "index": index})
  return health.Watchdog(config, model_dir=model_dir, timeout=timeout,
                         interval=0.3, startup_timeout=startup_timeout,
                         exit=exits)


@pytest.mark.parametrize("fault, reason", [
    (signal.SIGSTOP, "deadline exceeded"), (signal.SIGKILL, "unavailable")])
def test_a_lost_peer_ends_this_task_in_bounded_time(fault, reason, servers,
                                                     capfd):
  cluster, processes = servers(2)
  exits = _Exits()
  watchdog = _watchdog(cluster, 0, exits).start()
  try:
    time.sleep(1.0)
    assert exits.codes == []  # Both answer.
    processes[1].send_signal(fault)
    lost_at = time.monotonic()
    assert exits.wait(10) == health.PEER_LOST_EXIT
    took = time.monotonic() - lost_at
    # Silence counts from the peer's last answer, which came up to one
    # probe interval (0.3 s) before the fault: 2.0 s less that at the least.
    assert 2.0 - 0.3 <= took < 5.0, took
  finally:
    watchdog.stop()
    processes[1].send_signal(signal.SIGCONT)
  line = capfd.readouterr().err.strip().splitlines()[-1]
  assert line.startswith(f"[tfconfig] worker:0: lost worker:1 at "
                         f"{cluster['cluster']['worker'][1]}: no answer for ")
  assert line.endswith(f"({reason}); exiting with 150"), line


def _state(pid):
  """The process's state letter in /proc/PID/stat (T: stopped), or None."""
  try:
    with open(f"/proc/{pid}/stat") as stat:
      return stat.read().rsplit(")", 1)[1].split()[0]
  except OSError:
    return None


def _stopped(pid, seconds=2.0):
  deadline = time.monotonic() + seconds
  while _state(pid) != "T":
    if time.monotonic() > deadline:
      return False
    time.sleep(0.01)
  return True


def test_refusing_peers_names_the_exited_not_the_frozen(servers):
  """What a stop waiting for its micro-batch asks (preemption's
  _ExitedPeers): an exited peer refuses at once; a frozen one, whose port
  still accepts, is not named; one that answers is not either."""
  cluster, processes = servers(4)
  config = dict(cluster, task={"type": "worker", "index": 0})
  assert health.refusing_peers(config, deadline=0.5) == []
  assert health.peer_answers(config, deadline=0.5) == {
      "worker:1": None, "worker:2": None, "worker:3": None}
  processes[1].kill()
  processes[1].wait()
  processes[2].send_signal(signal.SIGSTOP)
  try:
    # Frozen for the kernel before anything asks it (once, in a whole-suite
    # run, the frozen peer answered: this says whether it was stopped).
    assert _stopped(processes[2].pid), (
        processes[2].pid, processes[2].poll(), _state(processes[2].pid))
    started = time.monotonic()
    assert health.refusing_peers(config, deadline=0.5) == ["worker:1"]
    assert time.monotonic() - started < 2.0
    # What a stop's lost-peer time rule asks: does every peer answer?
    assert health.peer_answers(config, deadline=0.5) == {
        "worker:1": "unavailable", "worker:2": "deadline exceeded",
        "worker:3": None}
  finally:
    processes[2].send_signal(signal.SIGCONT)


def test_a_peer_that_finished_is_not_lost(servers, tmp_path):
  cluster, processes = servers(2)
  exits = [_Exits(), _Exits()]
  # Worker 1's finish waits for worker 0 to finish too (the training
  # tasks leave together), up to its startup timeout: 3 s here.
  watchdogs = [_watchdog(cluster, i, exits[i], str(tmp_path),
                         startup_timeout=30 if i == 0 else 3).start()
               for i in range(2)]
  try:
    time.sleep(1.5)
    watchdogs[1].finish()
    processes[1].kill()
    time.sleep(4.0)  # Twice the timeout.
    assert exits[0].codes == []
    marker = json.loads((tmp_path / health.MARKER_DIR /
                         "worker-1.json").read_text())
    assert marker["state"] == "done"
  finally:
    for watchdog in watchdogs:
      watchdog.stop()


def test_a_model_dir_that_is_not_shared_is_found(servers, tmp_path, capfd):
  cluster, _ = servers(2)
  exits = [_Exits(), _Exits()]
  watchdogs = [_watchdog(cluster, i, exits[i], str(tmp_path / f"d{i}"))
               .start() for i in range(2)]
  try:
    for index in range(2):
      assert exits[index].wait(10) == health.MODEL_DIR_NOT_SHARED_EXIT
  finally:
    for watchdog in watchdogs:
      watchdog.stop()
  assert "is not the one worker:1 uses" in capfd.readouterr().err


@pytest.mark.parametrize("stopping", [False, True],
                         ids=["training_done", "sigterm_stop_serving"])
def test_a_parameter_server_ends_when_training_is_done(servers, tmp_path,
                                                       stopping, monkeypatch):
  # Stopping: a SIGTERM stop serves the variables in the ps; its own thread
  # exits with 143 once training has gone (tests/integration/
  # test_preemption.py), not this watchdog with 0.
  # The stop's own state, as a SIGTERM stop sets it (restored after).
  from estimator_accum.distribution import stop_state
  monkeypatch.setattr(stop_state.STOP, "asked_at",
                      time.monotonic() if stopping else None)
  cluster, _ = servers(3)
  addresses = cluster["cluster"]["worker"]
  config = {"cluster": {"chief": addresses[:1], "worker": addresses[1:2],
                        "ps": addresses[2:]}}
  exits = {name: _Exits() for name in ("chief", "worker", "ps")}

  def watchdog(task_type):
    return health.Watchdog(
        dict(config, task={"type": task_type, "index": 0}),
        model_dir=str(tmp_path), timeout=2.0, interval=0.3,
        exit=exits[task_type]).start()

  dogs = {name: watchdog(name) for name in exits}
  try:
    time.sleep(1.5)
    assert exits["ps"].codes == []
    dogs["worker"].finish()
    dogs["chief"].finish()
    assert exits["ps"].wait(2 if stopping else 5) == (None if stopping else 0)
    assert exits["chief"].codes == exits["worker"].codes == []
  finally:
    for dog in dogs.values():
      dog.stop()


def test_watch_outside_a_cluster_is_none(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  monkeypatch.delenv("CLUSTER_SPEC", raising=False)
  assert health.watch() is None
  evaluator = {"cluster": {"worker": ["a:1"]},
               "task": {"type": "evaluator", "index": 0}}
  assert health.watch(config=tfc.validate(evaluator)) is None


@pytest.mark.parametrize("arguments, message", [
    (dict(timeout=0), "timeout must be a number of seconds > 0, got 0"),
    (dict(interval=-1), "interval must be a number of seconds > 0, got -1"),
    (dict(timeout=1, interval=2), "interval (2) must not exceed timeout (1)"),
])
def test_bad_arguments_are_one_line(arguments, message):
  config = {"cluster": {"worker": ["a:1", "b:1"]},
            "task": {"type": "worker", "index": 0}}
  with pytest.raises(ValueError) as raised:
    health.Watchdog(config, **arguments)
  assert str(raised.value) == message


def test_exit_codes_are_distinct_and_retryable_where_they_should_be():
  assert health.PEER_LOST_EXIT >= 128  # Kubeflow's ExitCode retries these.
  assert health.MODEL_DIR_NOT_SHARED_EXIT < 128  # A permanent error.
  assert os.EX_CONFIG == health.MODEL_DIR_NOT_SHARED_EXIT


@pytest.mark.parametrize("cluster, task, hosts", [
    ({"chief": ["a:1"], "worker": ["b:1", "c:1"]}, ("chief", 0), True),
    ({"chief": ["a:1"], "worker": ["b:1", "c:1"]}, ("worker", 0), False),
    ({"worker": ["b:1", "c:1"]}, ("worker", 0), True),
    ({"worker": ["b:1", "c:1"]}, ("worker", 1), False),
])
def test_the_coordination_service_host_is_the_chief_or_worker_0(cluster, task,
                                                                 hosts):
  config = {"cluster": cluster, "task": {"type": task[0], "index": task[1]}}
  watchdog = health.Watchdog(config, timeout=2.0, interval=0.3)
  assert health.hosts_coordination_service(
      watchdog.task_type, watchdog.index, watchdog.peers) == hosts


def test_the_host_leaves_after_the_others_are_gone(servers):
  # worker 1's server answers, then goes: worker 0, the host, waits for
  # that (and no longer), so that worker 1 never outlives the service.
  cluster, processes = servers(2)
  watchdog = _watchdog(cluster, 0, exits=lambda code: None)
  threading.Timer(1.0, processes[1].kill).start()
  started = time.monotonic()
  health.outlive_peers(watchdog.peers, seconds=10)
  assert 0.9 < time.monotonic() - started < 5


_HEARTBEAT = """
import json, sys
from tensorflow.python.eager import context
from estimator_accum.distribution import health
config = json.loads(sys.argv[1])
print(health.coordination_heartbeat(60, config))
service = context.context().coordination_service
print(service.heartbeat_timeout_in_ms if service else None)
print(service.service_leader if service else None)
"""


@pytest.mark.parametrize("cluster, task, expected", [
    ({"worker": ["a:1", "b:1"]}, ("worker", 1),
     ["True", "60000", "/job:worker/replica:0/task:0"]),
    ({"chief": ["c:1"], "worker": ["a:1"]}, ("worker", 0),
     ["True", "60000", "/job:chief/replica:0/task:0"]),
    # The strategy configures no service there: neither does this.
    ({"worker": ["a:1"], "ps": ["p:1"]}, ("worker", 0),
     ["False", "None", "None"]),
    ({"worker": ["a:1"], "evaluator": ["e:1"]}, ("evaluator", 0),
     ["False", "None", "None"]),
])
def test_the_coordination_heartbeat_is_set_before_the_strategy(cluster, task,
                                                               expected):
  config = {"cluster": cluster, "task": {"type": task[0], "index": task[1]}}
  result = subprocess.run(
      [sys.executable, "-c", _HEARTBEAT, json.dumps(config)],
      capture_output=True, text=True, timeout=120,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split() == expected
