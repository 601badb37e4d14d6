"""Each function of estimator_accum's doors to private TensorFlow and
Keras (tf_private, runtime_private, keras_private) against the installed
TensorFlow: an upgrade that moves a private name fails here."""

import importlib
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from estimator_accum import keras_private, releases, runtime_private, tf_private
from tests.helpers import one_worker

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_reroute_moves_every_consumer():
  graph = tf.Graph()
  with graph.as_default():
    old = tf.constant(1.0)
    new = tf.constant(5.0)
    doubled = old * 2.0
    tripled = 3.0 * old
    both = old + old
    tf_private.reroute(old, new)
    assert not old.consumers()
    with tf.compat.v1.Session() as session:
      assert session.run([doubled, tripled, both]) == [10.0, 15.0, 10.0]


def test_the_overridden_hooks_exist_on_their_bases():
  for base, name in tf_private.OVERRIDDEN_HOOKS:
    assert callable(getattr(base, name, None)), (base, name)


def test_add_control_inputs_orders_an_op_after_another():
  with tf.Graph().as_default():
    first = tf.no_op(name="first")
    later = tf.no_op(name="later")
    tf_private.add_control_inputs(later, [first])
    tf_private.add_control_inputs(later, [])
    assert list(later.control_inputs) == [first]


def test_control_flow_context_of_ops_and_graphs():
  with tf.Graph().as_default() as graph:
    outside = tf.constant(1.0)
    assert tf_private.control_flow_context(outside.op) is None
    assert tf_private.control_flow_context(graph) is None
    inside = []
    tf.compat.v1.disable_control_flow_v2()
    try:
      tf.compat.v1.cond(tf.constant(True),
                        lambda: inside.append(tf.identity(outside)) or
                        inside[0], lambda: outside)
    finally:
      tf.compat.v1.enable_control_flow_v2()
    assert tf_private.control_flow_context(inside[0].op) is not None


def test_the_graphs_loss_flags():
  with tf.Graph().as_default() as graph:
    assert not tf_private.loss_marked_mean_over_replicas(graph)
    assert tf_private.last_loss_reduction(graph) is None
    tf.compat.v1.losses.compute_weighted_loss(
        tf.ones([2]), reduction=tf.compat.v1.losses.Reduction.SUM)
    assert (tf_private.last_loss_reduction(graph) ==
            tf.compat.v1.losses.Reduction.SUM)
    tf_private.mark_loss_mean_over_replicas(graph)
    assert tf_private.loss_marked_mean_over_replicas(graph)
    # What Estimator reads (TensorFlow's own name).
    assert graph._is_loss_scaled_by_optimizer


def test_replicas_in_sync_and_a_mirrored_container():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  with tf.Graph().as_default(), strategy.scope():
    variable = tf.Variable(1.0)
    assert tf_private.replicas_in_sync(variable) == 1
    value = tf.constant(2.0)
    copies = tf_private.mirrored([value])
    assert isinstance(copies, tf.distribute.DistributedValues)
    tf_private.report_as_mirrored(value, lambda: copies)
    assert value._distributed_container() is copies


@pytest.mark.keras2
def test_distributed_apply_of_a_v1_optimizer():
  with tf.Graph().as_default():
    variable = tf.compat.v1.get_variable("w", initializer=1.0,
                                         use_resource=True)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.5)
    assert tf_private.applies_through_distributed_apply(optimizer)
    assert not tf_private.applies_through_distributed_apply(
        tf.keras.optimizers.legacy.SGD(0.5))
    seen = []

    def wrap(strategy):
      seen.append(strategy)
      return strategy

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope(), tf_private.distributed_apply_strategy(optimizer,
                                                                 wrap):
      apply = strategy.extended.call_for_each_replica(
          optimizer.apply_gradients, ([(tf.constant(2.0), variable)],))
    assert seen == [strategy]
    assert "_distributed_apply" not in vars(optimizer)
    with tf.compat.v1.Session() as session:
      session.run(variable.initializer)
      session.run(apply)
      assert session.run(variable) == 0.0


def test_distributed_apply_runs_the_cross_replica_apply():
  with tf.Graph().as_default():
    variable = tf.compat.v1.get_variable("w", initializer=1.0,
                                         use_resource=True)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.5)
    strategy = tf.distribute.get_strategy()
    with strategy.scope():
      apply = tf_private.distributed_apply(
          optimizer, strategy, [(tf.constant(4.0), variable)])
    with tf.compat.v1.Session() as session:
      session.run(variable.initializer)
      session.run(apply)
      assert session.run(variable) == -1.0


def test_slot_restoring_hook_is_called_through():
  with tf.Graph().as_default():
    optimizer = tf.compat.v1.train.AdamOptimizer()
    variable = tf.compat.v1.get_variable("v", [2], use_resource=True)

    # A slot a checkpoint holds for `variable` before the slot exists: the
    # hook makes it and restores it.
    seen = []

    class Position:
      restore_uid = 1

      def is_simple_variable(self):
        return True

      def value_tensors(self):
        return {}

      def restore(self, slot):
        seen.append(slot)

    tf_private.create_or_restore_slot_variable(
        optimizer, Position(), "m", variable)
    assert not seen  # (graph mode: deferred until the slot is made)
    optimizer.apply_gradients([(tf.ones([2]), variable)])
    assert seen and seen[0] is optimizer.get_slot(variable, "m")


@pytest.mark.keras2
def test_an_optimizers_tensor_attributes_and_adagrad_da_step():
  with tf.Graph().as_default():
    rate = tf.constant(0.1)
    v1 = tf.compat.v1.train.GradientDescentOptimizer(rate)
    assert any(value is rate
               for value in tf_private.tensor_attributes(v1).values())
    keras = tf.keras.optimizers.legacy.SGD(learning_rate=0.3)
    assert "learning_rate" in tf_private.tensor_attributes(keras)
    step = tf.compat.v1.train.get_or_create_global_step()
    dual = tf.compat.v1.train.AdagradDAOptimizer(0.1, step)
    assert tf_private.adagrad_da_global_step(dual) is step


@pytest.mark.keras2
def test_loss_scale_optimizers_taken_apart():
  inner = tf.compat.v1.train.GradientDescentOptimizer(0.1)
  wrapped = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
      inner, 64.0)
  found, scale = tf_private.v1_loss_scale_parts(wrapped)
  assert found is inner
  assert tf_private.fixed_loss_scale_value(scale) == 64.0
  keras_inner = tf.keras.optimizers.legacy.SGD(0.1)
  keras = tf.keras.mixed_precision.LossScaleOptimizer(keras_inner)
  assert keras_private.is_wrapped_by_keras_loss_scale_optimizer(keras_inner)
  assert not keras_private.is_wrapped_by_keras_loss_scale_optimizer(
      tf.keras.optimizers.legacy.SGD(0.1))
  assert not keras_private.keras_loss_has_been_scaled(keras)
  keras.get_scaled_loss(tf.constant(1.0))
  assert keras_private.keras_loss_has_been_scaled(keras)


def test_saveables_replaced_and_their_tensors_mapped(tmp_path):
  # As the window's per-replica state is made: the Saver asks such a
  # variable for its saveables (a plain variable it saves directly).
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  with tf.Graph().as_default(), strategy.scope():
    variable = tf.Variable(
        3.0, name="v", synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.SUM)
    factories = tf_private.saveable_factories(variable)
    assert factories
    key, factory = next(iter(factories.items()))

    def gather():
      def doubled(*args, **kwargs):
        return tf_private.map_saveable_tensors(
            factory(*args, **kwargs),
            lambda t: (lambda: (t() if callable(t) else t) * 2.0))
      return {key: doubled}

    tf_private.replace_saveable_factories(variable, gather)
    saver = tf.compat.v1.train.Saver([variable])
    with tf.compat.v1.Session() as session:
      session.run(variable.initializer)
      path = saver.save(session, str(tmp_path / "model"))
  assert tf.train.load_checkpoint(path).get_tensor("v") == 6.0


def test_tracking_children_and_deferred_restores(tmp_path):
  saved = tf.Module()
  saved.child = tf.Variable(7.0)
  saved.extra = tf.Variable(5.0)
  path = tf.train.Checkpoint(root=saved).write(str(tmp_path / "c"))
  loaded = tf.Module()
  status = tf.train.Checkpoint(root=loaded).read(path)
  assert sorted(tf_private.deferred_dependency_names(loaded)) == [
      "child", "extra"]
  child = tf.Variable(0.0)
  tf_private.track_child(loaded, "child", child)
  assert float(child.numpy()) == 7.0
  assert tf_private.trackable_children(loaded)["child"] is child
  extra = tf.Variable(0.0)
  loaded.extra_holder = extra
  tf_private.restore_deferred(loaded, "extra", extra)
  assert float(extra.numpy()) == 5.0
  del status


def test_restored_checkpoint_of_a_position(tmp_path):
  saved = tf.Module()
  saved.child = tf.Variable(7.0)
  path = tf.train.Checkpoint(root=saved).write(str(tmp_path / "c"))
  loaded = tf.Module()
  tf.train.Checkpoint(root=loaded).read(path)
  # The position Checkpoint keeps for a dependency not yet claimed.
  positions = loaded._deferred_dependencies["child"]
  graph, where = tf_private.restored_checkpoint(positions[0])
  assert where == path
  assert any(c.local_name == "root" for c in graph.nodes[0].children)
  # Not a Keras BackupAndRestore's restore.
  assert not keras_private.keras_backup_resumes_at_an_epoch(positions[0])


@pytest.mark.keras2
@pytest.mark.parametrize("save_freq", ["epoch", 2])
def test_keras_backup_resumes_at_an_epoch_reads_the_callbacks_state(
    tmp_path, save_freq):
  """The training state Keras's BackupAndRestore makes (its own class)
  backs a model up and restores it; a dependency the model restored into
  lacks is kept as a position, which tells the callback's `save_freq`."""
  worker_training_state = importlib.import_module(
      f"{releases.keras2_module_prefix()}.src.distribute.worker_training_state")

  def model(extra):
    made = tf.keras.Sequential([tf.keras.Input((2,)),
                                tf.keras.layers.Dense(1)])
    if extra:
      made.extra = tf.Variable(3.0)
    return made

  saved = model(extra=True)
  worker_training_state.WorkerTrainingState(
      saved, str(tmp_path), save_freq).back_up(epoch=0)
  loaded = model(extra=False)
  loaded._training_state = worker_training_state.WorkerTrainingState(  # noqa: SLF001
      loaded, str(tmp_path), save_freq)
  loaded._training_state.restore()  # noqa: SLF001
  position = loaded._deferred_dependencies["extra"][0]  # noqa: SLF001
  assert keras_private.keras_backup_resumes_at_an_epoch(position) == (
      save_freq == "epoch")


@pytest.mark.keras2
def test_keep_keras2_backups_keeps_that_many(tmp_path):
  """Keras's own training state keeps one backup; kept at 2, three
  backups leave the last two."""
  worker_training_state = importlib.import_module(
      f"{releases.keras2_module_prefix()}.src.distribute.worker_training_state")
  model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
  state = worker_training_state.WorkerTrainingState(model, str(tmp_path),
                                                    "epoch")
  keras_private.keep_keras2_backups(state, 2)
  for epoch in range(3):
    state.back_up(epoch=epoch)
  kept = sorted(path.name for path in (tmp_path / "chief").glob("*.index"))
  assert kept == ["ckpt-2.index", "ckpt-3.index"], kept


def test_local_devices_include_the_cpu():
  assert any(d.device_type == "CPU" for d in runtime_private.local_devices())


@pytest.mark.parametrize("setting", ["0", "1"])
def test_onednn_enabled_follows_tf_enable_onednn_opts(setting):
  script = ("from estimator_accum import runtime_private\n"
            "print(runtime_private.onednn_enabled())\n")
  env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=setting,
             TF_CPP_MIN_LOG_LEVEL="3")
  done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, timeout=120, cwd=ROOT, env=env)
  assert done.stdout.split() == [str(setting == "1")], done.stderr[-2000:]


def test_the_coordination_service_configured_in_a_fresh_process():
  # Process-wide state: configured in a process of its own.
  script = textwrap.dedent("""
      import json, os
      os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
      from estimator_accum import runtime_private
      assert not runtime_private.coordination_service_configured()
      runtime_private.configure_coordination_service(
          "/job:worker/replica:0/task:0", 5000, [("worker", 2)])
      assert runtime_private.coordination_service_configured()
      print("configured")
  """)
  done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, timeout=120, cwd=ROOT)
  assert done.returncode == 0 and "configured" in done.stdout, done.stderr


@pytest.mark.keras2
def test_in_keras_load_is_true_only_inside_load_model(tmp_path):
  seen = []

  class Probe(tf.keras.layers.Layer):
    @classmethod
    def from_config(cls, config):
      seen.append(keras_private.in_keras_load())
      return cls(**config)

  assert not keras_private.in_keras_load()
  model = tf.keras.Sequential([tf.keras.Input((2,)), Probe()])
  model.save(str(tmp_path / "m.h5"))
  tf.keras.models.load_model(str(tmp_path / "m.h5"),
                             custom_objects={"Probe": Probe})
  assert seen == [True] and not keras_private.in_keras_load()


@pytest.mark.slow  # a process making a MultiWorkerMirroredStrategy
def test_a_coordination_service_value_is_waited_for_in_a_fresh_process():
  # A one-worker MultiWorkerMirroredStrategy starts the service; the value
  # a thread waits for arrives when it is set (as TensorFlow's preemption
  # notice does), and the main thread runs meanwhile (the GIL is free).
  script = textwrap.dedent("""
      import os, threading, time
      os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
      import tensorflow as tf
      from tensorflow.python.eager import context
      from estimator_accum import runtime_private
      tf.distribute.MultiWorkerMirroredStrategy()
      got = []
      waiter = threading.Thread(target=lambda: got.append(
          runtime_private.wait_for_coordination_service_value("probe")))
      waiter.start()
      time.sleep(0.5)
      assert not got
      context.context().set_config_key_value("probe", "here")
      waiter.join(10)
      print(got)
  """)
  done = subprocess.run(
      [sys.executable, "-c", script], capture_output=True, text=True,
      timeout=120, cwd=ROOT, env=dict(
          os.environ,
          TF_CONFIG=one_worker.tf_config()))
  assert done.returncode == 0 and "['here']" in done.stdout, done.stderr


@pytest.mark.keras2
def test_the_savedmodel_keras_loads_and_a_checkpoints_object_graph(tmp_path):
  model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
  model.compile("sgd", "mse")
  model.save(str(tmp_path / "model"), save_format="tf")
  seen = []

  class Probe(tf.keras.layers.Dense):
    @classmethod
    def from_config(cls, config):
      seen.append(keras_private.keras_saved_model_being_loaded())
      return super().from_config(config)

  assert keras_private.keras_saved_model_being_loaded() is None
  tf.keras.models.load_model(str(tmp_path / "model"),
                             custom_objects={"Dense": Probe})
  assert seen and seen[0] == str(tmp_path / "model")
  graph = tf_private.checkpoint_object_graph(tf.train.load_checkpoint(
      str(tmp_path / "model" / "variables" / "variables")))
  assert "optimizer" in [c.local_name for c in graph.nodes[0].children]


def test_ops_marked_for_xla_run_compiled_one_cluster_per_scope():
  """What jit_scope sets, on ops already made: marked ops of two scopes run
  as two XLA clusters (on the CPU, without global auto-clustering), and
  compute what the unmarked ops do."""
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [6])  # (a constant folds)
    first = tf.sqrt(x + 1.0)
    second = tf.exp(x * 0.5)
    for op, scope in ((first.op, "a"), (first.op.inputs[0].op, "a"),
                      (second.op, "b"), (second.op.inputs[0].op, "b")):
      tf_private.mark_for_xla(op, scope)
    assert first.op.get_attr("_XlaScope") == b"a"
    metadata = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session() as session:
      values = session.run([first, second], {x: np.arange(6)},
                           options=tf.compat.v1.RunOptions(
          trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                           run_metadata=metadata)
  np.testing.assert_allclose(values[0], np.sqrt(np.arange(6) + 1.0),
                             rtol=1e-6)
  np.testing.assert_allclose(values[1], np.exp(np.arange(6) * 0.5),
                             rtol=1e-6)
  clusters = {node.node_name.split("/")[0]
              for device in metadata.step_stats.dev_stats
              for node in device.node_stats
              if node.node_name.startswith("cluster_")}
  assert len(clusters) == 2, clusters


def test_ops_xla_cannot_compile_of_a_function_and_what_it_calls():
  """The op types without an XLA kernel, in the function and in the
  functions it calls, found before anything in the process compiled."""
  with tf.Graph().as_default():
    variable = tf.compat.v1.get_variable("v", initializer=tf.ones([3]))

    @tf.function(autograph=False)
    def inner(x):
      return tf.strings.as_string(x)

    @tf.function(jit_compile=True, autograph=False)
    def outer(x):
      variable.assign(variable * x)
      return tf.strings.length(inner(x))

    concrete = outer.get_concrete_function(tf.ones([3]))
    library = concrete.graph.as_graph_def().library.function
    cannot = tf_private.ops_xla_cannot_compile(
        concrete.function_def, library, "CPU")
    assert cannot == ["AsString", "StringLength"], cannot

    @tf.function(jit_compile=True, autograph=False)
    def compiles(x):
      variable.assign(variable * x)
      return tf.sqrt(x)

    concrete = compiles.get_concrete_function(tf.ones([3]))
    assert tf_private.ops_xla_cannot_compile(
        concrete.function_def,
        concrete.graph.as_graph_def().library.function, "CPU") == []


def test_local_copy_is_a_replicas_own_component():
  plain = tf.Variable(1.0)
  assert tf_private.local_copy(plain) is plain
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  with strategy.scope():
    summed = tf.Variable(0.0, synchronization=tf.VariableSynchronization.
                         ON_READ, aggregation=tf.VariableAggregation.SUM)
  component = tf_private.local_copy(summed)
  assert component is summed.values[0]
  component.assign(3.0)
  assert float(summed.read_value()) == 3.0


@pytest.mark.keras3
def test_keras3_clip_gradients_clips_as_the_optimizer_does():
  import keras  # noqa: PLC0415

  grads = [tf.constant([3.0, 4.0])]
  clipped = keras_private.keras3_clip_gradients(
      keras.optimizers.SGD(global_clipnorm=1.0), grads)
  np.testing.assert_allclose(clipped[0].numpy(), [0.6, 0.8], rtol=1e-6)
  same = keras_private.keras3_clip_gradients(keras.optimizers.SGD(), grads)
  np.testing.assert_allclose(same[0].numpy(), [3.0, 4.0])


def test_the_recoverable_session_is_the_one_monitored_sessions_use():
  recoverable = runtime_private.recoverable_session_class()
  for name in ("close", "_create_session", "run"):
    assert callable(getattr(recoverable, name)), name
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    with tf.compat.v1.train.MonitoredSession() as session:
      assert isinstance(session._sess, recoverable)  # noqa: SLF001


def test_per_device_datasets_carry_autotuning_off():
  """A MultiDeviceIterator (a distribution strategy's input) builds one
  dataset per device; each now records autotuning off in its graph (an
  OptionsDataset op), so its iterator starts no autotuning thread."""
  from tensorflow.core.framework import dataset_options_pb2  # noqa: PLC0415
  from tensorflow.python.data.ops import (  # noqa: PLC0415
    multi_device_iterator_ops,
  )

  runtime_private.per_device_datasets_without_autotune()
  runtime_private.per_device_datasets_without_autotune()  # idempotent
  with tf.Graph().as_default() as graph:
    multi_device_iterator_ops.MultiDeviceIterator(
        tf.data.Dataset.range(8), ["/cpu:0"])
  autotune = []
  for op in graph.get_operations():
    if op.type == "OptionsDataset":
      options = dataset_options_pb2.Options()
      options.ParseFromString(op.get_attr("serialized_options"))
      if options.autotune_options.HasField("enabled"):
        autotune.append(options.autotune_options.enabled)
  assert autotune == [False]


def test_a_session_remade_after_an_abort_is_told_in_a_fresh_process():
  # Patches MonitoredSession's class for the process: a process of its own.
  script = textwrap.dedent("""
      import os
      os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
      import tensorflow as tf
      from estimator_accum import runtime_private
      told = []
      runtime_private.on_session_remade(told.append)

      class AbortOnce(tf.compat.v1.train.SessionRunHook):
        runs = 0
        def after_run(self, run_context, run_values):
          AbortOnce.runs += 1
          if AbortOnce.runs == 2:
            raise tf.errors.AbortedError(None, None, "the second run")

      with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        bump = tf.compat.v1.assign_add(step, 1)
        with tf.compat.v1.train.MonitoredSession(hooks=[AbortOnce()]) as s:
          for _ in range(4):
            s.run(bump)
      assert len(told) == 1, told
      assert isinstance(told[0], tf.errors.AbortedError), told
      print("told", told[0].message)
  """)
  done = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, timeout=120, cwd=ROOT)
  assert done.returncode == 0 and "told the second run" in done.stdout, (
      done.stderr[-2000:])
