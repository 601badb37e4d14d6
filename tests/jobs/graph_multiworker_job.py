"""A MultiWorkerMirroredStrategy worker of a plain tf.compat.v1 graph, no
Estimator (what runs on every TensorFlow release): started by `python -m
tfconfig launch`, it trains STEPS windows of K micro-batches of B with the
library and prints the weights as JSON. Worker w's micro-batch m of window
u holds examples (u * workers + w) * K * B + m * B onwards, so the
workers' windows together are plain training's batches of K * B * workers.

  python -m tfconfig launch --workers 2 -- python tests/jobs/graph_multiworker_job.py adam
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from harness import faults, support  # noqa: E402

K, B = 2, 4
# JOB_STEPS: more windows, for benchmarks/closed_ports.py.
STEPS = int(os.environ.get("JOB_STEPS", "3"))
OPTIMIZERS = {
    "sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.5),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.2, 0.9),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
}


def _wait_at_gate(target):
  """With JOB_GATE set (the closing tests): says this task serves, and
  waits for that file before training, so that attacks meet the job's
  servers up."""
  gate = os.environ.get("JOB_GATE")
  if not gate:
    return
  print(f"serving {target}", flush=True)
  while not os.path.exists(gate):
    time.sleep(0.1)


def _session(target, config, initialize, index):
  """A plain session, initialized; with JOB_ABORT_AT or JOB_STALL_AT, a
  MonitoredSession (what remakes a session after AbortedError) whose
  worker 1 aborts, or stalls, once."""
  abort_at = os.environ.get("JOB_ABORT_AT")
  stall_at = os.environ.get("JOB_STALL_AT")
  if not (abort_at or stall_at):
    session = tf.compat.v1.Session(target, config=config)
    session.run(initialize)
    return session
  hooks = []
  if index == 1:
    markers = os.environ["JOB_ABORT_DIR"]
    if abort_at:
      hooks.append(faults.AbortOnce(int(abort_at), os.path.join(
          markers, "worker_1_aborted")))
    if stall_at:
      hooks.append(faults.StallOnce(int(stall_at), os.path.join(
          markers, "worker_1_stalled")))
  return tf.compat.v1.train.MonitoredSession(
      session_creator=tf.compat.v1.train.ChiefSessionCreator(
          scaffold=tf.compat.v1.train.Scaffold(init_op=initialize),
          master=target, config=config), hooks=hooks)


def main(optimizer_name):
  tf_config = json.loads(os.environ["TF_CONFIG"])
  index = tf_config["task"]["index"]
  workers = len(tf_config["cluster"]["worker"])
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  # The tf.compat.v1 class: its collective ops serve graph sessions, on the
  # server its construction starts for this task.
  strategy = tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy(
      cluster_resolver=resolver)
  config = strategy.update_config_proto(tf.compat.v1.ConfigProto())
  target = "grpc://" + resolver.master().replace("grpc://", "")
  _wait_at_gate(target)
  data = support.make_data(K * B * workers * STEPS)
  with tf.Graph().as_default(), strategy.scope():
    tf.compat.v1.train.get_or_create_global_step()
    inputs = {key: tf.compat.v1.placeholder(
        tf.as_dtype(value.dtype), (B,) + value.shape[1:])
        for key, value in data.items()}
    optimizer = OPTIMIZERS[optimizer_name]()

    def micro_batch_step():
      loss = support.model_loss(inputs, inputs["labels"])
      return estimator_accum.build_accumulating_train_op(
          loss, optimizer, K, summaries=False, log_every_n_micro_batches=None)

    train_op = strategy.group(
        strategy.extended.call_for_each_replica(micro_batch_step))
    variables = {v.name.split(":")[0]: v
                 for v in tf.compat.v1.global_variables()}
    initialize = tf.compat.v1.global_variables_initializer()
    with _session(target, config, initialize, index) as session:
      started = time.perf_counter()
      for update in range(STEPS):
        for micro in range(K):
          start = (update * workers + index) * K * B + micro * B
          session.run(train_op, {inputs[key]: value[start:start + B]
                                 for key, value in data.items()})
      trained = time.perf_counter() - started
      weights = {name: session.run(variables[name]).tolist()
                 for name in support.weight_names()}
  print(f"TRAINED_SECONDS {trained:.4f}", flush=True)
  print("WEIGHTS " + json.dumps(weights), flush=True)


if __name__ == "__main__":
  main(sys.argv[1])
