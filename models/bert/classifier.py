"""BERT sequence classification: the model_fn run_classifier.py trains.

The head is google-research/bert's (`output_weights` [num_labels, hidden],
`output_bias`, dropout 0.1 on the pooled output), so its checkpoints and
fine-tuned models carry over. Training goes through
`estimator_accum.build_accumulating_train_op`; the learning rate follows the
number of optimizer updates, not micro-batches.
"""

import dataclasses

import tensorflow as tf
from absl import logging

import estimator_accum
from estimator_accum.estimator import runner as session_runner
from models.bert import modeling, optimization, packing


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
  """What the model_fn needs to train; plain values, no flags."""
  num_labels: int
  learning_rate: float = 5e-5
  num_train_updates: int = 1
  num_warmup_updates: int = 0
  k: int = 1
  clip_norm: float | None = 1.0
  optimizer: str = "adamw"
  init_checkpoint: str | None = None
  micro_batch_size: int | None = None
  total_micro_batches: int | None = None
  log_every_n_micro_batches: int = 50
  # The products' precision: "float32", "bfloat16" (the dense products in
  # bfloat16, everything else float32, no loss scale) or "float16" (float16
  # compute with dynamic loss scaling).
  precision: str = "float32"
  # Windows skipped in a row (non-finite gradients) that stop training as
  # diverged; None never stops.
  max_consecutive_skipped_windows: int | None = 25
  # Dropout on the pooled output (Google's run_classifier.py: 0.1).
  classifier_dropout: float = 0.1
  # Recompute each transformer layer's activations in the backward pass.
  recompute: bool = False
  # Where the window's accumulators live: "device", "host" or "sharded".
  accumulator_placement: str = "device"
  # The window's end in one pass a variable (fused_apply: XLA where
  # AdamWeightDecay's native op does not apply, and the sums zeroed in
  # place).
  fused_apply: bool = False
  # The layers' dense parts compute real tokens only (BertModel unpadded).
  unpadded: bool = False
  # The last layer computes each example's first token only (BertModel
  # pooled_only): the classifier reads nothing else.
  pooled_only: bool = False
  # A directory for a trace of one window (WindowTraceHook), or None.
  trace_dir: str | None = None
  # Dropout's masks keyed by each example (features' example_key, salted by
  # dropout_seed): every split of a window trains to the same weights.
  keyed_dropout: bool = False
  dropout_seed: int = 0
  # Attention as one native op over the real tokens (BertModel
  # fused_attention; with unpadded, in training).
  fused_attention: bool = True


def create_model(bert_config, is_training, features, num_labels,
                 compute_type=tf.float32, classifier_dropout=0.1,
                 recompute=False, unpadded=False, pooled_only=False,
                 keyed_dropout=False, dropout_seed=0, fused_attention=True,
                 product_type=None, window_copies=False):
  """Returns (logits, probabilities) for features from bert_features.

  Packed rows (`example_ids` in the features, `models.bert.packing`):
  logits [batch, max_examples, num_labels], one per example a row may hold,
  `label_ids` [batch, max_examples] giving max_examples. `keyed_dropout`
  (training): every dropout's masks keyed by the features' `example_key`
  (`BertModel(dropout_keys=...)`), the classifier's too."""
  packed = "example_ids" in features
  keys = None
  if keyed_dropout and is_training:
    if packed or "example_key" not in features:
      raise ValueError(
          "keyed_dropout needs features['example_key'] (input_fn_builder("
          "..., example_keys=True)) and one example a row, got features "
          f"{sorted(features)}")
    keys = features["example_key"]
  model = modeling.BertModel(
      bert_config, is_training, features["input_ids"],
      None if packed else features["input_mask"], features["segment_ids"],
      compute_type=compute_type, recompute=recompute and is_training,
      example_ids=features.get("example_ids"),
      max_examples=features["label_ids"].shape[-1] if packed else None,
      unpadded=unpadded, pooled_only=pooled_only, dropout_keys=keys,
      dropout_seed=dropout_seed, fused_attention=fused_attention,
      product_type=product_type, window_copies=window_copies)
  pooled = model.get_pooled_output()
  hidden_size = pooled.shape[-1]
  output_weights = tf.compat.v1.get_variable(
      "output_weights", [num_labels, hidden_size],
      initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.02))
  output_bias = tf.compat.v1.get_variable(
      "output_bias", [num_labels], initializer=tf.compat.v1.zeros_initializer())
  if is_training and classifier_dropout and keys is not None:
    pooled = estimator_accum.keyed_dropout(
        pooled, classifier_dropout, model.example_dropout_keys,
        seed=dropout_seed, site="classifier")
  elif is_training and classifier_dropout:
    pooled = tf.nn.dropout(pooled, rate=classifier_dropout)
  logits = (tf.einsum("bnh,lh->bnl", pooled, output_weights) if packed else
            tf.matmul(pooled, output_weights, transpose_b=True)) + output_bias
  return logits, tf.nn.softmax(logits, axis=-1)


def packed_loss(features, logits):
  """(loss, examples) of packed rows: the mean cross-entropy over the
  examples the rows hold, and their number, which weighs this micro-batch
  in its window (`num_examples`): the window's update is then the mean
  over all its examples, as unpacked. Rows holding none give 0 and 0."""
  _, held = packing.first_tokens(features["example_ids"], logits.shape[1])
  held = tf.cast(held, tf.float32)
  examples = tf.reduce_sum(held)
  losses = tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=features["label_ids"], logits=logits)
  return (tf.reduce_sum(losses * held) / tf.maximum(examples, 1.0),
          examples)




def model_fn_builder(bert_config, training):
  """Returns an Estimator model_fn for a TrainingConfig."""

  def model_fn(features, labels, mode):
    del labels
    is_training = mode == session_runner.TRAIN
    logits, probabilities = create_model(
        bert_config, is_training, features, training.num_labels,
        tf.float16 if training.precision == "float16" else tf.float32,
        training.classifier_dropout, training.recompute, training.unpadded,
        training.pooled_only, training.keyed_dropout, training.dropout_seed,
        training.fused_attention,
        tf.bfloat16 if training.precision == "bfloat16" else None,
        # The accumulating train op below remakes them after each update.
        window_copies=is_training)
    if training.init_checkpoint:
      mapping, _ = modeling.get_assignment_map_from_checkpoint(
          tf.compat.v1.trainable_variables(), training.init_checkpoint)
      tf.compat.v1.train.init_from_checkpoint(training.init_checkpoint,
                                              mapping)
      if is_training:
        logging.info("Initialized %d of %d variables from %s.", len(mapping),
                     len(tf.compat.v1.trainable_variables()),
                     training.init_checkpoint)
    if mode == session_runner.PREDICT:
      return session_runner.model_spec(
          mode, predictions={"probabilities": probabilities})
    label_ids = features["label_ids"]
    num_examples = None
    if "example_ids" in features:
      if mode != session_runner.TRAIN:
        raise ValueError("packed rows (example_ids) are for training; "
                         f"evaluate and predict one example per row, got "
                         f"mode={mode!r}")
      loss, num_examples = packed_loss(features, logits)
    else:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=label_ids, logits=logits))
    if mode == session_runner.EVAL:
      weights = tf.cast(features["is_real_example"], tf.float32)
      predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
      metrics = {
          "eval_accuracy": tf.compat.v1.metrics.accuracy(
              label_ids, predictions, weights=weights),
          "eval_loss": tf.compat.v1.metrics.mean(
              tf.nn.sparse_softmax_cross_entropy_with_logits(
                  labels=label_ids, logits=logits), weights=weights),
      }
      return session_runner.model_spec(mode, loss=loss,
                                       eval_metric_ops=metrics)
    learning_rate = optimization.learning_rate_schedule(
        training.learning_rate, estimator_accum.update_count(training.k),
        training.num_train_updates, training.num_warmup_updates)
    optimizer = optimization.make_optimizer(training.optimizer,
                                              learning_rate)
    # Reported before the train op is built: a NaN micro-batch then costs its
    # window and one line when the window ends, not a line of its own.
    reported = estimator_accum.reportable_loss(loss)
    train_op = estimator_accum.build_accumulating_train_op(
        loss, optimizer, training.k, clip_norm=training.clip_norm,
        num_examples=num_examples,
        loss_scale="dynamic" if training.precision == "float16" else None,
        accumulator_placement=training.accumulator_placement,
        fused_apply=training.fused_apply,
        max_consecutive_skipped_windows=(
            training.max_consecutive_skipped_windows))
    tf.compat.v1.summary.scalar("learning_rate", learning_rate)
    hook = estimator_accum.AccumulationLoggingHook(
        every_n_micro_batches=training.log_every_n_micro_batches,
        micro_batch_size=training.micro_batch_size,
        total_micro_batches=training.total_micro_batches, loss=loss,
        # Token positions: micro-batches trimmed or sorted by length differ.
        work=tf.size(features["input_ids"]))
    hooks = [hook]
    if training.trace_dir:
      hooks.append(estimator_accum.WindowTraceHook(training.trace_dir))
    return session_runner.model_spec(
        mode, loss=reported, train_op=train_op, training_hooks=hooks)

  return model_fn
