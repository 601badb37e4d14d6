"""TF_CONFIG of a one-worker cluster on loopback, for tests that start a
MultiWorkerMirroredStrategy (and so its coordination service) in a child
process of their own."""

import json

from clusterspec import config as tfc
from tfconfig import launch


def tf_config():
  """The TF_CONFIG value: one worker, on a port free on 127.0.0.1 now."""
  (port,) = launch.free_ports(1)
  return json.dumps(tfc.build([f"127.0.0.1:{port}"], task=("worker", 0)))
