"""The suite's sessions run without Grappler, tests marked `grappler` or
`memory` and their children with it, and a config that asks for a pass
gets TensorFlow's default Grappler (tests/helpers/grappler.py). Observed on the graph the
session really runs: Grappler's arithmetic optimizer and pruning take
`-(-(x)) + 1` down to `x + 1` (TensorFlow's own constant folding, outside
Grappler, runs either way)."""

import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tests.helpers import grappler

_PROGRAM = """
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
x = tf.compat.v1.placeholder(tf.float32, [])
y = tf.negative(tf.negative(tf.identity(x))) + 1.0
options = tf.compat.v1.RunOptions(output_partition_graphs=True)
metadata = tf.compat.v1.RunMetadata()
with tf.compat.v1.Session() as session:
  assert session.run(y, {x: 1.0}, options=options,
                     run_metadata=metadata) == 2.0
print(" ".join(sorted({n.op for g in metadata.partition_graphs
                       for n in g.node})))
"""


def _ops_run(config=None):
  """The op types of the graph a session runs for `-(-(x)) + 1`."""
  with tf.Graph().as_default():
    x = tf.compat.v1.placeholder(tf.float32, [])
    y = tf.negative(tf.negative(tf.identity(x))) + 1.0
    options = tf.compat.v1.RunOptions(output_partition_graphs=True)
    metadata = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(config=config) as session:
      assert session.run(y, {x: 1.0}, options=options,
                         run_metadata=metadata) == 2.0
  return {n.op for g in metadata.partition_graphs for n in g.node}


def _arithmetic_config():
  config = tf.compat.v1.ConfigProto()
  config.graph_options.rewrite_options.arithmetic_optimization = (
      config.graph_options.rewrite_options.ON)
  return config


def test_a_suite_session_leaves_the_graph_as_built(monkeypatch):
  # As in a run of the suite (CI also runs the fast tier with "default").
  monkeypatch.setenv(grappler.ENV, "off")
  assert "Neg" in _ops_run()


def test_a_pass_the_config_asks_for_runs(monkeypatch):
  monkeypatch.setenv(grappler.ENV, "off")
  assert "Neg" not in _ops_run(_arithmetic_config())


@pytest.mark.grappler
def test_a_grappler_test_runs_tensorflows_defaults():
  assert os.environ[grappler.ENV] == grappler.DEFAULT
  assert "Neg" not in _ops_run()


def test_the_setting_leaves_the_users_config_otherwise_unchanged():
  config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=3)
  config.graph_options.rewrite_options.meta_optimizer_iterations = (
      config.graph_options.rewrite_options.ONE)  # as Estimator's default
  changed = grappler.without_grappler(config)
  assert changed.inter_op_parallelism_threads == 3
  assert changed.graph_options.rewrite_options.disable_meta_optimizer
  assert not config.graph_options.rewrite_options.disable_meta_optimizer, (
      "the caller's config must not change")


_MULTI_WORKER_CONFIG = """
import tensorflow as tf
strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
print(strategy.update_config_proto(
    tf.compat.v1.ConfigProto()).SerializeToString().hex())
"""


def test_a_multi_worker_config_runs_without_grappler_unless_marked(
    tmp_path):
  """MultiWorkerMirroredStrategy's session config asks for the scoped
  allocator (which merges a step's all-reductions): alone, that does not
  keep Grappler on; the multi-worker tests marked `grappler` (the exactness
  of a window across workers) run it as users' jobs do. A config that asks
  for any other pass besides keeps it whole. (The strategy is made in a
  child: it sets up collectives process-wide.)"""
  script = tmp_path / "config.py"
  script.write_text(_MULTI_WORKER_CONFIG)
  done = subprocess.run([sys.executable, str(script)], capture_output=True,
                        text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
  config = tf.compat.v1.ConfigProto.FromString(
      bytes.fromhex(done.stdout.split()[-1]))
  options = config.graph_options.rewrite_options
  assert options.scoped_allocator_optimization == options.ON
  changed = grappler.without_grappler(config)
  assert changed.graph_options.rewrite_options.disable_meta_optimizer
  assert changed.graph_options.rewrite_options.scoped_allocator_optimization \
      == options.ON
  config.graph_options.rewrite_options.constant_folding = options.ON
  assert grappler.without_grappler(config) == config


@pytest.mark.parametrize("how", ["forked", "exec"])
@pytest.mark.parametrize("setting", ["off", grappler.DEFAULT])
def test_children_follow_the_tests_setting(how, setting, tmp_path,
                                           monkeypatch):
  """A child started through the fork server or with exec (`python -u -c`:
  a new interpreter, its sitecustomize) runs as the test that started
  it."""
  monkeypatch.setenv(grappler.ENV, setting)
  if how == "forked":
    script = tmp_path / "child.py"
    script.write_text(_PROGRAM)
    command = [sys.executable, str(script)]
  else:
    command = [sys.executable, "-u", "-c", _PROGRAM]
  done = subprocess.run(command, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
  ops = done.stdout.split()
  assert ops, done.stdout
  assert ("Neg" in ops) == (setting == "off"), ops
