"""TF_CONFIG: build, parse and validate it; launch a local cluster."""

from clusterspec.config import (
    TFConfigError,
    build,
    check_strategy,
    describe,
    for_task,
    from_environment,
    parse,
    tasks,
    tensorflow_form,
    use_environment,
    validate,
)
from tfconfig.launch import local_cluster, run_cluster

__all__ = ["TFConfigError", "build", "check_strategy", "describe", "for_task",
           "from_environment", "local_cluster", "parse",
           "run_cluster", "tasks", "tensorflow_form", "use_environment",
           "validate"]
