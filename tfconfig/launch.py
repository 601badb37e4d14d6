"""Run every task of a TF_CONFIG cluster as a local process on loopback.

`launch(command, workers=2, chief=False, ps=0, evaluator=False)` picks free
ports on 127.0.0.1, starts one process per task with its own TF_CONFIG,
prefixes each output line with the task (`[worker:1] ...`) on stdout, writes
its own lines (`[tfconfig] ...`) on stderr, and returns 0 when every training
task (chief and workers) has exited 0. If a task fails, the others are
stopped and the return code is non-zero, with a line that names the task;
a task that exited 143 (stopped by SIGTERM, its window saved) first gives
the other training tasks the grace period to stop with it by themselves.
Parameter servers never finish on their own: they are stopped once training
is done. So is the evaluator, unless `evaluator_wait` gives it time to
finish its last evaluation (train_and_evaluate's evaluator exits by itself
once it has evaluated the final checkpoint).

Failures are named with how the task ended: an exit code (with what the
project's own codes mean: a lost peer, a model_dir that is not shared) or
the signal that killed it. `restarts=N` then starts the whole job again,
up to N times, as a Kubernetes TFJob with `restartPolicy: OnFailure` would:
a job that saves checkpoints resumes from its last one.

`task_prefix` runs each task behind a command prefix, such as `ip netns
exec HOST` for the one-namespace-per-task test bed (tfconfig/testbed.py).

Stopping: SIGINT (Ctrl-C), SIGTERM (a batch system, `timeout`) and SIGHUP
(a closed terminal) sent to the launcher stop every task it started (SIGTERM
to each task's process group, which saves its open window and exits; SIGKILL
after a grace period, 25 s by default, at once on a second signal), and the
launcher exits with 128 + the signal's number. A
launcher killed outright (SIGKILL) takes its tasks with it too: each task is
started with the kernel's parent-death signal set (Linux).
"""

import ctypes
import ctypes.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from clusterspec import closing as closed
from clusterspec import config as tfc
from clusterspec import health_format
from tfconfig.ports import (  # noqa: F401  (the launcher's names)
  free_ports,
  local_cluster,
)

# A task stopped by SIGTERM saves its open window and exits with 143 (an
# accumulating train op does, estimator_accum.distribution.preemption),
# within its 20 s by default: SIGKILL only after that, and before the 30 s
# that Kubernetes and Slurm give the launcher itself.
STOP_GRACE_SECONDS = 25
STOPPED = 128 + int(signal.SIGTERM)
# A local launch runs every task on this machine: more than this is a typo
# (and would exhaust open files reserving ports).
MAX_LOCAL_TASKS = 256

# Exit code for a command that cannot be started, as a shell returns it.
CANNOT_START = 127
# Exit code when `timeout` runs out, as coreutils' timeout returns it.
TIMED_OUT = 124
# The signals that stop a launch; each task is stopped, and the launch
# returns 128 + the signal's number.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_PR_SET_PDEATHSIG = 1
# Exit codes of a task that ended because of a peer, not on its own.
_CONSEQUENCES = (health_format.PEER_LOST_EXIT,
                 health_format.SESSION_LOST_EXIT)


class LaunchError(RuntimeError):
  """A task's command could not be started; the message is one line."""


def check_command(command, first_task="worker:0"):
  """Raises LaunchError, naming the command, if it cannot be started."""
  program = command[0]
  found = shutil.which(program)
  if found is None:
    reason = "No such file or directory"
    if os.path.sep in program and os.path.exists(program):
      reason = "Permission denied"
    raise LaunchError(f"cannot start {first_task}: {program!r}: {reason}")


# The kernel's ephemeral ports: what it gives a socket bound to port 0, and
# every outgoing connection its local port (Linux: ip_local_port_range).
class StopSignals:
  """Context manager: while open, SIGINT, SIGTERM and SIGHUP are recorded
  instead of ending the process; `received` is the first one's number (or
  None), `repeated` whether another came after it.

  Signal handlers can only be set from the main thread; elsewhere this is
  a no-op and the signals keep their handlers.
  """

  def __init__(self):
    self.received = None
    self.repeated = False
    self._previous = {}

  def _record(self, signum, frame):
    del frame
    if self.received is None:
      self.received = signum
    else:
      self.repeated = True

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for signum in STOP_SIGNALS:
        self._previous[signum] = signal.signal(signum, self._record)
    return self

  def __exit__(self, *exc_info):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous.clear()


def signal_name(signum):
  return signal.Signals(signum).name


def describe_exit(status):
  """How a task ended, for the launcher's line: 'failed with exit code 150
  (it lost a peer)', 'was killed by SIGKILL'."""
  if status < 0:
    return f"was killed by {signal_name(-status)}"
  meaning = {
      health_format.PEER_LOST_EXIT: " (it lost a peer)",
      health_format.MODEL_DIR_NOT_SHARED_EXIT: " (its model_dir is not shared)",
      health_format.SESSION_LOST_EXIT: " (its session failed; the job "
                                       "restarts whole)",
      health_format.NO_PROGRESS_EXIT: " (it made no progress within its "
                                      "bound)",
      128 + int(signal.SIGTERM): " (it was stopped by SIGTERM)",
  }.get(status, "")
  if status > 128 and not meaning:
    try:
      meaning = f" ({signal_name(status - 128)})"
    except ValueError:
      pass
  return f"failed with exit code {status}{meaning}"


def _die_with_parent():
  """preexec_fn: the kernel sends SIGKILL to the task if the launcher dies."""
  libc_name = ctypes.util.find_library("c")
  if not libc_name:
    return
  libc = ctypes.CDLL(libc_name, use_errno=True)
  libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
  if os.getppid() == 1:  # The launcher died before prctl: go with it.
    os._exit(128 + int(signal.SIGKILL))


class _Tasks:
  """The processes of one launch, their output pumps and its own lines."""

  def __init__(self, out, log, grace, preexec=None):
    self.out, self.log, self.grace = out, log, grace
    self._preexec = preexec
    self.lock = threading.Lock()
    self.processes = {}
    self._pumps = []
    self.stopping_since = None  # a task exited 143: the others follow

  def report(self, message):
    with self.lock:
      self.log.write(f"[tfconfig] {message}\n")
      self.log.flush()

  def _before_exec(self):
    """In the task's child process: dies with the launcher, and joins the
    job's private network namespace where it has one."""
    _die_with_parent()
    if self._preexec is not None:
      self._preexec()

  def start(self, name, task_type, command, env):
    try:
      process = subprocess.Popen(
          command, env=env, stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT, text=True, bufsize=1,
          start_new_session=True,
          preexec_fn=self._before_exec if sys.platform == "linux" else None)
    except subprocess.SubprocessError as error:
      raise LaunchError(f"cannot start {name} in the job's network "
                        f"namespace: {error}") from None
    except OSError as error:
      raise LaunchError(
          f"cannot start {name}: {command[0]!r}: "
          f"{error.strerror or error}") from None
    self.processes[name] = (task_type, process)
    pump = threading.Thread(target=self._pump,
                            args=(process.stdout, f"[{name}]"), daemon=True)
    pump.start()
    self._pumps.append(pump)

  def _pump(self, stream, prefix):
    for line in iter(stream.readline, ""):
      with self.lock:
        self.out.write(f"{prefix} {line}" if line.endswith("\n") else
                       f"{prefix} {line}\n")
        self.out.flush()
    stream.close()

  def running(self, task_type=None):
    """Names of the running tasks (of `task_type`, if given)."""
    return [name for name, (kind, process) in self.processes.items()
            if process.poll() is None and task_type in (None, kind)]

  def failures(self):
    """The non-zero exit statuses of the tasks that have exited."""
    return [status for _, process in self.processes.values()
            if (status := process.poll()) not in (None, 0)]

  def first_failure(self):
    """(name, exit status) of a task that exited non-zero, or None; a
    cause before its consequences: a task that failed on its own before
    one that exited because of a peer (lost it, 150; its session failed
    with it, 151)."""
    failed = [(name, status) for name, (_, process) in self.processes.items()
              if (status := process.poll()) not in (None, 0)]
    for name, status in failed:
      if status not in _CONSEQUENCES:
        return name, status
    return failed[0] if failed else None

  def training_running(self):
    return any(kind in tfc.TRAINING_TYPES and process.poll() is None
               for kind, process in self.processes.values())

  def stop_all(self, signals=None):
    """SIGTERM to every running task's group; SIGKILL to those still running
    after the grace period, or at once when `signals` records a repeat."""
    processes = [p for _, p in self.processes.values()]
    for process in processes:
      if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + self.grace
    while any(p.poll() is None for p in processes):
      if time.monotonic() > deadline or (signals and signals.repeated):
        break
      time.sleep(0.05)
    for process in processes:
      if process.poll() is None:
        _signal_group(process, signal.SIGKILL)
      process.wait()
      # A task's own children left behind in its group go too.
      _signal_group(process, signal.SIGKILL)
    for pump in self._pumps:
      pump.join(timeout=5)


def run_cluster(command, cluster, out=None, timeout=None, env=None,
                evaluator_wait=0, log=None, grace=STOP_GRACE_SECONDS,
                task_prefix=None, restarts=0, isolation="auto"):
  """Starts `command` once per task of `cluster`; returns an exit code.

  The tasks' ports are closed to every other host and local user for the
  whole launch (`isolation`, clusterspec/closing.py), before any task starts.

  Args:
    command: list of str, the program every task runs.
    cluster: TF_CONFIG dict, e.g. from `local_cluster`.
    out: text stream for the tasks' prefixed output; default sys.stdout.
    timeout: optional seconds; past it every task is stopped and 124 returned.
    env: optional base environment; default os.environ.
    evaluator_wait: seconds the evaluator may go on after training has
      finished, to evaluate the final checkpoint; 0 stops it at once (as a
      Kubernetes TFJob does by default).
    log: text stream for the launcher's own lines; default sys.stderr.
    grace: seconds a stopped task has between SIGTERM and SIGKILL.
    task_prefix: optional function (task_type, index) -> list of str put
      before `command` for that task (e.g. `ip netns exec HOST`).
    restarts: int >= 0, how many times a failed job is started again
      (every task, after stopping the others); not after a timeout or a
      stop signal.
    isolation: 'auto' (default: an nftables table where this process may
      write one, else a private network namespace), 'firewall',
      'namespace', or 'open' (TensorFlow's default: every host and local
      user reaches the ports). With `task_prefix` the tasks run elsewhere
      (other namespaces): 'open' here, and each task guards its own port
      (`python -m tfconfig guard`).

  Returns:
    0 when all training tasks exited 0 (and the evaluator too, if it
    finished within `evaluator_wait`); otherwise the failing task's exit
    code (or 1 if it was killed by a signal), after stopping the others;
    128 + N when the launcher received signal N (SIGINT, SIGTERM, SIGHUP),
    after stopping every task.

  Raises:
    LaunchError: a task's command cannot be started (not found, not
      executable); the tasks already started are stopped first.
    closed.ClosingError: the ports cannot be closed as `isolation` asks;
      no task was started.
  """
  if not isinstance(restarts, int) or restarts < 0:
    raise ValueError(f"restarts must be an int >= 0, got {restarts!r}")
  deadline = None if timeout is None else time.monotonic() + timeout
  with closed.one_host(cluster_ports(cluster), isolation) as closure:
    (log or sys.stderr).write(f"[tfconfig] {closure.description}\n")
    (log or sys.stderr).flush()
    return _run_attempts(command, cluster, out, deadline, timeout, env,
                         evaluator_wait, log, grace, task_prefix, restarts,
                         closure)


def cluster_ports(cluster):
  """Every port in `cluster` (a TF_CONFIG dict's, or its 'cluster')."""
  jobs = cluster.get("cluster", cluster)
  return sorted({int(address.rpartition(":")[2])
                 for addresses in jobs.values() for address in addresses})


def _run_attempts(command, cluster, out, deadline, timeout, env,
                  evaluator_wait, log, grace, task_prefix, restarts, closure):
  attempt = 0
  with StopSignals() as signals:
    while True:
      tasks = _Tasks(out or sys.stdout, log or sys.stderr, grace,
                     preexec=closure.preexec)
      try:
        for task_type, index in tfc.tasks(cluster):
          if signals.received is not None:
            break
          task_env = dict(env if env is not None else os.environ)
          task_env["TF_CONFIG"] = json.dumps(
              tfc.for_task(cluster, task_type, index))
          task_env[closed.CLOSED_BY_ENV] = f"tfconfig launch:{closure.mode}"
          prefix = task_prefix(task_type, index) if task_prefix else []
          tasks.start(f"{task_type}:{index}", task_type,
                      list(prefix) + list(command), task_env)
        code = _supervise(tasks, signals, deadline, evaluator_wait, timeout)
      finally:
        tasks.stop_all(signals)
      if signals.received is not None:
        code = 128 + signals.received
        tasks.report(f"stopped every task; exiting with {code}")
        return code
      if code in (0, TIMED_OUT) or attempt >= restarts:
        return code
      attempt += 1
      tasks.report(f"restarting the job ({attempt} of {restarts})")


def _supervise(tasks, signals, deadline, evaluator_wait, timeout):
  """Waits until the launch is over; returns its exit code."""
  training_finished = None
  while True:
    if signals.received is not None:
      tasks.report(f"received {signal_name(signals.received)}; stopping "
                   "every task")
      return 128 + signals.received
    # Whether training tasks run, read once a turn and before their
    # failures: a task that ends after this reading is seen next turn, one
    # that ended before it with its failure (read twice, a stopped job's
    # launch could return 0 when its last task ended between the reads).
    running = tasks.training_running()
    failed = tasks.first_failure()
    if failed and not _stopping_together(tasks, failed, running):
      name, status = failed
      tasks.report(f"task {name} {describe_exit(status)}; stopping the "
                   "other tasks")
      return status if status > 0 else 1
    if not running:
      if training_finished is None:
        tasks.report("all training tasks finished")
        training_finished = time.monotonic()
        if evaluator_wait > 0 and tasks.running("evaluator"):
          tasks.report(f"waiting up to {evaluator_wait:g} s for the "
                       "evaluator's last evaluation")
      if not tasks.running("evaluator"):
        return 0
      if time.monotonic() - training_finished >= evaluator_wait:
        tasks.report(
            f"stopping {', '.join(tasks.running('evaluator'))} (still "
            "running" + (f" after {evaluator_wait:g} s" if evaluator_wait > 0
                         else "; --evaluator_wait S lets it finish its last "
                         "evaluation") + ")")
        return 0
    if deadline is not None and time.monotonic() > deadline:
      tasks.report(f"timed out after {timeout} s; stopping every task")
      return TIMED_OUT
    time.sleep(0.1)


def _stopping_together(tasks, failed, running):
  """Whether the launch waits for the other training tasks to finish a
  stop on their own: `failed` (name, status) exited 143, the stop on
  SIGTERM (a pod deleted, a parameter server told to stop), and its
  peers stop at the step it stopped at, the chief after its save. A
  SIGTERM from the launcher now would be their second, which ends a
  task at once: a parameter server's, while the chief still saves. For
  at most the grace period; any other failure ends the wait."""
  if any(status != STOPPED for status in tasks.failures()):
    return False
  if not running:  # (whether training tasks run, read once this turn)
    return False
  if tasks.stopping_since is None:
    tasks.stopping_since = time.monotonic()
    tasks.report(f"task {failed[0]} {describe_exit(failed[1])}; waiting up "
                 f"to {tasks.grace:g} s for the other training tasks to "
                 "stop with it")
  return time.monotonic() - tasks.stopping_since < tasks.grace


def _signal_group(process, signum):
  try:
    os.killpg(process.pid, signum)
  except (ProcessLookupError, PermissionError):
    pass
