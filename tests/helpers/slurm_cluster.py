"""A real one-node Slurm cluster for the tests: munged, slurmctld and slurmd
from Debian's `slurm-wlm` and `munge`, each with its own key, config, state
and logs in a temporary directory, on free ports; the node is this machine
by its hostname (which must resolve to a loopback address), with its CPUs.
Stopped, every job cancelled and every daemon gone, by `stop`.

  cluster = SlurmCluster(tmp_path).start()
  cluster.run(["srun", "-n", "2", ...])       # with SLURM_CONF set
  cluster.stop()
"""

import os
import shutil
import signal
import socket
import subprocess
import time

DAEMONS = ("munged", "slurmctld", "slurmd")


def missing():
  """The daemons and commands not installed (apt-get install slurm-wlm
  munge), or []."""
  return [name for name in (*DAEMONS, "srun", "sbatch", "scancel", "squeue")
          if shutil.which(name) is None]


def _free_port():
  with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    return probe.getsockname()[1]


_CONFIG = """\
ClusterName=estimatoraccum
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


class SlurmCluster:
  """See the module's docstring."""

  def __init__(self, root):
    self.root = str(root)
    self.host = socket.gethostname()
    self.env = dict(os.environ, SLURM_CONF=os.path.join(self.root,
                                                        "slurm.conf"))
    self._daemons = []

  def start(self, seconds=30):
    addresses = {info[4][0] for info in socket.getaddrinfo(self.host, None)}
    if not all(a.startswith("127.") or a == "::1" for a in addresses):
      raise RuntimeError(f"hostname {self.host} resolves to {addresses}, not "
                         "a loopback address: the one-node cluster would "
                         "serve on the network")
    for folder in ("munge", "state", "spool"):
      os.makedirs(os.path.join(self.root, folder), exist_ok=True)
    os.chmod(os.path.join(self.root, "munge"), 0o700)
    key = os.path.join(self.root, "munge", "munge.key")
    with open(key, "wb") as writer:
      writer.write(os.urandom(1024))
    os.chmod(key, 0o400)
    with open(self.env["SLURM_CONF"], "w") as writer:
      writer.write(_CONFIG.format(
          root=self.root, host=self.host, ctld_port=_free_port(),
          d_port=_free_port(), cpus=os.cpu_count()))
    munge = os.path.join(self.root, "munge")
    self._spawn(["munged", "--foreground", "--force", f"--key-file={key}",
                 f"--socket={munge}/munge.socket",
                 f"--pid-file={munge}/munged.pid",
                 f"--log-file={munge}/munged.log",
                 f"--seed-file={munge}/munged.seed"])
    self._wait(lambda: os.path.exists(f"{munge}/munge.socket"), seconds,
               "munged")
    self._spawn(["slurmctld", "-D", "-c", "-i"])
    self._wait(lambda: self.run(["sinfo", "-h"], check=False).returncode == 0,
               seconds, "slurmctld")
    self._spawn(["slurmd", "-D", "-N", self.host])
    self._wait(lambda: self.run(["sinfo", "-h", "-o", "%t"],
                                check=False).stdout.strip() == "idle",
               seconds, "slurmd (node idle)")
    return self

  def _spawn(self, command):
    log = open(os.path.join(self.root, command[0] + ".out"), "w")
    self._daemons.append(subprocess.Popen(
        command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True))

  def _wait(self, ready, seconds, what):
    deadline = time.monotonic() + seconds
    while not ready():
      for daemon in self._daemons:
        if daemon.poll() is not None:
          raise RuntimeError(f"{daemon.args[0]} exited with "
                             f"{daemon.returncode}: {self.logs()}")
      if time.monotonic() > deadline:
        raise RuntimeError(f"{what} not ready in {seconds} s: {self.logs()}")
      time.sleep(0.2)

  def logs(self):
    """The daemons' own logs, their last lines."""
    text = []
    for name in ("slurmctld.log", "slurmd.log", "munge/munged.log"):
      path = os.path.join(self.root, name)
      if os.path.exists(path):
        text.append(f"--- {name}\n" + "".join(open(path).readlines()[-15:]))
    return "\n".join(text)

  def run(self, command, check=True, timeout=600, **kwargs):
    """Runs a Slurm command (srun, sbatch, ...) against this cluster."""
    done = subprocess.run(command, env=self.env, capture_output=True,
                          text=True, timeout=timeout, **kwargs)
    if check and done.returncode != 0:
      raise AssertionError(f"{command}: exit {done.returncode}\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done

  def job_state(self, job):
    """The job's state (PENDING, RUNNING, COMPLETED, ...), from scontrol."""
    out = self.run(["scontrol", "show", "job", str(job)], check=False).stdout
    for field in out.split():
      if field.startswith("JobState="):
        return field.split("=", 1)[1]
    return None

  def wait_for_job(self, job, states, seconds):
    """Waits until job `job` is in one of `states`; returns its state."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
      state = self.job_state(job)
      if state in states:
        return state
      time.sleep(0.5)
    raise AssertionError(f"job {job} not in {states} within {seconds} s "
                         f"(is {self.job_state(job)}): {self.logs()}")

  def stop(self):
    """Cancels every job and stops the daemons (their process groups)."""
    if self._daemons:
      self.run(["scancel", "--full", "--user", "root"], check=False,
               timeout=30)
    for daemon in reversed(self._daemons):
      if daemon.poll() is None:
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
          daemon.wait(15)
        except subprocess.TimeoutExpired:
          os.killpg(daemon.pid, signal.SIGKILL)
          daemon.wait()
    self._daemons = []
