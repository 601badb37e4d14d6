"""TF_CONFIG: build, parse and validate it; launch a local cluster."""

from tfconfig.config import (
    TFConfigError,
    build,
    describe,
    for_task,
    from_environment,
    parse,
    tasks,
    validate,
)
from tfconfig.launch import local_cluster, run_cluster

__all__ = ["TFConfigError", "build", "describe", "for_task", "from_environment",
           "local_cluster", "parse", "run_cluster", "tasks", "validate"]
