"""Faults on real links: how long until the job exits, what it says, and
whether the restarted job ends where the uninterrupted one does.

A 2-worker MultiWorkerMirroredStrategy job (`harness/multiworker_job.py`:
k=2, Adam, a checkpoint every 2 micro-batches, 60 micro-batches per worker
at 0.2 s each) runs on the test bed (tfconfig/testbed.py: each worker in a
network namespace of its own, on a private link). Once it has trained a
few windows a fault is injected for real:

  cut_mid_window      worker:1's link cut at the switch (ip link set down)
  cut_during_save     the same, the moment a checkpoint's save barrier opens
  chief_host_cut      worker:0's link cut (MWMS's chief)
  sigstop             worker:1 frozen (SIGSTOP)
  sigkill_no_launcher worker:1 killed (SIGKILL), the tasks started one by
                      one with no launcher to stop the rest (Kubernetes)
  loss_5              5% of worker:1's input dropped (nftables), from the
                      start: the job must finish, not be taken for dead

Printed per fault: seconds from the fault until the last task exited (or
"no exit" after --cap seconds, when everything is killed), the exit code,
the line that names the loss; then the link is restored, the job started
again (it resumes from its last checkpoint) and its final weights compared
with the same job run without a fault.

  python benchmarks/network_faults.py [--peer_timeout 60] [--cap 150]
  python benchmarks/network_faults.py --peer_timeout 0   # no watchdog

Root only. Exits non-zero when a restarted job does not end within 1e-5 of
the uninterrupted one.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


import numpy as np  # noqa: E402

from harness import bench, hosts, support  # noqa: E402
from tfconfig import testbed  # noqa: E402

UPDATES = 30
FAULTS = ("cut_mid_window", "cut_during_save", "chief_host_cut", "sigstop",
          "sigkill_no_launcher", "loss_5")


def _final(model_dir):
  saved = np.load(os.path.join(model_dir, "final_weights.npz"))
  return {n: saved[n.replace("/", "__")] for n in support.weight_names()}


def _difference(actual, expected):
  return max(float(np.max(np.abs(actual[n] - expected[n]) /
                          (np.abs(expected[n]) + 1e-6))) for n in expected)


def _job(bed, model_dir, peer_timeout, *extra):
  return hosts.launch_command(bed, 2, model_dir, UPDATES, "--save_every", "2",
                              *extra, peer_timeout=peer_timeout)


def _run_to_end(bed, model_dir, peer_timeout):
  start = time.monotonic()
  result = subprocess.run(_job(bed, model_dir, peer_timeout), cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
  if result.returncode != 0:
    raise RuntimeError(f"job failed ({result.returncode}): "
                       f"{result.stderr[-2000:]}")
  return time.monotonic() - start


def _start(bed, fault, model_dir, peer_timeout, log_dir):
  """The job, as the launcher or (no launcher) as one process per task."""
  slow = ("--step_seconds", "0.2")
  if fault != "sigkill_no_launcher":
    return [hosts.Run(_job(bed, model_dir, peer_timeout, *slow), log_dir,
                      "launch")]
  return hosts.start_without_launcher(
      bed, [model_dir] * 2, UPDATES, log_dir, "--save_every", "2", *slow,
      peer_timeout=peer_timeout)


def _inject(bed, fault, model_dir, runs):
  if fault == "cut_mid_window":
    bed.cut(1)
  elif fault == "cut_during_save":
    hosts.wait_for_save_barrier(model_dir)
    bed.cut(1)
  elif fault == "chief_host_cut":
    bed.cut(0)
  elif fault == "sigstop":
    for pid in hosts.host_pids(bed, 1):
      os.kill(pid, signal.SIGSTOP)
  elif fault == "sigkill_no_launcher":
    os.killpg(runs[1].process.pid, signal.SIGKILL)


def _lines(runs):
  text = "\n".join(run.output() for run in runs)
  found = re.findall(r"(lost \S+ at \S+: no answer for \d+ s[^;]*|model_dir "
                     r"[^\n]* is not the one[^;]*|task \S+ (?:failed with|was "
                     r"killed)[^;]*)", text)
  return "; ".join(dict.fromkeys(found)) or "-"


def measure(fault, peer_timeout, cap, reference):
  work = tempfile.mkdtemp(prefix=f"fault_{fault}_")
  model_dir = os.path.join(work, "model")
  row = {"fault": fault}
  with testbed.TestBed(2) as bed:
    if fault == "loss_5":
      bed.set_loss(1, 5)
      seconds = _run_to_end(bed, model_dir, peer_timeout)
      row.update(exit="finished", seconds=f"{seconds:.0f} s", code=0,
                 line="-")
    else:
      from pathlib import Path

      runs = _start(bed, fault, model_dir, peer_timeout, Path(work))
      try:
        hosts.wait_for_step(model_dir, 5, [r.process for r in runs])
        _inject(bed, fault, model_dir, runs)
        injected = time.monotonic()
        survivors = runs if fault != "sigkill_no_launcher" else runs[:1]
        codes = []
        for run in survivors:
          remaining = cap - (time.monotonic() - injected)
          try:
            codes.append(run.wait(max(remaining, 0.1)))
          except subprocess.TimeoutExpired:
            codes.append(None)
        took = time.monotonic() - injected
        if None in codes:
          row.update(exit=f"no exit in {cap:g} s", seconds="-", code="-")
        else:
          row.update(exit="exited", seconds=f"{took:.0f} s",
                     code=codes[0])
        row["line"] = _lines(runs)
      finally:
        for pid in hosts.host_pids(bed, 1) + hosts.host_pids(bed, 0):
          try:
            os.kill(pid, signal.SIGKILL)
          except ProcessLookupError:
            pass
        for run in runs:
          run.kill()
      bed.restore(0)
      bed.restore(1)
      _run_to_end(bed, model_dir, peer_timeout)
    row["difference"] = _difference(_final(model_dir), reference)
  shutil.rmtree(work, ignore_errors=True)
  return row


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--peer_timeout", type=float, default=60,
                      help="the job's estimator_accum.distribution.health timeout; 0: none")
  parser.add_argument("--cap", type=float, default=150,
                      help="seconds to wait for an exit before killing")
  parser.add_argument("--faults", nargs="+", default=FAULTS, choices=FAULTS)
  args = parser.parse_args()
  reason = testbed.available()
  if reason:
    print(f"network_faults: {reason}", file=sys.stderr)
    return 2
  testbed.remove_leftovers(only_dead=True)
  with testbed.TestBed(2) as bed:
    work = tempfile.mkdtemp(prefix="fault_reference_")
    seconds = _run_to_end(bed, work, args.peer_timeout)
    reference = _final(work)
    shutil.rmtree(work, ignore_errors=True)
  difference = "restarted vs uninterrupted (max rel.)"
  rows = bench.Rows(
      f"2 workers on 2 hosts, MWMS, k=2, Adam; peer timeout "
      f"{args.peer_timeout:g} s (0: no watchdog); uninterrupted job "
      f"{seconds:.0f} s", args.json, markdown=True,
      formats={difference: ".1e"})
  for fault in args.faults:
    row = measure(fault, args.peer_timeout, args.cap, reference)
    rows.add(**{"fault": row["fault"], "outcome": row["exit"],
                "fault to last exit": row["seconds"],
                "exit code": row["code"], "line": row["line"],
                difference: row["difference"]})
    if not row["difference"] <= 1e-5:
      rows.fail(f"{fault}: the restarted job differs by "
                f"{row['difference']}")
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
