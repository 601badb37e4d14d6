"""What the planner builds and feeds from: `estimator_step`, the
`build(micro_batch, k)` of an Estimator's model_fn and input_fn, and
`window_batches`, a dataset batched into a plan's windows."""

import tensorflow as tf

from estimator_accum import _checks
from estimator_accum.estimator import runner as session_runner
from estimator_accum.planning.plan import MicroBatchPlan

__all__ = ["estimator_step", "window_batches"]


def estimator_step(model_fn, input_fn, params=None, config=None):
  """A `build(micro_batch, k)` for `plan_micro_batch` from an Estimator's
  functions: calls `input_fn` and `model_fn` (TRAIN) with
  params["batch_size"] = the micro-batch and params["k"] = k, as Estimator
  would with `params`, and returns the EstimatorSpec's train op."""

  def build(micro_batch, k):
    tf.compat.v1.train.get_or_create_global_step()
    step_params = dict(params or {}, batch_size=micro_batch, k=k)
    # Repeated: a short input still gives the few micro-batches measured.
    features, labels = session_runner.input_features(
        input_fn, step_params, config, repeat=True)
    spec = session_runner.call_as_estimator(
        model_fn, features=features, labels=labels,
        mode=session_runner.TRAIN, params=step_params, config=config)
    return spec.train_op

  return build


def window_batches(dataset, plan):
  """Batches `dataset` (of examples) into the plan's windows: k - 1
  micro-batches of `plan.micro_batch` and a last one of
  `plan.last_micro_batch`, each window the replica's share in order."""
  if not isinstance(dataset, tf.data.Dataset):
    raise TypeError(f"dataset must be a tf.data.Dataset of examples, got "
                    f"{_checks.short(dataset)} of type "
                    f"{type(dataset).__name__}.")
  if not isinstance(plan, MicroBatchPlan):
    raise TypeError(f"plan must be a MicroBatchPlan (plan_micro_batch's or "
                    f"MicroBatchPlan.given's), got {_checks.short(plan)} of "
                    f"type {type(plan).__name__}.")
  share = plan.per_replica
  return dataset.batch(share, drop_remainder=True).flat_map(
      lambda *window: tf.data.Dataset.from_tensor_slices(
          window if len(window) > 1 else window[0]).batch(plan.micro_batch))
