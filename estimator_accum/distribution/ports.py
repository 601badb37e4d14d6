"""This task's TensorFlow port closed to all but its cluster, on import.

A TensorFlow server runs any graph sent to its port, as the job's user, and
listens on every address of its host in both families. `python -m tfconfig
launch`, `guard` and `slurm` close the ports before a task starts and say
so in the task's environment (`CLOSED_BY`). A task started by the user's
own per-host command with TF_CONFIG has had no such launcher: importing
`estimator_accum` closes its port then, before any server of the process
starts, as `tfconfig guard` would (clusterspec/closing.py):

- as root (or with CAP_NET_ADMIN) and nftables: a table that admits the
  port only from the addresses of the cluster's hosts (both families) and,
  on this host, only this user; its holder process dies with this process
  (the kernel's parent-death signal), and the kernel then removes the
  table, however the process ends;
- otherwise: one line naming the port and the `nft` table that closes it,
  and the task goes on (a job is not stopped for a firewall it cannot
  write).

`ESTIMATOR_ACCUM_ISOLATION` chooses: `auto` (the default, as above),
`firewall` (stop with one line where it cannot be had), `open` (leave the
port as TensorFlow opens it). An evaluator task (no port in the cluster)
and a process without TF_CONFIG are left alone.
"""

import os
import sys

from clusterspec import closing as closed
from clusterspec import config as tfc

CLOSED_BY = closed.CLOSED_BY_ENV
SETTING = "ESTIMATOR_ACCUM_ISOLATION"

# The closure this process holds: its holder lives as long as this module.
_held = []


class PortsError(RuntimeError):
  """The port cannot be closed as ESTIMATOR_ACCUM_ISOLATION asks."""


def _task_with_port(text):
  """TF_CONFIG (or Vertex AI's CLUSTER_SPEC) in TensorFlow's form when it
  places this process in its training cluster, else None. A malformed one
  is None too: the program's own TF_CONFIG check names it, in one line."""
  try:
    config = tfc.tensorflow_form(tfc.parse(text))
  except (tfc.TFConfigError, KeyError, TypeError, ValueError):
    return None
  task = config.get("task") or {}
  addresses = config["cluster"].get(task.get("type")) or []
  return config if 0 <= int(task.get("index", 0)) < len(addresses) else None


def close_own_port(environ=None, log=None):
  """Closes this task's port as the module's docstring says; returns the
  closure's mode ('firewall', 'open'), or None where there is nothing to
  close (no TF_CONFIG place, or a launcher closed it already).

  Raises:
    PortsError: ESTIMATOR_ACCUM_ISOLATION is not one of auto, firewall and
      open, or is firewall where no firewall can be written.
  """
  environ = os.environ if environ is None else environ
  log = log or sys.stderr
  text = environ.get("TF_CONFIG") or environ.get("CLUSTER_SPEC")
  if environ.get(CLOSED_BY) or not text:
    return None
  config = _task_with_port(text)
  if config is None:
    return None
  mode = environ.get(SETTING, "auto")
  if mode not in closed.HOST_MODES:
    raise PortsError(f"{SETTING}={mode!r}: one of "
                     f"{', '.join(closed.HOST_MODES)}")
  try:
    closure = closed.guard_task(config, mode, log=log,
                                prefix="[estimator_accum]",
                                open_flag=f"{SETTING}=open")
  except closed.ClosingError as error:
    raise PortsError(f"{SETTING}={mode}: {error}") from None
  if closure.description:
    log.write(f"[estimator_accum] {closure.description}\n")
    log.flush()
  # The process's children (a task's helpers) are the same task: the
  # port is this process's and stays as it is now.
  environ[CLOSED_BY] = f"estimator_accum:{closure.mode}"
  _held.append(closure)
  return closure.mode
