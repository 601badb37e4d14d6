"""The window options: one table, checked once into a frozen value.

`OPTIONS` lists every option a window takes, with its default, its check
and its documentation: the one list of them. Every entry point takes
exactly these, as keyword-only arguments written out in its signature:
`build_accumulating_train_op`, `AccumulatingOptimizer` and
`AccumulatingKerasOptimizer` (and through them the tf-slim and
canned-estimator paths). `WindowSettings`, a frozen dataclass with a field
per option, is the checked value the window's plan is made from; made or
replaced, it checks every field, as tensorflow/estimator's `RunConfig`
does.

A new option is a row here, a field of `WindowSettings`, an argument of
each entry point and the code that reads it; `tests/test_design.py` fails
until all of them agree with the table. Nothing is rewritten at import
time.
"""

from __future__ import annotations

import dataclasses
import numbers
import types

import tensorflow as tf

from estimator_accum import _checks
from estimator_accum.distribution import replicas
from estimator_accum.window.compact import SPARSE_THRESHOLD_BYTES
from estimator_accum.window.loss_scale import check_loss_scale

# See max_consecutive_skipped_windows.
DEFAULT_MAX_CONSECUTIVE_SKIPPED_WINDOWS = 25
DEFAULT_NAME = "gradient_accumulation"
# Packs of the window's all-reduce when no CommunicationOptions are given.
# One pack (TensorFlow's default) concatenates every gradient, reduces, and
# splits the result: two copies of the model and one collective that starts
# only when all of it is ready. Packs of about 4 MB run concurrently and
# leave variables of 4 MB and more uncopied (MLP of 3.2M parameters on 2 CPU
# workers, k=8: apply step 59-67 ms against 74-90 ms with one pack, 5 runs
# each; per-tensor packs and 2 MB alike, 8 MB in between).
BYTES_PER_PACK = 4 * 2**20


@dataclasses.dataclass(frozen=True)
class Option:
  """One window option.

  Attributes:
    name: the keyword argument.
    default: its value when not given.
    check: value -> the value to keep (normalized), raising TypeError or
      ValueError naming the option and the value.
    doc: what it does, for the entry points' docstrings and the guide.
  """

  name: str
  default: object
  check: object
  doc: str


def _check_reduction(value):
  _checks.check_reduction(value)
  return value


def _check_summaries(value):
  _checks.check_bool("summaries", value)
  return value


def _check_loss_scale(value):
  check_loss_scale(value)
  return value


def _check_sparse_accumulation(value):
  if isinstance(value, (str, bool)):
    if isinstance(value, str) and value != "auto":
      raise ValueError(
          "sparse_accumulation must be 'auto', True, False or a list of "
          f"variables or names, got {value!r}.")
    return value
  if isinstance(value, (list, tuple, set, frozenset)):
    return tuple(value)
  raise TypeError(
      "sparse_accumulation must be 'auto', True, False or a list of "
      f"variables or names, got {value!r}.")


def _check_threshold(value):
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(f"sparse_threshold_bytes must be an int, got {value!r}.")
  if value < 0:
    raise ValueError(f"sparse_threshold_bytes must be >= 0, got {value!r}.")
  return int(value)


def _check_communication_options(value):
  return replicas.communication_options(value, BYTES_PER_PACK)


def _check_table_all_reduce(value):
  if value not in ("auto", "rows", "dense"):
    raise ValueError(f"table_all_reduce must be 'auto', 'rows' or 'dense', "
                     f"got {value!r}.")
  return value


def _check_communication_dtype(value):
  if value is None:
    return None
  try:
    dtype = tf.as_dtype(value)
  except TypeError:
    dtype = None
  if dtype not in (tf.bfloat16, tf.float16, tf.float32):
    raise ValueError(
        f"communication_dtype must be None, 'bfloat16', 'float16' or "
        f"'float32', got {value!r}.")
  return None if dtype == tf.float32 else dtype


def _check_accumulator_placement(value):
  if value not in ("device", "host", "sharded"):
    raise ValueError(f"accumulator_placement must be 'device', 'host' or "
                     f"'sharded', got {value!r}.")
  return value


def _check_overlap_backward(value):
  _checks.check_bool("overlap_backward", value)
  return value


def _check_sequential_apply(value):
  _checks.check_bool("sequential_apply", value)
  return value


def _check_fused_apply(value):
  _checks.check_bool("fused_apply", value)
  return value


def _check_after_update(value):
  if value is not None and not callable(value):
    raise TypeError(
        f"after_update must be a callable with no arguments or None, got "
        f"{value!r} of type {type(value).__name__}.")
  return value


def _check_name(value):
  _checks.check_name(value)
  return value


OPTIONS = (
    Option("clip_norm", None, _checks.check_clip_norm,
           "float > 0 or None. Clips the window's gradient (the mean, after "
           "the all-reduce) by global norm, as clipping the big batch "
           "would, not each micro-batch."),
    Option("reduction", "mean", _check_reduction,
           "\"mean\" (the big batch's mean; weighted by `num_examples` when "
           "given), \"sum\" (no division; for summed losses), or "
           "\"running_mean\" (the accumulators hold the mean so far, which "
           "keeps low-precision accumulators in range). The optimizer "
           "wrappers also take None: the loss's own reduction."),
    Option("accumulator_dtype", tf.float32, _checks.check_accumulator_dtype,
           "floating tf.DType (or its name) of the accumulators; float32."),
    Option("accumulator_placement", "device", _check_accumulator_placement,
           "\"device\" (the accumulators beside the variables) or \"host\" "
           "(in the host's memory, one replica only: the device keeps no "
           "copy of the model for the window, and each micro-batch's "
           "gradient crosses to the host once, read back once per window), "
           "or \"sharded\" (under N replicas each keeps 1/N of the window's "
           "dense sums: every micro-batch all-reduces its gradient; "
           "reduction 'mean' without num_examples, or 'sum'; checkpoints "
           "resume at windows' ends only). Exact each way."),
    Option("summaries", True, _check_summaries,
           "bool, whether to add TensorBoard scalars `accumulation/*`."),
    Option("loss_scale", None, _check_loss_scale,
           "None, \"dynamic\", a number > 0, or \"auto\" (\"dynamic\" "
           "when the loss, or a gradient given, is computed through float16 "
           "values, a mixed_float16 model's, read when the window is first "
           "built, else None; AccumulatingKerasOptimizer's default): scale "
           "the loss for float16 "
           "models. Gradients are unscaled in float32 as they enter the "
           "accumulators; a window with an overflow is skipped whole, and a "
           "dynamic scale is halved there and doubled after 2000 good "
           "windows in a row. A loss-scale optimizer (tf.compat.v1 or Keras) "
           "passed as the optimizer is unwrapped and its settings used "
           "instead (pass the unscaled loss)."),
    Option("sparse_accumulation", "auto", _check_sparse_accumulation,
           "how tables with tf.IndexedSlices gradients (embedding lookups) "
           "are accumulated. \"auto\": compact (the rows the window touched "
           "only) when a masked accumulator (a dense sum with a row mask) "
           "would take at least `sparse_threshold_bytes`, else masked. "
           "True: every such table compact; False: none; or a list of "
           "variables or names to accumulate compactly. Compact "
           "accumulation needs one replica (one device, or parameter-server "
           "workers)."),
    Option("sparse_threshold_bytes", SPARSE_THRESHOLD_BYTES, _check_threshold,
           "int >= 0, the table size from which \"auto\" chooses compact "
           "accumulation; 128 MB."),
    Option("communication_options", None, _check_communication_options,
           "a tf.distribute.experimental.CommunicationOptions for the "
           "window's all-reduce under a collective strategy, or None: packs "
           "of about 4 MB, which run concurrently and skip most of the "
           "concatenate-and-split copies one pack would make."),
    Option("table_all_reduce", "auto", _check_table_all_reduce,
           "how a masked table's window crosses replicas: \"rows\" (its "
           "row mask with the dense gradients, then only the rows touched "
           "on any replica, in a second round), \"dense\" (the whole "
           "table), or \"auto\": by rows for tables of 1 MB or more whose "
           "window cannot touch every row. Exact either way."),
    Option("communication_dtype", None, _check_communication_dtype,
           "None (float32), \"bfloat16\" or \"float16\": the dtype the "
           "window's gradient sums take on the wire; accumulation, counts, "
           "clipping and the apply stay float32. Rounds the window's "
           "gradient: off by default."),
    Option("overlap_backward", True, _check_overlap_backward,
           "bool. True: the window's all-reduce starts during the last "
           "micro-batch's backward pass, each pack (in the order the "
           "backward makes the gradients) once its own accumulators hold "
           "the micro-batch. False: it waits for the whole micro-batch. "
           "Exact either way."),
    Option("sequential_apply", True, _check_sequential_apply,
           "bool. True: the window's end hands the optimizer one "
           "variable's gradient at a time, so that its temporaries (the "
           "clipped gradient, Adam's new moments) live for one variable at "
           "a time, not for the whole model at once; left as it is when an "
           "update reads several variables' gradients. False: every "
           "variable's update may run at once. Exact either way."),
    Option("fused_apply", False, _check_fused_apply,
           "bool. True: XLA compiles the window's apply (the gradients' "
           "scale, the optimizer's arithmetic, the writes of the variables "
           "and their slots), one pass over memory per variable instead of "
           "one per step of the arithmetic, compiled once at the first "
           "window's end. On one replica outside a distribution strategy, "
           "its variables on one device of its own task, "
           "with dense gradients (an embedding lookup's is sparse, but an "
           "optimizer that applies it as the dense gradient its rows sum "
           "to, such as BERT's AdamWeightDecay and LAMB, is handed that "
           "one), the whole apply is one jit_compile "
           "function, which writes the variables and slots in place (no "
           "buffer the size of a variable); under a strategy, with "
           "variables on several devices or a parameter server, with "
           "another optimizer's sparse gradient or reference variables, or "
           "where XLA "
           "cannot compile an op of the apply (said in a line), each "
           "variable's update is compiled apart and such ops run as they "
           "are. Equal to the unfused update up to float32 rounding (XLA "
           "orders some arithmetic differently). Off, said in a line, on "
           "TensorFlow 2.15 with XLA's persistent cache over the CPU "
           "(TF_XLA_FLAGS), where every XLA compile on a CPU fails. False: "
           "TensorFlow's ops, one by one. Either way, on one replica, an "
           "optimizer that applies in one pass (its applies_in_one_pass: "
           "models.bert's AdamWeightDecay on the CPU, one native op a "
           "variable, TensorFlow's ops' values bit for bit) is handed the "
           "window and its scale and nothing is compiled for the apply; "
           "True then still zeroes the window's sums in place."),
    Option("after_update", None, _check_after_update,
           "a callable with no arguments, or None: what a big-batch recipe "
           "runs after its train op every step, such as an "
           "ExponentialMovingAverage's apply. Called once while the graph "
           "is built; the ops it creates run after each micro-batch that "
           "applies an update, and only then. A count it needs should be "
           "`update_count(k)` created inside the callable."),
    Option("log_every_n_micro_batches", 100, _checks.check_log_every,
           "int >= 1 or None. The train op logs a progress line (micro-batch, "
           "update, skipped windows, micro-batches/sec, examples/sec) at the "
           "first micro-batch, at the end of the first window and then every "
           "this many; None for none. Build with None a graph that another "
           "process will import (`import_meta_graph`) and run."),
    Option("max_consecutive_skipped_windows",
           DEFAULT_MAX_CONSECUTIVE_SKIPPED_WINDOWS, _checks.check_max_skipped,
           "int >= 1 or None. When this many windows in a row are skipped "
           "for non-finite gradients, the micro-batch ending the last of them "
           "fails with tf.errors.InvalidArgumentError saying \"training "
           "diverged\" (`estimator_accum.is_divergence(error)`). Default 25: "
           "a dynamic loss scale from 2**15 skips at most about 15 in a row "
           "while it settles. Counted in this run; None: never stop."),
    Option("name", DEFAULT_NAME, _check_name,
           "str, the name scope of the window's ops and the prefix of its "
           "counters. The optimizer wrappers also take None: "
           "\"gradient_accumulation\", or \"gradient_accumulation_1\", ... "
           "where another train op of the graph took it."),
)
OPTION_NAMES = tuple(option.name for option in OPTIONS)
DEFAULTS = types.MappingProxyType({o.name: o.default for o in OPTIONS})


@dataclasses.dataclass(frozen=True)
class WindowSettings:
  """The window's options, checked once, and `k`: a frozen value, as
  Estimator's `RunConfig` is.

  Its fields are `k`, the options of `OPTIONS` (in the table's order, with
  the table's defaults: `tests/test_design.py` checks both, and the
  table documents each), and `gradient_options`, the `tf.gradients`
  arguments for the loss (colocate_gradients_with_ops, and optionally
  grad_ys, aggregation_method, gate_gradients), read-only. Made, and
  `dataclasses.replace`d, it checks every field (`__post_init__`): a
  TypeError or ValueError names the argument and the value.
  """

  k: int
  clip_norm: object = None
  reduction: object = "mean"
  accumulator_dtype: object = tf.float32
  accumulator_placement: str = "device"
  summaries: bool = True
  loss_scale: object = None
  sparse_accumulation: object = "auto"
  sparse_threshold_bytes: int = SPARSE_THRESHOLD_BYTES
  communication_options: object = None
  table_all_reduce: str = "auto"
  communication_dtype: object = None
  overlap_backward: bool = True
  sequential_apply: bool = True
  fused_apply: bool = False
  after_update: object = None
  log_every_n_micro_batches: object = 100
  max_consecutive_skipped_windows: object = (
      DEFAULT_MAX_CONSECUTIVE_SKIPPED_WINDOWS)
  name: str = DEFAULT_NAME
  gradient_options: types.MappingProxyType = dataclasses.field(
      default_factory=lambda: types.MappingProxyType(
          {"colocate_gradients_with_ops": False}))

  def __post_init__(self):
    """The one validation: each option by the table's check, in its order."""
    checked = {"k": _checks.check_k(self.k)}
    for option in OPTIONS:
      checked[option.name] = option.check(getattr(self, option.name))
    gradient_options = dict(self.gradient_options)
    gradient_options.setdefault("colocate_gradients_with_ops", False)
    _checks.check_bool("colocate_gradients_with_ops",
                       gradient_options["colocate_gradients_with_ops"])
    checked["gradient_options"] = types.MappingProxyType(gradient_options)
    for name, value in checked.items():
      object.__setattr__(self, name, value)

  @classmethod
  def checked(cls, k, **options):
    """A WindowSettings of `k` and `options` (the table's names, and
    `gradient_options`); an unknown name is a TypeError listing them."""
    unknown = set(options) - set(OPTION_NAMES) - {"gradient_options"}
    if unknown:
      raise TypeError(f"unknown window settings: {sorted(unknown)}; the "
                      f"window options are {list(OPTION_NAMES)}.")
    return cls(k, **options)

  def replace(self, **changes):
    """A copy with `changes`, checked as `checked` checks them."""
    unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
    if unknown:
      raise TypeError(f"unknown window settings: {sorted(unknown)}.")
    return dataclasses.replace(self, **changes)


def window_options(arguments):
  """{option name: value} of an entry point's arguments (its `locals()`),
  for the options of the table: what the entry points pass on."""
  return {name: arguments[name] for name in OPTION_NAMES}


def config_value(name, value):
  """An option's value as a Keras config holds it (a dtype by name)."""
  if isinstance(value, tf.DType):
    return value.name
  return value
