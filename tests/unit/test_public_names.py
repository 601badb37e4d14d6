"""The public names, pinned: what a user's script calls is on the package
(or `estimator_accum.estimator`, `estimator_accum.keras`), listed in each
`__all__` and in docs/reference.md, documented, and never disappears
without a shim. A name that moved keeps working for a release with a
DeprecationWarning naming its new home."""

import importlib
import pathlib
import subprocess
import sys
import warnings

import pytest

import estimator_accum

ROOT = pathlib.Path(__file__).resolve().parents[2]
REFERENCE = (ROOT / "docs" / "reference.md").read_text()

# Every public name, by module. Removing one fails here: give it a shim
# (below) for a release first.
PUBLIC = {
    "estimator_accum": [
        "AccumulatingKerasOptimizer", "AccumulatingOptimizer",
        "AccumulationLoggingHook", "AccumulationState", "Accumulator",
        "BackupAndRestore", "CompactSparseAccumulator", "Estimator",
        "EstimatorSpec", "EvalSpec", "EveryStepSummaryHook",
        "LeanCheckpointSaverHook", "MicroBatchPlan", "ModeKeys",
        "OutOfMemory", "PredictOutput", "RunConfig", "SPARSE_THRESHOLD_BYTES",
        "ServingInputReceiver", "TrainSpec", "WindowBatchNormalization",
        "WindowTraceHook", "adjusted_momentum", "batch_norm",
        "build_accumulating_train_op", "cast_once_per_window",
        "coordination_heartbeat",
        "estimator_step", "get_accumulation_state", "halve_checkpoint",
        "hold_run_lock", "is_divergence", "is_full_disk", "keyed_dropout",
        "lean_grappler", "measure_peak", "own_threads", "plan_micro_batch",
        "recompute", "remove_cut_saves", "reportable_loss",
        "resume_from_complete", "train_and_evaluate", "train_halving_on_oom",
        "update_count", "watch_cluster", "window_batches", "without_autotune",
    ],
    "estimator_accum.estimator": [
        "Estimator", "EstimatorSpec", "EvalSpec", "ModeKeys", "PredictOutput",
        "RunConfig", "ServingInputReceiver", "TrainSpec", "train_and_evaluate",
    ],
    "estimator_accum.keras": [
        "AccumulatingKerasOptimizer", "BackupAndRestore",
        "WindowBatchNormalization",
    ],
}

# Names that moved: old module, name -> the new home's module.
MOVED = [
    ("tfconfig.health", "watch", "estimator_accum.distribution.health"),
    ("tfconfig.health", "coordination_heartbeat",
     "estimator_accum.distribution.health"),
    ("tfconfig.health", "PEER_LOST_EXIT", "estimator_accum.distribution.health"),
    ("tfconfig.config", "from_environment", "clusterspec.config"),
    ("tfconfig.config", "build", "clusterspec.config"),
    ("tfconfig.config", "TFConfigError", "clusterspec.config"),
    ("estimator_accum.integrations.session_runner", "SessionEstimator",
     "estimator_accum.estimator.runner"),
    ("estimator_accum.integrations.session_runner", "RunSettings",
     "estimator_accum.estimator.runner"),
    ("estimator_accum.integrations.session_runner", "model_spec",
     "estimator_accum.estimator.runner"),
]


# A fresh interpreter, as a user's (not the suite's fork server, whose
# processes have TensorFlow, and more, imported already).
_FRESH = {"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin",
          "ESTIMATOR_ACCUM_TEST_FORK": "0"}


def _fresh_python(script):
  result = subprocess.run([sys.executable, "-c", script], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=_FRESH)
  assert result.returncode == 0, result.stderr[-2000:]
  return result


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_is_there_listed_and_documented(module):
  loaded = importlib.import_module(module)
  assert sorted(loaded.__all__) == sorted(PUBLIC[module])
  for name in PUBLIC[module]:
    value = getattr(loaded, name)
    if name != "SPARSE_THRESHOLD_BYTES":
      assert value.__doc__, f"{module}.{name} has no docstring"
    assert f"`{name}`" in REFERENCE, f"docs/reference.md does not name {name}"


@pytest.mark.parametrize("old, name, new", MOVED)
def test_a_moved_name_works_and_warns_with_its_new_home(old, name, new):
  module = importlib.import_module(old)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    value = getattr(module, name)
  assert value is getattr(importlib.import_module(new), name)
  assert [w.category for w in caught] == [DeprecationWarning]
  assert new in str(caught[0].message), caught[0].message


def test_a_script_on_the_old_watchdog_name_runs_and_is_told():
  """As docs/distributed.md gave it until 2026-12: `import tfconfig.health;
  tfconfig.health.watch(...)`. The warning shows with Python's default
  filters (it points at the script's own line)."""
  script = ("import tfconfig.health\n"
            "print(tfconfig.health.watch.__name__, "
            "tfconfig.health.DEFAULT_TIMEOUT)\n")
  result = _fresh_python(script)
  assert result.stdout.split() == ["watch", "60.0"]
  assert ("DeprecationWarning: tfconfig.health.watch moved: use "
          "estimator_accum.distribution.health.watch") in result.stderr


def test_the_public_names_import_nothing_of_tf_estimator_until_asked():
  """`import estimator_accum` does not load tf.estimator (2.15's is slow
  to import and prints its own warnings); `EstimatorSpec` loads it."""
  script = ("import sys, estimator_accum\n"
            "print('tensorflow_estimator' in sys.modules)\n"
            "estimator_accum.EstimatorSpec\n"
            "print('tensorflow_estimator' in sys.modules)\n")
  result = _fresh_python(script)
  has_estimator = estimator_accum.releases.estimator() is not None
  assert result.stdout.split() == ["False", str(has_estimator)]
