"""BERT's optimizers and learning-rate schedule, for accumulated training.

`AdamWeightDecayOptimizer` is google-research/bert's Adam with decoupled
weight decay and no bias correction; `LambOptimizer` is LAMB (You et al.,
2019): Adam with bias correction and weight decay, scaled per variable by the
trust ratio ||w|| / ||update||. Both are `tf.compat.v1.train.Optimizer`
subclasses built from the standard slot machinery, so they work inside
`build_accumulating_train_op` and under distribution strategies. Slots are
named like Google's (`<var>/adam_m`, `<var>/adam_v`), and sparse gradients are
applied densely, as Google's code does, so every row's moments decay.

On the CPU, AdamWeightDecay applies the window's gradient to each variable
in one native pass (`applies_in_one_pass`, `gradients_scaled_by`: the
window's end hands it the gradient and its scale, and the one op
`EaAdamWeightDecay` does the product, the moments, the step and the
writes in place), the values of TensorFlow's ops bit for bit, with no
compile.

`learning_rate_schedule` is Google's warmup-then-linear-decay, driven by the
number of optimizer updates (not micro-batches): with accumulation that is
`estimator_accum.update_count(k)`.

`create_optimizer(loss, init_lr, num_train_steps, num_warmup_steps, use_tpu)`
keeps google-research/bert's signature and meaning and returns the train op,
so a script written for Google's code gains accumulation with one argument
(`gradient_accumulation_multiplier=k`): its step counts are Estimator's
steps, micro-batches here, as that script also passes them as `max_steps`.
"""

import contextlib
import re

import tensorflow as tf

import estimator_accum
from estimator_accum import native

DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")
OPTIMIZERS = ("adamw", "lamb")


def learning_rate_schedule(init_lr, update_count, num_train_updates,
                           num_warmup_updates):
  """Linear warmup to init_lr over num_warmup_updates, then linear decay to 0
  at num_train_updates (Google's create_optimizer schedule)."""
  if num_train_updates < 1:
    raise ValueError(f"num_train_updates must be >= 1, got "
                     f"{num_train_updates!r}.")
  if not 0 <= num_warmup_updates <= num_train_updates:
    raise ValueError(f"num_warmup_updates must be in [0, num_train_updates="
                     f"{num_train_updates}], got {num_warmup_updates!r}.")
  step = tf.cast(update_count, tf.float32)
  decayed = init_lr * tf.maximum(
      1.0 - tf.minimum(step, num_train_updates) / num_train_updates, 0.0)
  if not num_warmup_updates:
    return decayed
  warmup = init_lr * step / num_warmup_updates
  return tf.where(step < num_warmup_updates, warmup, decayed)


def make_optimizer(name, learning_rate, weight_decay_rate=0.01):
  """`adamw` or `lamb` with BERT's defaults (epsilon 1e-6, weight decay off
  for LayerNorm and biases)."""
  if name == "adamw":
    return AdamWeightDecayOptimizer(
        learning_rate, weight_decay_rate,
        exclude_from_weight_decay=DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY)
  if name == "lamb":
    return LambOptimizer(learning_rate, weight_decay_rate)
  raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}.")


def create_optimizer(loss, init_lr, num_train_steps, num_warmup_steps,
                     use_tpu=False, *, gradient_accumulation_multiplier=1,
                     optimizer="adamw", clip_norm=1.0, loss_scale=None):
  """google-research/bert's create_optimizer, with accumulation: returns the
  train op.

  As Google's: AdamWeightDecay (weight decay 0.01, not on LayerNorm and
  biases), warmup then linear decay, gradients clipped to global norm 1.0,
  `global_step` incremented. `num_train_steps` and `num_warmup_steps` mean
  what Google's run_classifier.py means by them: Estimator steps, which
  count micro-batches here (that script passes num_train_steps as
  `max_steps` too). The schedule itself moves once per update: it spans
  num_train_steps / k updates, num_warmup_steps / k of them warming up. The
  schedule's value is the graph's tensor `learning_rate`.

  Args:
    loss: the micro-batch's scalar loss (its mean; do not divide by k).
    init_lr: peak learning rate.
    num_train_steps: micro-batches in the whole training (Estimator's
      max_steps).
    num_warmup_steps: micro-batches of linear warmup.
    use_tpu: must be False (TPUs are not supported by this project).
    gradient_accumulation_multiplier: k, micro-batches per update.
    optimizer: "adamw" or "lamb".
    clip_norm: global-norm clip of the accumulated gradient; None disables.
    loss_scale: None, "dynamic" or a number, for float16 models.
  """
  if use_tpu:
    raise ValueError("use_tpu=True is not supported: this project trains on "
                     "CPUs and GPUs.")
  k = gradient_accumulation_multiplier
  num_train_updates, num_warmup_updates = updates_of_steps(
      num_train_steps, num_warmup_steps, k)
  learning_rate = tf.identity(learning_rate_schedule(
      init_lr, estimator_accum.update_count(k), num_train_updates,
      num_warmup_updates), name="learning_rate")
  return estimator_accum.build_accumulating_train_op(
      loss, make_optimizer(optimizer, learning_rate), k,
      clip_norm=clip_norm, loss_scale=loss_scale)


def updates_of_steps(num_train_steps, num_warmup_steps, k):
  """(updates, warmup updates) of a schedule given in micro-batches, as
  floats: k micro-batches make one update (at least one update in all)."""
  if num_train_steps < 1:
    raise ValueError(f"num_train_steps must be >= 1, got "
                     f"{num_train_steps!r}.")
  return max(num_train_steps / k, 1.0), num_warmup_steps / k


def _var_name(var):
  return re.sub(r":\d+$", "", var.name)


class _BertAdamBase(tf.compat.v1.train.Optimizer):
  """Shared slots, weight-decay selection and dense application."""

  # A sparse gradient is applied as the dense one its rows sum to (below):
  # estimator_accum's fused_apply may hand it that dense gradient, and
  # compile the whole apply as one function.
  sparse_apply_is_dense_apply = True

  def __init__(self, learning_rate, weight_decay_rate, beta_1, beta_2,
               epsilon, exclude_from_weight_decay, name):
    super().__init__(use_locking=False, name=name)
    self._lr = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.exclude_from_weight_decay = tuple(exclude_from_weight_decay or ())

  def _do_use_weight_decay(self, var):
    if not self.weight_decay_rate:
      return False
    name = _var_name(var)
    return not any(re.search(pattern, name)
                   for pattern in self.exclude_from_weight_decay)

  def _create_slots(self, var_list):
    for var in var_list:
      self._zeros_slot(var, "m", "adam_m")
      self._zeros_slot(var, "v", "adam_v")

  def _prepare(self):
    self._lr_t = tf.convert_to_tensor(self._call_if_callable(self._lr),
                                      tf.float32, name="learning_rate")
    # The hyperparameters as float32 constants made once an apply, not once
    # a variable: the same values (each Python float rounded to float32,
    # as beside a float32 tensor), a few hundred ops fewer to build.
    self._constants = {name: tf.constant(value, tf.float32, name=name)
                       for name, value in self._hyperparameters().items()}

  def _hyperparameters(self):
    return {"beta_1": self.beta_1, "one_minus_beta_1": 1.0 - self.beta_1,
            "beta_2": self.beta_2, "one_minus_beta_2": 1.0 - self.beta_2,
            "epsilon": self.epsilon,
            "weight_decay_rate": self.weight_decay_rate}

  def _constant(self, name, like):
    """The hyperparameter `name` for an op with `like`: its float32
    constant, or the Python float where `like` is of another dtype."""
    if like.dtype.base_dtype == tf.float32:
      return self._constants[name]
    return self._hyperparameters()[name]

  def _moments(self, grad, var):
    m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
    next_m = (self._constant("beta_1", grad) * m +
              self._constant("one_minus_beta_1", grad) * grad)
    next_v = (self._constant("beta_2", grad) * v +
              self._constant("one_minus_beta_2", grad) * tf.square(grad))
    return m, v, next_m, next_v

  def _update(self, var, next_m, next_v):
    raise NotImplementedError

  def _resource_apply_dense(self, grad, var):
    m, v, next_m, next_v = self._moments(grad, var)
    new_var = var - self._update(var, next_m, next_v)
    return tf.group(var.assign(new_var), m.assign(next_m), v.assign(next_v))

  def _apply_dense(self, grad, var):
    return self._resource_apply_dense(grad, var)

  def _resource_apply_sparse_duplicate_indices(self, grad, var, indices):
    # Google's optimizer densifies IndexedSlices: every row's moments decay.
    dense = tf.math.unsorted_segment_sum(grad, indices, tf.shape(var)[0])
    return self._resource_apply_dense(dense, var)

  def _apply_sparse_duplicate_indices(self, grad, var):
    dense = tf.math.unsorted_segment_sum(grad.values, grad.indices,
                                         tf.shape(var)[0])
    return self._resource_apply_dense(dense, var)


class AdamWeightDecayOptimizer(_BertAdamBase):
  """google-research/bert's Adam with decoupled weight decay.

  No bias correction; weight decay is added to the Adam step (not to the
  gradient) for variables whose names match none of
  exclude_from_weight_decay. `global_step` in apply_gradients is incremented
  if given, as for every tf.compat.v1 optimizer. The defaults are Google's
  (no weight decay unless asked); `make_optimizer` sets BERT's.
  """

  def __init__(self, learning_rate, weight_decay_rate=0.0, beta_1=0.9,
               beta_2=0.999, epsilon=1e-6, exclude_from_weight_decay=None,
               name="AdamWeightDecayOptimizer", one_pass=True):
    super().__init__(learning_rate, weight_decay_rate, beta_1, beta_2,
                     epsilon, exclude_from_weight_decay, name)
    if not isinstance(one_pass, bool):
      raise ValueError(f"one_pass={one_pass!r}: must be True (the native "
                       f"one-pass update where it loads) or False "
                       f"(TensorFlow's ops)")
    self.one_pass = one_pass
    self._one_pass_scale = None

  def applies_in_one_pass(self, variables):
    """Whether `gradients_scaled_by` applies to every one of `variables`:
    each a float32 resource variable on the CPU (no device set counts:
    the native kernels load only where no GPU is), the native kernels
    loaded. estimator_accum's window end asks this first."""
    if not self.one_pass or native.adam_weight_decay_op() is None:
      return False
    return all(isinstance(v, tf.Variable) and hasattr(v, "handle") and
               v.dtype.base_dtype == tf.float32 and
               "GPU" not in (v.device or "").upper() for v in variables)

  @contextlib.contextmanager
  def gradients_scaled_by(self, scale):
    """While open, the gradients handed to `apply_gradients` are applied
    times `scale` (a float32 scalar tensor, or None for 1), each variable
    in one op (`EaAdamWeightDecay`): the product `gradient * scale`, the
    moments and the step as TensorFlow's ops compute them, bit for bit,
    and no tensor of the model's size made. For the variables
    `applies_in_one_pass` accepts."""
    self._one_pass_scale = (tf.constant(1.0, tf.float32) if scale is None
                            else tf.convert_to_tensor(scale, tf.float32))
    try:
      yield
    finally:
      self._one_pass_scale = None

  def _resource_apply_dense(self, grad, var):
    scale = self._one_pass_scale
    if scale is None:
      return super()._resource_apply_dense(grad, var)
    constant = self._constants
    return native.adam_weight_decay_op()(
        var.handle, self.get_slot(var, "m").handle,
        self.get_slot(var, "v").handle, tf.cast(grad, tf.float32), scale,
        self._lr_t, constant["beta_1"], constant["one_minus_beta_1"],
        constant["beta_2"], constant["one_minus_beta_2"],
        constant["epsilon"], constant["weight_decay_rate"],
        decay=self._do_use_weight_decay(var))

  def _update(self, var, next_m, next_v):
    update = next_m / (tf.sqrt(next_v) + self._constant("epsilon", next_v))
    if self._do_use_weight_decay(var):
      update += self._constant("weight_decay_rate", update) * var
    return self._lr_t * update


class LambOptimizer(_BertAdamBase):
  """LAMB: bias-corrected Adam plus decoupled weight decay, with each
  variable's step scaled by the trust ratio ||w|| / ||step|| (1 when either
  norm is zero). The bias correction counts this optimizer's own updates, in
  a `<name>/step` variable that is saved in checkpoints.
  """

  def __init__(self, learning_rate, weight_decay_rate=0.01, beta_1=0.9,
               beta_2=0.999, epsilon=1e-6,
               exclude_from_weight_decay=DEFAULT_EXCLUDE_FROM_WEIGHT_DECAY,
               name="LambOptimizer"):
    super().__init__(learning_rate, weight_decay_rate, beta_1, beta_2,
                     epsilon, exclude_from_weight_decay, name)

  def _create_slots(self, var_list):
    super()._create_slots(var_list)
    first = min(var_list, key=lambda var: var.name)
    self._create_non_slot_variable(initial_value=0.0, name="step",
                                   colocate_with=first)

  def _step(self):
    # init_scope: inside a tf.cond branch the default graph is the branch's.
    with tf.init_scope():
      graph = (None if tf.executing_eagerly()
               else tf.compat.v1.get_default_graph())
      return self._get_non_slot_variable("step", graph=graph)

  def _update(self, var, next_m, next_v):
    step = self._step() + 1.0
    m_hat = next_m / (1.0 - tf.pow(self.beta_1, step))
    v_hat = next_v / (1.0 - tf.pow(self.beta_2, step))
    update = m_hat / (tf.sqrt(v_hat) + self.epsilon)
    if self._do_use_weight_decay(var):
      update += self.weight_decay_rate * var
    w_norm, u_norm = tf.norm(var), tf.norm(update)
    ratio = tf.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
    return self._lr_t * ratio * update

  def _finish(self, update_ops, name_scope):
    with tf.control_dependencies(update_ops):
      step = self._step()
      with tf.compat.v1.colocate_with(step):
        increment = step.assign_add(1.0, read_value=False)
    return tf.group(*update_ops, increment, name=name_scope)
