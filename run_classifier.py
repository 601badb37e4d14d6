"""Fine-tunes BERT for sentence (pair) classification with gradient
accumulation, on one device, several (mirrored) or a TF_CONFIG cluster.

With no flags it runs the project's main job: all-MiniLM-L6-v2 (converted once
from its offline package) fine-tuned on Rotten Tomatoes polarity with
micro-batch 8 and k=4, evaluated on a held-out split of movies it never
trains on:

    python run_classifier.py

Google's flags work as in google-research/bert, except that
`train_batch_size` is the micro-batch per replica: the effective batch is
workers x replicas x train_batch_size x gradient_accumulation_multiplier.
"""

import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# oneDNN's CPU kernels, which TensorFlow 2.15 turns on by default only on
# CPUs with AVX-512-class features: on the main job they are faster than
# Eigen's held to AVX2 too (`python benchmarks/main_job_speed.py
# --cpu_paths`: 1.24x Eigen's at AVX2, 1.38x at AVX-512; docs/bert.md).
# Read when TensorFlow starts; TF_ENABLE_ONEDNN_OPTS=0 keeps Eigen's.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
# oneDNN's cache of the product kernels it built, 1024 by default: each
# micro-batch's row count (unpadded, a sum of its examples' lengths) has
# its own shapes, about ten kernels each, and at 1024 oneDNN built them
# again all epoch (939 builds, 0.40 s, in the second half of 0.3 epoch of
# bfloat16 training; 633, 0.15 s, at 16384). Steady bfloat16 training
# 1.02x (3 of 3 interleaved rounds); 54 MiB more resident (docs/bert.md).
# Read when oneDNN first builds a kernel.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16384")

# First: TensorFlow loaded with its load-time lines held back.
from models import quiet_import  # noqa: E402, F401, I001
import tensorflow as tf  # noqa: E402
from absl import app, logging

import estimator_accum
from data import bert_features, classification
from estimator_accum.checkpoints import full_disk
from models import batch_plan, console, strategies
from models.bert import classifier_flags, classifier_setup
from models.bert import classifier_run_dir as run_dir
from models.bert import classifier_training as training
from models.bert.classifier_errors import (
  DIVERGED_EXIT_CODE,
  DiskFull,
  NotFinite,
  UsageError,
)
from models.script_flags import FlagValues
from models.training import (DISK_FULL_EXIT_CODE, end_finished_run,
                             resume_from_complete)

FLAGS = classifier_flags.FLAGS
# --sort_eval_by_length sorts the dev split this many batches at a time
# (64 x --eval_batch_size examples held at once).
EVAL_SORT_BATCHES = 64


class ClassifierRun:
  """The phases of one run: the directory held, the job spread, then
  training (with the micro-batch plan), evaluation, prediction and export.
  The flags are read once (`self.flags`); what they need checked first is
  `classifier_setup`'s, the output directory `classifier_run_dir`'s."""

  def __init__(self, flag_values, setup):
    self.flags = flag_values
    self.setup = setup
    self.output_dir = flag_values.output_dir or run_dir.default(
        setup.processor.name, setup.cluster)
    self.distribution = None
    strategy = flag_values.distribution_strategy
    # How the job is spread, from --distribution_strategy, once.
    self.one_device = strategy == "none"
    self.one_process = strategy in ("none", "mirrored")
    self.multi_worker = strategy == "multi_worker"
    # Each parameter-server worker applies its own windows, asynchronously.
    self.between_graph = strategy == "parameter_server"

  def run(self):
    created = run_dir.prepare(self.output_dir, self.setup.processor.name,
                              self.setup.bert_config)
    lock = run_dir.hold(self.output_dir, self.setup.cluster)
    try:
      self._run_holding_the_directory(created)
    finally:
      lock.release()

  def _run_holding_the_directory(self, created):
    # A checkpoint cut short or corrupted is skipped, each named in a line,
    # and the run resumes from the newest complete one (none: exit 4).
    resume_from_complete("run_classifier", self.output_dir,
                         flag="--output_dir")
    if self.flags.do_train and self.setup.init_checkpoint:
      run_dir.warn_if_short_of_room(self.output_dir,
                                    self.setup.init_checkpoint,
                                    self.flags.keep_checkpoint_max)
    try:
      self.distribution = strategies.choose(
          self.flags.distribution_strategy, self.output_dir,
          self.flags.peer_timeout_secs)
    except strategies.StrategyError as error:
      if created:
        run_dir.remove_if_empty(self.output_dir)
      raise UsageError(str(error)) from None
    if self.flags.do_train and self.flags.fused_apply and self.one_device:
      # The window's end is compiled (one replica): XLA's one-time lines
      # on CPU go nowhere, after the allocator is chosen.
      console.quiet_xla_start(self.flags.verbose)
    try:
      self._train_and_evaluate()
    except BaseException:
      self.distribution.stop()
      if created:
        run_dir.remove_if_empty(self.output_dir)
      raise
    self._remove_own_worker_checkpoints()
    self.distribution.finish()

  def _remove_own_worker_checkpoints(self):
    """A MultiWorkerMirroredStrategy worker other than the chief saves its
    own copy of every checkpoint in output_dir/tmp_worker_<i> (the size of
    the model each); once the job has ended nothing reads them."""
    if not self.multi_worker or self.distribution.is_chief:
      return
    task = self.distribution.task
    path = os.path.join(self.output_dir,
                        f"tmp_{task.get('type')}_{task.get('index')}")
    if tf.io.gfile.isdir(path):
      tf.io.gfile.rmtree(path)

  def _features(self, split):
    """(examples, the cached TFRecord file, its count) of `split`."""
    processor, tokenizer = self.setup.processor, self.setup.tokenizer
    label_list = self.setup.label_list
    getter = {"train": processor.get_train_examples,
              "dev": processor.get_dev_examples,
              "test": processor.get_test_examples}[split]
    examples = getter(self.flags.data_dir)
    length = self.flags.max_seq_length
    if length < 5 and any(e.text_b is not None for e in examples):
      raise UsageError(
          f"--max_seq_length={length} cannot hold a sentence "
          f"pair of task {processor.name}: [CLS] a [SEP] b [SEP] needs at "
          "least 5 tokens.")
    # Keyed by everything the features depend on: another --data_dir,
    # vocabulary, case, length or task never reuses this file.
    key = bert_features.cache_key(examples, label_list, length,
                                  tokenizer)
    path = os.path.join(self.output_dir, "features",
                        f"{split}-{self.flags.max_seq_length}-{key}.tf_record")
    count = bert_features.cached_tfrecord(
        examples, label_list, length, tokenizer, path,
        report=lambda line: print(line, flush=True),
        shared_dir=bert_features.feature_cache())
    return examples, path, count

  def _train_and_evaluate(self):
    problem = training.precision_problem(self.flags)
    if problem:
      raise UsageError(problem)
    distribution = self.distribution
    strategy, workers = distribution.strategy, distribution.workers
    replicas = distribution.replicas_per_worker
    between_graph = self.between_graph
    ways = 1 if between_graph else workers * replicas
    num_train, train_file = 0, None
    if self.flags.do_train:
      _, train_file, num_train = self._features("train")
    plan = self._batch_plan(train_file, ways)
    num_train_updates = max(1, math.ceil(
        num_train * self.flags.num_train_epochs / plan.effective_batch))
    if self.flags.do_train:
      training.describe(self.flags, plan, workers, replicas, between_graph,
                        num_train_updates, num_train, self.setup.bert_config)

    def estimator_for(plan):
      return training.estimator(
          self.flags, self.setup, self.output_dir,
          training.config(self.flags, self.setup, plan, num_train_updates,
                          self.setup.init_checkpoint, self.output_dir),
          plan, strategy, replicas,
          distribution.tf_config if between_graph else None)

    def train(plan):
      started = time.perf_counter()
      trained = self._train(estimator_for(plan), plan, train_file,
                            num_train_updates)
      print(training.report(time.perf_counter() - started, trained,
                            num_train_updates * plan.k), flush=True)

    if self.flags.do_train:
      # One process only: on a cluster every worker would have to halve.
      if (self.flags.micro_batch_size in batch_plan.MEASURED and
          self.one_process):
        plan = estimator_accum.train_halving_on_oom(
            train, plan, self.output_dir, log=self._replanned)
      else:
        train(plan)
    if not self.distribution.is_chief:
      return
    self._evaluate_and_predict(estimator_for(plan))
    if self.flags.export_dir:
      self._export(estimator_for(plan))
    print(f"{self.output_dir}: {run_dir.size(self.output_dir) / 2**20:.1f} "
          f"MB (the last {self.flags.keep_checkpoint_max} checkpoints, "
          "features, events)", flush=True)

  def _export(self, estimator):
    """Writes the SavedModel for serving (models/bert/export.py) of the
    latest checkpoint under --export_dir, and says where."""
    from models.bert import export  # noqa: PLC0415 (TensorFlow Text's ops)

    run_dir.require_checkpoint(self.output_dir, "export")
    pair = any(e.text_b is not None for e in
               self.setup.processor.get_dev_examples(self.flags.data_dir))
    try:
      path = export.export_classifier(
          estimator, self.flags.export_dir, self.setup.vocab_file,
          self.flags.do_lower_case, self.flags.max_seq_length, pair=pair)
    except (tf.errors.OpError, OSError) as error:
      if not full_disk.is_full_disk(error):
        raise
      raise DiskFull(full_disk.describe_export(
          self.flags.export_dir, error,
          tf.train.latest_checkpoint(self.output_dir))) from None
    print(f"exported for serving to {path} (signatures serving_default: "
          f"input_ids, input_mask, segment_ids -> probabilities; text: "
          f"{'text, text_b' if pair else 'text'} -> probabilities)",
          flush=True)

  def _replanned(self, line):
    """After running out of memory: says so, and records the halved plan."""
    print(line, flush=True)
    path = os.path.join(self.output_dir, batch_plan.PLAN_FILE)
    if tf.io.gfile.exists(path):
      batch_plan.write(batch_plan.load(path).halved(), path)

  def _batch_plan(self, train_file, ways):
    """The run's MicroBatchPlan: from --micro_batch_size (measured for
    'auto'), else --train_batch_size and k as given."""
    explicit = [name for name in ("train_batch_size",
                                  "gradient_accumulation_multiplier")
                if name in self.flags.given]
    try:
      batch_plan.check_flags(self.flags, explicit)
    except batch_plan.PlanError as error:
      raise UsageError(str(error)) from None
    k = self.flags.gradient_accumulation_multiplier
    effective = self.flags.effective_batch_size or (
        ways * self.flags.train_batch_size * k)
    if self.flags.micro_batch_size is None:
      return estimator_accum.MicroBatchPlan.given(
          effective, self.flags.train_batch_size, ways)
    if (not self.flags.do_train and
        self.flags.micro_batch_size in batch_plan.MEASURED):
      return estimator_accum.MicroBatchPlan.given(effective, effective // ways,
                                                  ways)
    measured = training.config(
        self.flags, self.setup, estimator_accum.MicroBatchPlan.given(
            effective, effective // ways, ways), 1, None)
    try:
      return batch_plan.resolve(
          self.flags, build=training.planning_step(
              self.flags, self.setup, measured, train_file),
          speed_build=training.planning_step(
              self.flags, self.setup, measured, train_file, arranged=True),
          signature=training.planning_signature(self.flags, self.setup,
                                                train_file),
          effective_batch=effective, replicas=ways, run_dir=self.output_dir,
          is_chief=self.distribution.is_chief)
    except batch_plan.PlanError as error:
      raise UsageError(str(error)) from None

  def _train(self, estimator, plan, train_file, num_train_updates):
    """Trains to the run's last micro-batch; returns how many this
    process set out to train (those left after where it resumed)."""
    between_graph = self.between_graph
    packing = self.flags.pack_windows
    # Where this run goes on (said once); parameter-server workers share one
    # global step and cannot tell their own position: they start again.
    skip = 0 if between_graph else run_dir.resumed_at(self.output_dir)

    def train_input_fn(arranged):
      return bert_features.input_fn_builder(
          train_file, self.flags.max_seq_length, plan.micro_batch,
          is_training=True, drop_remainder=True, seed=self.flags.seed,
          shard=self.distribution.trainer_shard() if between_graph else None,
          skip_batches=skip,
          sort_window=plan.k if (arranged and not packing and
                                 self.flags.sort_windows_by_length) else None,
          pack_window=plan.k if (arranged and packing) else None,
          max_examples_per_row=self.flags.max_examples_per_row,
          pad_to_multiple_of=self.flags.pad_to_multiple_of,
          example_keys=training.keyed_dropout(self.flags))

    train_input = train_input_fn(arranged=True)
    max_steps = num_train_updates * plan.k
    if (not self.one_process and
        estimator_accum.releases.estimator() is not None):
      # (The evaluation train_and_evaluate asks for reads one example a row.)
      tf.estimator.train_and_evaluate(
          estimator, tf.estimator.TrainSpec(train_input, max_steps=max_steps),
          tf.estimator.EvalSpec(train_input_fn(arranged=False), steps=1,
                                start_delay_secs=0, throttle_secs=0))
    else:
      estimator.train(train_input, max_steps=max_steps,
                      hooks=training.training_hooks(estimator))
    return max(max_steps - skip, 0)

  def _evaluate_and_predict(self, estimator):
    if self.flags.do_eval:
      _, eval_file, num_eval = self._features("dev")
      run_dir.require_checkpoint(self.output_dir, "evaluate")
      result = estimator.evaluate(bert_features.input_fn_builder(
          eval_file, self.flags.max_seq_length, self.flags.eval_batch_size,
          is_training=False, drop_remainder=False,
          pad_to_multiple_of=self.flags.pad_to_multiple_of,
          sort_window=(EVAL_SORT_BATCHES if self.flags.sort_eval_by_length
                       else None)))
      result["num_examples"] = num_eval
      not_finite = sorted(key for key, value in result.items()
                          if not math.isfinite(float(value)))
      path = os.path.join(self.output_dir, "eval_results.txt")
      with tf.io.gfile.GFile(path, "w") as writer:
        for key in sorted(result):
          writer.write(f"{key} = {result[key]}\n")
      print(f"eval on {num_eval} held-out examples: accuracy "
            f"{result['eval_accuracy']:.4f}, loss {result['eval_loss']:.4f} "
            f"(written to {path})", flush=True)
      if not_finite:
        values = ", ".join(f"{key} = {result[key]}" for key in not_finite)
        raise NotFinite(f"evaluation is not finite: {values} (see {path}); "
                        "the model diverged.")
    if self.flags.do_predict:
      _, test_file, num_test = self._features("test")
      run_dir.require_checkpoint(self.output_dir, "predict")
      path = os.path.join(self.output_dir, "test_results.tsv")
      predictions = estimator.predict(bert_features.input_fn_builder(
          test_file, self.flags.max_seq_length, self.flags.predict_batch_size,
          is_training=False, drop_remainder=False,
          pad_to_multiple_of=self.flags.pad_to_multiple_of))
      written = 0
      with tf.io.gfile.GFile(path, "w") as writer:
        for prediction in predictions:
          writer.write("\t".join(f"{p:.6f}" for p in prediction[
              "probabilities"]) + "\n")
          written += 1
      if written != num_test:
        raise RuntimeError(f"predicted {written} of {num_test} test examples.")
      print(f"predictions for {num_test} test examples written to {path}",
            flush=True)


def main(argv):
  del argv
  values = FlagValues.of(FLAGS)  # The flags, read once.
  console.quiet_tensorflow(values.verbose)
  batch_plan.use_bfc_on_cpu(values)
  logging.set_verbosity(logging.INFO)
  tf.get_logger().propagate = False  # Else absl prints TF's lines twice.
  try:
    run = ClassifierRun(values, classifier_setup.setup(values))
    try:
      run.run()
    except (tf.errors.OpError, OSError) as error:
      if not full_disk.is_full_disk(error):
        raise
      raise DiskFull(full_disk.describe(
          run.output_dir, error,
          estimate_bytes=run_dir.checkpoint_estimate(
              run.setup.init_checkpoint))) from None
  except DiskFull as error:
    print(f"run_classifier: error: {error}", file=sys.stderr)
    sys.exit(DISK_FULL_EXIT_CODE)
  except (UsageError, classification.DataError, FileNotFoundError) as error:
    sys.exit(f"run_classifier: error: {error}")
  except NotFinite as error:
    print(f"run_classifier: error: {error}", file=sys.stderr)
    sys.exit(DIVERGED_EXIT_CODE)
  except estimator_accum.OutOfMemory as error:
    sys.exit(f"run_classifier: error: {error}; give a smaller "
             "--micro_batch_size or --memory_budget_mb.")
  except tf.errors.ResourceExhaustedError as error:
    sys.exit(f"run_classifier: error: out of memory "
             f"({str(error).splitlines()[0][:200]}); give a smaller "
             "--micro_batch_size or --train_batch_size.")
  except tf.errors.InvalidArgumentError as error:
    if not estimator_accum.is_divergence(error):
      raise
    print("run_classifier: error: training diverged: "
          f"{values.max_consecutive_skipped_windows} windows in a row were "
          "skipped for non-finite gradients; lower --learning_rate or "
          "--clip_norm (or raise --max_consecutive_skipped_windows).",
          file=sys.stderr)
    sys.exit(DIVERGED_EXIT_CODE)
  # Finished: the exit without Python's teardown of TensorFlow's objects.
  end_finished_run()


if __name__ == "__main__":
  app.run(main)
