"""One task of a parameter-server Estimator job (for the tests).

Run by `python -m tfconfig launch --chief --workers 2 --ps 1 -- python
harness/ps_job.py --model_dir D [--parameter_server_strategy]`: Estimator's
own between-graph placement, or a
`tf.compat.v1.distribute.experimental.ParameterServerStrategy` as its
`train_distribute`. The model is one scalar w with loss
w * mean(x); each task feeds its own constant x (chief 1, worker 0 10,
worker 1 100) for its own number of micro-batches (7, 9, 5), then stops. With
SGD at learning rate 1 and k=2, every window a task completes subtracts its
constant once, so at the end w must be -(1*3 + 10*4 + 100*2) = -243 exactly:
any window mixing tasks, or a partial window, shows in the digits.

A batch_norm layer (momentum 1/2) sees the same pattern on every task, so
every window any task completes moves its moving statistics one step toward
the pattern's: after the 9 windows, mean = target * (1 - 2**-9).

Each worker writes D/done_<task>.json (its micro-batch count) when it stops;
the chief then waits for them and writes D/final.json from the shared state.

For the stop tests (SIGTERM, tests/integration/test_preemption.py):
`--repeat M` trains M times each task's count, `--step_seconds S` sleeps
after each micro-batch, `--run NAME` suffixes the done files (a job started
again on the same directory), and every task keeps its micro-batch count in
D/progress_<task>.json after each one. A task told to stop writes no done
file, and its chief gathers nothing.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

import estimator_accum  # noqa: E402
from estimator_accum.distribution import (
  health,  # noqa: E402
  preemption,  # noqa: E402
)
from estimator_accum.window.batch_norm import window_statistics  # noqa: E402

K = 2
PLAN = {"chief:0": (1.0, 7), "worker:0": (10.0, 9), "worker:1": (100.0, 5)}
ROWS = {"chief:0": 0, "worker:0": 1, "worker:1": 2}
SHARED_ROW = 3
BATCH_NORM_MOMENTUM = 0.5
PATTERN = [[1.0, 2.0], [3.0, 5.0], [0.0, 1.0], [4.0, 0.0]]


def _flag_value(name, default):
  return (type(default)(sys.argv[sys.argv.index(name) + 1])
          if name in sys.argv else default)


class _Record(tf.compat.v1.train.SessionRunHook):
  """Counts this task's micro-batches; the chief gathers the final state
  from the tasks `others` (names)."""

  def __init__(self, model_dir, task, others, run="", step_seconds=0.0):
    self._model_dir, self._task, self._runs = model_dir, task, 0
    self._others, self._run = others, run
    self._step_seconds = step_seconds

  def after_create_session(self, session, coord):
    if self._task == "chief:0":
      # The variables are initialized: the workers may start.
      with open(os.path.join(self._model_dir, "chief_ready"), "w"):
        pass

  def after_run(self, run_context, run_values):
    self._runs += 1
    if self._step_seconds:
      with open(os.path.join(self._model_dir,
                             f"progress_{self._task}.json"), "w") as writer:
        json.dump({"micro_batches": self._runs}, writer)
      time.sleep(self._step_seconds)

  def end(self, session):
    if preemption.stopping():
      return  # told to stop: the chief saves, nothing to gather
    state = estimator_accum.get_accumulation_state()
    devices = sorted({v.device for a in state.accumulators
                      for v in a.state_variables()})
    (statistics,) = window_statistics()
    window_devices = sorted({v.device for v in (
        statistics.total, statistics.square_total, statistics.count)} | {
            v.device for v in tf.compat.v1.local_variables() +
            tf.compat.v1.global_variables() if "last_finite_loss" in v.name})
    assert len(window_devices) == 1, window_devices
    path = os.path.join(self._model_dir, f"done_{self._task}{self._run}.json")
    with open(path, "w") as writer:
      json.dump({"micro_batches": self._runs, "accumulator_devices": devices,
                 "worker_state_devices": window_devices}, writer)
    if self._task != "chief:0":
      return
    deadline = time.time() + 120
    while not all(os.path.exists(os.path.join(
        self._model_dir, f"done_{t}{self._run}.json")) for t in self._others):
      if time.time() > deadline:
        raise RuntimeError("workers did not finish")
      time.sleep(0.2)
    (weight,) = [v for v in tf.compat.v1.global_variables()
                 if v.op.name == "w"]
    (table,) = [v for v in tf.compat.v1.global_variables()
                if v.op.name == "table"]
    moving = {v.op.name: v for v in tf.compat.v1.global_variables()
              if v.op.name.startswith("bn/moving_")}
    values = session.run({"w": weight, "updates": state.updates_applied,
                          "global_step": state.global_step, "table": table,
                          **moving})
    compact = [a.variable.op.name for a in state.accumulators if a.is_compact]
    with open(os.path.join(self._model_dir, "final.json"), "w") as writer:
      json.dump({key: value.tolist() for key, value in values.items()}
                | {"compact": compact}, writer)


def main():
  # In main, not at import: the test imports this module for its constants.
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
  model_dir = sys.argv[sys.argv.index("--model_dir") + 1]
  tf_config = json.loads(os.environ["TF_CONFIG"])
  task = tf_config["task"]
  name = f"{task['type']}:{task['index']}"
  others = [f"worker:{i}" for i in range(len(tf_config["cluster"]["worker"]))]
  pause = _flag_value("--pause_at_start", 0.0)
  if pause:
    # A stop before training (tests/integration/test_preemption.py).
    print("phase imported", flush=True)
    time.sleep(pause)
  constant, micro_batches = PLAN.get(name, (0.0, 0))
  micro_batches *= _flag_value("--repeat", 1)
  record = _Record(model_dir, name, others, _flag_value("--run", ""),
                   _flag_value("--step_seconds", 0.0))
  # Every task, the ps included: a lost peer ends it in bounded time, and
  # the ps ends by itself once every training task is done.
  watchdog = health.watch(model_dir, timeout=30, interval=1)

  def model_fn(features, labels, mode):
    del labels
    w = tf.compat.v1.get_variable("w", [], initializer=tf.zeros_initializer())
    table = tf.compat.v1.get_variable("table", [1000, 2],
                                      initializer=tf.zeros_initializer())
    rows = tf.gather(table, [ROWS.get(name, 0), SHARED_ROW])
    loss = (w + tf.reduce_sum(rows)) * tf.reduce_mean(features)
    estimator_accum.batch_norm(tf.constant(PATTERN), True, K,
                               momentum=BATCH_NORM_MOMENTUM, center=False,
                               scale=False, name="bn")
    train_op = estimator_accum.build_accumulating_train_op(
        loss, tf.compat.v1.train.GradientDescentOptimizer(1.0), K,
        sparse_accumulation=[table])
    return tf.estimator.EstimatorSpec(
        mode, loss=estimator_accum.reportable_loss(loss), train_op=train_op,
        training_hooks=[record,
                        estimator_accum.AccumulationLoggingHook(2)])

  def input_fn():
    dataset = tf.data.Dataset.from_tensors(tf.fill([4], constant))
    return dataset.repeat(micro_batches).map(lambda x: (x, 0))

  train_distribute = None
  if "--parameter_server_strategy" in sys.argv:
    train_distribute = (
        tf.compat.v1.distribute.experimental.ParameterServerStrategy())
  config = tf.estimator.RunConfig(
      model_dir=model_dir, save_checkpoints_steps=10_000,
      experimental_max_worker_delay_secs=1, log_step_count_steps=10_000,
      train_distribute=train_distribute)
  estimator = tf.estimator.Estimator(model_fn, config=config)
  if task["type"] == "worker":
    # A worker that finds the variables uninitialized checks again only 30 s
    # later (SessionManager's recovery wait): start once the chief is in.
    ready = os.path.join(model_dir, "chief_ready")
    deadline = time.time() + 60
    while not os.path.exists(ready) and time.time() < deadline:
      time.sleep(0.1)
  tf.estimator.train_and_evaluate(
      estimator, tf.estimator.TrainSpec(input_fn, max_steps=10_000),
      tf.estimator.EvalSpec(input_fn, steps=1))
  print(f"{name} finished", flush=True)
  if watchdog:
    watchdog.finish()


if __name__ == "__main__":
  main()
