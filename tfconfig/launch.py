"""Run every task of a TF_CONFIG cluster as a local process on loopback.

`launch(command, workers=2, chief=False, ps=0, evaluator=False)` picks free
ports on 127.0.0.1, starts one process per task with its own TF_CONFIG,
prefixes each output line with the task (`[worker:1] ...`), and returns 0
when every training task (chief and workers) has exited 0. If a task fails,
the others are stopped and the return code is non-zero, with a line that
names the task. Parameter servers never finish on their own: they are
stopped once training is done. So is the evaluator, unless `evaluator_wait`
gives it time to finish its last evaluation (train_and_evaluate's evaluator
exits by itself once it has evaluated the final checkpoint).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from tfconfig import config as tfc

_STOP_GRACE_SECONDS = 10

# Exit code for a command that cannot be started, as a shell returns it.
CANNOT_START = 127


class LaunchError(RuntimeError):
  """A task's command could not be started; the message is one line."""


def free_ports(count, host="127.0.0.1"):
  """Returns `count` distinct ports that were free on `host` just now."""
  sockets, ports = [], []
  try:
    for _ in range(count):
      sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      sock.bind((host, 0))
      sockets.append(sock)
      ports.append(sock.getsockname()[1])
  finally:
    for sock in sockets:
      sock.close()
  return ports


def local_cluster(workers, chief=False, ps=0, evaluator=False):
  """A TF_CONFIG dict (no task) for a cluster on free loopback ports."""
  count = workers + int(chief) + ps + int(evaluator)
  addresses = [f"127.0.0.1:{port}" for port in free_ports(count)]
  take = lambda n: [addresses.pop(0) for _ in range(n)]  # noqa: E731
  return tfc.build(
      workers=take(workers), chief=take(1)[0] if chief else None,
      ps=take(ps), evaluator=take(1)[0] if evaluator else None)


def _pump(stream, prefix, out, lock):
  for line in iter(stream.readline, ""):
    with lock:
      out.write(f"{prefix} {line}" if line.endswith("\n") else
                f"{prefix} {line}\n")
      out.flush()
  stream.close()


def run_cluster(command, cluster, out=None, timeout=None, env=None,
                evaluator_wait=0):
  """Starts `command` once per task of `cluster`; returns an exit code.

  Args:
    command: list of str, the program every task runs.
    cluster: TF_CONFIG dict, e.g. from `local_cluster`.
    out: text stream for the prefixed output; default sys.stdout.
    timeout: optional seconds; past it every task is stopped and 124 returned.
    env: optional base environment; default os.environ.
    evaluator_wait: seconds the evaluator may go on after training has
      finished, to evaluate the final checkpoint; 0 stops it at once (as a
      Kubernetes TFJob does by default).

  Returns:
    0 when all training tasks exited 0 (and the evaluator too, if it
    finished within `evaluator_wait`); otherwise the failing task's exit
    code (or 1 if it was killed by a signal), after stopping the others.

  Raises:
    LaunchError: a task's command cannot be started (not found, not
      executable); the tasks already started are stopped first.
  """
  out = out or sys.stdout
  lock = threading.Lock()
  processes, pumps = {}, []
  for task_type, index in tfc.tasks(cluster):
    task_env = dict(env if env is not None else os.environ)
    task_env["TF_CONFIG"] = json.dumps(tfc.for_task(cluster, task_type, index))
    name = f"{task_type}:{index}"
    try:
      process = subprocess.Popen(
          command, env=task_env, stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT, text=True, bufsize=1,
          start_new_session=True)
    except OSError as error:
      _stop_all([p for _, p in processes.values()])
      raise LaunchError(
          f"cannot start {name}: {command[0]!r}: "
          f"{error.strerror or error}") from None
    processes[name] = (task_type, process)
    pump = threading.Thread(target=_pump,
                            args=(process.stdout, f"[{name}]", out, lock),
                            daemon=True)
    pump.start()
    pumps.append(pump)

  def report(message):
    with lock:
      out.write(f"[tfconfig] {message}\n")
      out.flush()

  deadline = None if timeout is None else time.monotonic() + timeout
  code = 0
  training_finished = None
  try:
    while True:
      training_running = False
      failed = None
      for name, (task_type, process) in processes.items():
        status = process.poll()
        if status is None:
          training_running |= task_type in tfc.TRAINING_TYPES
        elif status != 0:
          failed = (name, status)
          break
      if failed:
        name, status = failed
        report(f"task {name} failed with exit code {status}; stopping the "
               "other tasks")
        code = status if status > 0 else 1
        break
      if not training_running:
        if training_finished is None:
          report("all training tasks finished")
          training_finished = time.monotonic()
          if evaluator_wait > 0 and _running(processes, "evaluator"):
            report(f"waiting up to {evaluator_wait:g} s for the evaluator's "
                   "last evaluation")
        if not _running(processes, "evaluator"):
          break
        if time.monotonic() - training_finished >= evaluator_wait:
          report(f"stopping {', '.join(_running(processes, 'evaluator'))} "
                 "(still running" + (
                     f" after {evaluator_wait:g} s" if evaluator_wait > 0
                     else "; --evaluator_wait S lets it finish its last "
                     "evaluation") + ")")
          break
      if deadline is not None and time.monotonic() > deadline:
        report(f"timed out after {timeout} s; stopping every task")
        code = 124
        break
      time.sleep(0.2)
  finally:
    _stop_all([p for _, p in processes.values()])
    for pump in pumps:
      pump.join(timeout=5)
  return code


def _running(processes, task_type):
  """The names of the tasks of `task_type` that are still running."""
  return [name for name, (kind, process) in processes.items()
          if kind == task_type and process.poll() is None]


def _stop_all(processes):
  for process in processes:
    if process.poll() is None:
      _signal_group(process, "SIGTERM")
  deadline = time.monotonic() + _STOP_GRACE_SECONDS
  for process in processes:
    try:
      process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      _signal_group(process, "SIGKILL")
      process.wait()


def _signal_group(process, signal_name):
  try:
    os.killpg(process.pid, getattr(signal, signal_name))
  except ProcessLookupError:
    pass
