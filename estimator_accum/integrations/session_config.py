"""A session config whose Grappler skips the passes that change nothing a
training step computes on a CPU.

Grappler optimizes the whole graph again for every new set of fetches a
session runs, and an Estimator's `train()` runs about ten (initialization,
readiness checks, the saver, the step). In the main job (MiniLM, `python
run_classifier.py`, `TF_CPP_VMODULE=meta_optimizer=1`) three of its passes
changed the node count of none of those graphs: the memory optimizer (its
swapping serves GPUs), the layout optimizer (NHWC/NCHW for GPU
convolutions) and TFG's MLIR pipeline (on a small window's graph it routes
two constants through the window's branch; without it they are constants
of their own, tests/unit/test_lean_grappler.py). They took 3.2 s of a
run's start on a 2-core AMD EPYC without AVX-512 (docs/bert.md, "Grappler's
idle passes").
"""

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

from estimator_accum import _checks

_REWRITER = rewriter_config_pb2.RewriterConfig


def lean_grappler(session_config=None, *, gpu=None):
  """A copy of `session_config` without Grappler's idle passes on a CPU.

  `session_config`: a tf.compat.v1.ConfigProto, or None for the one
  Estimator makes on one machine (soft placement, one meta-optimizer
  iteration). Under TF_CONFIG's cluster pass the RunConfig's own
  `session_config` (Estimator fills in device filters there), not None.
  `gpu`: whether the process sees a GPU (None: ask TensorFlow). Where it
  does, the copy is `session_config` as given: the memory and layout
  optimizers serve GPUs, and this was measured on CPUs only.

  Off in the copy: TFG's optimizer, and unless `session_config` chose
  them itself, the memory optimizer (`NO_MEM_OPT`) and the layout
  optimizer.
  Every other pass (the remapper's fused products, constant folding, the
  arithmetic and dependency optimizers, function inlining) runs as before:
  a step runs the same ops but for where two constants come from, and
  trains to the same weights to the bit (tested); only the time to make
  its graph is shorter.
  """
  config = _checks.session_config_copy(session_config)
  if config is None:
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    config.graph_options.rewrite_options.meta_optimizer_iterations = (
        _REWRITER.ONE)
  if gpu not in (None, True, False):
    raise ValueError(f"gpu must be True, False or None (ask TensorFlow), "
                     f"got {_checks.short(gpu)}.")
  if gpu is None:
    gpu = bool(tf.config.list_physical_devices("GPU"))
  if gpu:
    return config
  options = config.graph_options.rewrite_options
  options.disable_tfg_optimizer = True
  if options.memory_optimization == _REWRITER.DEFAULT_MEM_OPT:
    options.memory_optimization = _REWRITER.NO_MEM_OPT
  if options.layout_optimizer == _REWRITER.DEFAULT:
    options.layout_optimizer = _REWRITER.OFF
  return config
