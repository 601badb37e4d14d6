"""Measuring one candidate of the planner: the accumulating step built at
a micro-batch and k in a fresh graph, run on real input, and the
allocator's peak of tensor memory read after each micro-batch
(`measure_peak`); the device, its allocator's statistics and the session's
own threads it needs. The search over candidates is `planner.py`'s.
"""

import gc
import time

import tensorflow as tf

from estimator_accum import _checks, runtime_private
from estimator_accum.planning.plan import Measurement

__all__ = ["built_step", "check_build", "check_memory_statistics",
           "default_device", "free_device_memory", "measure_peak",
           "own_threads"]

# Micro-batches run per candidate: two windows of k=2.
MEASURED_MICRO_BATCHES = 4


def default_device():
  """'GPU:0' when TensorFlow sees a GPU, else 'CPU:0'."""
  return "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"


def free_device_memory(device):
  """The bytes TensorFlow's allocator may use on a GPU `device` (its memory
  limit: what was free when TensorFlow started, less a reserve)."""
  index = int(device.rsplit(":", 1)[-1])
  gpus = [d for d in runtime_private.local_devices()
          if d.device_type == "GPU"]
  return int(gpus[index].memory_limit)


def check_memory_statistics(device):
  """ValueError in one line when `device`'s allocator keeps no statistics
  to measure with: TensorFlow's plain CPU allocator (the one it uses with
  oneDNN off, the default on CPUs without AVX-512) keeps none; the BFC
  allocator does, when TF_CPU_ALLOCATOR_USE_BFC=true was set before
  TensorFlow started."""
  try:
    tf.config.experimental.get_memory_info(device)
  except ValueError as error:
    if "not available" not in str(error):
      raise ValueError(f"device={device!r}: {error}") from None
    raise ValueError(
        f"device={device!r}: its allocator keeps no memory statistics to "
        "measure with; set TF_CPU_ALLOCATOR_USE_BFC=true in the environment "
        "before TensorFlow starts (the BFC allocator, as a GPU's, keeps "
        "them)") from None


def own_threads(session_config):
  """A copy of `session_config` (None: TensorFlow's defaults) whose session
  runs its ops on the inter-op threads it asks for.

  A graph session's inter-op pool is process-wide unless the config says
  `use_per_session_threads`: the process's first session makes it with its
  own `inter_op_parallelism_threads`, and every later session uses it,
  whatever it asks. A measurement asked on one thread, in a process that
  had run a default session before, ran on several, in an order (and so to
  a peak) that differed from run to run. (The intra-op pool is process-wide
  too; it splits one op's work and did not move the peaks measured.)"""
  config = _checks.session_config_copy(session_config)
  if config is None:
    config = tf.compat.v1.ConfigProto()
  if (config.inter_op_parallelism_threads > 0 and
      not config.session_inter_op_thread_pool):
    config.use_per_session_threads = True
  return config


def measure_peak(build, micro_batch, k, device=None,
                 micro_batches=MEASURED_MICRO_BATCHES, session_config=None,
                 **memory_options):
  """Builds `build(micro_batch, k, **memory_options)` in a fresh graph, runs
  it `micro_batches` times after initializing, and returns a Measurement of
  the allocator's peak bytes on `device` (None if it ran out of memory) and
  of the micro-batches' mean time after the first window (after the first
  micro-batch when no whole window follows it). `memory_options`:
  `recompute` and `accumulator_placement`, for a `build` that takes them.
  `session_config`: the tf.compat.v1.ConfigProto the job runs with (its
  threads decide the order ops run in, and so what is alive at once);
  default TensorFlow's."""
  check_build(build)
  micro_batch = _checks.check_positive_int("micro_batch", micro_batch)
  k = _checks.check_k(k)
  micro_batches = _checks.check_positive_int("micro_batches", micro_batches)
  device = device or default_device()
  check_memory_statistics(device)
  started = time.perf_counter()
  graph, config, fetch, init = built_step(build, micro_batch, k,
                                          session_config, memory_options)
  try:
    run_peaks, step_seconds = _run(graph, config, init, fetch, device, k,
                                   micro_batches)
    peak = max(run_peaks)
  except tf.errors.ResourceExhaustedError:
    peak = step_seconds = None
    run_peaks = []
  except tf.errors.OutOfRangeError:
    raise ValueError(
        f"the input ended before {micro_batches} micro-batches of "
        f"{micro_batch}: planning runs that many (repeat the input)"
    ) from None
  finally:
    del graph, fetch
    gc.collect()
  # After the first window (whose end makes the optimizer's slots), the
  # last micro-batch that adds and the last that ends a window.
  settled = run_peaks[k:]
  adding = [p for i, p in enumerate(settled, k) if (i + 1) % k]
  ending = [p for i, p in enumerate(settled, k) if not (i + 1) % k]
  return Measurement(micro_batch, k, peak, time.perf_counter() - started,
                     step_seconds, memory_options.get("recompute", False),
                     memory_options.get("accumulator_placement", "device"),
                     adding[-1] if adding else None,
                     ending[-1] if ending else None)


def built_step(build, micro_batch, k, session_config, memory_options):
  """(graph, config, fetch, init): `build(micro_batch, k,
  **memory_options)` in a fresh graph, its fetch checked, the initializers,
  and the session config on threads of its own that may place ops softly.
  Whoever runs it deletes the graph and collects afterwards."""
  config = own_threads(session_config)
  config.allow_soft_placement = True
  # What earlier work left for the collector (an input pipeline's iterator
  # in a reference cycle keeps its threads filling buffers): gone before
  # the step is measured, not allocating during it.
  gc.collect()
  graph = tf.Graph()
  with graph.as_default():
    fetch = _checked_fetch(build(micro_batch, k, **memory_options), graph,
                           micro_batch, k)
    init = [tf.compat.v1.global_variables_initializer(),
            tf.compat.v1.local_variables_initializer(),
            tf.compat.v1.tables_initializer()]
  return graph, config, fetch, init


def _run(graph, config, init, fetch, device, k, micro_batches):
  """Runs `fetch` `micro_batches` times in a session of `graph` after
  `init`; returns (the allocator's peak on `device` in each run, the mean
  seconds of the runs after the first window, or None)."""
  run_peaks, step_seconds = [], None
  with tf.compat.v1.Session(graph=graph, config=config) as session:
    session.run(init)
    # Timed after the first window when a whole one follows it: its end
    # makes the optimizer's slots and compiles a fused apply (XLA: most of
    # a second, once), which would otherwise count at k > 1 and not at
    # k = 1, and bias the model against small micro-batches.
    untimed = k if micro_batches > k else 1
    timed = None
    for run in range(micro_batches):
      tf.config.experimental.reset_memory_stats(device)
      session.run(fetch)
      run_peaks.append(
          int(tf.config.experimental.get_memory_info(device)["peak"]))
      if run == untimed - 1:
        timed = time.perf_counter()
    if micro_batches > untimed:
      step_seconds = (time.perf_counter() - timed) / (micro_batches - untimed)
  return run_peaks, step_seconds


def check_build(build):
  """Refuses a `build` that is not callable, in one line."""
  if not callable(build):
    raise TypeError(
        "build must be a callable build(micro_batch, k) that returns the "
        f"train op, got {_checks.short(build)} of type "
        f"{type(build).__name__}.")


def _checked_fetch(fetch, graph, micro_batch, k):
  """`fetch`, what `build(micro_batch, k)` returned, if a session can run
  it in `graph` (an op, a tensor, a variable, or a list or dict of them);
  else a one-line error naming `build` and what it returned."""
  if fetch is None:
    raise ValueError(f"build({micro_batch}, {k}) returned None: it must "
                     "return the train op (what one micro-batch runs)")
  for element in tf.nest.flatten(fetch):
    try:
      graph.as_graph_element(element, allow_tensor=True,
                             allow_operation=True)
    except (TypeError, ValueError):
      why = (f"{type(element).__name__} is not something a session runs"
             if getattr(element, "graph", graph) is graph else
             "it was made in another graph than the one build is called in")
      raise TypeError(
          f"build({micro_batch}, {k}) returned {_checks.short(fetch, 120)}: "
          f"it must return the train op (what one micro-batch runs); {why}"
      ) from None
  return fetch
