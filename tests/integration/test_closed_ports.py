"""A job's TensorFlow servers, attacked for real (clusterspec/closing.py).

Each attack is a real TensorFlow client (tests/helpers/attacks.py) that
opens a session on a task's port and runs `tf.io.read_file` of a secret
(mode 600, root's) and `tf.io.write_file` into a directory only root may
write, pinned to that task. Attackers: another host on the job's network
(a namespace of this test's own on a veth link), over IPv4 and IPv6, and
another local user (`nobody`) over 127.0.0.1 and [::1]. With the ports
left open (`--isolation open`) every attack gets in: that is what shows
the attack is real. Closed, none reads or writes anything, the job ends
as it would have, and nothing is left behind: no nftables table, no
namespace, no holder process, after a normal end, SIGTERM and SIGKILL.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.helpers import attacks
from tfconfig import testbed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SERVER_ONLY = os.path.join(ROOT, "tests", "jobs", "server_only.py")
pytestmark = pytest.mark.slow


@pytest.fixture
def stage():
  """The attacks' secret and drop directory, and the job's stop file, in a
  directory every user may enter (pytest's own is root's alone, and an
  unprivileged job must see its stop file)."""
  reason = attacks.available()
  if reason:
    if os.environ.get("CI"):
      pytest.fail(f"the closing tests must run in CI: {reason}")
    pytest.skip(reason)
  directory = tempfile.mkdtemp(prefix="closed_ports_", dir="/tmp")
  os.chmod(directory, 0o755)
  secret = os.path.join(directory, "secret")
  with open(secret, "w", encoding="utf-8") as stream:
    stream.write("the job's secret")
  os.chmod(secret, 0o600)
  drop = os.path.join(directory, "drop")
  os.mkdir(drop, 0o755)
  yield {"secret": secret, "drop": drop,
         "stop": os.path.join(directory, "stop"), "dir": directory}
  shutil.rmtree(directory, ignore_errors=True)


def _start(prefix, flags, stop, tasks=2, env=None, python=sys.executable,
           command=None):
  """Starts `python -m tfconfig launch FLAGS -- <server_only.py STOP>`
  behind `prefix`; returns (process, ports in cluster order, task names,
  the lines read so far) once every task serves."""
  command = command or [python, SERVER_ONLY, stop]
  launch = list(prefix) + [python, "-m", "tfconfig", "launch", *flags,
                           "--timeout", "200", "--", *command]
  process = subprocess.Popen(launch, cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True,
                             env=env or dict(os.environ),
                             start_new_session=True)
  lines, deadline = [], time.monotonic() + 120
  while sum("serving grpc://" in line for line in lines) < tasks:
    line = process.stdout.readline()
    if not line or time.monotonic() > deadline:
      process.kill()
      raise AssertionError("the job did not start: " + "".join(lines)[-3000:])
    lines.append(line)
  cluster = next(line for line in lines if "[tfconfig] cluster" in line)
  found = re.findall(r"(\w+:\d+)=[^ ]*?:(\d+)", cluster)
  return process, [int(p) for _, p in found], [t for t, _ in found], lines


def _finish(process, stop, lines):
  open(stop, "w").close()
  out, _ = process.communicate(timeout=60)
  return process.returncode, "".join(lines) + out


def _assert_all_in(results, what):
  for result in results:
    assert result["read"] == "the job's secret" and result["wrote"], (
        f"{what}: the open job should have let this attack in (the attack "
        f"is not real otherwise): {result}")


def _assert_none_in(results, stage, what):
  for result in results:
    assert result["read"] is None and not result["wrote"], (
        f"{what}: an attack got in: {result}")
  assert not os.listdir(stage["drop"]), os.listdir(stage["drop"])


def _tables(prefix=()):
  result = subprocess.run(list(prefix) + ["nft", "list", "tables"],
                          capture_output=True, text=True, check=False)
  return [line for line in result.stdout.splitlines()
          if "estimator_accum_" in line]


def _processes(pattern):
  """Ids of the processes whose command line matches `pattern` (a regular
  expression over its arguments joined by spaces), from /proc."""
  found = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == os.getpid():
      continue
    try:
      with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
        text = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
      continue
    if re.search(pattern, text.strip()):
      found.append(int(entry))
  return found


def _holders(launcher):
  """Holder processes (clusterspec/closing.py) of the launcher `launcher`."""
  return _processes(rf"clusterspec\.closing_holder [a-z-]+ {launcher}$")


@pytest.mark.parametrize("mode", ["open", "auto", "namespace"])
def test_one_host_launch_is_closed_to_other_hosts_and_users(mode, stage):
  """The README's launch, as root: `auto` writes the firewall; a private
  namespace is the other way; `open` is TensorFlow's default, and every
  attack then gets in."""
  with attacks.JobHost() as host:
    process, ports, tasks, lines = _start(
        host.exec_prefix(), ["--workers", "2", "--isolation", mode],
        stage["stop"])
    try:
      if mode == "auto":
        assert len(_tables(host.exec_prefix())) == 1
      if mode != "open":
        assert len(_holders(process.pid)) == 1
      remote = host.from_attacker(ports, tasks, stage["secret"],
                                  stage["drop"])
      local = host.from_local_user(ports, tasks, stage["secret"],
                                   stage["drop"])
    finally:
      code, output = _finish(process, stage["stop"], lines)
    assert code == 0, output[-3000:]
    assert len(remote) == len(local) == 4
    if mode == "open":
      _assert_all_in(remote + local, "open")
      assert "open to every host and local user" in output
    else:
      _assert_none_in(remote, stage, f"{mode}: another host")
      _assert_none_in(local, stage, f"{mode}: another local user")
      assert ("closed to other hosts" in output if mode == "auto" else
              "private network namespace" in output), output[-2000:]
    assert _tables(host.exec_prefix()) == []
  assert _holders(process.pid) == []


def test_parameter_server_job_is_closed(stage):
  """A parameter-server job's every port, and the ps's port used to reach
  the chief and the workers through it."""
  with attacks.JobHost() as host:
    process, ports, tasks, lines = _start(
        host.exec_prefix(), ["--chief", "--workers", "2", "--ps", "1"],
        stage["stop"], tasks=4)
    try:
      ps = tasks.index("ps:0")
      targets = [(port, task) for port, task in zip(ports, tasks)] + [
          (ports[ps], task) for task in tasks if task != "ps:0"]
      remote = host.from_attacker([p for p, _ in targets],
                                  [t for _, t in targets], stage["secret"],
                                  stage["drop"])
      local = host.from_local_user([p for p, _ in targets],
                                   [t for _, t in targets], stage["secret"],
                                   stage["drop"])
    finally:
      code, output = _finish(process, stage["stop"], lines)
    assert code == 0, output[-3000:]
    assert len(remote) == len(local) == 2 * 7
    _assert_none_in(remote + local, stage, "parameter-server job")


def _unprivileged_python():
  """An interpreter `nobody` may run with this venv's packages: this
  machine's venv links into root's home, which other users cannot reach,
  so the system's python of the same version, given the venv's
  site-packages."""
  import sysconfig  # noqa: PLC0415

  version = f"python{sys.version_info.major}.{sys.version_info.minor}"
  for candidate in (sys.executable, f"/usr/bin/{version}",
                    f"/usr/local/bin/{version}"):
    probe = subprocess.run(
        attacks.as_user() + [candidate, "-c", "import subprocess, sys; "
                             "subprocess.run([sys.executable, '-c', ''], "
                             "check=True)"],
        capture_output=True, check=False, cwd="/")
    if probe.returncode == 0:
      return candidate, os.pathsep.join(
          [ROOT, sysconfig.get_paths()["purelib"],
           sysconfig.get_paths()["platlib"]])
  pytest.fail(f"no {version} that user nobody may run here (tried "
              f"{sys.executable} and /usr/bin/{version})")


def test_unprivileged_launch_runs_in_a_user_namespace(stage):
  """A user without root: no firewall, so `auto` makes an unprivileged
  user namespace with a network namespace in it. Another host, another
  local user and root on the same host all fail to get in, and the tasks
  write their files as their own user."""
  python, path = _unprivileged_python()
  env = dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="3")
  with attacks.JobHost() as host:
    process, ports, tasks, lines = _start(
        host.exec_prefix() + attacks.as_user(), ["--workers", "2"],
        stage["stop"], env=env, python=python)
    try:
      remote = host.from_attacker(ports, tasks, stage["secret"],
                                  stage["drop"])
      other_user = attacks.attack(
          attacks.local_targets(ports, tasks), stage["secret"],
          stage["drop"], host.exec_prefix() + attacks.as_user(uid=1))
      root = attacks.attack(attacks.local_targets(ports, tasks),
                            stage["secret"], stage["drop"],
                            host.exec_prefix())
    finally:
      code, output = _finish(process, stage["stop"], lines)
    assert code == 0, output[-3000:]
    assert "private network namespace" in output, output[-2000:]
    # The tasks run as their own user, not as root of the namespace.
    assert output.count(f"as uid {attacks.NOBODY}") == 2, output[-2000:]
    for what, results in (("another host", remote),
                          ("another local user", other_user),
                          ("root over loopback", root)):
      _assert_none_in(results, stage, f"unprivileged job: {what}")


def test_a_mode_that_cannot_be_had_is_one_line(stage):
  """Not root: the firewall cannot be written. One line naming why and
  the flag that opens the ports; no task starts, no traceback."""
  python, path = _unprivileged_python()
  env = dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="3")
  result = subprocess.run(
      attacks.as_user() + [python, "-m", "tfconfig", "launch", "--isolation",
                           "firewall", "--workers", "2", "--", python, "-c",
                           "print('TASK RAN')"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
  assert result.returncode == 2, result.stderr
  errors = [line for line in result.stderr.splitlines()
            if line.startswith("error:")]
  assert len(errors) == 1, result.stderr
  assert "not root and no CAP_NET_ADMIN" in errors[0]
  assert "--isolation open" in errors[0]
  assert "Traceback" not in result.stderr
  assert "TASK RAN" not in result.stdout


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("mode", ["auto", "namespace"])
def test_nothing_is_left_behind_when_the_launcher_is_stopped(stop, mode,
                                                             stage):
  with attacks.JobHost() as host:
    process, ports, tasks, _ = _start(
        host.exec_prefix(), ["--workers", "2", "--isolation", mode],
        stage["stop"])
    pids = _task_pids(ports, host)
    assert len(pids) == 2
    if mode == "auto":
      assert len(_tables(host.exec_prefix())) == 1
    assert len(_holders(process.pid)) == 1
    # The launcher alone (`ip netns exec` execs it: the same process), as
    # a batch system or an operator stops it.
    os.kill(process.pid, getattr(signal, stop))
    process.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
        _tables(host.exec_prefix()) or _holders(process.pid) or
        any(_alive(pid) for pid in pids)):
      time.sleep(0.2)
    assert _tables(host.exec_prefix()) == []
    assert _holders(process.pid) == []
    assert not any(_alive(pid) for pid in pids)
  assert not any(name.startswith((host.host, host.attacker))
                 for name in testbed.namespaces(""))


def _alive(pid):
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
      return stat.read().split(") ")[1][0] != "Z"
  except OSError:
    return False


def _task_pids(ports, host):
  """The processes of the tasks (server_only.py) of this launch."""
  pids = []
  for pid in _processes(re.escape(SERVER_ONLY)):
    try:
      with open(f"/proc/{pid}/environ", "rb") as environ:
        text = environ.read().decode(errors="replace")
    except OSError:
      continue
    if any(f":{port}" in text for port in ports):
      pids.append(pid)
  del host
  return pids


@pytest.mark.parametrize("name", ["adam"])
def test_a_training_job_under_attack_ends_at_the_same_weights(name, stage):
  """Two MultiWorkerMirroredStrategy workers of a plain graph, attacked
  from another host and another user while their servers are up: the
  closed job ends at the weights the same job reaches with its ports
  open (1e-6), which are the big batch's."""
  import numpy as np  # noqa: PLC0415

  from harness import support  # noqa: PLC0415
  from tests.jobs import graph_multiworker_job as job  # noqa: PLC0415

  weights = {}
  with attacks.JobHost() as host:
    for mode in ("open", "auto"):
      gate = stage["stop"] + mode
      process, ports, tasks, lines = _start(
          host.exec_prefix(), ["--workers", "2", "--isolation", mode], gate,
          env=dict(os.environ, JOB_GATE=gate),
          command=[sys.executable, "tests/jobs/graph_multiworker_job.py",
                   name])
      try:
        if mode == "auto":
          results = host.from_attacker(ports, tasks, stage["secret"],
                                       stage["drop"]) + host.from_local_user(
              ports, tasks, stage["secret"], stage["drop"])
      finally:
        code, output = _finish(process, gate, lines)
      assert code == 0, output[-3000:]
      found = [json.loads(line.split("WEIGHTS ", 1)[1])
               for line in output.splitlines() if "WEIGHTS " in line]
      assert len(found) == 2, output[-3000:]
      weights[mode] = {key: np.array(value) for key, value in found[0].items()}
  _assert_none_in(results, stage, "a training job")
  for key, value in weights["open"].items():
    np.testing.assert_allclose(weights["auto"][key], value, rtol=1e-6,
                               atol=1e-7, err_msg=key)
  data = support.make_data(job.K * job.B * 2 * job.STEPS)
  expected = support.reference_train(job.OPTIMIZERS[name], data,
                                     job.K * job.B * 2, job.STEPS)
  support.assert_weights_close(weights["auto"], expected,
                               what="closed job under attack")


# Multi-host jobs -------------------------------------------------------------


def _bed_targets(bed, tasks):
  """Every task's port on its test-bed host, over IPv4 and IPv6."""
  return [{"address": f"{address}:{testbed.PORT}", "task": task}
          for index, task in enumerate(tasks)
          for address in (bed.address(index), f"[{bed.address6(index)}]")]


def _bed(tag):
  """A three-host test bed of this test's own (skipped where the machine
  cannot make one, failed in CI), after removing the beds of dead runs."""
  reason = testbed.available()
  assert reason is None or not os.environ.get("CI"), reason
  if reason:
    pytest.skip(reason)
  testbed.remove_leftovers(only_dead=True)
  return testbed.TestBed(3, name=f"{testbed.PREFIX}{os.getpid()}{tag}")


def test_multi_host_job_admits_only_its_peers(stage):
  """Two hosts of a test bed run the job, each task behind `tfconfig
  guard` (what `launch --netns` puts before every task); a third host on
  the same switch attacks both over IPv4 and IPv6, and `nobody` on a
  job's host over loopback and the host's own address. Nothing gets in;
  the job's own tasks keep talking (the job ends normally); no table is
  left in any host."""
  bed = _bed("c")
  with bed:
    process, ports, tasks, lines = _start(
        [], ["--netns", bed.name, "--workers", "2"], stage["stop"])
    try:
      targets = _bed_targets(bed, tasks)
      remote = attacks.attack(targets, stage["secret"], stage["drop"],
                              bed.exec_prefix(2))
      local = attacks.attack(
          [{"address": address, "task": "worker:0"} for address in (
              f"127.0.0.1:{testbed.PORT}", f"[::1]:{testbed.PORT}",
              f"{bed.address(0)}:{testbed.PORT}")] +
          [{"address": f"{bed.address(1)}:{testbed.PORT}",
            "task": "worker:1"}],
          stage["secret"], stage["drop"], bed.exec_prefix(0) +
          attacks.as_user())
      tables = [_tables(bed.exec_prefix(i)) for i in range(2)]
    finally:
      code, output = _finish(process, stage["stop"], lines)
    assert code == 0, output[-3000:]
    assert all(len(t) == 1 for t in tables), tables
    assert output.count("admits only the cluster's") == 2, output[-2000:]
    _assert_none_in(remote, stage, "multi-host: a third host")
    _assert_none_in(local, stage, "multi-host: another local user")
    assert [_tables(bed.exec_prefix(i)) for i in range(3)] == [[], [], []]
  assert ports == [testbed.PORT] * 2


def test_multi_host_job_open_lets_the_third_host_in(stage):
  """The control of the test above: `--isolation open` on the same bed,
  and the third host's attack gets in."""
  bed = _bed("o")
  with bed:
    process, _, tasks, lines = _start(
        [], ["--netns", bed.name, "--workers", "2", "--isolation", "open"],
        stage["stop"])
    try:
      targets = _bed_targets(bed, tasks)
      remote = attacks.attack(targets, stage["secret"], stage["drop"],
                              bed.exec_prefix(2))
    finally:
      code, output = _finish(process, stage["stop"], lines)
    assert code == 0, output[-3000:]
    _assert_all_in(remote, "multi-host, open")


@pytest.mark.parametrize("end", ["exit", "SIGTERM", "SIGKILL"])
def test_a_guarded_tasks_table_goes_with_it_however_it_ends(end, stage):
  """`guard` execs the task: the table's holder is the task's child and
  ends with it, on a normal exit, SIGTERM or SIGKILL."""
  config = {"cluster": {"worker": ["127.0.0.1:23456", "[::1]:23457"]},
            "task": {"type": "worker", "index": 0}}
  env = dict(os.environ, TF_CONFIG=json.dumps(config))
  seconds = "0.5" if end == "exit" else "60"
  with attacks.JobHost() as host:
    task = subprocess.Popen(
        host.exec_prefix() + [sys.executable, "-m", "tfconfig", "guard",
                              "--isolation", "firewall", "--", "sleep",
                              seconds],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    deadline = time.monotonic() + 30
    while not (_holders(task.pid) and _tables(host.exec_prefix())) and (
        time.monotonic() < deadline):
      time.sleep(0.05)
    assert len(_holders(task.pid)) == 1
    assert len(_tables(host.exec_prefix())) == 1
    # The task is `sleep` now, the same process: exec kept its id.
    with open(f"/proc/{task.pid}/comm", encoding="ascii") as comm:
      assert comm.read().strip() in ("sleep", "python")
    if end != "exit":
      os.kill(task.pid, getattr(signal, end))
    task.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while (_tables(host.exec_prefix()) or _holders(task.pid)) and (
        time.monotonic() < deadline):
      time.sleep(0.05)
    assert _tables(host.exec_prefix()) == []
    assert _holders(task.pid) == []


def test_guard_without_root_names_the_port_and_the_commands(stage):
  """Not root: the guard cannot write rules; it says so in one line with
  the port and the nft commands that close it, and runs the task."""
  python, path = _unprivileged_python()
  config = {"cluster": {"worker": ["127.0.0.1:23456", "[::1]:23457"]},
            "task": {"type": "worker", "index": 0}}
  env = dict(os.environ, PYTHONPATH=path, TF_CONFIG=json.dumps(config))
  result = subprocess.run(
      attacks.as_user() + [python, "-m", "tfconfig", "guard", "--", python,
                           "-c", "print('TASK RAN')"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
  assert result.returncode == 0, result.stderr
  assert "TASK RAN" in result.stdout
  warning = [line for line in result.stderr.splitlines() if "OPEN" in line]
  assert len(warning) == 1, result.stderr
  assert "port 23456" in warning[0] and "nft -f -" in warning[0]
  assert "tcp dport 23456 counter drop" in warning[0]
  assert "127.0.0.1" in warning[0] and "::1" in warning[0]
  assert "Traceback" not in result.stderr


def _unclosed_environment():
  """This environment without what says a task's port was closed or how to
  close it: a task started by the user's own command."""
  return {k: v for k, v in os.environ.items()
          if k not in ("ESTIMATOR_ACCUM_PORTS", "ESTIMATOR_ACCUM_ISOLATION")}


def _own_command_job(bed, stage, isolation=None):
  """Two hosts of `bed` each run a task by a plain per-host command with
  TF_CONFIG, no launcher and no guard: the task imports estimator_accum
  (which closes its port) and then serves, reaching its peer. Returns the
  processes once both served and reached each other."""
  cluster = {"worker": [f"{bed.address(i)}:{testbed.PORT}" for i in (0, 1)]}
  processes = []
  for index in (0, 1):
    env = _unclosed_environment()
    env["TF_CONFIG"] = json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": index}})
    if isolation:
      env["ESTIMATOR_ACCUM_ISOLATION"] = isolation
    processes.append(subprocess.Popen(
        bed.exec_prefix(index) + [sys.executable, SERVER_ONLY, stage["stop"],
                                  "--library", "--reach"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True))
  outputs = [[] for _ in processes]
  deadline = time.monotonic() + 150
  for process, lines in zip(processes, outputs):
    while not any(line.startswith("reached") for line in lines):
      line = process.stdout.readline()
      if not line or time.monotonic() > deadline:
        for each in processes:
          each.kill()
        raise AssertionError("the own-command job did not start: " +
                             "".join(sum(outputs, []))[-3000:])
      lines.append(line)
  return processes, outputs


def _end_own_command_job(processes, outputs, stage):
  open(stage["stop"], "w").close()
  for process, lines in zip(processes, outputs):
    out, _ = process.communicate(timeout=60)
    lines.append(out)
  return [p.returncode for p in processes], ["".join(o) for o in outputs]


@pytest.mark.parametrize("isolation", [None, "open"])
def test_own_per_host_command_is_closed_by_importing_the_library(
    isolation, stage):
  """A user's own per-host command with TF_CONFIG, no launcher: each of
  two test-bed hosts runs `python task.py` that imports estimator_accum
  and serves. The import closes its port before the server starts (as
  root: a table admitting only the cluster's hosts). A third host (IPv4,
  IPv6) and `nobody` on a job's host get nothing, the two tasks still
  reach each other, and the tables go with the tasks. With
  ESTIMATOR_ACCUM_ISOLATION=open (the control) the third host gets in."""
  bed = _bed("u")
  with bed:
    processes, outputs = _own_command_job(bed, stage, isolation)
    try:
      remote = attacks.attack(_bed_targets(bed, ["worker:0", "worker:1"]),
                              stage["secret"], stage["drop"],
                              bed.exec_prefix(2))
      local = [] if isolation else attacks.attack(
          [{"address": address, "task": "worker:0"} for address in (
              f"127.0.0.1:{testbed.PORT}", f"[::1]:{testbed.PORT}",
              f"{bed.address(0)}:{testbed.PORT}")],
          stage["secret"], stage["drop"],
          bed.exec_prefix(0) + attacks.as_user())
      tables = [_tables(bed.exec_prefix(i)) for i in range(2)]
    finally:
      codes, texts = _end_own_command_job(processes, outputs, stage)
    assert codes == [0, 0], texts
    if isolation == "open":
      _assert_all_in(remote, "own command, ESTIMATOR_ACCUM_ISOLATION=open")
      assert tables == [[], []]
      return
    assert all(len(t) == 1 for t in tables), tables
    for text in texts:
      assert text.count("[estimator_accum] worker:") == 1, text
      assert "admits only the cluster's" in text, text
    _assert_none_in(remote, stage, "own command: a third host")
    _assert_none_in(local, stage, "own command: another local user")
    deadline = time.monotonic() + 10
    while any(_tables(bed.exec_prefix(i)) for i in range(2)) and (
        time.monotonic() < deadline):
      time.sleep(0.1)
    assert [_tables(bed.exec_prefix(i)) for i in range(3)] == [[], [], []]


def test_own_command_without_root_names_its_open_port(stage):
  """Not root, no launcher: importing estimator_accum in a task with
  TF_CONFIG cannot write rules; it says so in one line naming the port
  and the nft table that closes it, and the task goes on."""
  python, path = _unprivileged_python()
  config = {"cluster": {"worker": ["127.0.0.1:23458", "[::1]:23459"]},
            "task": {"type": "worker", "index": 0}}
  env = _unclosed_environment()
  env.update(PYTHONPATH=path, TF_CONFIG=json.dumps(config),
             TF_CPP_MIN_LOG_LEVEL="3", HOME=stage["dir"])
  result = subprocess.run(
      attacks.as_user() + [python, "-c", "import estimator_accum; "
                           "print('TASK RAN')"],
      cwd=stage["dir"], env=env, capture_output=True, text=True, timeout=180)
  assert result.returncode == 0, result.stderr
  assert "TASK RAN" in result.stdout
  warning = [line for line in result.stderr.splitlines() if "OPEN" in line]
  assert len(warning) == 1, result.stderr
  assert warning[0].startswith("[estimator_accum] warning: worker:0's port "
                               "23458 is OPEN"), warning[0]
  assert "nft -f -" in warning[0] and "tcp dport 23458 counter drop" in (
      warning[0])
  assert "Traceback" not in result.stderr


@pytest.mark.parametrize("end", ["exit", "SIGKILL"])
def test_the_librarys_table_goes_with_its_task(end, stage):
  """The table estimator_accum's import writes for a task with TF_CONFIG
  is held by a child of the task: it goes when the task exits or is
  killed, and a process the launcher closed (ESTIMATOR_ACCUM_PORTS set)
  writes none."""
  config = {"cluster": {"worker": ["127.0.0.1:23460", "[::1]:23461"]},
            "task": {"type": "worker", "index": 0}}
  env = _unclosed_environment()
  env.update(TF_CONFIG=json.dumps(config), TF_CPP_MIN_LOG_LEVEL="3")
  code = ("import sys, time, estimator_accum; print('imported', flush=True); "
          "time.sleep(float(sys.argv[1]))")
  with attacks.JobHost() as host:
    closed_by_launcher = subprocess.run(
        host.exec_prefix() + [sys.executable, "-c", code, "0"], cwd=ROOT,
        env=dict(env, ESTIMATOR_ACCUM_PORTS="tfconfig launch:firewall"),
        capture_output=True, text=True, timeout=180)
    assert closed_by_launcher.returncode == 0, closed_by_launcher.stderr
    assert "[estimator_accum]" not in closed_by_launcher.stderr
    task = subprocess.Popen(
        host.exec_prefix() + [sys.executable, "-c", code,
                              "0.5" if end == "exit" else "60"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    assert task.stdout.readline().strip() == "imported", task.stderr.read()
    assert len(_tables(host.exec_prefix())) == 1
    assert len(_processes(rf"clusterspec\.closing_holder table {task.pid}$")) == 1
    if end == "SIGKILL":
      task.kill()
    task.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while _tables(host.exec_prefix()) and time.monotonic() < deadline:
      time.sleep(0.05)
    assert _tables(host.exec_prefix()) == []
    assert _processes(rf"clusterspec\.closing_holder table {task.pid}$") == []
