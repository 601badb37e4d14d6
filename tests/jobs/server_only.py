"""A task that only serves: its TensorFlow server from TF_CONFIG, up until
the file named by its argument exists (or 120 s pass). The closing tests'
target when what runs in the job does not matter, only its ports.

`--library`: imports estimator_accum first, as a user's own per-host
command would (which closes the task's port where no launcher did).
`--reach`: once serving, runs an op on every other task of the cluster
through its own server until each answers, and prints `reached TASK`: the
job's own tasks still reach each other through the closed ports.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

if "--library" in sys.argv:
  import estimator_accum  # noqa: E402, F401

import tensorflow as tf  # noqa: E402


def _reach(server, cluster, own):
  for kind, addresses in cluster.items():
    for index in range(len(addresses)):
      if (kind, index) == own:
        continue
      graph = tf.Graph()
      with graph.as_default(), tf.device(f"/job:{kind}/task:{index}"):
        value = tf.constant(1) + 1
      deadline = time.monotonic() + 60
      while True:
        try:
          with tf.compat.v1.Session(server.target, graph=graph, config=(
              tf.compat.v1.ConfigProto(operation_timeout_in_ms=5000))) as s:
            assert s.run(value) == 2
          break
        except tf.errors.OpError:
          if time.monotonic() > deadline:
            raise
          time.sleep(0.5)
      print(f"reached {kind}:{index}", flush=True)


def main(stop_file, flags):
  config = json.loads(os.environ["TF_CONFIG"])
  task = config["task"]
  server = tf.distribute.Server(
      tf.train.ClusterSpec(config["cluster"]), job_name=task["type"],
      task_index=int(task["index"]), start=True)
  print(f"serving {server.target} as uid {os.getuid()}", flush=True)
  if "--reach" in flags:
    _reach(server, config["cluster"], (task["type"], int(task["index"])))
  deadline = time.monotonic() + 120
  while not os.path.exists(stop_file) and time.monotonic() < deadline:
    time.sleep(0.2)
  print("stopping", flush=True)
  os._exit(0)


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2:])
