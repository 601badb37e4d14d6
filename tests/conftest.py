"""pytest fixtures shared by the test suite."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# Two logical CPU devices for the MirroredStrategy tests. This must happen
# before TensorFlow's runtime starts, so at import, before any test.
NUM_LOGICAL_CPUS = 2
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)


# The fast tier (`pytest -m "not slow"`, about 2 minutes on 2 cores): the
# modules that check the library in one process on small graphs. Every
# other module (whole Estimator jobs, BERT, multi-process clusters) is
# marked slow; CI runs both tiers.
FAST_MODULES = frozenset({
    "test_window_unit", "test_divergence", "test_errors", "test_step_counting",
    "test_partitioned", "test_ref_variables", "test_object_checkpoints",
    "test_classification_data", "test_bert_google_api",
    "test_bert_optimization", "test_tfconfig", "test_accumulator_dtypes",
    "test_after_update", "test_graph_footprint", "test_graph_lifetime",
    "test_observability", "test_sparse_accumulation", "test_optimizer_wrapper",
    "test_docs", "test_settings", "test_save_barrier", "test_planner",
})


def pytest_collection_modifyitems(config, items):
  del config
  for item in items:
    if item.module.__name__.rsplit(".", 1)[-1] not in FAST_MODULES:
      item.add_marker(pytest.mark.slow)


@pytest.fixture(params=["cf_v2", "cf_v1"])
def control_flow(request):
  """Runs the test under control flow v2 (TF 2 default) and v1."""
  if request.param == "cf_v1":
    tf.compat.v1.disable_control_flow_v2()
  else:
    tf.compat.v1.enable_control_flow_v2()
  yield request.param
  tf.compat.v1.enable_control_flow_v2()
