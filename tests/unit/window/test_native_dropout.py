"""estimator_accum.native: keyed dropout in one pass, the kernel built for
the running TensorFlow on first use. It makes TensorFlow's own ops' masks
bit for bit, forward and backward; bad shapes are an error, not a crash;
where it cannot be built or is turned off, one line (or none) and
TensorFlow's ops."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from estimator_accum.window import keyed_dropout as keyed
from tests.helpers import native_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


_loaded = native_kernels.loaded


def _both(values, rate, keys, seed=3, site="s"):
  """(output, its gradient) through the kernel, and through TensorFlow's
  ops, and the two graphs' op types."""
  results, kinds = [], []
  for one_pass in (None, False):
    with tf.Graph().as_default():
      inputs = tf.constant(values)
      dropped = keyed.keyed_dropout(inputs, rate, tf.constant(keys),
                                    seed=seed, site=site, one_pass=one_pass)
      gradient = tf.gradients(tf.reduce_sum(tf.square(dropped) * 0.5 +
                                            dropped), inputs)[0]
      kinds.append(dropped.op.type)
      with tf.compat.v1.Session() as session:
        results.append(session.run([dropped, gradient]))
  return results, kinds


@pytest.mark.parametrize("shape", [[217, 384], [8, 12, 28, 28], [3, 1],
                                   [0, 16], [4, 0], [7]])
@pytest.mark.parametrize("rate", [0.1, 0.5, 0.97])
def test_one_pass_is_tensorflows_ops_bit_for_bit(shape, rate):
  _loaded()
  rng = np.random.RandomState(len(shape) + int(rate * 10))
  values = (rng.normal(size=shape) * 50).astype(np.float32)
  keys = (np.arange(int(np.prod(shape[:-1]))).reshape(shape[:-1]) * 7919 +
          2**33).astype(np.int64)
  (one_pass, ops), kinds = _both(values, rate, keys)
  assert kinds == ["EaKeyedDropout", "SelectV2"]
  for fast, plain in zip(one_pass, ops):
    np.testing.assert_array_equal(fast.view(np.uint32), plain.view(np.uint32))
  if values.size:
    kept = one_pass[0] != 0
    assert abs(kept.mean() - (1 - rate)) < max(0.05, 3 / np.sqrt(kept.size))


def test_inf_and_nan_where_dropped_are_zero_as_with_tf_where():
  _loaded()
  values = np.full([64, 32], np.inf, np.float32)
  values[::2] = np.nan
  (one_pass, ops), _ = _both(values, 0.5, np.arange(64))
  dropped = ops[0] == 0
  assert dropped.any() and not dropped.all()
  np.testing.assert_array_equal(one_pass[0] == 0, dropped)
  np.testing.assert_array_equal(np.isnan(one_pass[0]), np.isnan(ops[0]))


def test_bad_shapes_are_an_error_naming_them_not_a_crash():
  op = _loaded().ea_keyed_dropout
  cases = [
      ([4, 5], [4], [6], "columns must hold one word a column of inputs"),
      ([4, 5], [3], [5], "rows must have the shape of inputs without its "
                         "last axis"),
      ([4, 5], [4, 1], [5], "rows must have the shape of inputs without its "
                            "last axis"),
      ([2, 3, 5], [3, 2], [5], "rows must have the shape of inputs without "
                               "its last axis"),
  ]
  for inputs, rows, columns, message in cases:
    with tf.Graph().as_default():
      x = tf.compat.v1.placeholder(tf.float32)
      r = tf.compat.v1.placeholder(tf.uint32)
      c = tf.compat.v1.placeholder(tf.uint32)
      dropped = op(x, r, c, threshold=2**31, scale=2.0)
      with tf.compat.v1.Session() as session:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
          session.run(dropped, {x: np.ones(inputs), r: np.ones(rows),
                                c: np.ones(columns)})


def test_bert_trains_alike_with_the_kernel_and_without(monkeypatch):
  """A BERT with keyed dropout on every site: the same gradients either
  way (the kernel in every dropout site, attention's too)."""
  _loaded()

  def gradients():
    return native_kernels.tiny_bert(
        unpadded=True, dropout_keys=np.array([5, 9, 11], np.int64),
        dropout_seed=4)

  with_kernel, types = gradients()
  assert "EaKeyedDropout" in types
  monkeypatch.setattr(keyed, "_one_pass_op", lambda inputs: None)
  without, types = gradients()
  assert "EaKeyedDropout" not in types
  for a, b in zip(with_kernel, without):
    np.testing.assert_array_equal(a, b)
  assert max(np.abs(g).max() for g in with_kernel) > 0


def _masks_in_a_new_process(env):
  """stdout and stderr of a process that drops out of a [6, 5] tensor
  and prints the op it used and the result."""
  code = textwrap.dedent("""
      import numpy as np, tensorflow as tf
      from estimator_accum.window import keyed_dropout
      tf.compat.v1.disable_eager_execution()
      out = keyed_dropout.keyed_dropout(tf.ones([6, 5]), 0.4,
                                        tf.range(6), seed=1, site="x")
      with tf.compat.v1.Session() as session:
        values = session.run(out)
      print(out.op.type, (values != 0).astype(int).ravel().tolist())
  """)
  return subprocess.run(
      [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
      timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env))


def test_a_compiler_that_fails_is_one_line_and_tensorflows_ops(tmp_path):
  # The kernel's masks from the default cache (built there once for the
  # suite; a build into an empty cache is the next test's).
  built = _masks_in_a_new_process({})
  assert built.returncode == 0, built.stderr[-3000:]
  assert built.stdout.split()[0] == "EaKeyedDropout", built.stderr[-2000:]
  for env, said in [
      ({"CXX": "false"}, "estimator_accum: the native kernels were not "
                         "built: false failed (exit 1)"),
      ({"CXX": "no-such-compiler"}, "estimator_accum: no C++ compiler "
                                    "('no-such-compiler' not found)"),
      ({"ESTIMATOR_ACCUM_NATIVE": "0"}, None)]:
    cache = tmp_path / env.get("CXX", "off")
    for _ in range(2):  # the second: a failed build is not tried again
      result = _masks_in_a_new_process(
          dict(env, ESTIMATOR_ACCUM_CACHE=str(cache)))
      assert result.returncode == 0, result.stderr[-3000:]
      assert "Traceback" not in result.stderr
      assert result.stdout.split()[0] == "SelectV2", result.stdout
      # The same masks as the kernel's.
      assert result.stdout.split(None, 1)[1] == built.stdout.split(None, 1)[1]
      lines = [line for line in result.stderr.splitlines()
               if line.startswith("estimator_accum:")]
      if said is None:
        assert not lines, lines
      else:
        assert len(lines) == 1 and lines[0].startswith(said), lines
        assert ("keyed dropout and the GELU run TensorFlow's own ops"
                in lines[0]), lines
  assert "remove " in _masks_in_a_new_process(
      {"CXX": "false", "ESTIMATOR_ACCUM_CACHE": str(tmp_path / "false")}
  ).stderr


def test_processes_that_build_at_once_all_load_one_library(tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             ESTIMATOR_ACCUM_CACHE=str(tmp_path))
  code = ("from estimator_accum import native; "
          "print(native.load() is not None)")
  processes = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
               for _ in range(3)]
  for process in processes:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0 and out.strip() == "True", err[-2000:]
  assert len(list(tmp_path.glob("native/*/estimator_accum_ops.so"))) == 1
  assert not list(tmp_path.rglob("*.tmp"))
