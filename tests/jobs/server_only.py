"""A task that only serves: its TensorFlow server from TF_CONFIG, up until
the file named by its argument exists (or 120 s pass). The closing tests'
target when what runs in the job does not matter, only its ports."""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402


def main(stop_file):
  config = json.loads(os.environ["TF_CONFIG"])
  task = config["task"]
  server = tf.distribute.Server(
      tf.train.ClusterSpec(config["cluster"]), job_name=task["type"],
      task_index=int(task["index"]), start=True)
  print(f"serving {server.target} as uid {os.getuid()}", flush=True)
  deadline = time.monotonic() + 120
  while not os.path.exists(stop_file) and time.monotonic() < deadline:
    time.sleep(0.2)
  print("stopping", flush=True)
  os._exit(0)


if __name__ == "__main__":
  main(sys.argv[1])
