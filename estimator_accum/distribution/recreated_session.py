"""A MultiWorkerMirroredStrategy worker whose session is made anew exits.

`MonitoredSession` closes a session whose step (or a hook's run) raised
AbortedError or UnavailableError and makes a new one, logging at INFO
only. In a parameter-server job that is recovery. Under
MultiWorkerMirroredStrategy it is a hang: the other workers stay in the
old session's collectives, and this one waits in its new session's first
save or step for peers that never come (seen: worker 0 in
`_RecoverableSession._create_session`, then in CheckpointSaverHook's
save; worker 1 in the old session's training step; 10 minutes, every task
alive, until the launcher was stopped). So in such a job, once this
module is installed (the default watchdog installs it when it arms), a
session about to be made anew after such an error ends the process with
one line naming the error and exit `SESSION_LOST_EXIT` (151, >= 128: a
TFJob's `ExitCode` policy and `tfconfig launch --restart N` restart the
job, which resumes from its last checkpoint). Its peers then lose it and
end too (exit 150). After UnavailableError, which a peer that is gone
raises too, it first gives the peer watchdog its time to name the lost
peer (exit 150).
"""

import os
import sys
import time

import tensorflow as tf

from clusterspec.health_format import SESSION_LOST_EXIT
from estimator_accum import runtime_private
from estimator_accum.distribution import health

_INSTALLED = []


def _say(message):
  sys.stderr.write(f"[tfconfig] {message}\n")
  sys.stderr.flush()


def _first_line(error):
  """The first line of `error`'s message that says something (TensorFlow
  puts "Graph execution error:" first)."""
  text = getattr(error, "message", None) or str(error)
  for line in text.splitlines():
    line = line.strip()
    if line and not line.startswith("Graph execution error"):
      return line[:300]
  return ""


def install(task_name):
  """Makes a MonitoredSession's remaking of its session after an error end
  this process (once per process; `task_name`: "worker:1", for the
  line)."""
  if _INSTALLED:
    return

  def end(error):
    if isinstance(error, tf.errors.UnavailableError):
      # A peer gone (killed, cut off) fails a step with UnavailableError
      # too: the peer watchdog, which names it, ends this process with
      # 150 within its timeout. Only a session failed with every peer
      # still there comes to the line below.
      wait = health.seconds_to_notice()
      if wait:
        time.sleep(wait)
    _say(f"{task_name}: its session failed ({type(error).__name__}: "
         f"{_first_line(error)}) and would be made anew on this worker "
         "alone, while its peers wait in the old one's collectives: exiting "
         f"{SESSION_LOST_EXIT} so that the job restarts whole from its last "
         "checkpoint")
    os._exit(SESSION_LOST_EXIT)

  runtime_private.on_session_remade(end)
  _INSTALLED.append(task_name)


def installed():
  return bool(_INSTALLED)
