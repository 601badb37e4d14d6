"""tfconfig: validation messages, show/print, and real local launches."""

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

import tfconfig
from tests.helpers import processes
from tfconfig import launch
from tfconfig import ports as tfconfig_ports


def _cluster(**cluster):
  return {"cluster": cluster}


@pytest.mark.parametrize("text, message", [
    ("{not json", "TF_CONFIG: not valid JSON: Expecting property name "
     "enclosed in double quotes at line 1 column 2"),
    (json.dumps(_cluster(trainer=["a:1"])), "TF_CONFIG: unknown task type "
     "'trainer' in 'cluster'; expected one of chief, worker, ps, evaluator, "
     "master, workerpool0, workerpool1, workerpool2, workerpool3"),
    (json.dumps(dict(_cluster(worker=["a:1"]), task={"type": "worker",
                                                     "index": 1})),
     "TF_CONFIG: task index 1 is out of range for 'worker', which has 1 "
     "task(s)"),
    (json.dumps(_cluster(worker=["localhost"])), "TF_CONFIG: worker:0 address "
     "'localhost' has no port; expected host:port"),
    (json.dumps(_cluster(worker=["a:1"], ps=["b:2"])), "TF_CONFIG: "
     "parameter-server training needs a chief (or master); 'cluster' has ps but no chief"),
    (json.dumps(dict(_cluster(worker=["a:1"]), task={"type": "chief"})),
     "TF_CONFIG: task type 'chief' is not in 'cluster' (which has worker)"),
    (json.dumps({"cluster": {}}), "TF_CONFIG: 'cluster' must be a non-empty "
     "object of task type -> addresses, got {}"),
    (json.dumps(_cluster(chief=["a:1"], worker=["b:1", "a:1"])), "TF_CONFIG: "
     "address 'a:1' is given to both chief:0 and worker:1; every task needs "
     "its own host:port"),
    (json.dumps(dict(_cluster(worker=["a:1"]), task={"type": "worker",
                                                     "index": "first"})),
     "TF_CONFIG: task index 'first' is not an integer (a JSON number such as "
     "0)"),
    (json.dumps(dict(_cluster(worker=["a:1"]), task={"type": "evaluator",
                                                     "index": -1})),
     "TF_CONFIG: task index -1 of the evaluator must be >= 0"),
])
def test_parse_errors_are_one_clear_line(text, message):
  with pytest.raises(tfconfig.TFConfigError) as raised:
    tfconfig.parse(text)
  assert str(raised.value) == message


def test_what_tensorflow_accepts_is_accepted():
  # The evaluator is named in "task" only (RunConfig: "Evaluator is not part
  # of the training cluster"), and TensorFlow reads the index with int().
  evaluator = dict(_cluster(chief=["a:1"], worker=["b:1"]),
                   task={"type": "evaluator", "index": 0})
  assert tfconfig.parse(json.dumps(evaluator)) == evaluator
  assert tfconfig.describe(evaluator).splitlines()[-1] == (
      "evaluator:0  (this task; not part of the training cluster)")
  worker = dict(_cluster(worker=["a:1", "b:1"]),
                task={"type": "worker", "index": "1"})
  assert tfconfig.parse(json.dumps(worker)) == worker
  assert tfconfig.describe(worker).splitlines()[1] == "worker:1  b:1  (this task)"


def test_from_environment(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  assert tfconfig.from_environment() == {}
  monkeypatch.setenv("TF_CONFIG", json.dumps(dict(
      _cluster(worker=["a:1", "b:1"]), task={"type": "worker", "index": "1"})))
  assert tfconfig.from_environment()["task"] == {"type": "worker", "index": 1}
  with pytest.raises(tfconfig.TFConfigError, match="this job needs a chief"):
    tfconfig.from_environment(require_chief=True)


def test_from_environment_reads_once_and_follows_a_change(monkeypatch):
  """Read once per TF_CONFIG text (the library asks at every stop check);
  a caller's change to what it got is its own; a new text is read anew,
  and a bad one is refused every time it is asked."""
  first = json.dumps(dict(_cluster(worker=["a:1", "b:1"]),
                          task={"type": "worker", "index": 0}))
  monkeypatch.setenv("TF_CONFIG", first)
  got = tfconfig.from_environment()
  got["task"]["index"] = 7
  assert tfconfig.from_environment()["task"]["index"] == 0
  monkeypatch.setenv("TF_CONFIG", first.replace('"index": 0', '"index": 1'))
  assert tfconfig.from_environment()["task"]["index"] == 1
  monkeypatch.setenv("TF_CONFIG", "{not json")
  for _ in range(2):
    with pytest.raises(tfconfig.TFConfigError, match="TF_CONFIG"):
      tfconfig.from_environment()


def test_missing_chief_where_required():
  with pytest.raises(tfconfig.TFConfigError, match="this job needs a chief"):
    tfconfig.parse(json.dumps(_cluster(worker=["a:1"])), require_chief=True)


def test_build_and_for_task():
  cluster = tfconfig.build(workers=["h1:2222", "h2:2222"], chief="h0:2222",
                           ps=["h3:2222"], evaluator="h4:2222")
  assert tfconfig.tasks(cluster) == [("chief", 0), ("worker", 0),
                                     ("worker", 1), ("ps", 0),
                                     ("evaluator", 0)]
  worker = tfconfig.for_task(cluster, "worker", 1)
  assert worker == {"cluster": {"chief": ["h0:2222"],
                                "worker": ["h1:2222", "h2:2222"],
                                "ps": ["h3:2222"]},
                    "task": {"type": "worker", "index": 1}}
  assert "evaluator" not in tfconfig.for_task(cluster, "evaluator",
                                              0)["cluster"]


def _tfconfig(*args, env=None, timeout=120):
  return subprocess.run([sys.executable, "-m", "tfconfig", *args],
                        capture_output=True, text=True, timeout=timeout,
                        env=env)


def test_show_and_print(monkeypatch):
  printed = _tfconfig("print", "--workers", "h1:2222", "h2:2222",
                      "--chief", "h0:2222")
  assert printed.returncode == 0
  lines = printed.stdout.splitlines()
  assert lines[0] == "# chief:0 on h0:2222"
  value = lines[5].split("=", 1)[1].strip("'")
  assert json.loads(value)["task"] == {"type": "worker", "index": 1}

  import os
  env = dict(os.environ, TF_CONFIG=value)
  shown = _tfconfig("show", env=env)
  assert shown.stdout.splitlines() == [
      "chief:0  h0:2222", "worker:0  h1:2222", "worker:1  h2:2222  (this task)"]
  # Every value print gives, the evaluator's too, is one show accepts.
  printed = _tfconfig("print", "--workers", "h1:2222", "--chief", "h0:2222",
                      "--evaluator", "h4:2222")
  values = [line.split("=", 1)[1].strip("'")
            for line in printed.stdout.splitlines()[1::2]]
  assert len(values) == 3
  for value in values:
    shown = _tfconfig("show", env=dict(os.environ, TF_CONFIG=value))
    assert shown.returncode == 0, (value, shown.stderr)
  assert shown.stdout.splitlines()[-1] == (
      "evaluator:0  (this task; not part of the training cluster)")
  bad = _tfconfig("show", env=dict(os.environ, TF_CONFIG="{"))
  assert bad.returncode == 2
  assert bad.stderr.strip().startswith("error: TF_CONFIG: not valid JSON")


PRINT_TASK = ("import json, os; t = json.loads(os.environ['TF_CONFIG']); "
              "print('I am', t['task']['type'], t['task']['index'], "
              "len(t['cluster']['worker']))")


def test_launch_runs_every_task_with_its_config():
  result = _tfconfig("launch", "--workers", "2", "--chief", "--",
                     sys.executable, "-c", PRINT_TASK)
  assert result.returncode == 0, result.stdout + result.stderr
  out = result.stdout
  for task in ("chief:0] I am chief 0 2", "worker:0] I am worker 0 2",
               "worker:1] I am worker 1 2"):
    assert "[" + task in out, out
  assert "[tfconfig] all training tasks finished" in result.stderr
  assert "127.0.0.1:" in result.stderr.splitlines()[0]


def test_failing_task_stops_the_others_and_is_named():
  script = ("import json, os, sys, time; "
            "t = json.loads(os.environ['TF_CONFIG'])['task']; "
            "sys.exit(3) if t['index'] == 1 else time.sleep(120)")
  started = time.monotonic()
  result = _tfconfig("launch", "--workers", "2", "--chief", "--ps", "1", "--",
                     sys.executable, "-c", script)
  assert result.returncode == 3
  assert ("[tfconfig] task worker:1 failed with exit code 3; stopping the "
          "other tasks") in result.stderr
  assert time.monotonic() - started < 60, "the sleeping tasks were not stopped"


# Worker 1 exits 143 (stopped by SIGTERM, its window saved); the others
# note a SIGTERM of the launcher's, then exit 143 after `STOP_AFTER` s by
# themselves (or never, when it is "never").
STOPPING_TASK = """
import json, os, signal, sys, time
t = json.loads(os.environ["TF_CONFIG"])["task"]
signal.signal(signal.SIGTERM, lambda *_: print("SIGTERM", flush=True))
if (t["type"], t["index"]) == ("worker", 1):
  sys.exit(143)
after = os.environ["STOP_AFTER"]
time.sleep(300 if after == "never" else float(after))
sys.exit(143 if t["type"] != "ps" else 0)
"""


@pytest.mark.parametrize("after", ["0.5", "never"])
def test_a_task_stopped_by_sigterm_lets_the_others_stop_by_themselves(
    after):
  started = time.monotonic()
  result = _tfconfig("launch", "--workers", "2", "--chief", "--grace", "4",
                     "--", sys.executable, "-c", STOPPING_TASK,
                     env=dict(os.environ, STOP_AFTER=after))
  assert result.returncode == 143, result.stderr
  assert ("[tfconfig] task worker:1 failed with exit code 143 (it was "
          "stopped by SIGTERM); waiting up to 4 s for the other training "
          "tasks to stop with it") in result.stderr, result.stderr
  if after == "never":
    # After the grace period they are stopped (SIGTERM, then SIGKILL).
    assert result.stdout.count("SIGTERM") == 2, result.stdout
    assert time.monotonic() - started < 60
  else:
    # Stopping by themselves, they get no second SIGTERM from it.
    assert "SIGTERM\n" not in result.stdout, result.stdout


def test_a_command_that_cannot_start_is_one_line():
  result = _tfconfig("launch", "--workers", "2", "--",
                     "no-such-command-for-tfconfig", "--flag")
  assert result.returncode == 127
  assert "Traceback" not in result.stderr, result.stderr
  assert result.stderr.strip() == (
      "error: cannot start worker:0: 'no-such-command-for-tfconfig': No such "
      "file or directory")


def test_parameter_servers_are_stopped_when_training_ends():
  script = ("import json, os, time; "
            "t = json.loads(os.environ['TF_CONFIG'])['task']; "
            "time.sleep(600) if t['type'] == 'ps' else print('trained')")
  result = _tfconfig("launch", "--workers", "1", "--chief", "--ps", "1", "--",
                     sys.executable, "-c", script, timeout=90)
  assert result.returncode == 0
  assert "[worker:0] trained" in result.stdout


@pytest.mark.parametrize("wait", [None, "60"])
def test_evaluator_is_stopped_or_waited_for(wait):
  """Without --evaluator_wait the evaluator is stopped when training ends;
  with it, the evaluator finishes its last evaluation first."""
  evaluation_seconds = 1 if wait else 120
  script = ("import json, os, time; "
            "t = json.loads(os.environ['TF_CONFIG'])['task']; "
            f"time.sleep({evaluation_seconds}) if t['type'] == 'evaluator' "
            "else None; print(t['type'], 'finished')")
  flags = ["--evaluator_wait", wait] if wait else []
  started = time.monotonic()
  result = _tfconfig("launch", "--workers", "1", "--evaluator", *flags, "--",
                     sys.executable, "-c", script, timeout=90)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "[worker:0] worker finished" in result.stdout
  if wait:
    assert "[evaluator:0] evaluator finished" in result.stdout
    assert "waiting up to 60 s for the evaluator's last evaluation" in (
        result.stderr)
  else:
    assert "evaluator finished" not in result.stdout
    assert ("stopping evaluator:0 (still running; --evaluator_wait S lets it "
            "finish its last evaluation)") in result.stderr
    assert time.monotonic() - started < 60, "the evaluator was not stopped"


def test_launch_needs_a_command():
  result = _tfconfig("launch", "--workers", "2")
  assert result.returncode == 2
  assert "launch needs a command after --" in result.stderr


@pytest.mark.parametrize("flags, message", [
    (["--workers", "-1"], "error: --workers must be >= 0, got -1"),
    (["--ps", "-2"], "error: --ps must be >= 0, got -2"),
    (["--workers", "0"], "error: launch needs at least one training task, "
     "got --workers 0 and no chief"),
    (["--timeout", "0"], "error: --timeout must be a number of seconds > 0, "
     "got 0.0"),
    (["--evaluator", "--evaluator_wait", "-1"], "error: --evaluator_wait must "
     "be a number of seconds >= 0, got -1.0"),
    (["--evaluator_wait", "5"], "error: --evaluator_wait 5 needs --evaluator"),
])
def test_launch_refuses_bad_flags_before_starting_anything(flags, message):
  result = _tfconfig("launch", *flags, "--", sys.executable, "-c",
                     "print('started')")
  assert result.returncode == 2
  assert result.stderr.strip() == message
  assert "started" not in result.stdout


def test_print_refuses_one_address_for_two_tasks():
  result = _tfconfig("print", "--workers", "h1:2222", "h1:2222")
  assert result.returncode == 2
  assert "address 'h1:2222' is given to both worker:0 and worker:1" in (
      result.stderr)


# A task that records its pid, then sleeps; with IGNORE_TERM it survives
# SIGTERM, so only the launcher's SIGKILL after the grace period ends it.
SLEEPING_TASK = """
import json, os, signal, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
if "IGNORE_TERM" in os.environ:
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
path = os.path.join(sys.argv[1], f"{task['type']}_{task['index']}.pid")
with open(path + ".tmp", "w") as f:
  f.write(str(os.getpid()))
os.rename(path + ".tmp", path)
print("started", flush=True)
time.sleep(300)
"""


def _start_sleeping_launch(tmp_path, *flags, env=None):
  """Starts a launch of 2 workers and a ps that sleep; returns (launcher,
  task pids) once every task has written its pid."""
  launcher = subprocess.Popen(
      [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
       "--chief", "--ps", "1", *flags, "--", sys.executable, "-c",
       SLEEPING_TASK, str(tmp_path)],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=env, start_new_session=True)
  deadline = time.monotonic() + 60
  while len(list(tmp_path.glob("*.pid"))) < 4:
    assert time.monotonic() < deadline, "the tasks did not start"
    assert launcher.poll() is None, launcher.communicate()
    time.sleep(0.05)
  pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
  assert all(processes.alive(pid) for pid in pids)
  return launcher, pids


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP,
                                    signal.SIGINT])
def test_a_stopped_launcher_stops_every_task(tmp_path, signum):
  launcher, pids = _start_sleeping_launch(tmp_path)
  os.kill(launcher.pid, signum)
  out, err = launcher.communicate(timeout=60)
  assert launcher.returncode == 128 + signum, (out, err)
  assert not processes.wait_gone(pids, 5), "tasks left running after the launcher"
  name = signal.Signals(signum).name
  assert f"[tfconfig] received {name}; stopping every task" in err, err
  assert f"[tfconfig] stopped every task; exiting with {128 + signum}" in err
  assert "Traceback" not in err, err
  assert "[tfconfig]" not in out, "the launcher's lines belong on stderr"


def test_a_task_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path):
  env = dict(os.environ, IGNORE_TERM="1")
  launcher, pids = _start_sleeping_launch(tmp_path, "--grace", "1", env=env)
  started = time.monotonic()
  os.kill(launcher.pid, signal.SIGTERM)
  launcher.communicate(timeout=60)
  assert launcher.returncode == 128 + signal.SIGTERM
  assert not processes.wait_gone(pids, 5)
  assert time.monotonic() - started < 30


def test_a_second_signal_kills_at_once(tmp_path):
  env = dict(os.environ, IGNORE_TERM="1")
  launcher, pids = _start_sleeping_launch(tmp_path, "--grace", "300",
                                          env=env)
  os.kill(launcher.pid, signal.SIGINT)
  time.sleep(0.5)
  os.kill(launcher.pid, signal.SIGINT)
  launcher.communicate(timeout=60)
  assert launcher.returncode == 128 + signal.SIGINT
  assert not processes.wait_gone(pids, 5)


def test_tasks_die_with_a_launcher_killed_outright(tmp_path):
  launcher, pids = _start_sleeping_launch(tmp_path)
  os.kill(launcher.pid, signal.SIGKILL)
  launcher.communicate(timeout=60)
  assert not processes.wait_gone(pids, 10), "tasks outlived a SIGKILLed launcher"


def test_launch_says_how_its_ports_are_closed_or_that_they_are_open():
  result = _tfconfig("launch", "--workers", "1", "--", sys.executable, "-c",
                     "print('ok')")
  assert result.returncode == 0, result.stderr
  lines = [line for line in result.stderr.splitlines()
           if "closed to other hosts" in line or "private network" in line]
  assert len(lines) == 1, result.stderr
  opened = _tfconfig("launch", "--workers", "1", "--isolation", "open", "--",
                     sys.executable, "-c", "print('ok')")
  assert opened.returncode == 0, opened.stderr
  assert re.search(r"\[tfconfig\] port \d+ is open to every host and local "
                   r"user \(--isolation open\)", opened.stderr), opened.stderr


def test_closing_rules_cover_both_families_and_other_users():
  """The tables' text (the attacks themselves: tests/integration/
  test_closed_ports.py)."""
  import ipaddress  # noqa: PLC0415

  from clusterspec import closing as closed  # noqa: PLC0415

  rules = closed.one_host_rules("t", [2223, 2222, 2222], uid=1000)
  assert "table inet t {" in rules  # inet: IPv4 and IPv6 alike
  assert "elements = { 2222, 2223 }" in rules
  assert rules.index('iif "lo" accept;') < rules.index(
      "tcp dport @ports counter drop;")
  assert ("tcp flags & (syn | ack) == syn tcp dport @ports meta skuid != "
          "1000 counter reject with tcp reset;") in rules
  peers = [ipaddress.ip_address(a) for a in ("10.0.0.2", "10.0.0.1",
                                             "fd00::1")]
  rules = closed.peer_rules("t", 2222, peers, [2222, 2223], uid=0)
  assert "set peers4 { type ipv4_addr; elements = { 10.0.0.1, 10.0.0.2 }; }" in rules
  assert "set peers6 { type ipv6_addr; elements = { fd00::1 }; }" in rules
  assert rules.index("ip saddr @peers4 accept") < rules.index(
      "tcp dport 2222 counter drop")
  assert "fib daddr type local meta skuid != 0" in rules


@pytest.mark.parametrize("argv, message", [
    (["launch", "--isolation", "wide", "--", "true"], "invalid choice: 'wide'"),
    (["guard", "--isolation", "namespace", "--", "true"],
     "invalid choice: 'namespace'"),
])
def test_a_bad_isolation_is_one_line(argv, message):
  result = _tfconfig(*argv)
  assert result.returncode == 2
  assert message in result.stderr
  assert "Traceback" not in result.stderr


def test_guard_that_must_close_but_cannot_resolve_a_peer_is_one_line():
  env = dict(os.environ, TF_CONFIG=json.dumps(
      {"cluster": {"worker": ["127.0.0.1:2222", "no-such-host.invalid:2222"]},
       "task": {"type": "worker", "index": 0}}))
  result = _tfconfig("guard", "--isolation", "firewall", "--",
                     sys.executable, "-c", "print('TASK RAN')", env=env)
  assert result.returncode == 2
  assert result.stderr.strip() == (
      "error: cannot close worker:0's port 2222: cannot resolve "
      "no-such-host.invalid from TF_CONFIG, so its peers' addresses are "
      "unknown")
  assert "TASK RAN" not in result.stdout
  auto = _tfconfig("guard", "--", sys.executable, "-c", "print('TASK RAN')",
                   env=env)
  assert auto.returncode == 0 and "TASK RAN" in auto.stdout
  assert "port 2222 is OPEN" in auto.stderr


def test_an_absurd_number_of_tasks_is_one_line():
  result = _tfconfig("launch", "--workers", "100000", "--", sys.executable,
                     "-c", "print('started')")
  assert result.returncode == 2
  assert "Traceback" not in result.stderr
  assert result.stderr.strip() == (
      "error: --workers 100000 --ps 0: 100000 tasks, but a local launch runs "
      "at most 256 on this machine; for a larger cluster give each machine "
      "its TF_CONFIG (python -m tfconfig print)")


@pytest.mark.parametrize("text, message", [
    # Digits TensorFlow's int() would read, or fail on, but no port has.
    (json.dumps(_cluster(worker=["a:２２２２"])), "TF_CONFIG: worker:0 address "
     "'a:２２２２' is not host:port with a port in 1..65535"),
    (json.dumps(_cluster(worker=["a:2²"])), "TF_CONFIG: worker:0 address "
     "'a:2²' is not host:port with a port in 1..65535"),
    (json.dumps(dict(_cluster(worker=["a:1"]), task={"type": "worker",
                                                     "index": "٣"})),
     "TF_CONFIG: task index '٣' is not an integer (a JSON number such as 0)"),
    ("[" * 100_000 + "]" * 100_000,
     "TF_CONFIG: not a cluster: its JSON is nested too deeply"),
])
def test_odd_values_are_one_clear_line(text, message):
  with pytest.raises(tfconfig.TFConfigError) as raised:
    tfconfig.parse(text)
  assert str(raised.value) == message


@pytest.mark.parametrize("config", [
    _cluster(worker=["x" * 100_000]),
    _cluster(worker=["x" * 100_000 + ":1"]),
    dict(_cluster(worker=["a:1"]), task={"type": "worker", "index": 10**500}),
    dict(_cluster(worker=["a:1"]), task="t" * 100_000),
    _cluster(**{"w" * 100_000: ["a:1"]}),
])
def test_huge_values_are_quoted_short(config):
  with pytest.raises(tfconfig.TFConfigError) as raised:
    tfconfig.parse(json.dumps(config))
  assert len(str(raised.value)) < 400, str(raised.value)[:500]
  assert "characters" in str(raised.value)


def test_show_of_a_huge_or_deep_tf_config_is_one_line():
  for text in ("[" * 100_000, json.dumps(_cluster(worker=["x" * 100_000]))):
    shown = _tfconfig("show", env=dict(os.environ, TF_CONFIG=text))
    assert shown.returncode == 2
    assert "Traceback" not in shown.stderr
    assert len(shown.stderr.strip().splitlines()) == 1
    assert len(shown.stderr) < 400


# A launch's ports are chosen outside the kernel's ephemeral range: an
# outgoing connection (another job's gRPC, a health probe) may take an
# ephemeral port between the choice and the task's bind, and the task then
# fails with "Could not start gRPC server" (once in a whole-suite run).
def test_free_ports_lie_outside_the_ephemeral_range_and_are_free():
  first, last = tfconfig_ports._ephemeral_range()  # noqa: SLF001
  ports = launch.free_ports(16)
  assert len(set(ports)) == 16
  assert all(1024 <= p < 65536 and not first <= p <= last for p in ports)
  for port in ports:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
      sock.bind(("127.0.0.1", port))


def test_free_ports_skip_a_port_in_use(monkeypatch):
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    # The taken port outside the range, and the first one tried:
    monkeypatch.setattr(tfconfig_ports, "_ephemeral_range",
                        lambda: (port + 1, 65535))
    monkeypatch.setattr(tfconfig_ports.random, "SystemRandom", _LastFirst)
    ports = launch.free_ports(3)
  assert port not in ports and len(set(ports)) == 3
  assert all(p <= port for p in ports)


def test_free_ports_are_the_kernels_where_its_range_leaves_none(monkeypatch):
  monkeypatch.setattr(tfconfig_ports, "_ephemeral_range", lambda: (1024, 65535))
  ports = launch.free_ports(4)
  assert len(set(ports)) == 4


class _LastFirst:
  """Random choices whose first is the last port below the fake range (the
  taken one)."""

  def __init__(self):
    self._first = True

  def randrange(self, count):
    if self._first:
      self._first = False
      return count - 1
    return random.randrange(count)


@pytest.mark.parametrize("task_type, index, position", [
    ("chief", 0, 0), ("worker", 0, 1), ("worker", 2, 3)])
def test_a_trainers_position_counts_the_chief_first(task_type, index,
                                                    position):
  from clusterspec import config  # noqa: PLC0415

  cluster = {"chief": ["h0:1"], "worker": ["h1:1", "h2:1", "h3:1"],
             "ps": ["h4:1"]}
  assert config.trainer_position(cluster, task_type, index) == (4, position)
  assert config.trainer_position({"worker": ["h1:1", "h2:1"]}, "worker",
                                 1) == (2, 1)
