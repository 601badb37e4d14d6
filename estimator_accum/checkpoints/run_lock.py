"""One run per model directory.

Two runs writing one directory interleave their checkpoints, events and
state file, and both exit 0. `hold(directory)` takes the directory's lock
(`.run.lock`, linked into place whole: of two runs starting at once one
gets it)
or refuses in one line naming the run that holds it. The holder touches the
lock every `HEARTBEAT_SECONDS`; a lock whose process is gone (this host) or
that nobody touched for `STALE_SECONDS` (another host sharing the file
system) is taken over, with a line saying so. The tasks of one TF_CONFIG
cluster share the directory: a lock of the same cluster is theirs.

    lock = run_lock.hold(model_dir, cluster=tf_config.get("cluster"))
    ...                                 # train
    lock.release()                      # also at the process's exit
"""

import atexit
import datetime
import hashlib
import json
import os
import socket
import threading
import time

__all__ = ["DirectoryInUse", "LOCK_NAME", "hold"]

LOCK_NAME = ".run.lock"
HEARTBEAT_SECONDS = 5.0
STALE_SECONDS = 60.0


class DirectoryInUse(RuntimeError):
  """Another live run holds the directory."""


def _cluster_id(cluster):
  if not cluster:
    return None
  return hashlib.sha1(json.dumps(cluster, sort_keys=True).encode()
                      ).hexdigest()[:12]


def _alive(pid):
  """Whether process `pid` runs: it exists and is not a zombie (a killed
  run whose parent has not reaped it yet is gone all the same)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  try:
    with open(f"/proc/{pid}/stat") as file:
      # "pid (name) state ...": the state follows the name's last ")".
      return file.read().rpartition(")")[2].split()[0] != "Z"
  except (OSError, IndexError):
    return True


def _read(path):
  """(the lock's JSON, seconds since it was last touched), or None when
  there is no lock; a lock that cannot be parsed (a holder killed while
  writing it) reads as {}."""
  for _ in range(20):
    try:
      with open(path) as file:
        text = file.read()
      age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
      return None
    if text or age > 1.0:
      break
    time.sleep(0.05)  # being written (no hard links): read it again
  try:
    return json.loads(text), age
  except ValueError:
    return {}, age


def _describe(held):
  started = held.get("started")
  when = (datetime.datetime.fromtimestamp(
      started, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
      if isinstance(started, (int, float)) else "?")
  return (f"pid {held.get('pid', '?')} on host {held.get('host', '?')}, "
          f"started {when}")


def _stale(held, age):
  """Why the lock `held` (touched `age` s ago) is stale, or None."""
  if not held:
    return "its lock cannot be read" if age > STALE_SECONDS else None
  if held.get("host") == socket.gethostname():
    pid = held.get("pid")
    if isinstance(pid, int) and not _alive(pid):
      return f"its process ({_describe(held)}) is gone"
    return None
  if age > STALE_SECONDS:
    return (f"its lock ({_describe(held)}) was last touched {age:.0f} s "
            f"ago")
  return None


class Lock:
  """A held directory lock: released by `release()` or at exit."""

  def __init__(self, path, owned):
    self.path = path
    self.owned = owned
    self._stop = threading.Event()
    if owned:
      self._beat = threading.Thread(
          target=self._heartbeat, name="estimator_accum-run-lock",
          daemon=True)
      self._beat.start()
      atexit.register(self.release)

  def _heartbeat(self):
    while not self._stop.wait(HEARTBEAT_SECONDS):
      try:
        os.utime(self.path)
      except OSError:
        return

  def release(self):
    """Removes the lock, if this run made it (once)."""
    if not self.owned:
      return
    self.owned = False
    self._stop.set()
    try:
      os.remove(self.path)
    except OSError:
      pass


def _create(path, content):
  """Makes the lock `path` holding `content` (JSON) whole, unless it exists:
  written to a file of its own, then linked into place (a reader never sees
  it half written); where the file system has no hard links, created with
  O_EXCL and written. Whether it was made."""
  temporary = f"{path}.{os.getpid()}.{threading.get_ident()}"
  try:
    with open(temporary, "w") as file:
      json.dump(content, file)
  except OSError:  # a full disk: nothing half written left behind
    if os.path.exists(temporary):
      os.remove(temporary)
    raise
  try:
    os.link(temporary, path)
    return True
  except FileExistsError:
    return False
  except OSError:  # no hard links here
    try:
      descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(descriptor, "w") as file:
      json.dump(content, file)
    return True
  finally:
    os.remove(temporary)


def hold(directory, cluster=None, report=None, flag="--output_dir"):
  """Takes `directory`'s lock for this run, or shares it with the tasks of
  the same `cluster` (TF_CONFIG's "cluster" dict, or None).

  Args:
    directory: str, an existing local or network-mounted directory.
    cluster: dict or None: tasks of the same cluster share the directory.
    report: callable taking one line, told when a stale lock is taken over.
    flag: the name the user gave the directory under, for the messages.

  Returns:
    A `Lock`.

  Raises:
    DirectoryInUse: another live run holds it; the message names it.
  """
  path = os.path.join(directory, LOCK_NAME)
  mine = {"host": socket.gethostname(), "pid": os.getpid(),
          "started": time.time(), "cluster": _cluster_id(cluster)}
  for _ in range(3):
    if _create(path, mine):
      return Lock(path, owned=True)
    found = _read(path)
    if found is None:
      continue  # released in between: try again
    held, age = found
    if mine["cluster"] and held.get("cluster") == mine["cluster"]:
      return Lock(path, owned=False)
    why = _stale(held, age)
    if why is None:
      raise DirectoryInUse(
          f"{flag}={directory} is in use by another run ({_describe(held)}"
          f"; {path}): wait for it to end, stop it, or give this run "
          f"another {flag}.")
    try:  # of the runs that found it stale, one moves it away
      os.rename(path, f"{path}.stale.{os.getpid()}")
    except FileNotFoundError:
      continue
    os.remove(f"{path}.stale.{os.getpid()}")
    if report is not None:
      report(f"{flag}={directory}: taking over the lock of a run that "
             f"ended without releasing it: {why}")
  raise DirectoryInUse(f"{flag}={directory}: its lock {path} keeps changing "
                       f"hands; is another run starting there?")
