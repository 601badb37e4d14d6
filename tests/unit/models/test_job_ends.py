"""What lets a multi-worker job end in seconds (benchmarks/job_end.py
measures the end itself): input pipelines whose session closes at once,
and one model_dir for every task of a cluster that gave none."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum
from data import housing, mnist
from models import training


def _autotune(dataset):
  return dataset.options().autotune.enabled


def test_without_autotune_turns_it_off_and_keeps_the_elements():
  dataset = tf.data.Dataset.range(10).map(lambda x: x * 2,
                                          num_parallel_calls=tf.data.AUTOTUNE)
  assert _autotune(dataset) is None  # TensorFlow's default: on
  quiet = estimator_accum.without_autotune(dataset.prefetch(tf.data.AUTOTUNE))
  assert _autotune(quiet) is False
  assert list(quiet.as_numpy_iterator()) == list(range(0, 20, 2))


def test_without_autotune_names_what_it_was_given():
  with pytest.raises(TypeError, match="dataset must be a tf.data.Dataset, "
                     "got list"):
    estimator_accum.without_autotune([1, 2])


def test_the_projects_input_fns_close_at_once():
  images = {"images": np.zeros((8, 28, 28, 1), np.float32),
            "labels": np.zeros((8,), np.int64)}
  assert _autotune(mnist.input_fn(images, 4)) is False
  prices = {"x": np.zeros((8, 3), np.float32),
            "price": np.zeros((8,), np.float32)}
  assert _autotune(housing.input_fn(prices, 2, k=2)) is False


def _cluster(index, workers=2):
  return json.dumps({"cluster": {"worker": [f"127.0.0.1:{2000 + i}"
                                            for i in range(workers)]},
                     "task": {"type": "worker", "index": index}})


def test_every_task_of_a_cluster_gets_the_same_default_model_dir(
    monkeypatch, tmp_path):
  monkeypatch.setenv("TMPDIR", str(tmp_path))
  monkeypatch.setattr("tempfile.tempdir", None)
  paths = []
  for index in range(2):
    monkeypatch.setenv("TF_CONFIG", _cluster(index))
    paths.append(training.default_model_dir("mnist"))
  assert paths[0] == paths[1]
  assert os.path.dirname(paths[0]) == str(tmp_path)
  assert os.stat(paths[0]).st_mode & 0o777 == 0o700
  monkeypatch.setenv("TF_CONFIG", _cluster(0, workers=3))
  assert training.default_model_dir("mnist") != paths[0]
  monkeypatch.delenv("TF_CONFIG")
  alone = {training.default_model_dir("mnist") for _ in range(2)}
  assert len(alone) == 2 and paths[0] not in alone


def test_a_default_model_dir_that_is_a_link_is_refused(monkeypatch, tmp_path):
  monkeypatch.setenv("TMPDIR", str(tmp_path))
  monkeypatch.setattr("tempfile.tempdir", None)
  monkeypatch.setenv("TF_CONFIG", _cluster(1))
  path = training.default_model_dir("mnist")
  os.rmdir(path)
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  os.symlink(elsewhere, path)
  with pytest.raises(SystemExit, match="is not a directory of this user's "
                     "own; give --model_dir"):
    training.default_model_dir("mnist")


@pytest.mark.parametrize("cluster, task, removed", [
    ({"worker": ["a:1", "b:1"]}, ("worker", 1), True),
    ({"worker": ["a:1", "b:1"]}, ("worker", 0), False),  # the chief
    ({"chief": ["c:1"], "worker": ["a:1"]}, ("worker", 0), True),
    ({"chief": ["c:1"], "worker": ["a:1"]}, ("chief", 0), False),
])
def test_a_worker_removes_its_own_checkpoint_copies_at_its_end(
    cluster, task, removed, monkeypatch, tmp_path):
  kind, index = task
  monkeypatch.setenv("TF_CONFIG", json.dumps(
      {"cluster": cluster, "task": {"type": kind, "index": index}}))
  own = tmp_path / f"tmp_{kind}_{index}"
  own.mkdir()
  (own / "model.ckpt-1.index").write_text("x")
  other = tmp_path / "tmp_worker_7"
  other.mkdir()
  training.remove_own_worker_checkpoints(str(tmp_path))
  assert own.exists() is not removed
  assert other.exists()


def test_a_finished_run_exits_after_its_handlers_writers_and_streams(
    tmp_path):
  # The script's end without Python's teardown: what the teardown would
  # have done for a run is done first (exit handlers, a summary event not
  # yet flushed, a line still in stdout's buffer), and the exit is 0.
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415

  marker = tmp_path / "handler_ran"
  program = f"""
import atexit
import tensorflow as tf
from models import training
tf.compat.v1.disable_eager_execution()
atexit.register(lambda: open({str(marker)!r}, "w").close())
writer = tf.compat.v1.summary.FileWriterCache.get({str(tmp_path)!r})
writer.add_summary(tf.compat.v1.Summary(value=[
    tf.compat.v1.Summary.Value(tag="loss", simple_value=0.5)]), 7)
print("the run's last line")
training.end_finished_run()
print("not reached")
"""
  done = subprocess.run([sys.executable, "-c", program], capture_output=True,
                        text=True, cwd=os.path.dirname(os.path.dirname(
                            os.path.dirname(os.path.dirname(__file__)))),
                        timeout=120, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.splitlines()[-1:] == ["the run's last line"], done.stdout
  assert marker.exists()
  events = [event for path in tmp_path.glob("events.out.tfevents.*")
            for event in tf.compat.v1.train.summary_iterator(str(path))]
  assert [(e.step, v.tag, v.simple_value) for e in events
          for v in e.summary.value] == [(7, "loss", 0.5)]
