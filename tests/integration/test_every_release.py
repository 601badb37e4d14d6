"""The library on every TensorFlow release (2.15-2.21), without Estimator.

`build_accumulating_train_op` in a plain `tf.compat.v1` graph, run by a
`tf.compat.v1.Session` or a `MonitoredTrainingSession`, on one device,
under MirroredStrategy (two logical CPUs, the model built in each replica by
`call_for_each_replica`, as Estimator would) and on two workers of
MultiWorkerMirroredStrategy (processes on loopback): k micro-batches of B give the
weights of plain TensorFlow's big batch of k*B at <= 1e-5 relative, for
every tf.compat.v1.train optimizer and, where `tf.keras` is Keras 2, its
legacy optimizers. None of it asks for tf.estimator.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum import releases
from estimator_accum.checkpoints import integrity
from harness import support
from tests.integration import test_run_classifier as runs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

K, MICRO_BATCH, UPDATES = 4, 8, 3

V1_OPTIMIZERS = support.V1_OPTIMIZERS

KERAS_LEGACY = ("Adam", "SGD", "RMSprop")

def _keras_legacy(name):
  options = {"SGD": dict(momentum=0.9, nesterov=True)}.get(name, {})
  rate = 0.2 if name == "SGD" else 0.05
  return lambda: getattr(tf.keras.optimizers.legacy, name)(rate, **options)


def _weights(running, variables):
  """The model's weights by name, a partitioned embedding's parts joined
  (as support.reference_train returns them)."""
  values = {}
  for name in support.weight_names():
    parts = sorted((n for n in variables
                    if re.fullmatch(rf"{name}/part_\d+", n)),
                   key=lambda n: int(n.rsplit("_", 1)[1]))
    values[name] = (np.concatenate([running.run(variables[n]) for n in parts])
                    if parts else running.run(variables[name]))
  return values


def _accumulated(optimizer_fn, data, session="plain", replicas=1,
                 model=None, options=None):
  """Trains UPDATES windows of K micro-batches of MICRO_BATCH per replica
  with the library in a fresh graph; returns the weights by name. Window u
  holds examples [u*K*B*R, (u+1)*K*B*R) in order, replica r the r-th share
  of it, as the big batch has them."""
  graph = tf.Graph()
  strategy = (tf.distribute.MirroredStrategy(
      [f"/cpu:{index}" for index in range(replicas)]) if replicas > 1
      else tf.distribute.get_strategy())
  share = replicas * MICRO_BATCH
  with graph.as_default(), strategy.scope():
    tf.compat.v1.set_random_seed(0)
    tf.compat.v1.train.get_or_create_global_step()
    inputs = {key: tf.compat.v1.placeholder(
        tf.as_dtype(value.dtype), (share,) + value.shape[1:])
        for key, value in data.items()}
    optimizer = optimizer_fn()

    def micro_batch_step():
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      own = {key: value[replica * MICRO_BATCH:(replica + 1) * MICRO_BATCH]
             for key, value in inputs.items()}
      loss = support.model_loss(own, own["labels"], **(model or {}))
      return estimator_accum.build_accumulating_train_op(
          loss, optimizer, K, summaries=False, log_every_n_micro_batches=None,
          **(options or {}))

    if replicas > 1:
      train_op = strategy.group(
          strategy.extended.call_for_each_replica(micro_batch_step))
    else:
      train_op = micro_batch_step()
    variables = {v.name.split(":")[0]: v
                 for v in tf.compat.v1.global_variables()}
    feeds = []
    for update in range(UPDATES):
      for micro in range(K):
        rows = np.concatenate([
            np.arange(start, start + MICRO_BATCH) for start in (
                (update * replicas + replica) * K * MICRO_BATCH +
                micro * MICRO_BATCH for replica in range(replicas))])
        feeds.append({inputs[key]: value[rows] for key, value in data.items()})
    # Two CPUs, as the suite's logical devices give (conftest.py).
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
    if session == "plain":
      with tf.compat.v1.Session(config=config) as running:
        running.run(tf.compat.v1.global_variables_initializer())
        for feed in feeds:
          running.run(train_op, feed)
        return _weights(running, variables)
    with tf.compat.v1.train.MonitoredTrainingSession(
        checkpoint_dir=None, save_summaries_steps=None,
        log_step_count_steps=None, config=config) as running:
      for feed in feeds:
        running.run(train_op, feed)
      return _weights(running, variables)


def _check(optimizer_fn, session="plain", replicas=1, minimize=True,
           accumulated_fn=None, model=None, options=None, reference=None):
  data = support.make_data(replicas * K * MICRO_BATCH * UPDATES)
  expected = support.reference_train(
      optimizer_fn, data, replicas * K * MICRO_BATCH, UPDATES,
      minimize=minimize, **(reference or {}))
  actual = _accumulated(accumulated_fn or optimizer_fn, data, session,
                        replicas, model, options)
  support.assert_weights_moved(expected, "big batch")
  support.assert_weights_close(
      actual, expected, what=f"{session} session, {replicas} replica(s), "
                             f"TensorFlow {tf.__version__}")


@pytest.mark.parametrize("name", sorted(V1_OPTIMIZERS))
def test_every_v1_optimizer_in_a_plain_session(name):
  _check(V1_OPTIMIZERS[name])


def test_adagrad_da_counting_updates():
  """AdagradDA reads a step count: given `update_count(k)` it sees the count
  plain training gives it."""
  def adagrad_da(step):
    return tf.compat.v1.train.AdagradDAOptimizer(
        0.5, step, l1_regularization_strength=0.001,
        l2_regularization_strength=0.01)

  _check(lambda: adagrad_da(tf.compat.v1.train.get_or_create_global_step()),
         accumulated_fn=lambda: adagrad_da(estimator_accum.update_count(K)))


# The window's options and the model's kinds of variables, as their
# Estimator tests check them on 2.15 (the reference as plain TensorFlow
# trains the same: the big batch's gradient clipped, its losses summed).
FEATURES = {
    "clip_norm": dict(options=dict(clip_norm=0.5),
                      reference=dict(clip_norm=0.5)),
    "summed": dict(model=dict(reduction="sum"), options=dict(reduction="sum"),
                   reference=dict(loss_reduction="sum")),
    "recompute": dict(model=dict(recompute=True)),
    "fused_apply": dict(options=dict(fused_apply=True)),
    # One replica's (partitioned variables and a window in host memory)...
    "partitioned_embedding": dict(model=dict(embedding_partitions=3),
                                  reference=dict(embedding_partitions=3)),
    "host_accumulators": dict(options=dict(accumulator_placement="host")),
    # ... and several replicas' (1/N of the window on each).
    "sharded_accumulators": dict(options=dict(
        accumulator_placement="sharded")),
}
ONE_REPLICA = ("partitioned_embedding", "host_accumulators")
REPLICAS = ("sharded_accumulators",)


@pytest.mark.parametrize("feature, replicas", [
    (feature, replicas) for feature in sorted(FEATURES)
    for replicas in (1, 2)
    if not (feature in ONE_REPLICA and replicas > 1)
    and not (feature in REPLICAS and replicas == 1)])
def test_the_windows_options_and_models(feature, replicas):
  _check(V1_OPTIMIZERS["adam"], replicas=replicas, **FEATURES[feature])


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam"])
def test_monitored_training_session(name):
  _check(V1_OPTIMIZERS[name], session="monitored")


@pytest.mark.parametrize("name", ["sgd", "adam", "ftrl"])
def test_mirrored_strategy_in_a_plain_graph(name):
  _check(V1_OPTIMIZERS[name], replicas=2)


@pytest.mark.keras2
@pytest.mark.parametrize("name", KERAS_LEGACY)
def test_keras_legacy_optimizers(name):
  _check(_keras_legacy(name), minimize=False)


@pytest.mark.skipif(releases.keras_major() < 3,
                    reason="tf.keras is Keras 2 here, which the wrapper runs on "
                           "(tests/unit/keras/test_keras_tf2.py)")
def test_under_keras_3_what_runs_only_on_keras_2_is_refused_in_one_line():
  """Around a Keras 3 optimizer the wrapper is Keras 3's
  (tests/unit/keras/test_keras3.py); around a tf.compat.v1 one it
  needs Keras 2 and says so. WindowBatchNormalization is Keras 3's
  there (tests/unit/keras/test_keras3_batch_norm.py)."""
  wrapped = estimator_accum.AccumulatingKerasOptimizer(
      tf.keras.optimizers.Adam(1e-3), k=4)
  assert isinstance(wrapped, tf.keras.optimizers.Optimizer)
  v1 = tf.compat.v1.train.AdamOptimizer(1e-3)
  with pytest.raises(TypeError, match=(
      r"^AccumulatingKerasOptimizer runs on Keras 2, and tf\.keras is Keras "
      r"3\.\d+\.\d+ here .*got optimizer .*AdamOptimizer.*"
      r"TF_USE_LEGACY_KERAS=1.*or give it a Keras 3 optimizer")):
    estimator_accum.AccumulatingKerasOptimizer(v1, k=4)
  assert isinstance(estimator_accum.WindowBatchNormalization(k=4),
                    tf.keras.layers.BatchNormalization)


without_estimator = pytest.mark.skipif(
    releases.estimator() is not None,
    reason="this TensorFlow has tf.estimator, which run_classifier trains "
           "through (tests/integration/test_run_classifier.py)")
tiny_model = runs.tiny_model  # a one-layer random BERT, made once here


@pytest.mark.slow
@without_estimator
def test_run_classifier_trains_evaluates_predicts_and_resumes_without_estimator(
    tiny_model, tmp_path):
  """TensorFlow 2.16+: the same model_fn through the library's sessions
  (estimator_accum.estimator.runner): train, eval and predict;
  a run killed after its checkpoint at micro-batch 6 and run again ends at
  the weights of one that ran to 60 at once (dropout off)."""
  model = runs._no_dropout_model(tiny_model, tmp_path)
  data = runs._write_sst2(tmp_path / "data")
  flags = dict(save_checkpoints_steps=6, classifier_dropout=0,
               do_predict=True)
  whole = runs._run(runs._flags(model, data, tmp_path / "whole",
                                num_train_epochs=6, **flags))
  assert whole.returncode == 0, whole.stderr[-3000:]
  assert "Traceback" not in whole.stderr
  # TensorFlow 2.16+'s lines while it loads are held back.
  for chatter in ("absl::InitializeLog", "I0000", "cuInit", "oneDNN custom"):
    assert chatter not in whole.stderr, whole.stderr[-3000:]
  assert ("effective batch 8 = 1 worker(s) x 1 replica(s) x micro-batch 4 x "
          "k=2; 30 updates (60 micro-batches)") in whole.stdout
  assert re.search(r"eval on 10 held-out examples: accuracy [01]\.\d{4}, loss "
                   r"\d+\.\d{4}", whole.stdout), whole.stdout
  assert "predictions for 10 test examples written" in whole.stdout
  rows = (tmp_path / "whole" / "test_results.tsv").read_text().splitlines()
  assert len(rows) == 10
  assert all(abs(sum(map(float, row.split("\t"))) - 1) < 1e-5 for row in rows)

  # Killed once its checkpoint at micro-batch 6 is written, then run again.
  stopped = tmp_path / "stopped"
  runs.kill_after_first_checkpoint_and_resume(
      model, data, stopped, dict(num_train_epochs=6, **flags), 60)
  runs.assert_trained_to_the_same_weights(stopped, tmp_path / "whole", 60)


def _parameter_server_job(model, data, output_dir, workers, **extra):
  command = [sys.executable, "-m", "tfconfig", "launch", "--chief",
             "--workers", str(workers), "--ps", "1", "--timeout",
             str(runs.TIMEOUT), "--", sys.executable, "run_classifier.py",
             *runs._flags(model, data, output_dir,
                          distribution_strategy="parameter_server", **extra)]
  result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          timeout=runs.TIMEOUT + 30, check=False)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  return result


@pytest.mark.slow
@without_estimator
def test_run_classifier_with_parameter_servers_without_estimator(
    tiny_model, tmp_path):
  """TensorFlow 2.16+: --distribution_strategy=parameter_server between
  graphs, as Estimator runs it: a chief, a worker and a ps (python -m
  tfconfig launch, loopback), each trainer applying its own windows to the
  ps's variables through the library's sessions; the chief saves and
  evaluates, the ps serves until the trainers have exited. With the chief
  as the only trainer the job is synchronous: it ends at the weights of
  the one-device run (dropout off)."""
  data = runs._write_sst2(tmp_path / "data")
  result = _parameter_server_job(tiny_model, data, tmp_path / "run", 1)
  # 40 x 2 / (4 x k=2) = 10 updates, 20 micro-batches between both trainers.
  assert ("[chief:0] effective batch 8 = micro-batch 4 x k=2 per update, each "
          "of 2 worker(s) applying its own windows to the ps; 10 updates (20 "
          "micro-batches)") in result.stdout
  for task in ("chief:0", "worker:0"):
    assert (f"[{task}] each window's 2 x 4 examples sorted by length"
            in result.stdout), result.stdout[-3000:]
  reader = tf.train.load_checkpoint(str(tmp_path / "run"))
  assert reader.get_tensor("global_step") >= 20
  assert reader.get_tensor("gradient_accumulation/updates_applied") >= 8
  assert "[chief:0] eval on 10 held-out examples" in result.stdout
  # The ps served until both trainers had exited: its own watchdog saw every
  # training task finished, or the launcher's SIGTERM (sent once the last
  # trainer had exited) came first; which one is a race.
  output = result.stdout + result.stderr
  served = re.search(r"\[ps:0\] .*(stopped: every training task has exited|"
                     r"every training task has finished; exiting)", output)
  evaluated = output.index("[chief:0] eval on 10 held-out examples")
  assert served and served.start() > evaluated, output[-3000:]

  model = runs._no_dropout_model(tiny_model, tmp_path)
  _parameter_server_job(model, data, tmp_path / "alone", 0,
                        classifier_dropout=0, do_eval=False)
  one = runs._run(runs._flags(model, data, tmp_path / "one",
                              classifier_dropout=0, do_eval=False))
  assert one.returncode == 0, one.stderr[-3000:]
  # (Each trainer's window is its own, not saved on the ps: the names of
  # the job's checkpoint, the weights, are compared.)
  runs.assert_trained_to_the_same_weights(tmp_path / "one",
                                          tmp_path / "alone", 20)


@pytest.mark.slow
@without_estimator
def test_run_classifier_on_two_workers_without_estimator(tiny_model, tmp_path):
  """TensorFlow 2.16+: --distribution_strategy=multi_worker on two worker
  processes (python -m tfconfig launch, loopback), each training its share
  in tf.compat.v1's MultiWorkerMirroredStrategy through the library's
  sessions; the chief alone saves, evaluates and predicts. The windows
  sorted by length (the default), packed into rows and as the input gives
  them end at the same weights (dropout off), which moved from the
  start."""
  model = runs._no_dropout_model(tiny_model, tmp_path)
  data = runs._write_sst2(tmp_path / "data")
  weights = {}
  for arrangement, extra in (("sorted", dict(do_predict=True)),
                             ("packed", dict(pack_windows=True,
                                             do_eval=False)),
                             ("plain", dict(sort_windows_by_length=False,
                                            unpadded=False,
                                            pooled_only=False,
                                            do_eval=False))):
    result = runs._two_workers(model, data, tmp_path / arrangement,
                               classifier_dropout=0, **extra)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    for worker in (0, 1):
      assert (f"[worker:{worker}] effective batch 16 = 2 worker(s) x 1 "
              f"replica(s) x micro-batch 4 x k=2; 5 updates (10 "
              f"micro-batches)") in result.stdout, result.stdout[-3000:]
    weights[arrangement] = tf.train.load_checkpoint(
        str(tmp_path / arrangement))
    assert weights[arrangement].get_tensor("global_step") == 10
  assert "[worker:0] eval on 10 held-out examples" in result.stdout or (
      (tmp_path / "sorted" / "eval_results.txt").exists())
  assert (tmp_path / "sorted" / "test_results.tsv").exists()
  # The worker other than the chief writes no checkpoint of its own.
  assert not list(tmp_path.glob("*/tmp_worker_*"))
  runs.assert_arrangements_trained_alike(weights, tiny_model)


@pytest.mark.slow
@without_estimator
def test_two_workers_killed_mid_training_resume_without_estimator(
    tiny_model, tmp_path):
  """TensorFlow 2.16+: both workers of a multi_worker run killed (SIGKILL
  to every process of the job) once the chief's checkpoint at micro-batch
  6 is written; the job started again restores it on both workers and
  ends at the weights of the job that ran to the end at once."""
  model = runs._no_dropout_model(tiny_model, tmp_path)
  data = runs._write_sst2(tmp_path / "data")
  args = dict(num_train_epochs=6, save_checkpoints_steps=6, do_eval=False,
              classifier_dropout=0)
  runs._two_workers(model, data, tmp_path / "whole", **args)
  killed = tmp_path / "killed"
  launcher = subprocess.Popen(
      [sys.executable, "-m", "tfconfig", "launch", "--workers", "2", "--",
       sys.executable, "run_classifier.py", *runs._flags(
           model, data, killed, distribution_strategy="multi_worker",
           **args)],
      cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
      start_new_session=True)
  try:
    deadline = time.monotonic() + runs.TIMEOUT
    while not list(killed.glob("model.ckpt-6.index")):
      assert launcher.poll() is None, "finished before it could be killed"
      assert time.monotonic() < deadline
      time.sleep(0.02)
  finally:
    os.killpg(launcher.pid, signal.SIGKILL)
    launcher.wait()
  killed_at = tf.train.load_checkpoint(integrity.newest_complete(
      str(killed))).get_tensor("global_step")
  assert 6 <= killed_at < 30, killed_at
  resumed = runs._two_workers(model, data, killed, **args)
  for worker in (0, 1):
    assert re.search(rf"\[worker:{worker}\] .*at micro-batch {killed_at}",
                     resumed.stdout), resumed.stdout[-3000:]
  runs.assert_trained_to_the_same_weights(killed, tmp_path / "whole", 30)


@pytest.mark.slow
@without_estimator
def test_run_classifier_mirrored_without_estimator(tiny_model, tmp_path):
  """TensorFlow 2.16+: --distribution_strategy=mirrored trains in
  MirroredStrategy's replicas through the library's sessions (here the one
  CPU's: MirroredStrategy() takes every GPU, else the CPU), to the weights
  of the run on one device (dropout off); 2 replicas are exact in
  tests/unit/estimator/test_runner.py."""
  model = runs._no_dropout_model(tiny_model, tmp_path)
  data = runs._write_sst2(tmp_path / "data")
  flags = dict(classifier_dropout=0, num_train_epochs=2)
  for strategy in ("none", "mirrored"):
    result = runs._run(runs._flags(model, data, tmp_path / strategy,
                                   distribution_strategy=strategy,
                                   trace_window=True, **flags))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    # --trace_window through the library's sessions too.
    assert "window trace: the window before, untraced: 2 micro-batches" in (
        result.stderr), result.stderr[-3000:]
    assert (tmp_path / strategy / "window_trace.json").exists()
  assert re.search(r"eval on 10 held-out examples: accuracy", result.stdout)
  runs.assert_trained_to_the_same_weights(tmp_path / "mirrored",
                                          tmp_path / "none", 20)


def _faulted_two_workers(tmp_path, *flags, **env):
  """Two MultiWorkerMirroredStrategy workers of a plain graph in
  MonitoredSessions (tests/jobs/graph_multiworker_job.py, no Estimator:
  every release), launched with `--restart 1` and `flags`, the job's fault
  set by `env`; returns what they said, after checking that the restarted
  job ends at the big batch's weights."""
  from tests.jobs import graph_multiworker_job as job  # noqa: PLC0415

  result = subprocess.run(
      [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
       "--restart", "1", *flags, "--timeout", "240", "--", sys.executable,
       "tests/jobs/graph_multiworker_job.py", "adam"],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
      env=dict(os.environ, JOB_ABORT_DIR=str(tmp_path), **env))
  said = result.stdout + result.stderr
  assert result.returncode == 0, said[-4000:]
  assert "[tfconfig] restarting the job (1 of 1)" in said
  weights = [json.loads(line.split("WEIGHTS ", 1)[1])
             for line in result.stdout.splitlines() if "WEIGHTS " in line]
  assert len(weights) == 2, said[-3000:]
  data = support.make_data(job.K * job.B * 2 * job.STEPS)
  expected = support.reference_train(
      job.OPTIMIZERS["adam"], data, job.K * job.B * 2, job.STEPS)
  for worker in weights:
    support.assert_weights_close(
        {key: np.array(value) for key, value in worker.items()}, expected,
        what=f"the restarted job, TensorFlow {tf.__version__}")
  return said


@pytest.mark.slow
def test_a_job_that_stands_still_ends_at_its_bound(tmp_path):
  """Worker 1 sleeps before micro-batch 4, alive, and worker 0 waits in
  that micro-batch's collective. Past the progress bound (floor 8 s here)
  worker 0 exits 152 naming where it waits, and the job runs again to the
  big batch's weights."""
  said = _faulted_two_workers(tmp_path, "--grace", "5", JOB_STALL_AT="4",
                              ESTIMATOR_ACCUM_PROGRESS_BOUND="8")
  assert "[worker:1] stalling before micro-batch 4" in said
  line = re.search(r"\[worker:0\] \[tfconfig\] worker:0: no progress for "
                   r"(\d+) s: .*bound of (\d+) s.*exiting with 152", said)
  assert line, [text for text in said.splitlines() if "progress" in text]
  # 20x the job's longest step so far, at least the floor (8 s here).
  assert int(line.group(2)) >= 8 and int(line.group(1)) >= int(line.group(2))
  assert ("[tfconfig] task worker:0 failed with exit code 152 (it made no "
          "progress within its bound)") in said


@pytest.mark.slow
def test_a_session_remade_on_one_worker_ends_the_job_at_once(tmp_path):
  """Worker 1's step raises AbortedError once. MonitoredSession would
  remake that session alone while worker 0 waits in the old one's
  collective; instead worker 1 exits 151 with one line, and the job runs
  again to the big batch's weights."""
  said = _faulted_two_workers(tmp_path, JOB_ABORT_AT="3",
                              ESTIMATOR_ACCUM_PEER_TIMEOUT="10")
  assert "[worker:1] aborting after 3 micro-batches" in said
  assert re.search(r"\[worker:1\] \[tfconfig\] worker:1: its session failed "
                   r"\(AbortedError: injected by the test's hook\).*exiting "
                   r"151", said), said[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sgd", "momentum", "adam"])
def test_multi_worker_mirrored_strategy_in_a_plain_graph(name, tmp_path):
  """Two workers of `tf.compat.v1`'s MultiWorkerMirroredStrategy, started
  by `python -m tfconfig launch` on loopback, each building the model in a
  plain graph and training it in a session on its own task's server: both
  end at the weights of plain training's batch of K x B x 2."""
  from tests.jobs import graph_multiworker_job as job  # noqa: PLC0415

  result = subprocess.run(
      [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
       "--timeout", "240", "--", sys.executable,
       "tests/jobs/graph_multiworker_job.py", name],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  weights = [json.loads(line.split("WEIGHTS ", 1)[1])
             for line in result.stdout.splitlines() if "WEIGHTS " in line]
  assert len(weights) == 2, result.stdout[-3000:]
  data = support.make_data(job.K * job.B * 2 * job.STEPS)
  expected = support.reference_train(
      job.OPTIMIZERS[name], data, job.K * job.B * 2, job.STEPS)
  support.assert_weights_moved(expected, "big batch")
  for worker in weights:
    support.assert_weights_close(
        {key: np.array(value) for key, value in worker.items()}, expected,
        what=f"a worker, TensorFlow {tf.__version__}")


@pytest.mark.slow
def test_the_examples_run_on_every_release(tmp_path):
  """The examples are written once through the library's names
  (`estimator_accum.RunConfig`, `EstimatorSpec`, `ModeKeys`,
  `train_and_evaluate`; tf.estimator's Estimator on 2.15, the library's
  on 2.16+): housing trains accumulated and plain to the same weights,
  and MNIST trains on two MultiWorkerMirroredStrategy workers and exports
  a SavedModel that serves."""
  housing = subprocess.run(
      [sys.executable, "-m", "models.housing", "--model_dir",
       str(tmp_path / "housing")], cwd=ROOT, capture_output=True, text=True,
      timeout=300, check=False)
  said = housing.stdout + housing.stderr
  assert housing.returncode == 0, said[-3000:]
  difference = re.search(r"largest relative weight difference: (\S+)", said)
  assert difference and float(difference.group(1)) <= 1e-5, said[-2000:]
  mnist = subprocess.run(
      [sys.executable, "-m", "tfconfig", "launch", "--workers", "2",
       "--timeout", "300", "--", sys.executable, "-m", "models.mnist",
       "--strategy", "multi_worker", "--k", "2", "--nocompare", "--epochs",
       "1", "--model_dir", str(tmp_path / "mnist"), "--export_dir",
       str(tmp_path / "export")], cwd=ROOT, capture_output=True, text=True,
      timeout=400, check=False)
  said = mnist.stdout + mnist.stderr
  assert mnist.returncode == 0, said[-3000:]
  assert re.search(r"\[worker:0\] b8_k2_w2: test accuracy 0\.[89]", said), (
      said[-2000:])
  exported = re.search(r"exported for serving to (\S+) ", said)
  assert exported, said[-2000:]
  serving = tf.saved_model.load(exported.group(1)).signatures[
      "serving_default"]
  outputs = serving(images=tf.zeros([3, 28, 28, 1]))
  assert outputs["probabilities"].shape == (3, 10)
  np.testing.assert_allclose(
      np.sum(outputs["probabilities"].numpy(), axis=1), 1.0, rtol=1e-5)
