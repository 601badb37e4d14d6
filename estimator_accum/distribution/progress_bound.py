"""A task of a cluster that makes no progress for its bound exits.

The peer watchdog ends a task whose peer is lost, frozen or cut off. A job
whose tasks are all alive and answering can still stand still: collectives
that never meet, a save whose barrier waits for a peer that went on. Seen:
the README's two-worker job, both workers alive, neither moving for ten
minutes until the launcher was stopped by hand. Kubernetes and Slurm
restart a job that fails, never one that hangs.

So the first accumulating train op built in a TF_CONFIG cluster of two or
more training tasks starts this bound's thread. Progress is a micro-batch
that ends, a save's read of the window that ends; the task's wait in its
current step or save is measured as the peer watchdog measures it
(`watchdog.Steps`). The bound is derived from the job's own pace: 20 times
the longest step or save that ended so far, at least its floor
(`ESTIMATOR_ACCUM_PROGRESS_BOUND`, seconds, default 300; 0 turns the bound
off). A task waiting longer in one step or save says so in one line with
where its main thread waits, and exits `NO_PROGRESS_EXIT` (152, >= 128:
`tfconfig launch --restart N`, a TFJob's `ExitCode` policy and Slurm's
requeue start the job again, which resumes from its last checkpoint). Its
peers then lose it and end too.

Outside a step or a save (building the graph, making the session, a
chief's evaluation or export after training) the bound does not run: that
is not waiting on a peer.
"""

import os
import sys
import threading

from clusterspec.health_format import NO_PROGRESS_EXIT

FLOOR_ENV = "ESTIMATOR_ACCUM_PROGRESS_BOUND"
DEFAULT_FLOOR = 300.0
PACE_FACTOR = 20
CHECK_SECONDS = 1.0

_STARTED = []


def seconds_from_environment(name, default, zero_turns_off=None):
  """The environment variable `name` as seconds > 0, or `default` unset;
  with `zero_turns_off` (what 0 turns off), 0 too, given as None.

  Raises:
    ValueError: it is set to anything else (named, with its value).
  """
  value = os.environ.get(name)
  if value is None:
    return default
  try:
    seconds = float(value)
  except ValueError:
    seconds = -1.0
  if zero_turns_off is None:
    if not seconds > 0:
      raise ValueError(f"{name} must be a number of seconds > 0, got "
                       f"{value!r}.")
    return seconds
  if not seconds >= 0:
    raise ValueError(f"{name} must be a number of seconds >= 0 (0 turns "
                     f"{zero_turns_off} off), got {value!r}.")
  return seconds or None


def floor_from_environment():
  """The bound's floor in seconds, or None when it is off (0).

  Raises:
    ValueError: the variable is set to anything but a number >= 0 (named,
      with its value).
  """
  return seconds_from_environment(FLOOR_ENV, DEFAULT_FLOOR,
                                  zero_turns_off="the bound")


def bound(floor, longest):
  """The bound for a job whose longest ended step or save took `longest`
  seconds."""
  return max(floor, PACE_FACTOR * longest)


def _stack():
  from estimator_accum.distribution import health  # noqa: PLC0415

  return [line.strip() for line in health.main_thread_stack()]


def _watch(name, waiting, floor, exit):
  while True:
    threading.Event().wait(CHECK_SECONDS)
    waited, longest = waiting()
    limit = bound(floor, longest)
    if waited < limit:
      continue
    lines = [f"{name}: no progress for {waited:.0f} s: one step or save "
             f"has waited that long, past this job's bound of {limit:.0f} s "
             f"({PACE_FACTOR} x its longest step or save so far, "
             f"{longest:.1f} s, and at least {floor:g} s; {FLOOR_ENV} sets "
             f"the floor, 0 turns it off); exiting with {NO_PROGRESS_EXIT} "
             "so that the job restarts from its last checkpoint. Its main "
             "thread waits in:"]
    lines += [f"  {line}" for line in _stack()]
    sys.stderr.write("".join(f"[tfconfig] {line}\n" for line in lines))
    sys.stderr.flush()
    exit(NO_PROGRESS_EXIT)
    return


def start_once(name, waiting, exit=os._exit):
  """Starts this process's bound (once); whether it runs. `waiting()`
  gives (seconds in the current step or save, the longest that ended)."""
  if _STARTED:
    return _STARTED[0]
  floor = floor_from_environment()
  _STARTED.append(floor is not None)
  if floor is None:
    return False
  threading.Thread(target=_watch, args=(name, waiting, floor, exit),
                   name="estimator_accum_progress_bound", daemon=True).start()
  return True
