"""`AccumulatingKerasOptimizer` around a Keras 3 optimizer (TensorFlow
2.16+'s default `tf.keras`, TensorFlow backend).

A Keras 3 optimizer that holds the one it is given, as Keras 3's own
`LossScaleOptimizer` does: each call of `apply` (one micro-batch) adds the
micro-batch's gradients, weighted by its examples, to an accumulator; the
k-th applies the window's mean, clipped, through the inner optimizer and
clears the accumulators. So `model.fit(dataset.batch(b))` with k trains as
`dataset.batch(k * b)` does, the short last batch of an epoch included
(Keras 3's own `gradient_accumulation_steps` weighs it as a full one), and
the inner optimizer's weight decay, clipping and learning-rate schedule see
one update per window.

The micro-batch's examples are the leading dimension of the batch its
gradients are computed from, read from the step function's graph (Keras's
`train_step`, or a custom training loop's tf.function); run eagerly, where
there is no graph to read, every micro-batch weighs the same.

Under a distribution strategy each replica adds its own micro-batches to
its own copy of the accumulators (variables synchronized on read, summed):
nothing crosses devices until the window's end, where the inner optimizer
all-reduces the window once, as it would a big batch's gradients. The
window's end runs in a cond taken in cross-replica context, as Keras 3's
LossScaleOptimizer takes its own (a cond in a replica's context may not
hold the inner optimizer's merge_call; Keras 3's own
`gradient_accumulation_steps` fails there for that reason).

Imported by `AccumulatingKerasOptimizer` when it is given a Keras 3
optimizer: the class subclasses Keras 3's.
"""

import keras
import tensorflow as tf

from estimator_accum import _checks, keras_private, tf_private
from estimator_accum.distribution import replicas
from estimator_accum.keras import batch_norm_keras3
from estimator_accum.keras.variables_keras3 import (
  replica_sum,
  takes_synchronization,
)
from estimator_accum.window import reductions, reports

__all__ = ["AccumulatingKeras3Optimizer"]

_REDUCTIONS = ("mean", "sum")
# The Keras 3 wrapper's own arguments; the other window options are the
# tf-keras wrapper's (they run in the library's graph window).
_TAKES = ("k", "clip_norm", "reduction", "name")


def _examples_of(gradients):
  """The number of examples of the micro-batch `gradients` are computed
  from, as a float32 tensor: the leading dimension of the step function's
  batch (a tf.function's argument, or an input pipeline's get_next) they
  depend on, followed out of cond branches (Keras 3's LossScaleOptimizer
  calls `apply` in one); None run eagerly or when no batch is found."""
  tensors = [g.values if isinstance(g, tf.IndexedSlices) else g
             for g in gradients if g is not None]
  if not tensors or not all(hasattr(t, "graph") for t in tensors):
    return None
  seen, pending, batches = set(), [t.op for t in tensors], []
  while pending:
    op = pending.pop()
    if op in seen:
      continue
    seen.add(op)
    outer = _captured_from(op)
    if outer is not None:
      if tf.is_symbolic_tensor(outer):  # (not a constant captured eagerly)
        pending.append(outer.op)
    elif _is_argument(op) or reports.hands_out_batches(op):
      batches.extend(t for t in op.outputs
                     if t.dtype not in (tf.resource, tf.variant)
                     and t.shape.rank is not None and t.shape.rank >= 1)
    else:
      pending.extend(t.op for t in op.inputs)
  if not batches:
    return None
  # The first of the step's arguments (the features), as Keras counts.
  first = min(batches, key=_argument_index)
  # (A tensor of an outer graph is captured where this one is built.)
  return tf.cast(tf.shape(first)[0], tf.float32)


def _captured_from(op):
  """The outer tensor a function graph's placeholder `op` captures, or
  None."""
  if op.type != "Placeholder":
    return None
  for external, internal in getattr(op.graph, "captures", ()):
    if internal is op.outputs[0]:
      return external
  return None


def _is_argument(op):
  """Whether `op` is a placeholder of a function graph's own arguments."""
  return op.type == "Placeholder" and any(
      t is op.outputs[0] for t in getattr(op.graph, "inputs", ()))


def _argument_index(tensor):
  for i, t in enumerate(getattr(tensor.graph, "inputs", ())):
    if t is tensor:
      return i
  return len(getattr(tensor.graph, "inputs", ()))


@keras.saving.register_keras_serializable(package="estimator_accum")
class AccumulatingKeras3Optimizer(keras.optimizers.Optimizer):
  """A Keras 3 optimizer applying `optimizer` once per k micro-batches,
  with the k micro-batches' mean gradient (see the module)."""

  accumulates_micro_batches = True

  def __init__(self, optimizer, k, *, clip_norm=None, reduction="mean",
               name=None, **options):
    _check(optimizer, k, clip_norm, reduction, options)
    super().__init__(learning_rate=0.0,
                     name=name or "gradient_accumulation")
    self.inner_optimizer = optimizer
    self.k = int(k)
    self.clip_norm = None if clip_norm is None else float(clip_norm)
    self.reduction = reduction
    # A mean's micro-batches are weighed by their examples; a sum's added.
    self._weighs_examples = reductions.for_options(
        reduction, None).weighs_examples

  def build(self, var_list):
    if self.built:
      return
    if replicas.num_replicas() > 1 and not takes_synchronization():
      raise ValueError(
          f"AccumulatingKerasOptimizer under Keras {keras.__version__} runs "
          f"on one device; got {replicas.strategy_name()} with "
          f"{replicas.num_replicas()} replicas. Keras 3.6 or later runs it "
          f"under strategies (its variables can be synchronized on read).")
    # Each replica's own sums (summed when read across replicas, and when
    # saved); made untracked by Keras's tracker: listed in `variables`.
    self.window_examples = self._replica_sum((), "float32", "window_examples")
    self.accumulators = [
        self._replica_sum(v.shape, v.dtype, _accumulator_name(v))
        for v in var_list]
    self.inner_optimizer.build(var_list)
    super().build(var_list)

  def _replica_sum(self, shape, dtype, name):
    variable = replica_sum(self, shape, dtype, name)
    self._track_variable(variable)
    return variable

  @property
  def variables(self):
    return self._variables + self.inner_optimizer.variables

  @property
  def learning_rate(self):
    return self.inner_optimizer.learning_rate

  @learning_rate.setter
  def learning_rate(self, learning_rate):
    self.inner_optimizer.learning_rate = learning_rate

  def scale_loss(self, loss):
    # The inner optimizer unscales the window's mean by its
    # loss_scale_factor, if it has one.
    return self.inner_optimizer.scale_loss(loss)

  def apply(self, grads, trainable_variables=None):
    grads = list(grads)
    if trainable_variables is None:
      trainable_variables = self._trainable_variables
    trainable_variables = list(trainable_variables)
    if not self.built:
      self.build(trainable_variables)
      self.built = True
    examples = _examples_of(grads) if self._weighs_examples else None
    weight = tf.constant(1.0) if examples is None else examples
    accumulators = [self.accumulators[self._get_variable_index(v)]
                    for v in trainable_variables]
    applied = [(a, v) for g, a, v in
               zip(grads, accumulators, trainable_variables) if g is not None]
    for gradient, accumulator in zip(grads, accumulators):
      if gradient is None:
        continue
      if isinstance(gradient, tf.IndexedSlices):
        # Added to this replica's own copy (a variable synchronized on read
        # takes no scatter itself).
        tf_private.local_copy(accumulator.value).scatter_add(
            tf.IndexedSlices(
                gradient.values * tf.cast(weight, gradient.values.dtype),
                gradient.indices, gradient.dense_shape))
      else:
        self.assign_add(accumulator, gradient * tf.cast(weight,
                                                       gradient.dtype))
    self.window_examples.assign_add(weight)
    replicas.in_each_replica_when(
        self._ends_window, self._end_window, applied, accumulators,
        batch_norm_keras3.windows_in_step(self.k))
    self._iterations.assign_add(1)

  def _ends_window(self):
    return tf.equal((self._iterations + 1) % self.k, 0)

  def _end_window(self, applied, accumulators, layers):
    """Applies the window through the inner optimizer and clears it, in a
    replica's context: each replica hands the inner optimizer its own part,
    which the inner optimizer sums over the replicas."""
    # On this replica's device: a collective's destination is its value's
    # device, which a variable's read in a cond's branch does not name
    # (hence the identities below).
    with tf.device(tf_private.local_copy(self.window_examples.value).device):
      self._end_window_on_device(applied, accumulators, layers)
    return tf.no_op()

  def _end_window_on_device(self, applied, accumulators, layers):
    """`layers`: the step's `WindowBatchNormalization` layers, whose moving
    statistics move here."""
    replica_count = replicas.num_replicas()
    # The window's examples and its layers' sums, over every replica in
    # one all-reduce.
    layer_parts = [layer.window_parts() for layer in layers]
    shared = [tf.identity(self.window_examples)] + [
        part for parts in layer_parts for part in parts]
    if replica_count > 1:
      shared = _summed(shared)
    start = 1
    for layer, parts in zip(layers, layer_parts):
      layer.end_window(shared[start:start + len(parts)])
      start += len(parts)
    parts = [tf.identity(a) for a, _ in applied]
    if self._weighs_examples:
      # The mean over replicas of their means, as Keras's losses divide
      # each replica's by the replicas' number.
      examples = shared[0] / replica_count
      parts = [p / tf.cast(examples, p.dtype) for p in parts]
    clips = self.clip_norm is not None or _clips(self.inner_optimizer)
    if replica_count > 1 and clips:
      # Clipped as one device clips the big batch: the window's own norm
      # (Keras 3 clips each replica's share before summing them, which
      # differs with how the examples fall on the replicas). The inner
      # optimizer's clipping of the parts is then a no-op.
      window = self._clip(_summed(parts))
      window = keras_private.keras3_clip_gradients(self.inner_optimizer, window)
      parts = [w / replica_count for w in window]
    else:
      parts = self._clip(parts)
    self.inner_optimizer.apply(parts, [v for _, v in applied])
    for accumulator in accumulators:
      accumulator.assign(tf.zeros_like(accumulator))
    self.window_examples.assign(0.0)

  def _clip(self, window):
    if self.clip_norm is None:
      return window
    return tf.clip_by_global_norm(window, self.clip_norm)[0]

  def finalize_variable_values(self, var_list):
    self.inner_optimizer.finalize_variable_values(var_list)

  def get_config(self):
    config = super().get_config()
    config.pop("learning_rate", None)
    return dict(
        config,
        optimizer=keras.saving.serialize_keras_object(self.inner_optimizer),
        k=self.k, clip_norm=self.clip_norm, reduction=self.reduction)

  @classmethod
  def from_config(cls, config, custom_objects=None):
    config = dict(config)
    optimizer = keras.saving.deserialize_keras_object(
        config.pop("optimizer"), custom_objects=custom_objects)
    return cls(optimizer, config.pop("k"), clip_norm=config.pop("clip_norm"),
               reduction=config.pop("reduction"), name=config.get("name"))


def _accumulator_name(variable):
  path = getattr(variable, "path", None) or str(variable.name)
  return f"{path.replace('/', '_').replace(':', '_')}_accumulator"


def _summed(values):
  """`values` summed over the replicas, from a replica's context."""
  return replicas.sum_in_replica(values, replicas.communication_options(
      None, default_bytes_per_pack=0))


def _clips(optimizer):
  """Whether the Keras 3 `optimizer` clips its gradients."""
  return any(getattr(optimizer, name, None)
             for name in ("clipnorm", "global_clipnorm", "clipvalue"))


def _check(optimizer, k, clip_norm, reduction, options):
  given = {name: value for name, value in options.items()
           if value is not None}
  if given:
    name, value = next(iter(given.items()))
    raise TypeError(
        f"AccumulatingKerasOptimizer under Keras 3 takes "
        f"{', '.join(_TAKES)}; got {name}={_checks.short(value)}. The other "
        f"window options run with tf-keras (TF_USE_LEGACY_KERAS=1; "
        f"docs/releases.md).")
  if getattr(optimizer, "accumulates_micro_batches", False):
    raise TypeError(
        f"optimizer {type(optimizer).__name__} already accumulates "
        f"micro-batches: give AccumulatingKerasOptimizer the optimizer "
        f"inside it")
  if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
    raise TypeError(
        "optimizer LossScaleOptimizer: give AccumulatingKerasOptimizer the "
        "optimizer inside it, and wrap the accumulating one: "
        "LossScaleOptimizer(AccumulatingKerasOptimizer(optimizer, k)), as "
        "compile does for a mixed_float16 model (one inside would be "
        "wrapped again there, its loss scale divided but never multiplied)")
  if getattr(optimizer, "gradient_accumulation_steps", None):
    raise ValueError(
        f"optimizer {type(optimizer).__name__} has "
        f"gradient_accumulation_steps={optimizer.gradient_accumulation_steps}"
        f": give AccumulatingKerasOptimizer one without it (it accumulates "
        f"k micro-batches itself)")
  _checks.check_k(k)
  _checks.check_clip_norm(clip_norm)
  if reduction not in _REDUCTIONS:
    raise ValueError(
        f"reduction must be one of {', '.join(_REDUCTIONS)}, got "
        f"reduction={_checks.short(reduction)}")
