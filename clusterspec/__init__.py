"""What the library and the launcher agree on, in pure Python (no
TensorFlow): TF_CONFIG's format (`clusterspec.config`: parse, validate,
build) and the exit codes and marker directory of the task-health
watchdog (`clusterspec.health_format`).

`estimator_accum` (the training processes) and `tfconfig` (the launcher)
both import it; the library imports nothing of the launcher.
"""
