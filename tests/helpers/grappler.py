"""The suite's TensorFlow sessions run without Grappler, unless their
config asks it for a pass or the test is about what it does.

Why: Grappler optimizes the graph again for every new set of fetches a
session runs (an Estimator's `train()` runs about ten: initialization,
readiness checks, the step with and without its hooks' tensors, the saver),
and the suite's graphs are small and run a few steps each. Measured on an
AMD EPYC with AVX-512, 2 cores (busy CPU-s of the machine around
`pytest -n 0 tests/integration/test_exact_optimizers.py`): 74.4 with
TensorFlow's default Grappler, 45.1 without it.

A config that asks Grappler for a pass (a toggle ON, a memory optimizer, a
custom optimizer) runs TensorFlow's default Grappler untouched, except
MultiWorkerMirroredStrategy's own request for its scoped allocator (which
merges the all-reductions of a step): alone, that does not keep Grappler
on. Measured the same way: a two-worker run_classifier job on the tiny
BERT 27 s of CPU with it, 19 s without; the multi-worker modules of the
suite 347 -> 317 s. The multi-worker tests of a window's exactness are
marked `grappler`, so the scoped allocator's merged all-reductions are
still checked against the big batch. The tests whose subject is the graph
Grappler makes or the memory a step takes (the `memory` and `grappler`
markers: allocator peaks, the planner, executor orders, folded constants,
oneDNN's fused layer norm, XLA marks) run TensorFlow's defaults too;
`ESTIMATOR_ACCUM_TEST_GRAPPLER=default` runs any test as users run it, and
CI runs the fast tier that way. Grappler's rewrites keep the graph's
meaning (TensorFlow's contract); the exactness tests compare accumulated
training with plain TensorFlow under the same setting.

Installed in the pytest process (tests/conftest.py) and in every Python
child of the session (tests/helpers/fork_site/sitecustomize.py), on
TensorFlow's import; read at each session's creation, so a test's
environment decides for its children too. The product never uses this.
"""

import importlib.abc
import importlib.util
import os
import sys

ENV = "ESTIMATOR_ACCUM_TEST_GRAPPLER"
DEFAULT = "default"  # TensorFlow's own Grappler, as users run it
_SESSION_MODULE = "tensorflow.python.client.session"
# MultiWorkerMirroredStrategy asks for this in every session's config: not
# a reason to keep Grappler (the tests marked grappler run it).
_NOT_A_REASON = ("scoped_allocator_optimization",)


def turned_off():
  """Whether sessions created now run without Grappler (unless asked)."""
  return os.environ.get(ENV, "off") != DEFAULT


def without_grappler(config):
  """A copy of `config` (a ConfigProto or None) that turns Grappler off,
  unless `config` asks it for a pass (then the copy is `config` as is)."""
  from tensorflow.core.protobuf import config_pb2
  result = config_pb2.ConfigProto()
  if config is not None:
    result.CopyFrom(config)
  options = result.graph_options.rewrite_options
  if not _asks_for_a_pass(options):
    options.disable_meta_optimizer = True
  return result


def _asks_for_a_pass(options):
  """Whether RewriterConfig `options` turns a pass on (a toggle ON or
  more, a memory optimizer chosen, a custom optimizer), other than
  MultiWorkerMirroredStrategy's scoped allocator."""
  from tensorflow.core.protobuf import rewriter_config_pb2
  rewriter = rewriter_config_pb2.RewriterConfig
  toggle = rewriter.DESCRIPTOR.enum_types_by_name["Toggle"]
  for field, value in options.ListFields():
    if field.name in _NOT_A_REASON:
      continue
    if field.enum_type is toggle and value not in (rewriter.DEFAULT,
                                                   rewriter.OFF):
      return True
  return bool(options.custom_optimizers) or (
      options.memory_optimization not in (rewriter.DEFAULT_MEM_OPT,
                                          rewriter.NO_MEM_OPT))


def _patch(session_module):
  base = session_module.BaseSession
  if getattr(base.__init__, "_estimator_accum_test", False):
    return
  original = base.__init__

  def __init__(self, target="", graph=None, config=None):
    if turned_off():
      config = without_grappler(config)
    original(self, target, graph, config)

  __init__._estimator_accum_test = True
  base.__init__ = __init__


class _AfterImport(importlib.abc.MetaPathFinder):
  """Patches TensorFlow's session module as soon as it is imported."""

  def find_spec(self, name, path=None, target=None):
    if name != _SESSION_MODULE:
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
      return spec
    execute = spec.loader.exec_module

    def exec_module(module):
      execute(module)
      _patch(module)

    spec.loader.exec_module = exec_module
    return spec


def install():
  """Patches sessions now if TensorFlow is imported, else on its import."""
  if _SESSION_MODULE in sys.modules:
    _patch(sys.modules[_SESSION_MODULE])
  elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterImport())
