"""fused_apply: XLA compiles the window's apply. On one replica with dense
gradients the whole apply is one `jit_compile` function, which updates the
variables in place; elsewhere (a strategy, a table's sparse gradient, an op
XLA cannot compile) each variable's update is compiled apart. The weights
are the unfused update's up to float32 rounding, and the applying
micro-batch needs no more memory than an accumulating one."""

import collections
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from estimator_accum import releases
from harness.google_style_adamw import GoogleStyleAdamWeightDecay
from models.bert import optimization
from tests.helpers import session_threads, tanh_stack

# XLA's marks and the window end's peak, on the graph Grappler makes.
pytestmark = pytest.mark.grappler



def _bert_optimizer(name, learning_rate):
  """BERT's `name` optimizer through TensorFlow's ops (XLA's case here):
  AdamWeightDecay's one native pass, which takes the apply on the CPU
  without XLA, is test_one_pass_apply.py's."""
  optimizer = optimization.make_optimizer(name, learning_rate)
  if name == "adamw":
    optimizer.one_pass = False
  return optimizer


OPTIMIZERS = {
    "google_adam_weight_decay": lambda: _bert_optimizer("adamw", 0.05),
    "adam": lambda: tf.compat.v1.train.AdamOptimizer(0.1),
    "momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
    "keras_legacy_adam": lambda: tf.keras.optimizers.legacy.Adam(0.1),
}


v1 = tf.compat.v1.train

_REPO = pathlib.Path(__file__).resolve().parents[3]

# Every family's apply compiles whole, in place (one replica, dense
# gradients): under control flow v2, the default.
MORE_OPTIMIZERS = {
    "sgd": lambda: v1.GradientDescentOptimizer(0.1),
    "nesterov": lambda: v1.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    "adagrad": lambda: v1.AdagradOptimizer(0.1),
    "rmsprop_centered_momentum": lambda: v1.RMSPropOptimizer(
        0.05, momentum=0.5, centered=True),
    "adadelta": lambda: v1.AdadeltaOptimizer(5.0),
    "ftrl": lambda: v1.FtrlOptimizer(0.1, l1_regularization_strength=0.001,
                                     l2_regularization_strength=0.001),
    "proximal_adagrad": lambda: v1.ProximalAdagradOptimizer(
        0.1, l1_regularization_strength=0.001,
        l2_regularization_strength=0.001),
    "keras_legacy_nadam": lambda: tf.keras.optimizers.legacy.Nadam(0.1),
    "keras_legacy_adamax": lambda: tf.keras.optimizers.legacy.Adamax(0.1),
    "keras_legacy_ftrl": lambda: tf.keras.optimizers.legacy.Ftrl(0.1),
    "bert_lamb": lambda: _bert_optimizer("lamb", 0.05),
    # As users have it from google-research/bert: slots by get_variable.
    "google_style_adam_weight_decay": lambda: GoogleStyleAdamWeightDecay(
        0.05, weight_decay_rate=0.01, exclude_from_weight_decay=["bias"]),
    # XLA has no kernel for ResourceApplyAdamWithAmsgrad: each variable's
    # update is compiled apart, as under a strategy.
    "keras_legacy_amsgrad_not_compiled_whole": (
        lambda: tf.keras.optimizers.legacy.Adam(0.1, amsgrad=True)),
}


def _build(optimizer, fused_apply, **options):
  return tanh_stack.train_op(optimizer, fused_apply=fused_apply, **options)


def _train(optimizer_fn, fused_apply, sequential_apply=True):
  return tanh_stack.trained_weights(optimizer_fn, fused_apply=fused_apply,
                                    sequential_apply=sequential_apply)


@pytest.mark.keras2
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_the_same_weights_fused_or_not(optimizer, control_flow):
  fused = _train(OPTIMIZERS[optimizer], True)
  plain = _train(OPTIMIZERS[optimizer], False)
  unordered = _train(OPTIMIZERS[optimizer], False, sequential_apply=False)
  for name in plain:
    start = tanh_stack.initial_kernel(int(name[-1]), *plain[name].shape)
    assert not np.allclose(plain[name], start), name  # it trained
    np.testing.assert_allclose(fused[name], plain[name], rtol=1e-6,
                               atol=1e-7, err_msg=name)
    np.testing.assert_allclose(unordered[name], plain[name], rtol=1e-6,
                               atol=1e-7, err_msg=name)


@pytest.mark.keras2
@pytest.mark.slow  # 13 optimizers trained twice; the fast tier keeps four
@pytest.mark.parametrize("optimizer", sorted(MORE_OPTIMIZERS))
def test_every_family_is_the_same_fused_or_not(optimizer):
  fused = _train(MORE_OPTIMIZERS[optimizer], True)
  plain = _train(MORE_OPTIMIZERS[optimizer], False)
  for name in plain:
    start = tanh_stack.initial_kernel(int(name[-1]), *plain[name].shape)
    assert not np.allclose(plain[name], start), name  # it trained
    np.testing.assert_allclose(fused[name], plain[name], rtol=1e-6,
                               atol=1e-7, err_msg=name)


def _variable_names(optimizer_fn, fused_apply):
  with tf.Graph().as_default():
    _build(optimizer_fn(), fused_apply)
    return sorted(v.op.name for v in tf.compat.v1.global_variables())


@pytest.mark.keras2
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_checkpoint_holds_the_same_names_fused_or_not(optimizer):
  """Slots and step counts made while the apply is traced into its
  function have the names plain training gives them: a run can resume
  with fused_apply turned on or off."""
  fused = _variable_names(OPTIMIZERS[optimizer], True)
  assert fused == _variable_names(OPTIMIZERS[optimizer], False)
  slot = {"adam": "kernel_0/Adam", "momentum": "kernel_0/Momentum",
          "google_adam_weight_decay": "kernel_0/adam_m",
          "keras_legacy_adam": "Adam/kernel_0/m"}[optimizer]
  assert slot in fused, fused


def test_fused_without_sequential_apply_is_exact_too():
  fused = _train(OPTIMIZERS["adam"], True, sequential_apply=False)
  plain = _train(OPTIMIZERS["adam"], False, sequential_apply=False)
  for name in plain:
    np.testing.assert_allclose(fused[name], plain[name], rtol=1e-6,
                               atol=1e-7, err_msg=name)


def _functions(graph):
  """{name: FunctionDef} of the functions `graph` holds."""
  return {f.signature.name: f for f in graph.as_graph_def().library.function}


def _compiled_functions(graph):
  """The FunctionDefs XLA must compile (`jit_compile`)."""
  return [f for f in _functions(graph).values()
          if f.attr["_XlaMustCompile"].b]


def _scopes(graph):
  """{XLA scope: the op types marked with it}, in the graph and its
  functions."""
  scopes = {}
  nodes = [*graph.as_graph_def().node,
           *(n for f in _functions(graph).values() for n in f.node_def)]
  for node in nodes:
    if "_XlaScope" in node.attr:
      scopes.setdefault(node.attr["_XlaScope"].s.decode(), set()).add(
          node.op)
  return scopes


def test_the_whole_apply_is_one_function_xla_compiles():
  """One replica, dense gradients: the scale and the whole apply in one
  `jit_compile` function (XlaLaunch: the variables written in place),
  called once per applied window, and the window's sums zeroed by another
  (in place too, after the apply or a skipped window); nothing marked
  variable by variable."""
  kernels = len(tanh_stack.WIDTHS) - 1
  with tf.Graph().as_default() as graph:
    _build(OPTIMIZERS["google_adam_weight_decay"](), True)
    compiled = {f.signature.name.split("_")[3]: f
                for f in _compiled_functions(graph)}
    assert sorted(compiled) == ["update", "zero"], sorted(compiled)
    types = collections.Counter(n.op for n in compiled["update"].node_def)
    # p, m and v of each of the three kernels.
    assert types["AssignVariableOp"] == 3 * kernels, types
    zeroing = collections.Counter(n.op for n in compiled["zero"].node_def)
    assert zeroing["AssignVariableOp"] == kernels, zeroing
    assert _scopes(graph) == {}
    for function in compiled.values():
      calls = [n for f in _functions(graph).values() for n in f.node_def
               if n.attr["f"].func.name == function.signature.name]
      assert len(calls) == 1 and calls[0].attr["_XlaMustCompile"].b, calls
  with tf.Graph().as_default() as graph:
    _build(OPTIMIZERS["google_adam_weight_decay"](), False)
    assert _compiled_functions(graph) == [] and _scopes(graph) == {}


@pytest.mark.keras2
def test_what_xla_cannot_compile_is_said_and_each_variable_compiled_apart(
    caplog):
  """Keras's amsgrad (ResourceApplyAdamWithAmsgrad has no XLA kernel):
  one line says so, each variable's own ops get an XLA scope of their own
  (the op XLA cannot compile runs as it is), no whole-apply function is
  called, and its slots are made once."""
  with tf.Graph().as_default() as graph:
    with caplog.at_level("WARNING", logger="absl"):
      _build(MORE_OPTIMIZERS["keras_legacy_amsgrad_not_compiled_whole"](),
             True)
    said = [r.getMessage() for r in caplog.records
            if "fused_apply" in r.getMessage()]
    assert len(said) == 1 and "ResourceApplyAdamWithAmsgrad" in said[0], said
    assert "Adam" in said[0], said
    scopes = _scopes(graph)
    assert len(scopes) == len(tanh_stack.WIDTHS) - 1, sorted(scopes)
    calls = [n.attr["f"].func.name for f in _functions(graph).values()
             for n in f.node_def if n.attr["_XlaMustCompile"].b]
    # The window's sums are zeroed in place all the same.
    assert len(calls) == 1 and "_zero_window_" in calls[0], calls
    names = [v.op.name for v in tf.compat.v1.global_variables()]
    assert len(names) == len(set(names)), names
    assert sum("vhat" in n for n in names) == len(tanh_stack.WIDTHS) - 1


class _PrintingAdamWeightDecay(GoogleStyleAdamWeightDecay):
  """Google's AdamWeightDecay (its slots made by `get_variable`, which
  refuses a second variable of a name) with a print XLA cannot compile."""

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    with tf.control_dependencies([tf.print("window applied")]):
      return super().apply_gradients(grads_and_vars, global_step, name)


def test_slots_made_by_name_while_tracing_are_the_ones_applied():
  def make():
    return _PrintingAdamWeightDecay(0.05, weight_decay_rate=0.01)

  with tf.Graph().as_default():
    _build(make(), True)
    names = [v.op.name for v in tf.compat.v1.global_variables()]
    assert sum(n.endswith("adam_m") for n in names) == len(
        tanh_stack.WIDTHS) - 1, names
  fused, plain = _train(make, True), _train(make, False)
  for name in plain:
    np.testing.assert_allclose(fused[name], plain[name], rtol=1e-6,
                               atol=1e-7, err_msg=name)


def _ref_variable_weights(fused_apply, optimizer_fn):
  """A reference variable (what disable_v2_behavior() builds, trained
  under control flow v1) after 3 updates, k=2."""
  with tf.Graph().as_default():
    with tf.compat.v1.variable_scope("model", use_resource=False):
      kernel = tf.compat.v1.get_variable("kernel", initializer=tf.constant(
          np.random.RandomState(0).randn(2, 3), tf.float32))
    tf.compat.v1.train.get_or_create_global_step()
    op = estimator_accum.build_accumulating_train_op(
        tf.reduce_sum(tf.square(tf.tanh(kernel))), optimizer_fn(), 2,
        clip_norm=1.0, log_every_n_micro_batches=None,
        fused_apply=fused_apply)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(6):
        session.run(op)
      return session.run(kernel)


@pytest.mark.parametrize("optimizer", ["adam", "google_adam_weight_decay"])
def test_reference_variables_are_compiled_apart(optimizer):
  """A function cannot assign a reference variable: the whole apply is
  not compiled, and the weights are the unfused apply's."""
  tf.compat.v1.disable_control_flow_v2()
  try:
    fused = _ref_variable_weights(True, OPTIMIZERS[optimizer])
    plain = _ref_variable_weights(False, OPTIMIZERS[optimizer])
  finally:
    tf.compat.v1.enable_control_flow_v2()
  assert not np.allclose(plain, np.random.RandomState(0).randn(2, 3))
  np.testing.assert_allclose(fused, plain, rtol=1e-6, atol=1e-7)


def _sparse_weights(fused_apply, optimizer_fn=None, graph=None):
  """An embedding table's rows (tf.IndexedSlices gradients) and a kernel
  after 3 updates of Adam (or `optimizer_fn()`), k=2."""
  with (graph or tf.Graph()).as_default():
    table = tf.compat.v1.get_variable("table", initializer=tf.constant(
        np.random.RandomState(0).randn(20, 4), tf.float32))
    kernel = tf.compat.v1.get_variable("kernel", initializer=tf.constant(
        np.random.RandomState(1).randn(4, 3), tf.float32))
    step = tf.compat.v1.train.get_or_create_global_step()
    ids = tf.gather(tf.constant([[1, 5, 5], [7, 1, 2]]), step % 2)
    loss = tf.reduce_sum(tf.square(tf.tanh(
        tf.matmul(tf.gather(table, ids), kernel))))
    optimizer = (optimizer_fn or (
        lambda: tf.compat.v1.train.AdamOptimizer(0.1)))()
    op = estimator_accum.build_accumulating_train_op(
        loss, optimizer, 2, clip_norm=1.0, log_every_n_micro_batches=None,
        fused_apply=fused_apply)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(6):
        session.run(op)
      return session.run({"table": table, "kernel": kernel})


def test_sparse_gradients_are_compiled_apart_and_exact(caplog):
  with caplog.at_level("INFO", logger="absl"):
    fused = _sparse_weights(True)
  said = [r.getMessage() for r in caplog.records
          if "fused_apply" in r.getMessage()]
  assert said == ["fused_apply: each variable's update is compiled apart: "
                  "sparse gradients of table:0."], said
  plain = _sparse_weights(False)
  start = np.random.RandomState(0).randn(20, 4)
  assert not np.allclose(plain["table"][[1, 2, 5, 7]], start[[1, 2, 5, 7]])
  np.testing.assert_array_equal(plain["table"][0], start[0].astype(
      np.float32))  # an untouched row
  for name in plain:
    np.testing.assert_allclose(fused[name], plain[name], rtol=1e-6,
                               atol=1e-7, err_msg=name)


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_a_sparse_gradient_that_bert_optimizers_densify_compiles_whole(
    name, caplog):
  """BERT's AdamWeightDecay and LAMB apply a table's sparse gradient as the
  dense one its rows sum to (`sparse_apply_is_dense_apply`): fused_apply
  hands them that dense gradient and compiles the whole apply as one
  function, the main job's case (its word embeddings). The same weights
  as without fused_apply; untouched rows decay as Google's optimizer
  decays them."""
  graph = tf.Graph()
  with caplog.at_level("INFO", logger="absl"):
    fused = _sparse_weights(
        True, lambda: _bert_optimizer(name, 0.05), graph)
  assert not [r.getMessage() for r in caplog.records
              if "compiled apart" in r.getMessage()]
  compiled = [f for f in _compiled_functions(graph)
              if "_update_" in f.signature.name]
  assert len(compiled) == 1, [f.signature.name for f in compiled]
  types = collections.Counter(n.op for n in compiled[0].node_def)
  assert types["AssignVariableOp"] == 3 * 2, types  # table and kernel
  assert _scopes(graph) == {}
  plain = _sparse_weights(False, lambda: _bert_optimizer(name, 0.05))
  start = np.random.RandomState(0).randn(20, 4)
  assert not np.allclose(plain["table"][[1, 2, 5, 7]], start[[1, 2, 5, 7]])
  assert not np.allclose(plain["table"][0], start[0])  # decayed, untouched
  for name_ in plain:
    np.testing.assert_allclose(fused[name_], plain[name_], rtol=1e-6,
                               atol=1e-7, err_msg=name_)


def _two_device_weights(fused_apply):
  """A kernel on each of the two logical CPUs after 3 updates of BERT's
  AdamWeightDecay, k=2."""
  with tf.Graph().as_default():
    kernels = []
    for index in (0, 1):
      with tf.device(f"/cpu:{index}"):
        kernels.append(tf.compat.v1.get_variable(
            f"kernel{index}", initializer=tf.constant(
                np.random.RandomState(index).randn(3, 3), tf.float32)))
    step = tf.compat.v1.train.get_or_create_global_step()
    x = tf.gather(tf.constant(np.random.RandomState(2).randn(2, 4, 3),
                              tf.float32), step % 2)
    loss = tf.reduce_sum(tf.square(tf.tanh(
        tf.matmul(tf.matmul(x, kernels[0]), kernels[1]))))
    op = estimator_accum.build_accumulating_train_op(
        loss, _bert_optimizer("adamw", 0.05), 2, clip_norm=1.0,
        log_every_n_micro_batches=None, fused_apply=fused_apply)
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
    with tf.compat.v1.Session(config=config) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(6):
        session.run(op)
      return session.run(kernels)


def test_variables_on_several_devices_are_compiled_apart(caplog):
  """A compiled function reaches only the resources of the device it runs
  on (a parameter server's variables failed the chief's first window with
  InvalidArgumentError): variables on two devices are applied by each
  one's own compiled update, said in one line, exactly."""
  with caplog.at_level("INFO", logger="absl"):
    fused = _two_device_weights(True)
  said = [r.getMessage() for r in caplog.records
          if "fused_apply" in r.getMessage()]
  assert len(said) == 1 and "variables on several devices (" in said[0], said
  plain = _two_device_weights(False)
  for index, (a, b) in enumerate(zip(fused, plain)):
    assert not np.allclose(b, np.random.RandomState(index).randn(3, 3))
    # XLA's arithmetic against TensorFlow's kernels: with Eigen's (oneDNN
    # off, a CPU without AVX-512) one weight of 0.096 came 3.7e-6 apart
    # after three updates: float32's rounding, within the project's 1e-5.
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_fused_apply_that_is_not_a_bool(value):
  with tf.Graph().as_default():
    with pytest.raises(TypeError, match=rf"fused_apply .*{value!r}"):
      _build(OPTIMIZERS["adam"](), value)


def _window_end_allocations(step_stats):
  """{op name: the bytes it allocated} of the ops of the window's end (its
  branch: the apply and the sums' reset) that allocated any, from a
  traced step's own records of each op's allocations: what the window's
  end makes, whichever order the executor ran it in."""
  made = {node.node_name: sum(m.total_bytes for m in node.memory)
          for device in step_stats.dev_stats for node in device.node_stats
          if "end_of_window/" in node.node_name}
  return {name: size for name, size in made.items() if size}


@pytest.mark.memory
@pytest.mark.parametrize("threads", ["default_threads", "one_thread"])
def test_the_applying_micro_batch_needs_no_more_than_an_accumulating_one(
    threads):
  """Four 1M-parameter variables (4 MB each), AdamWeightDecay, the BFC
  allocator. Compiled, the window's end (the apply, in place, and the
  sums zeroed in place) allocates less than a quarter of one variable in
  all its ops together; unfused, the optimizer's temporaries and the
  reset's zeros are each the size of a variable. Counted from the step's
  record of each op's allocations, not from the peak: which of the
  gradients are alive at once, and so an accumulating micro-batch's peak
  (4 to 16 MB here), moves with the executor's order. The applying
  micro-batch's peak stays within what an accumulating one can reach in
  any order (every gradient alive at once)."""
  config = session_threads.ONE_THREAD if threads == "one_thread" else None
  variable = 4 * 10**6
  traced = tf.compat.v1.RunOptions(
      trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
  made, peaks = {}, {}
  for fused in (False, True):
    with tf.Graph().as_default():
      train_op = _build(OPTIMIZERS["google_adam_weight_decay"](), fused,
                        widths=[1000] * 5, rows=4)
      with tf.compat.v1.Session(config=config) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        for _ in range(5):  # two windows (compiled, slots made), and one more
          session.run(train_op)
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        metadata = tf.compat.v1.RunMetadata()
        session.run(train_op, options=traced, run_metadata=metadata)
        peaks[fused] = (tf.config.experimental.get_memory_info("CPU:0")[
            "peak"] - before)
        made[fused] = _window_end_allocations(metadata.step_stats)
  assert made[True], "the traced micro-batch did not end a window"
  assert sum(made[True].values()) < variable / 4, made[True]
  large = [name for name, size in made[False].items() if size >= variable]
  assert len(large) >= 4, made[False]  # some of them the reset's zeros
  gradients = 4 * variable
  assert peaks[True] < gradients + variable / 4, peaks


def _weights_around_a_skipped_window(fused_apply):
  """Weights and the window's sums after 4 windows of k=2, the second
  one's gradients NaN (skipped), and the accumulators after it."""
  with tf.Graph().as_default():
    factor = tf.compat.v1.placeholder(tf.float32, [])
    kernel = tf.compat.v1.get_variable("kernel", initializer=tf.constant(
        np.random.RandomState(0).randn(6, 6), tf.float32))
    inputs = tf.constant(np.random.RandomState(1).randn(4, 6), tf.float32)
    loss = tf.reduce_sum(tf.square(tf.tanh(tf.matmul(inputs, kernel)))) * (
        factor)
    tf.compat.v1.train.get_or_create_global_step()
    op = estimator_accum.build_accumulating_train_op(
        loss, OPTIMIZERS["google_adam_weight_decay"](), 2,
        log_every_n_micro_batches=None, fused_apply=fused_apply)
    sums = [v for v in tf.compat.v1.global_variables()
            if v.op.name.endswith("/accum")]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      after_skip = None
      for micro_batch in range(8):
        session.run(op, {factor: np.nan if micro_batch in (2, 3) else 1.0})
        if micro_batch == 3:
          after_skip = session.run(sums)
      return session.run(kernel), after_skip


def test_a_skipped_window_is_zeroed_in_place_too():
  """A window with a NaN gradient is not applied, and its sums are zeroed
  all the same (the compiled zeroing runs after either branch): the next
  windows train as unfused."""
  fused, fused_sums = _weights_around_a_skipped_window(True)
  plain, plain_sums = _weights_around_a_skipped_window(False)
  assert fused_sums and all(not np.any(s) for s in fused_sums), fused_sums
  assert all(not np.any(s) for s in plain_sums)
  assert not np.allclose(plain, np.random.RandomState(0).randn(6, 6))
  np.testing.assert_allclose(fused, plain, rtol=1e-6, atol=1e-6)


# XLA's persistent compilation cache (TF_XLA_FLAGS) on a CPU: TensorFlow 2.15
# fails every XLA compile there (an InternalError at the first window's
# end), so the window's end runs without XLA, said in one line; later
# releases write the cache and compile. Read by XLA once per process: the
# run is a process of its own (exec, not the suite's fork server).
_CACHED_RUN = """
import json
import tensorflow as tf
from tests.helpers import tanh_stack
weights = tanh_stack.trained_weights(
    lambda: tf.compat.v1.train.AdamOptimizer(0.1), fused_apply=True)
print(json.dumps({name: value.tolist() for name, value in weights.items()}))
"""


def test_xla_persistent_cache_on_cpu_trains_the_same_weights(tmp_path):
  cache = tmp_path / "xla_cache"
  env = dict(os.environ, ESTIMATOR_ACCUM_TEST_FORK="0",
             CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(_REPO),
             TF_XLA_FLAGS=f"--tf_xla_persistent_cache_directory={cache}")
  run = subprocess.run([sys.executable, "-c", _CACHED_RUN], env=env,
                       cwd=_REPO, capture_output=True, text=True,
                       timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  cached = json.loads(run.stdout.strip().splitlines()[-1])
  plain = _train(OPTIMIZERS["adam"], False)
  for name, value in plain.items():
    start = tanh_stack.initial_kernel(int(name[-1]), *value.shape)
    assert not np.allclose(value, start), name  # it trained
    np.testing.assert_allclose(cached[name], value, rtol=1e-6, atol=1e-7,
                               err_msg=name)
  said = "fused_apply: TF_XLA_FLAGS=" in run.stderr
  written = cache.is_dir() and any(cache.iterdir())
  if releases.tensorflow_version() == (2, 15):
    assert said and "device_types=GPU" in run.stderr, run.stderr[-3000:]
    assert not written
  else:
    assert not said, run.stderr[-3000:]
    assert written  # XLA compiled the window's end, and cached it


@pytest.mark.parametrize("flags, fails", [
    ("--tf_xla_persistent_cache_directory=/c", True),
    ("--tf_xla_persistent_cache_directory=/c "
     "--tf_xla_persistent_cache_device_types=CPU,GPU", True),
    ("--tf_xla_persistent_cache_directory=/c "
     "--tf_xla_persistent_cache_device_types=GPU", False),
    ("--tf_xla_persistent_cache_directory=/c "
     "--tf_xla_persistent_cache_read_only=true", False),
    ("--tf_xla_persistent_cache_directory=/c "
     "--tf_xla_persistent_cache_read_only", False),
    ("--tf_xla_persistent_cache_directory=", False),
    ("--tf_xla_auto_jit=0", False),
    ("", False),
])
def test_which_xla_flags_fail_on_cpu(monkeypatch, flags, fails):
  monkeypatch.setenv("TF_XLA_FLAGS", flags)
  failing = (fails and
             releases.tensorflow_version() == (2, 15))
  assert releases.xla_cache_fails_on_cpu() == (
      flags if failing else None)


# XLA's auto-clustering on the CPU (TF_XLA_FLAGS) aborts the process on the
# window of a table's sparse gradient, inside XLA, on every release
# (2.15: std::out_of_range; 2.21: a failed check in XlaRunOp), where the
# same model's plain minimize trains: refused in one line at the build.
_AUTO_CLUSTERING = "--tf_xla_auto_jit=1 --tf_xla_cpu_global_jit"

_TABLE_RUN = """
import numpy as np
import tensorflow as tf
import estimator_accum
tf.compat.v1.disable_eager_execution()
table = tf.compat.v1.get_variable("table", [100, 8], use_resource=True)
kernel = tf.compat.v1.get_variable("kernel", [8, 1], use_resource=True)
ids = tf.constant(np.random.RandomState(0).randint(0, 100, (4, 5)))
pooled = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), 1)
loss = tf.reduce_mean(tf.square(tf.matmul(pooled, kernel)))
optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
tf.compat.v1.train.get_or_create_global_step()
if {accumulate}:
  op = estimator_accum.build_accumulating_train_op(
      loss, optimizer, 2, log_every_n_micro_batches=None)
else:
  op = optimizer.minimize(loss)
with tf.compat.v1.Session() as session:
  session.run(tf.compat.v1.global_variables_initializer())
  for _ in range(4):
    session.run(op)
print("trained")
"""


def _run_with_xla_flags(script, flags, cwd):
  """`script` in a process of its own (XLA reads TF_XLA_FLAGS once a
  process) with `flags` as TF_XLA_FLAGS, on the CPU."""
  env = dict(os.environ, ESTIMATOR_ACCUM_TEST_FORK="0",
             CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(_REPO),
             TF_CPP_MIN_LOG_LEVEL="2", TF_XLA_FLAGS=flags)
  return subprocess.run([sys.executable, "-c", script], env=env, cwd=cwd,
                        capture_output=True, text=True, timeout=300,
                        check=False)


@pytest.mark.parametrize("accumulate", [False, True])
def test_xla_auto_clustering_of_a_table_is_refused_not_a_crash(tmp_path,
                                                               accumulate):
  run = _run_with_xla_flags(_TABLE_RUN.format(accumulate=accumulate),
                            _AUTO_CLUSTERING, tmp_path)
  if not accumulate:  # plain TensorFlow trains the same model under it
    assert run.returncode == 0 and "trained" in run.stdout, run.stderr[-2000:]
    return
  assert run.returncode == 1, (run.returncode, run.stderr[-2000:])
  last = run.stderr.strip().splitlines()[-1]
  assert re.match(
      r"ValueError: TF_XLA_FLAGS='--tf_xla_auto_jit=1 --tf_xla_cpu_global_jit'"
      r" clusters the graph for XLA on the CPU, and XLA aborts the process "
      r"on the window of a table's gradient \(table\)", last), last


_TABLE_WEIGHTS = """
import json
import numpy as np
import tensorflow as tf
import estimator_accum
tf.compat.v1.disable_eager_execution()
init = tf.compat.v1.random_normal_initializer
table = tf.compat.v1.get_variable("table", [100, 8], use_resource=True,
                                  initializer=init(seed=1))
kernel = tf.compat.v1.get_variable("kernel", [8, 1], use_resource=True,
                                   initializer=init(seed=2))
ids = tf.constant(np.random.RandomState(0).randint(0, 100, (4, 5)))
pooled = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), 1)
loss = tf.reduce_mean(tf.square(tf.tanh(tf.matmul(pooled, kernel))))
tf.compat.v1.train.get_or_create_global_step()
op = estimator_accum.build_accumulating_train_op(
    loss, tf.compat.v1.train.AdamOptimizer(0.01), 4,
    log_every_n_micro_batches=None, sparse_accumulation={sparse})
with tf.compat.v1.Session() as session:
  session.run(tf.compat.v1.global_variables_initializer())
  start = session.run(kernel)
  for _ in range(12):
    session.run(op)
  print("MOVED", float(np.max(np.abs(session.run(kernel) - start))))
  print("WEIGHTS " + json.dumps(
      [v.ravel().tolist() for v in session.run([table, kernel])]))
"""


@pytest.mark.parametrize("sparse", [True, False])
def test_xla_clustering_of_fusible_ops_trains_a_table_window(tmp_path,
                                                             sparse):
  # Kept to the op kinds XLA fuses, clustering does not abort the window
  # of a table's gradient: not refused, and the weights are those without
  # XLA (three windows of Adam).
  weights = []
  for flags in ("", _AUTO_CLUSTERING + " --tf_xla_ops_to_cluster=FUSIBLE"):
    run = _run_with_xla_flags(_TABLE_WEIGHTS.format(sparse=sparse), flags,
                              tmp_path)
    line = next((li for li in run.stdout.splitlines()
                 if li.startswith("WEIGHTS ")), None)
    assert run.returncode == 0 and line, (flags, run.stderr[-2000:])
    moved = float(run.stdout.split("MOVED ")[1].split()[0])
    assert moved > 1e-3, moved  # three updates of Adam at 0.01
    weights.append([np.array(v) for v in json.loads(line[len("WEIGHTS "):])])
  without, with_xla = weights
  for a, b in zip(with_xla, without):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_xla_auto_clustering_of_dense_gradients_builds(monkeypatch):
  # Built only: XLA reads TF_XLA_FLAGS once a process, at its first
  # session, and the suite's later sessions must not cluster.
  monkeypatch.setenv("TF_XLA_FLAGS", _AUTO_CLUSTERING)
  with tf.Graph().as_default():
    op = _build(OPTIMIZERS["adam"](), False)
  assert isinstance(op, tf.Operation)  # built, not refused


@pytest.mark.parametrize("flags, clusters", [
    (_AUTO_CLUSTERING, True),
    ("--tf_xla_auto_jit=2 --tf_xla_cpu_global_jit=true", True),
    ("--tf_xla_auto_jit=1", False),
    ("--tf_xla_auto_jit=0 --tf_xla_cpu_global_jit", False),
    ("--tf_xla_auto_jit=-1 --tf_xla_cpu_global_jit", False),
    ("--tf_xla_auto_jit=1 --tf_xla_cpu_global_jit=false", False),
    ("--tf_xla_cpu_global_jit", False),
    ("", False),
    # Kept to XLA's fusible op kinds, the window trains (measured).
    (_AUTO_CLUSTERING + " --tf_xla_ops_to_cluster=FUSIBLE", False),
    (_AUTO_CLUSTERING + " --tf_xla_ops_to_cluster=PW,RED", False),
    # Ops named: clustering, as any op may be listed.
    (_AUTO_CLUSTERING + " --tf_xla_ops_to_cluster=FUSIBLE,MatMul", True),
    (_AUTO_CLUSTERING + " --tf_xla_ops_to_cluster=", True),
])
def test_which_xla_flags_cluster_on_cpu(monkeypatch, flags, clusters):
  monkeypatch.setenv("TF_XLA_FLAGS", flags)
  assert releases.xla_auto_clustering_on_cpu() == (
      flags if clusters else None)
