"""The suite's fork server (tests/helpers/fork_start.py) starts a child as
exec would: its argv, working directory, environment, pipes, exit status,
signals, session and, for the launcher's tasks, death with the launcher;
and it leaves to exec what it cannot start so."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.helpers import fork_start, processes

pytestmark = pytest.mark.skipif(
    not os.environ.get(fork_start.DIR_ENV) or
    os.environ.get(fork_start.SWITCH_ENV) == "0",
    reason="the session starts children with exec "
    "(ESTIMATOR_ACCUM_TEST_FORK=0)")

PROGRAM = textwrap.dedent("""\
    import os, sys, time
    print("argv", sys.argv)
    print("cwd", os.getcwd())
    print("env", os.environ.get("FORK_START_PROBE"))
    print("name", __name__)
    print("session", os.getsid(0) == os.getpid())
    print("stdin", sys.stdin.read().strip())
    print("numpy" in sys.modules and "tensorflow" in sys.modules)
    sys.stderr.write("to stderr\\n")
    if sys.argv[1] == "sleep":
      time.sleep(60)
    sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else 0)
""")


def _program(tmp_path):
  path = tmp_path / "program.py"
  path.write_text(PROGRAM)
  return str(path)


def test_a_child_is_forked_and_sees_what_exec_would_give_it(tmp_path):
  assert subprocess.Popen is fork_start.ForkedPopen or (
      subprocess.Popen.__name__ == "ForkedPopen")
  done = subprocess.run(
      [sys.executable, _program(tmp_path), "7", "two words"],
      input="from stdin", capture_output=True, text=True, cwd=tmp_path,
      env=dict(os.environ, FORK_START_PROBE="probe"),
      start_new_session=True, timeout=60)
  assert done.returncode == 7, done.stderr
  lines = done.stdout.splitlines()
  assert lines[0] == f"argv [{_program(tmp_path)!r}, '7', 'two words']"
  assert lines[1:7] == [f"cwd {tmp_path}", "env probe", "name __main__",
                        "session True", "stdin from stdin",
                        # Forked: TensorFlow was there before it began.
                        "True"]
  assert done.stderr == "to stderr\n"


def test_each_childs_cpu_is_noted_where_its_environment_says(tmp_path):
  """ESTIMATOR_ACCUM_TEST_FORK_CPU: the child's CPU seconds (wait4), the
  test that started it and its argv, written before its parent learns its
  exit."""
  script = tmp_path / "busy.py"
  script.write_text("import time\nend = time.process_time() + 0.3\n"
                    "while time.process_time() < end:\n  pass\n")
  log = tmp_path / "cpu.tsv"
  done = subprocess.run(
      [sys.executable, str(script), "an argument"], capture_output=True,
      text=True, env=dict(os.environ, **{fork_start.CPU_ENV: str(log)}),
      timeout=60)
  assert done.returncode == 0, done.stderr
  (line,) = log.read_text().splitlines()
  seconds, test, argv = line.split("\t")
  assert 0.3 <= float(seconds) < 5.0, line
  assert test.startswith("tests/unit/test_fork_start.py::test_each_childs"), (
      line)
  assert json.loads(argv) == [str(script), "an argument"]


def test_a_module_runs_as_main_and_a_traceback_exits_1(tmp_path):
  (tmp_path / "probe_module.py").write_text(
      "import sys\nprint(__name__, sys.argv[1:])\nraise ValueError('bad')\n")
  done = subprocess.run([sys.executable, "-m", "probe_module", "x"],
                        capture_output=True, text=True, cwd=tmp_path,
                        timeout=60)
  assert done.returncode == 1
  assert done.stdout == "__main__ ['x']\n"
  assert "ValueError: bad" in done.stderr


def test_signals_reach_the_child_and_wait_times_out(tmp_path):
  process = subprocess.Popen([sys.executable, _program(tmp_path), "sleep"],
                             stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, start_new_session=True)
  try:
    assert process.stdout.readline().startswith(b"argv")
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
      process.wait(0.2)
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(30) == -signal.SIGTERM
  finally:
    process.kill()
    process.stdout.close()


def test_the_launchers_tasks_die_with_it(tmp_path):
  # The launcher (itself forked) starts its task with its die-with-parent
  # preexec function: the forked task watches the launcher's pid instead.
  pid_file = tmp_path / "task.pid"
  task = tmp_path / "task.py"
  task.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write("
                  "str(os.getpid()))\ntime.sleep(120)\n")
  launcher = subprocess.Popen(
      [sys.executable, "-m", "tfconfig", "launch", "--workers", "1",
       "--grace", "5", "--", sys.executable, str(task)],
      cwd=os.path.dirname(os.path.dirname(os.path.dirname(
          os.path.abspath(__file__)))),
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
      start_new_session=True)
  try:
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
      assert time.monotonic() < deadline and launcher.poll() is None
      time.sleep(0.05)
    task_pid = int(pid_file.read_text())
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait(30)
    assert not processes.wait_gone([task_pid], 10), (
        "the task outlived its launcher")
  finally:
    launcher.kill()


def test_python_c_is_forked_with_pythons_argv_path_and_exit(tmp_path):
  # As `python -c CODE a b` gives it: sys.argv ['-c', 'a', 'b'], the
  # working directory first on sys.path (''), __main__, its exit status.
  code = ("import json, sys\n"
          "print(json.dumps([sys.argv, sys.path[0], __name__,\n"
          "                  'tensorflow' in sys.modules]))\n"
          "sys.exit(int(sys.argv[1]))\n")
  done = subprocess.run([sys.executable, "-c", code, "7", "two words"],
                        capture_output=True, text=True, timeout=60,
                        cwd=tmp_path)
  assert done.returncode == 7, done.stderr
  assert json.loads(done.stdout) == [["-c", "7", "two words"], "", "__main__",
                                     True]
  failed = subprocess.run([sys.executable, "-c", "raise ValueError('x')"],
                          capture_output=True, text=True, timeout=60)
  assert failed.returncode == 1
  assert "ValueError: x" in failed.stderr


@pytest.mark.parametrize("command", [
    ["-u", "-c", "import sys; print('exec' if 'tensorflow' not in "
     "sys.modules else 'forked')"],
    ["-B", "-c", "import sys; print('exec' if 'tensorflow' not in "
     "sys.modules else 'forked')"],
])
def test_what_it_cannot_start_so_is_started_with_exec(command):
  done = subprocess.run([sys.executable, *command], capture_output=True,
                        text=True, timeout=60)
  assert done.stdout == "exec\n"


def test_a_child_switched_off_is_started_with_exec(tmp_path):
  script = tmp_path / "probe.py"
  script.write_text("import sys\nprint('tensorflow' in sys.modules)\n")
  done = subprocess.run([sys.executable, str(script)], capture_output=True,
                        text=True, timeout=60,
                        env=dict(os.environ, **{fork_start.SWITCH_ENV: "0"}))
  assert done.stdout == "False\n"


def test_a_child_behind_ip_netns_exec_is_forked_into_that_namespace(
    tmp_path):
  from tfconfig import testbed
  reason = testbed.available()
  if reason is not None:
    if os.environ.get("CI"):
      pytest.fail(f"CI runs as root with iproute2: {reason}")
    pytest.skip(reason)
  name = f"{testbed.PREFIX}{os.getpid()}fork"
  subprocess.run(["ip", "netns", "add", name], check=True)
  try:
    script = tmp_path / "probe.py"
    script.write_text(
        "import os, sys, socket\n"
        "print('tensorflow' in sys.modules, os.readlink('/proc/self/ns/net'))\n"
        "print(sorted(n for _, n in socket.if_nameindex()))\n")
    done = subprocess.run(["ip", "netns", "exec", name, sys.executable,
                           str(script)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    expected = subprocess.run(
        ["ip", "netns", "exec", name, "readlink", "/proc/self/ns/net"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert done.stdout.splitlines() == [f"True {expected}", "['lo']"]
    assert expected != os.readlink("/proc/self/ns/net")
    missing = subprocess.run(["ip", "netns", "exec", name + "x",
                              sys.executable, str(script)],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 255 and (
        "Cannot open network namespace" in missing.stderr), missing
  finally:
    subprocess.run(["ip", "netns", "delete", name], check=True)


def test_harness_finds_a_forked_task_by_its_record(tmp_path):
  """harness.hosts.task_pids reads the server's record of each child (its
  requester, argv and TF_CONFIG), where /proc shows the server's."""
  from harness import hosts
  config = '{"cluster": {}, "task": {"type": "worker", "index": 1}}'
  process = subprocess.Popen(
      [sys.executable, _program(tmp_path), "sleep", "--model_dir", "x"],
      stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
      env=dict(os.environ, TF_CONFIG=config))
  try:
    assert process.stdout.readline().startswith(b"argv")
    assert hosts.task_pids(os.getpid(), 1) == [process.pid]
    assert hosts.task_pids(os.getpid(), 0) == []
  finally:
    process.kill()
    process.wait(30)
  assert processes.wait_gone([process.pid], 10) == []
  deadline = time.monotonic() + 10
  while hosts.task_pids(os.getpid(), 1) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert hosts.task_pids(os.getpid(), 1) == []


def test_each_servers_cpu_and_start_environment_are_noted(tmp_path):
  # A process standing in for a server (exec'd: -u), listening on a socket
  # path of a signature whose start environment differs from this one's.
  level = "1" if os.environ.get("TF_CPP_MIN_LOG_LEVEL") != "1" else "2"
  (tmp_path / "abc.start").write_text(json.dumps(
      {**fork_start._start_environment(os.environ),  # noqa: SLF001
       "TF_CPP_MIN_LOG_LEVEL": level}))
  stand_in = subprocess.Popen(
      [sys.executable, "-u", "-c", "while True: pass",
       str(tmp_path / "abc.sock")])
  try:
    # Until it has had 0.2 s of CPU: a fixed 0.5 s sleep gave it 0.04 s on
    # a machine busy with the rest of the suite.
    deadline = time.monotonic() + 60
    while (_cpu_seconds(stand_in.pid) < 0.2 and
           time.monotonic() < deadline):
      time.sleep(0.05)
    log = tmp_path / "cpu.tsv"
    fork_start._record_servers(str(tmp_path), [stand_in.pid], str(log))  # noqa: SLF001
  finally:
    stand_in.kill()
    stand_in.wait(30)
  seconds, name, differs = log.read_text().rstrip("\n").split("\t")
  assert float(seconds) > 0.1 and name == "<fork server>"
  assert json.loads(differs) == [f"TF_CPP_MIN_LOG_LEVEL={level}"]


def _cpu_seconds(pid):
  """User and system CPU a running process has had (/proc/PID/stat)."""
  with open(f"/proc/{pid}/stat") as stat:
    fields = stat.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
