"""The classifier's training, as run_classifier.py sets it up: the
model_fn's TrainingConfig from the flags, the Estimator (or, on TensorFlow
2.16+, the library's SessionEstimator) it trains through, the planner's
step, and the lines that say how it trains and what it took."""

import dataclasses
import functools
import os

import tensorflow as tf

import estimator_accum
from data import bert_features
from estimator_accum import native, runtime_private
from estimator_accum.estimator import runner as session_runner
from models import batch_plan
from models.bert import classifier, modeling

__all__ = ["config", "describe", "estimator", "planning_step", "report"]


def config(flags, setup, plan, num_train_updates, init_checkpoint,
           output_dir=None):
  """The model_fn's TrainingConfig of `plan` from the flags (`output_dir`:
  where --trace_window writes)."""
  return classifier.TrainingConfig(
      num_labels=len(setup.label_list),
      learning_rate=flags.learning_rate,
      num_train_updates=num_train_updates,
      num_warmup_updates=int(num_train_updates *
                             flags.warmup_proportion),
      k=plan.k, clip_norm=flags.clip_norm or None,
      optimizer=flags.optimizer,
      init_checkpoint=init_checkpoint, micro_batch_size=plan.micro_batch,
      total_micro_batches=num_train_updates * plan.k,
      log_every_n_micro_batches=flags.log_every,
      precision=precision(flags),
      max_consecutive_skipped_windows=(
          flags.max_consecutive_skipped_windows or None),
      classifier_dropout=flags.classifier_dropout,
      recompute=flags.recompute or plan.recompute,
      accumulator_placement=plan.accumulator_placement,
      fused_apply=flags.fused_apply, unpadded=flags.unpadded,
      pooled_only=flags.pooled_only,
      trace_dir=output_dir if flags.trace_window else None,
      keyed_dropout=keyed_dropout(flags), dropout_seed=flags.seed,
      fused_attention=flags.fused_attention)


def keyed_dropout(flags):
  """Whether dropout is keyed by example (--keyed_dropout; packed rows
  hold several examples a row and keep tf.nn.dropout)."""
  return flags.keyed_dropout and not flags.pack_windows


# Steps between two writes of the summaries (Estimator's default).
SUMMARY_STEPS = 100


def estimator(flags, setup, output_dir, training, plan, strategy, replicas,
              parameter_servers=None):
  """The Estimator (TensorFlow 2.15) or the library's SessionEstimator
  (2.16+) of the model_fn with `training`, on `output_dir`
  (`parameter_servers`: TF_CONFIG of a parameter-server job)."""
  session_config = None
  if strategy is not None and not tf.config.list_physical_devices("GPU"):
    session_config = tf.compat.v1.ConfigProto(
        device_count={"CPU": max(replicas, 1)})
  if (flags.lean_grappler and strategy is None and
      parameter_servers is None and setup.cluster is None):
    # (Under TF_CONFIG Estimator's own config, with its device filters.)
    session_config = estimator_accum.lean_grappler(session_config)
  save_every = flags.save_checkpoints_steps
  if flags.micro_batch_size in batch_plan.MEASURED:
    # Checkpoints at window boundaries, for halving.
    save_every = batch_plan.save_every(plan, save_every)
  model_fn = classifier.model_fn_builder(setup.bert_config, training)
  # One device: the summaries are fetched on every step by the run's
  # EveryStepSummaryHook (training_hooks), not by Estimator's own hooks on
  # some steps only, so that every step runs one executor.
  every_step = strategy is None and parameter_servers is None
  if estimator_accum.releases.estimator() is None:
    # TensorFlow 2.16+: the same model_fn through the library's sessions
    # (one process, MultiWorkerMirroredStrategy's workers, or a
    # parameter-server job between graphs).
    return session_runner.SessionEstimator(
        model_fn, session_runner.RunSettings(
            model_dir=output_dir, tf_random_seed=flags.seed,
            session_config=session_config, train_distribute=strategy,
            parameter_servers=parameter_servers,
            save_checkpoints_steps=save_every,
            keep_checkpoint_max=flags.keep_checkpoint_max,
            save_summary_steps=None if every_step else SUMMARY_STEPS,
            save_at_start=not every_step))
  run_config = tf.estimator.RunConfig(
      model_dir=output_dir, tf_random_seed=flags.seed,
      train_distribute=strategy, session_config=session_config,
      save_checkpoints_steps=save_every,
      keep_checkpoint_max=flags.keep_checkpoint_max,
      save_summary_steps=None if every_step else SUMMARY_STEPS,
      # No LoggingTensorHook: its fetch on its first step was one more
      # executor (run_classifier prints its own progress line).
      log_step_count_steps=None if every_step else flags.log_every * 1000,
      # No graph.pbtxt and no .meta beside each checkpoint: the events
      # file holds the graph for TensorBoard, and printing BERT's graph as
      # text took about 1 s of an 8 s tiny-BERT run (2 layers).
      checkpoint_save_graph_def=False)
  return tf.estimator.Estimator(model_fn, config=run_config)


def training_hooks(estimator):
  """The hooks `estimator` (of estimator()) trains with on one device:
  TensorBoard's summaries, which it writes none of itself, and on
  Estimator (2.15) its checkpoints without the save at global step 0
  (`LeanCheckpointSaverHook`; Estimator then adds no saver of its own, and
  the SessionEstimator has `save_at_start=False`). None on a cluster."""
  config = estimator.config
  if config.save_summary_steps is not None:
    return []
  hooks = [estimator_accum.EveryStepSummaryHook(estimator.model_dir,
                                                SUMMARY_STEPS)]
  if not isinstance(estimator, session_runner.SessionEstimator):
    hooks.append(estimator_accum.LeanCheckpointSaverHook(
        estimator.model_dir, save_steps=config.save_checkpoints_steps,
        save_graph_def=config.checkpoint_save_graph_def))
  return hooks


# The flags a training step's graph, memory and speed depend on: with the
# model's config and the training data's features, the plan cache's key.
STEP_FLAGS = ("task_name", "max_seq_length", "do_lower_case", "unpadded",
              "pooled_only", "fused_apply", "recompute",
              "sort_windows_by_length", "pack_windows", "max_examples_per_row",
              "pad_to_multiple_of", "classifier_dropout", "optimizer",
              "use_fp16", "precision", "distribution_strategy", "keyed_dropout",
              "fused_attention")


def planning_signature(flags, setup, train_file):
  """What the planned step is built from, for the plan cache: the model's
  config, the step's flags, and the training features (their file's name
  holds the key of the examples, tokenizer and length)."""
  return {"script": "run_classifier",
          "bert_config": setup.bert_config.to_dict(),
          "train_features": os.path.basename(train_file),
          "flags": {name: getattr(flags, name) for name in STEP_FLAGS}}


def planning_step(flags, setup, training, train_file, arranged=False):
  """build(micro_batch, k) for the planner: the training step on batches of
  the train file at the full --max_seq_length (the longest a batch gets;
  only --do_train measures). `arranged`: on batches as the run trains on
  them instead (each cut to its longest example, its window sorted or
  packed by the flags): what --micro_batch_size fastest times, with the
  window's end not compiled (--fused_apply's XLA compile took 3.7 s of
  each split's ~10 s; one apply a window, the same for every split, so it
  does not change which split is fastest; adamw's update is its native
  op's either way)."""

  def build(micro_batch, k, recompute=False,
            accumulator_placement="device"):
    tf.compat.v1.train.get_or_create_global_step()
    arrange = {}
    if arranged:
      packing = flags.pack_windows
      arrange = dict(
          trim=True, pad_to_multiple_of=flags.pad_to_multiple_of,
          sort_window=k if (not packing and flags.sort_windows_by_length)
          else None, pack_window=k if packing else None,
          max_examples_per_row=flags.max_examples_per_row)
    dataset = bert_features.input_fn_builder(
        train_file, flags.max_seq_length, micro_batch, is_training=True,
        drop_remainder=True, seed=flags.seed,
        example_keys=keyed_dropout(flags),
        **(arrange or dict(trim=False)))()
    features = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    step = dataclasses.replace(
        training, k=k, micro_batch_size=micro_batch, recompute=recompute,
        accumulator_placement=accumulator_placement)
    if arranged:
      step = dataclasses.replace(step, fused_apply=False)
    return classifier.model_fn_builder(setup.bert_config, step)(
        features, None, session_runner.TRAIN).train_op

  return build


def attention_fused(flags, bert_config):
  """Whether the training graph's attention runs as the native op over
  the real tokens (--fused_attention): BertModel's own test
  (`modeling.fused_attention_op`) for the model these flags build."""
  return modeling.fused_attention_op(
      bert_config, fused_attention=flags.fused_attention, is_training=True,
      one_example_a_row=flags.unpadded and not flags.pack_windows,
      compute_type=tf.float16 if precision(flags) == "float16" else
      tf.float32, keyed=keyed_dropout(flags)) is not None


def precision(flags):
  """The run's --precision (--use_fp16 is float16)."""
  return "float16" if flags.use_fp16 else getattr(flags, "precision",
                                                    "float32")


def describe(flags, plan, workers, replicas, between_graph,
             num_train_updates, num_train, bert_config):
  """Prints how the run trains: the effective batch and its split, and the
  arrangement of the windows' examples."""
  how = (f"{workers} worker(s) x {replicas} replica(s) x micro-batch "
         f"{plan.micro_batch} x k={plan.k}")
  if between_graph:
    how = (f"micro-batch {plan.micro_batch} x k={plan.k} per update, each "
           f"of {workers} worker(s) applying its own windows to the ps")
  print(f"effective batch {plan.effective_batch} = {how}; "
        f"{num_train_updates} updates ({num_train_updates * plan.k} "
        f"micro-batches) over {num_train} examples, "
        f"{flags.num_train_epochs:g} epoch(s)", flush=True)
  if flags.pack_windows:
    print(f"each window's {plan.k} x {plan.micro_batch} examples packed "
          f"into rows of {flags.max_seq_length} tokens, at most "
          f"{flags.max_examples_per_row} a row (--pack_windows): a "
          f"micro-batch is at most {plan.micro_batch} rows (what the plan "
          f"counts and measures, at {flags.max_seq_length} tokens) "
          f"and holds {plan.micro_batch} examples on average", flush=True)
  elif flags.sort_windows_by_length and plan.k > 1:
    print(f"each window's {plan.k} x {plan.micro_batch} examples sorted "
          "by length into its micro-batches (--sort_windows_by_length)",
          flush=True)
  if flags.unpadded:
    attention = ("too, one native op per example and head (--unpadded, "
                 "--fused_attention)" if attention_fused(flags, bert_config)
                 else "the padded rows (--unpadded)")
    print("the layers' dense parts compute real tokens only, attention "
          f"{attention}", flush=True)
  if flags.pooled_only:
    print("the last layer computes each example's first token only, the "
          "one the classifier reads (--pooled_only)", flush=True)
  if precision(flags) == "bfloat16":
    print("the dense products take bfloat16 operands; the weights, "
          "optimizer slots, accumulators, layer norms, softmax and loss "
          "stay float32, no loss scale (--precision bfloat16)", flush=True)
    native, why = native_bfloat16()
    if not native:
      print(f"this machine has no native bfloat16 products ({why}): "
            "bfloat16 runs slower here than float32 "
            f"({BFLOAT16_ANYWHERE}=1 given)", flush=True)


# Runs --precision bfloat16 where the machine has no native bfloat16
# products (for its numerics; 2.5-3.5x slower products, below).
BFLOAT16_ANYWHERE = "ESTIMATOR_ACCUM_BFLOAT16_ANYWHERE"


def precision_problem(flags):
  """Why --precision bfloat16 is refused here, or None. Without native
  bfloat16 products the library's bfloat16 matmuls ran at 0.28-0.40x
  float32's (oneDNN held to AVX-512 without its bf16 instructions,
  MiniLM's shapes and 2048², AMD EPYC, 2026-12-06): the run would only be
  slower, and its numbers rounder."""
  if precision(flags) != "bfloat16" or os.environ.get(BFLOAT16_ANYWHERE) == (
      "1"):
    return None
  native, why = native_bfloat16()
  if native:
    return None
  return (f"--precision bfloat16: this machine has no native bfloat16 "
          f"products ({why}), where bfloat16 matmuls run at about a third "
          f"of float32's speed; use --precision float32, or set "
          f"{BFLOAT16_ANYWHERE}=1 to run it anyway.")


@functools.cache
def native_bfloat16():
  """(whether this process multiplies bfloat16 natively, what says so): a
  GPU of compute capability 8.0+ (Ampere on), else a CPU whose flags list
  avx512_bf16 or amx_bf16 with TensorFlow's oneDNN kernels on."""
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    capability = tf.config.experimental.get_device_details(gpus[0]).get(
        "compute_capability", (0, 0))
    return (tuple(capability) >= (8, 0),
            f"GPU compute capability {capability[0]}.{capability[1]}")
  found = sorted(native.cpu_flags() & {"avx512_bf16", "amx_bf16"})
  if not found:
    return False, "the CPU lists neither avx512_bf16 nor amx_bf16"
  if not runtime_private.onednn_enabled():
    return False, ("TensorFlow's oneDNN kernels are off "
                   "(TF_ENABLE_ONEDNN_OPTS=0)")
  return True, f"CPU: {', '.join(found)}"


def report(seconds, micro_batches, total):
  """One line: the training's time (`micro_batches` trained by this
  process, of the run's `total`) and the allocator's peak of tensor memory
  (on CPU the BFC allocator's only with TF_CPU_ALLOCATOR_USE_BFC=true,
  which holds tensors as a GPU's allocator does)."""
  if not micro_batches:
    return (f"nothing left to train: the run is at micro-batch {total} of "
            f"{total} ({seconds:.1f} s)")
  resumed = (f" (resumed: the last {micro_batches} of {total})"
             if micro_batches < total else "")
  device = estimator_accum.planner.default_device()
  line = (f"trained {micro_batches} micro-batches{resumed} in "
          f"{seconds:.1f} s ({seconds / micro_batches:.3f} s each)")
  try:
    peak = tf.config.experimental.get_memory_info(device)["peak"]
  except ValueError:
    return (f"{line}; peak memory not measured ({device}'s allocator keeps "
            "no statistics: on CPU set TF_CPU_ALLOCATOR_USE_BFC=true)")
  how = ("the BFC allocator, as a GPU holds tensors"
         if device.startswith("CPU") else "its allocator")
  return f"{line}; peak tensor memory {peak / 2**20:,.0f} MB on {device} ({how})"
