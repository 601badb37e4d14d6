"""One run per model directory: a live run's lock refuses another, a stale
one (its process gone on this host, or untouched for a minute from another
host) is taken over with a line, the tasks of one cluster share it; a
real process on another host (its own UTS and PID namespaces) holds it.
Two real processes of run_classifier:
tests/integration/test_storage_faults.py."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from estimator_accum.checkpoints import run_lock

CLUSTER = {"worker": ["localhost:1", "localhost:2"]}


def _write_lock(directory, age=0.0, **held):
  path = directory / run_lock.LOCK_NAME
  path.write_text(json.dumps(held))
  if age:
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
  return path


def test_a_live_run_refuses_another_and_its_release_frees_it(tmp_path):
  lock = run_lock.hold(str(tmp_path))
  held = json.loads((tmp_path / run_lock.LOCK_NAME).read_text())
  assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
  with pytest.raises(run_lock.DirectoryInUse, match=(
      rf"^--output_dir={tmp_path} is in use by another run \(pid "
      rf"{os.getpid()} on host {socket.gethostname()}, started .*\): wait "
      r"for it to end, stop it, or give this run another --output_dir\.$")):
    run_lock.hold(str(tmp_path))
  lock.release()
  assert not (tmp_path / run_lock.LOCK_NAME).exists()
  run_lock.hold(str(tmp_path)).release()


def test_the_lock_of_a_process_that_is_gone_is_taken_over(tmp_path):
  gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True,
                        env=dict(os.environ, ESTIMATOR_ACCUM_TEST_FORK="0"))
  pid = int(gone.stdout)
  _write_lock(tmp_path, host=socket.gethostname(), pid=pid, started=1.0)
  lines = []
  lock = run_lock.hold(str(tmp_path), report=lines.append)
  assert lock.owned
  assert lines == [
      f"--output_dir={tmp_path}: taking over the lock of a run that ended "
      f"without releasing it: its process (pid {pid} on host "
      f"{socket.gethostname()}, started 1970-01-01 00:00:01 UTC) is gone"]
  assert json.loads((tmp_path / run_lock.LOCK_NAME).read_text())["pid"] == (
      os.getpid())
  lock.release()


def test_the_lock_of_a_killed_process_not_yet_reaped_is_taken_over(tmp_path):
  # A zombie: killed, its parent (this test) not waiting for it yet.
  child = subprocess.Popen(
      [sys.executable, "-c", "import time; time.sleep(60)"],
      env=dict(os.environ, ESTIMATOR_ACCUM_TEST_FORK="0"))
  try:
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while open(f"/proc/{child.pid}/stat").read().rpartition(")")[2].split(
        )[0] != "Z":
      assert time.monotonic() < deadline
      time.sleep(0.01)
    _write_lock(tmp_path, host=socket.gethostname(), pid=child.pid,
                started=1.0)
    lines = []
    run_lock.hold(str(tmp_path), report=lines.append).release()
    assert lines and lines[0].endswith("is gone"), lines
  finally:
    child.wait()


def test_another_hosts_lock_is_live_while_it_is_touched(tmp_path):
  _write_lock(tmp_path, host="elsewhere", pid=1, started=1.0)
  with pytest.raises(run_lock.DirectoryInUse, match="pid 1 on host elsewhere"):
    run_lock.hold(str(tmp_path))
  _write_lock(tmp_path, age=run_lock.STALE_SECONDS + 5, host="elsewhere",
              pid=1, started=1.0)
  lines = []
  run_lock.hold(str(tmp_path), report=lines.append).release()
  assert "was last touched 6" in lines[0], lines


def test_the_tasks_of_one_cluster_share_it(tmp_path):
  first = run_lock.hold(str(tmp_path), cluster=CLUSTER)
  second = run_lock.hold(str(tmp_path), cluster=dict(CLUSTER))
  assert first.owned and not second.owned
  with pytest.raises(run_lock.DirectoryInUse):
    run_lock.hold(str(tmp_path), cluster={"worker": ["localhost:3"]})
  second.release()  # not its lock: stays
  assert (tmp_path / run_lock.LOCK_NAME).exists()
  first.release()


def test_the_holder_touches_its_lock(tmp_path, monkeypatch):
  monkeypatch.setattr(run_lock, "HEARTBEAT_SECONDS", 0.05)
  lock = run_lock.hold(str(tmp_path))
  path = tmp_path / run_lock.LOCK_NAME
  stamp = time.time() - 1000
  os.utime(path, (stamp, stamp))
  deadline = time.monotonic() + 10
  while path.stat().st_mtime < stamp + 500:
    assert time.monotonic() < deadline, "the lock was not touched"
    time.sleep(0.02)
  lock.release()


def test_an_unreadable_lock_is_kept_until_it_is_stale(tmp_path):
  (tmp_path / run_lock.LOCK_NAME).write_text("{not json")
  with pytest.raises(run_lock.DirectoryInUse):
    run_lock.hold(str(tmp_path))
  _write_lock(tmp_path, age=run_lock.STALE_SECONDS + 5)
  (tmp_path / run_lock.LOCK_NAME).write_text("{not json")
  stamp = time.time() - run_lock.STALE_SECONDS - 5
  os.utime(tmp_path / run_lock.LOCK_NAME, (stamp, stamp))
  lines = []
  run_lock.hold(str(tmp_path), report=lines.append).release()
  assert lines[0].endswith("its lock cannot be read"), lines


@pytest.mark.parametrize("cluster", [None, CLUSTER])
def test_of_runs_starting_at_once_one_holds_it(tmp_path, cluster):
  """Eight starts at once (threads): one lock made, whole; the others
  refused, or sharing it when they are one cluster's tasks. A lock is
  linked into place written, so none reads it half made."""
  barrier = threading.Barrier(8)
  outcomes = []

  def start():
    barrier.wait()
    try:
      outcomes.append(run_lock.hold(str(tmp_path), cluster=cluster))
    except run_lock.DirectoryInUse as error:
      outcomes.append(error)

  threads = [threading.Thread(target=start) for _ in range(8)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  owned = [o for o in outcomes if isinstance(o, run_lock.Lock) and o.owned]
  assert len(owned) == 1, outcomes
  if cluster is None:
    refused = [o for o in outcomes if isinstance(o, run_lock.DirectoryInUse)]
    assert len(refused) == 7, outcomes
    assert all(f"pid {os.getpid()} on host" in str(e) for e in refused)
  else:
    assert all(isinstance(o, run_lock.Lock) for o in outcomes), outcomes
  assert sorted(os.listdir(tmp_path)) == [run_lock.LOCK_NAME]
  owned[0].release()


HOLDER = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("run_lock", sys.argv[1])
run_lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_lock)
run_lock.hold(sys.argv[2])
print("held", flush=True)
time.sleep(600)
"""


def test_a_run_on_another_host_holds_it_until_its_lock_goes_stale(tmp_path):
  """A real process on another host, as the lock sees one: its own host
  name and process ids (UTS and PID namespaces made for the test; the
  file system shared). While it runs it holds the directory; killed, its
  lock stays live (no process of another host can be looked up) until it
  is untouched for STALE_SECONDS, then it is taken over with a line."""
  if os.geteuid() != 0 or not shutil.which("unshare"):
    pytest.skip("namespaces need root and unshare (CI is root)")
  holder = subprocess.Popen(
      ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "sh", "-c",
       'hostname estimator-accum-other-host && exec "$0" -c "$1" "$2" "$3"',
       sys.executable, HOLDER, run_lock.__file__, str(tmp_path)],
      stdout=subprocess.PIPE, text=True, start_new_session=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    held = json.loads((tmp_path / run_lock.LOCK_NAME).read_text())
    assert held["host"] == "estimator-accum-other-host"
    assert held["host"] != socket.gethostname()
    with pytest.raises(run_lock.DirectoryInUse, match=(
        rf"is in use by another run \(pid {held['pid']} on host "
        rf"estimator-accum-other-host, started ")):
      run_lock.hold(str(tmp_path))
  finally:
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
  # Killed: still live from here, whose process table cannot tell.
  with pytest.raises(run_lock.DirectoryInUse, match="estimator-accum-other"):
    run_lock.hold(str(tmp_path))
  stamp = time.time() - run_lock.STALE_SECONDS - 1
  os.utime(tmp_path / run_lock.LOCK_NAME, (stamp, stamp))
  lines = []
  run_lock.hold(str(tmp_path), report=lines.append).release()
  assert len(lines) == 1 and "taking over the lock of a run that ended " \
      "without releasing it: its lock (pid" in lines[0], lines
  assert "on host estimator-accum-other-host" in lines[0], lines
