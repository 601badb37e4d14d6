"""The one place that knows `tf.distribute`.

Everything else in the library asks these modules, never `tf.distribute`
itself (`tests/test_design.py` checks):

- `replicas.py`: replica versus cross-replica context (`replica_id`,
  `in_replica_context`, `merge`), the number of replicas, the window's
  all-reduce and per-replica work (`CrossReplica`), variables each replica
  keeps for itself (`sync_on_read`, `replica_components`), the all-reduce's
  `communication_options`, and the flag that tells Estimator the loss is a
  mean over replicas.
- `apply.py`: handing the already-reduced window to an optimizer
  (`apply_reduced`) and creating its slots outside the window's `tf.cond`.
- `placement.py`: where a parameter-server worker keeps its window.
- `workers.py`: worker identity (`training_tasks`) and the loss each worker
  reports on its own; the one import of a private `tensorflow.python`
  module (`values.Mirrored`).
- `watchdog.py`: a lost peer ends a multi-task job in bounded time.
- `preemption.py`: SIGTERM saves the open window and exits 143;
  `stop_requests.py` carries the stop between a parameter-server job's
  tasks (a counter on ps task 0).
"""
