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

import dataclasses
import datetime
import hashlib
import json
import math
import os
import re
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# oneDNN's CPU kernels, which TensorFlow 2.15 turns on by default only on
# CPUs with AVX-512-class features: on the main job they are faster than
# Eigen's held to AVX2 too (`python benchmarks/main_job_speed.py
# --cpu_paths`: 1.24x Eigen's at AVX2, 1.38x at AVX-512; docs/bert.md).
# Read when TensorFlow starts; TF_ENABLE_ONEDNN_OPTS=0 keeps Eigen's.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import tensorflow as tf  # noqa: E402
from absl import app, flags, logging

import estimator_accum
from data import bert_features, classification
from estimator_accum.checkpoints import full_disk, run_lock
from estimator_accum.integrations import session_runner
from models import batch_plan, console, strategies
from models.bert import (
  classifier,
  modeling,
  optimization,
  pretrained,
  tokenization,
)
from models.script_flags import FlagValues
from models.training import DISK_FULL_EXIT_CODE, resume_from_complete

FLAGS = flags.FLAGS
flags.DEFINE_bool("verbose", False, "Show TensorFlow's INFO lines and "
                  "deprecation notices too (set TF_CPP_MIN_LOG_LEVEL=0 for "
                  "its C++ ones).")
STRATEGIES = ("none", "mirrored", "multi_worker", "parameter_server")

flags.DEFINE_string("task_name", "rotten_tomatoes",
                    f"One of {sorted(classification.PROCESSORS)}.")
flags.DEFINE_string("data_dir", None, "The task's data files (GLUE TSVs, "
                    "Yelp CSVs); Rotten Tomatoes defaults to its package.")
flags.DEFINE_string("bert_config_file", None, "bert_config.json; default "
                    "all-MiniLM-L6-v2 from its offline package.")
flags.DEFINE_string("vocab_file", None, "vocab.txt of the model.")
flags.DEFINE_string("init_checkpoint", None, "Pretrained checkpoint prefix.")
flags.DEFINE_string("output_dir", None, "Checkpoints, features and results; "
                    "default runs/<task>-<time>, or runs/<task>-cluster-<hash of "
                    "the cluster> under TF_CONFIG (one directory for all tasks).")
flags.DEFINE_bool("do_lower_case", True, "Lower-case the input; must match "
                  "the vocabulary (checked).")
flags.DEFINE_integer("max_seq_length", 128, "Tokens per example, after "
                     "WordPiece, with [CLS] and [SEP].", lower_bound=3)
flags.DEFINE_bool("do_train", True, "Fine-tune on the train split.")
flags.DEFINE_bool("do_eval", True, "Evaluate on the dev split.")
flags.DEFINE_bool("do_predict", False, "Predict the test split.")
flags.DEFINE_string("export_dir", None, "Write a SavedModel for serving "
                    "under this directory (a numbered version directory, as "
                    "TensorFlow Serving reads a model's base path): after "
                    "training and evaluation, or from --output_dir's latest "
                    "checkpoint with --do_train=false. Signatures "
                    "serving_default (input_ids, input_mask, segment_ids -> "
                    "probabilities) and text (raw strings, tokenized in the "
                    "graph). See docs/bert.md.")
flags.DEFINE_integer("train_batch_size", 8, "Micro-batch per replica.",
                     lower_bound=1)
flags.DEFINE_integer("eval_batch_size", 64, "Eval batch.", lower_bound=1)
flags.DEFINE_integer("predict_batch_size", 64, "Predict batch.",
                     lower_bound=1)
flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate.",
                   lower_bound=0.0)
flags.DEFINE_float("num_train_epochs", 1.0, "Epochs over the train split.",
                   lower_bound=0.0)
flags.DEFINE_float("warmup_proportion", 0.1, "Share of the updates spent "
                   "warming the learning rate up.", lower_bound=0.0,
                   upper_bound=1.0)
flags.DEFINE_integer("save_checkpoints_steps", 250, "Micro-batches between "
                     "checkpoints: a run stopped or killed resumes from the "
                     "last one, on the batches it would have trained on.",
                     lower_bound=1)
flags.DEFINE_integer("keep_checkpoint_max", 2, "Checkpoints kept (weights, "
                     "optimizer slots and window: about 3x the model each).",
                     lower_bound=1)
flags.DEFINE_integer("gradient_accumulation_multiplier", 4, "k: micro-batches "
                     "accumulated per optimizer update.", lower_bound=1,
                     upper_bound=2**24)
# The names other accumulation scripts use for k (Hugging Face's Trainer,
# NVIDIA's TF1 BERT), so their users' command lines carry over.
flags.DEFINE_alias("gradient_accumulation_steps",
                   "gradient_accumulation_multiplier")
flags.DEFINE_alias("num_accumulation_steps",
                   "gradient_accumulation_multiplier")
batch_plan.define_flags(flags)
flags.DEFINE_float("clip_norm", 1.0, "Clip the accumulated gradient to this "
                   "global norm; 0 disables.", lower_bound=0.0)
flags.DEFINE_float("classifier_dropout", 0.1, "Dropout on the pooled output "
                   "(Google's 0.1). Dropout masks are drawn anew after a "
                   "resume: only a run without dropout resumes to the very "
                   "weights of an uninterrupted one.", lower_bound=0.0,
                   upper_bound=0.99)
flags.DEFINE_integer("max_consecutive_skipped_windows", 25, "Stop as diverged "
                     "(exit code 3) when this many windows in a row are "
                     "skipped for non-finite gradients; 0 never stops.",
                     lower_bound=0)
flags.DEFINE_bool("recompute", False, "Recompute each transformer layer's "
                  "activations in the backward pass (dropout replayed "
                  "exactly): far less activation memory for about a third "
                  "more time; the gradient is unchanged.")
flags.DEFINE_bool("fused_apply", True, "XLA compiles the window's end "
                  "(AdamWeightDecay's arithmetic and the writes of the "
                  "weights and slots, in place) into one function: one pass "
                  "over memory instead of about ten, a few seconds' compile "
                  "at the first window's end; the same update up to float32 "
                  "rounding (the window option fused_apply). "
                  "--nofused_apply: TensorFlow's ops, one by one.")
flags.DEFINE_bool("unpadded", True, "The transformer layers' dense "
                  "parts (projections, feed-forward, layer norms: most of "
                  "the work) compute the real tokens only, gathered into "
                  "one matrix; attention runs on the padded rows. The same "
                  "outputs and update (dropout draws its masks in other "
                  "shapes), no work on the padding that trimming and "
                  "sorting leave. --nounpadded: every position computed.")
flags.DEFINE_bool("sort_windows_by_length", True, "Sort the examples of "
                  "each window (k micro-batches) by length before cutting "
                  "them into micro-batches, each trimmed to its longest: the "
                  "same update (the mean over the same examples), computed "
                  "over less padding.")
flags.DEFINE_bool("pack_windows", False, "Pack the examples of each window "
                  "(k micro-batches) into rows of max_seq_length, several a "
                  "row, each attending to its own only, with its own "
                  "positions and [CLS] (models/bert/packing.py), instead of "
                  "sorting them: the same update, computed over the fewest "
                  "rows. Training only; replaces --sort_windows_by_length.")
flags.DEFINE_integer("pad_to_multiple_of", 1, "Round each batch's length "
                     "(trimmed to its longest example) up to a multiple of "
                     "this, at most --max_seq_length: fewer distinct shapes "
                     "(8 suits GPU tensor cores; a compiler such as XLA "
                     "compiles each shape anew). The same examples and "
                     "update; 1: no rounding.", lower_bound=1)
flags.DEFINE_integer("max_examples_per_row", 8, "With --pack_windows, the "
                     "most examples one row holds.", lower_bound=1)
flags.DEFINE_enum("optimizer", "adamw", optimization.OPTIMIZERS, "Optimizer.")
flags.DEFINE_bool("use_fp16", False, "float16 compute (float32 variables) "
                  "with dynamic loss scaling.")
flags.DEFINE_enum("distribution_strategy", "none", STRATEGIES,
                  "none, mirrored (local devices), or multi_worker / "
                  "parameter_server with the cluster from TF_CONFIG.")
flags.DEFINE_float("peer_timeout_secs", 60.0,
                   "In a TF_CONFIG cluster: seconds without an answer from "
                   "another task before this one exits (exit code 150, one "
                   "line naming it) instead of hanging; 0 never.",
                   lower_bound=0)
flags.DEFINE_integer("log_every", 50, "Micro-batches between progress lines.",
                     lower_bound=1)
flags.DEFINE_integer("seed", 42, "Random seed.")
# google-research/bert's TPU flags, so that its command lines run unchanged.
# As there with --use_tpu=false, the others are not used; --use_tpu=true is
# refused (this script trains through tf.estimator.Estimator, not
# TPUEstimator).
flags.DEFINE_bool("use_tpu", False, "Must be false: no TPU support.")
flags.DEFINE_string("tpu_name", None, "TPU only; not used.")
flags.DEFINE_string("tpu_zone", None, "TPU only; not used.")
flags.DEFINE_string("gcp_project", None, "TPU only; not used.")
flags.DEFINE_string("master", None, "TPU only; not used.")
flags.DEFINE_integer("num_tpu_cores", 8, "TPU only; not used.")
flags.DEFINE_integer("iterations_per_loop", 1000, "TPU only; not used.")
TPU_FLAGS = ("tpu_name", "tpu_zone", "gcp_project", "master", "num_tpu_cores",
             "iterations_per_loop")


class UsageError(ValueError):
  """Bad flags or inputs: reported as one line and a non-zero exit."""


class NotFinite(RuntimeError):
  """Training or evaluation diverged: one line and exit code 3."""


# Exit codes: 1 for bad flags or inputs, 3 for a diverged run, 4 for an
# --output_dir whose checkpoints are all incomplete
# (models.training.NO_COMPLETE_CHECKPOINT_EXIT_CODE), 5 for a full disk
# (models.training.DISK_FULL_EXIT_CODE).
DIVERGED_EXIT_CODE = 3


class DiskFull(RuntimeError):
  """A write into --output_dir found the disk full: one line, exit 5."""


RUN_INFO = "run_info.json"


def _refuse_another_run(path, held, info):
  """UsageError naming both runs if `held` (the run_info of --output_dir)
  is of another task or model than `info` (this run's)."""
  if held.get("task_name") != info["task_name"]:
    raise UsageError(
        f"--output_dir={path} holds a run of task {held.get('task_name')}, "
        f"not {info['task_name']}: give this run another --output_dir.")
  there, here = held.get("bert_config", {}), info["bert_config"]
  changed = sorted(key for key in set(there) | set(here)
                   if there.get(key) != here.get(key))
  if changed:
    differences = ", ".join(f"{key} {there.get(key)} there, {here.get(key)} "
                            "here" for key in changed[:3])
    raise UsageError(
        f"--output_dir={path} holds a run of another model ({differences}): "
        "give this run another --output_dir.")


def _remove_if_empty(path):
  """Removes `path` and its subdirectories if they hold no file but our
  run_info.json and lock (a start that failed before writing anything)."""
  ours = {RUN_INFO, run_lock.LOCK_NAME}
  for root, _, files in os.walk(path, topdown=False):
    if set(files) <= (ours if root == path else set()):
      for name in files:
        os.remove(os.path.join(root, name))
      if not os.listdir(root):
        os.rmdir(root)


def _training_report(seconds, micro_batches):
  """One line: the training's time and the allocator's peak of tensor
  memory (on CPU the BFC allocator's only with TF_CPU_ALLOCATOR_USE_BFC=
  true, which holds tensors as a GPU's allocator does)."""
  device = estimator_accum.planner.default_device()
  line = (f"trained {micro_batches} micro-batches in {seconds:.1f} s "
          f"({seconds / max(micro_batches, 1):.3f} s each)")
  try:
    peak = tf.config.experimental.get_memory_info(device)["peak"]
  except ValueError:
    return (f"{line}; peak memory not measured ({device}'s allocator keeps "
            "no statistics: on CPU set TF_CPU_ALLOCATOR_USE_BFC=true)")
  how = ("the BFC allocator, as a GPU holds tensors"
         if device.startswith("CPU") else "its allocator")
  return f"{line}; peak tensor memory {peak / 2**20:,.0f} MB on {device} ({how})"


def _directory_size(path):
  """Bytes in the files under `path`."""
  return sum(os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(path) for name in names)


class ClassifierRun:
  """One run of the script: the flags, read once (`self.flags`), the
  output directory derived from them, and how the job is spread."""

  def __init__(self, flag_values):
    self.flags = flag_values
    self.output_dir = flag_values.output_dir
    self.distribution = None

  def _model_files(self):
    """(bert_config_file, vocab_file, init_checkpoint), the default model's
    when none of them is given."""
    flags = self.flags
    given = (flags.bert_config_file, flags.vocab_file, flags.init_checkpoint)
    if not any(given):
      checkpoint = pretrained.minilm_checkpoint()
      return (checkpoint.bert_config_file, checkpoint.vocab_file,
              checkpoint.init_checkpoint)
    if not self.flags.bert_config_file or not self.flags.vocab_file:
      raise UsageError("--bert_config_file and --vocab_file go together (and "
                       "--init_checkpoint with them unless training from "
                       "scratch).")
    for flag, path in (("bert_config_file", self.flags.bert_config_file),
                       ("vocab_file", self.flags.vocab_file)):
      if not tf.io.gfile.exists(path):
        raise UsageError(f"--{flag}={path} does not exist.")
    if self.flags.init_checkpoint and not tf.io.gfile.exists(
        self.flags.init_checkpoint + ".index"):
      raise UsageError(
          f"--init_checkpoint={self.flags.init_checkpoint} is not a "
          f"checkpoint ({self.flags.init_checkpoint}.index is missing).")
    return given

  def _features(self, processor, split, tokenizer, label_list):
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
        report=lambda line: print(line, flush=True))
    return examples, path, count

  def _prepare_output_dir(self, task, bert_config):
    """Checks --output_dir before anything is written, creates it, and
    records which task and model it holds; refuses one that holds another's.
    Returns whether it was created here."""
    path = self.output_dir
    if tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
      raise UsageError(f"--output_dir={path} is a file, not a directory.")
    existed = tf.io.gfile.exists(path)
    try:
      tf.io.gfile.makedirs(path)
      probe = os.path.join(path, f".write_test_{os.getpid()}")
      with tf.io.gfile.GFile(probe, "w") as f:
        f.write("")
      tf.io.gfile.remove(probe)
    except (OSError, tf.errors.OpError) as error:
      reason = getattr(error, "strerror", None) or getattr(
          error, "message", None) or str(error)
      raise UsageError(f"--output_dir={path} is not writable: "
                       f"{reason.splitlines()[0]}") from None
    info_path = os.path.join(path, RUN_INFO)
    info = {"task_name": task, "bert_config": bert_config.to_dict()}
    if tf.io.gfile.exists(info_path):
      with tf.io.gfile.GFile(info_path) as f:
        text = f.read()
      try:
        held = json.loads(text)
      except ValueError as error:
        raise UsageError(
            f"--output_dir={path} holds a {RUN_INFO} that is not JSON "
            f"({error}): remove it, or give this run another "
            "--output_dir.") from None
      _refuse_another_run(path, held, info)
    else:
      # Written whole, then renamed into place: a cluster's tasks share
      # --output_dir and start together, and one that found the file while
      # another was still writing it read an empty file (a
      # JSONDecodeError that failed a parameter-server job's chief).
      partial = os.path.join(path, f".{RUN_INFO}.{os.getpid()}")
      with tf.io.gfile.GFile(partial, "w") as f:
        json.dump(info, f, indent=2)
      tf.io.gfile.rename(partial, info_path, overwrite=True)
    return not existed

  def _warn_if_short_of_room(self, init_checkpoint):
    """Says at the start when --output_dir cannot hold
    --keep_checkpoint_max checkpoints, each about 4x the model (its
    weights, the optimizer's two slots, the window's sums)."""
    if not (self.flags.do_train and init_checkpoint):
      return
    line = full_disk.short_of_room(
        self.output_dir, 4 * full_disk.checkpoint_bytes(init_checkpoint),
        self.flags.keep_checkpoint_max)
    if line:
      print(f"warning: {line}", flush=True)

  def _resumed_at(self):
    """The micro-batch the run resumes at: its latest checkpoint's global
    step (0 for a new run). Parameter-server workers share one global step
    and cannot tell their own position: they start their input again."""
    latest = tf.train.latest_checkpoint(self.output_dir)
    if not latest:
      return 0
    step = int(tf.train.load_checkpoint(latest).get_tensor("global_step"))
    print(f"resuming from {latest} at micro-batch {step}", flush=True)
    return step

  def _require_checkpoint(self, what):
    """UsageError unless --output_dir holds a checkpoint to `what` with
    (without one Estimator would use an untrained classifier head)."""
    if tf.train.latest_checkpoint(self.output_dir) is None:
      raise UsageError(
          f"--do_train=false: nothing to {what}, --output_dir="
          f"{self.output_dir} holds no checkpoint; train first (--do_train) "
          "or give the --output_dir of a trained run.")

  def _check_release(self):
    """On TensorFlow 2.16+ (no tf.estimator) the script trains, evaluates
    and predicts on one device; what needs Estimator is refused here."""
    if estimator_accum.releases.estimator() is not None:
      return
    needs = [f"--{name}={value}" for name, value in (
        ("distribution_strategy", self.flags.distribution_strategy),
        ("export_dir", self.flags.export_dir))
        if value not in (None, "", "none")]
    if needs:
      raise UsageError(
          f"{', '.join(needs)} needs tf.estimator, which TensorFlow "
          f"{tf.__version__} does not have (its last release is 2.15); on "
          f"this release run_classifier trains, evaluates and predicts on "
          f"one device (--distribution_strategy=none, no --export_dir).")

  def _check_tpu_flags(self):
    if self.flags.use_tpu:
      raise UsageError(
          "--use_tpu=true: this script trains on CPUs and GPUs through "
          "tf.estimator.Estimator and has no TPU support; drop --use_tpu (use "
          "--distribution_strategy for several devices or machines).")
    given = [f"--{name}" for name in TPU_FLAGS if name in self.flags.given]
    if given:
      logging.warning("%s: TPU flags, not used without --use_tpu (as in "
                      "google-research/bert).", ", ".join(given))

  def _check_xla_auto_jit(self):
    """XLA's auto-clustering on CPU (TF_XLA_FLAGS) aborts the process on
    this script's training graph in TensorFlow 2.15: refused in one line,
    before any work, instead of a core dump mid-run."""
    value = os.environ.get("TF_XLA_FLAGS", "")
    auto = re.search(r"--tf_xla_auto_jit=(\S+)", value)
    cpu = re.search(r"--tf_xla_cpu_global_jit(?:=(\S+))?(?:\s|$)", value)
    if (self.flags.do_train and auto and auto.group(1) not in ("0", "-1")
        and cpu and (cpu.group(1) or "true").lower() not in ("false", "0")):
      raise UsageError(
          f"TF_XLA_FLAGS={value!r} clusters the training graph with XLA on "
          "CPU, which aborts TensorFlow 2.15's process on it "
          "(std::out_of_range in XLA; measured on this script's BERT, k=1, "
          "2 and 4, sorted or not): unset it (--fused_apply compiles the "
          "window's end alone with XLA).")

  def run(self):
    self._check_tpu_flags()
    self._check_release()
    self._check_xla_auto_jit()
    if not (self.flags.do_train or self.flags.do_eval or self.flags.do_predict
            or self.flags.export_dir):
      raise UsageError("at least one of --do_train, --do_eval, --do_predict "
                       "must be true, or --export_dir given.")
    processor = classification.get_processor(self.flags.task_name)
    label_list = processor.get_labels()
    bert_config_file, vocab_file, init_checkpoint = self._model_files()
    self.vocab_file = vocab_file
    bert_config = modeling.BertConfig.from_json_file(bert_config_file)
    try:
      modeling.check_config(bert_config)
    except ValueError as error:
      raise UsageError(f"--bert_config_file={bert_config_file}: {error}"
                       ) from None
    if self.flags.max_seq_length > bert_config.max_position_embeddings:
      raise UsageError(
          f"--max_seq_length={self.flags.max_seq_length} is above the model's "
          f"max_position_embeddings ({bert_config.max_position_embeddings}).")
    try:
      tokenization.validate_case_matches_vocab(self.flags.do_lower_case,
                                               vocab_file)
    except ValueError as error:
      raise UsageError(str(error).replace("do_lower_case", "--do_lower_case")
                       ) from None
    tokenizer = tokenization.FullTokenizer(vocab_file, self.flags.do_lower_case)
    try:  # A bad TF_CONFIG is refused here, before anything is written.
      cluster = strategies.tf_config(
          self.flags.distribution_strategy).get("cluster")
    except strategies.StrategyError as error:
      raise UsageError(str(error)) from None
    if self.output_dir is None:
      stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
      if cluster:
        # Every task of the job must land in one directory: named by the
        # cluster, which they share, not by each one's start time.
        stamp = "cluster-" + hashlib.sha1(json.dumps(
            cluster, sort_keys=True).encode()).hexdigest()[:10]
      self.output_dir = os.path.join("runs", f"{processor.name}-{stamp}")
    created = self._prepare_output_dir(processor.name, bert_config)
    lock = _hold_output_dir(self.output_dir, cluster)
    try:
      self._run_holding_the_directory(
          processor, label_list, bert_config, tokenizer, init_checkpoint,
          created)
    finally:
      lock.release()

  def _run_holding_the_directory(self, processor, label_list, bert_config,
                                 tokenizer, init_checkpoint, created):
    # A checkpoint cut short or corrupted is skipped, each named in a line,
    # and the run resumes from the newest complete one (none: exit 4).
    resume_from_complete("run_classifier", self.output_dir,
                         flag="--output_dir")
    self._warn_if_short_of_room(init_checkpoint)
    try:
      self.distribution = strategies.choose(
          self.flags.distribution_strategy, self.output_dir,
          self.flags.peer_timeout_secs)
    except strategies.StrategyError as error:
      if created:
        _remove_if_empty(self.output_dir)
      raise UsageError(str(error)) from None
    if (self.flags.do_train and self.flags.fused_apply and
        self.flags.distribution_strategy == "none"):
      # The window's end is compiled (one replica): XLA's one-time lines
      # on CPU go nowhere, after the allocator is chosen.
      console.quiet_xla_start(self.flags.verbose)
    try:
      self._train_and_evaluate(processor, label_list, bert_config, tokenizer,
                               init_checkpoint)
    except BaseException:
      self.distribution.stop()
      if created:
        _remove_if_empty(self.output_dir)
      raise
    self._remove_own_worker_checkpoints()
    self.distribution.finish()

  def _remove_own_worker_checkpoints(self):
    """A MultiWorkerMirroredStrategy worker other than the chief saves its
    own copy of every checkpoint in output_dir/tmp_worker_<i> (the size of
    the model each); once the job has ended nothing reads them."""
    if self.flags.distribution_strategy != "multi_worker" or (
        self.distribution.is_chief):
      return
    task = self.distribution.task
    path = os.path.join(self.output_dir,
                        f"tmp_{task.get('type')}_{task.get('index')}")
    if tf.io.gfile.isdir(path):
      tf.io.gfile.rmtree(path)

  def _train_and_evaluate(self, processor, label_list, bert_config, tokenizer,
                          init_checkpoint):
    distribution = self.distribution
    strategy, workers = distribution.strategy, distribution.workers
    replicas = distribution.replicas_per_worker
    between_graph = self.flags.distribution_strategy == "parameter_server"
    # Each parameter-server worker applies its own windows, asynchronously.
    ways = 1 if between_graph else workers * replicas
    num_train, train_file = 0, None
    if self.flags.do_train:
      _, train_file, num_train = self._features(processor, "train", tokenizer,
                                           label_list)
    plan = self._batch_plan(bert_config, train_file, ways, len(label_list))
    num_train_updates = max(1, math.ceil(
        num_train * self.flags.num_train_epochs / plan.effective_batch))
    if self.flags.do_train:
      how = (f"{workers} worker(s) x {replicas} replica(s) x micro-batch "
             f"{plan.micro_batch} x k={plan.k}")
      if between_graph:
        how = (f"micro-batch {plan.micro_batch} x k={plan.k} per update, each "
               f"of {workers} worker(s) applying its own windows to the ps")
      print(f"effective batch {plan.effective_batch} = {how}; "
            f"{num_train_updates} updates ({num_train_updates * plan.k} "
            f"micro-batches) over {num_train} examples, "
            f"{self.flags.num_train_epochs:g} epoch(s)", flush=True)
      if self.flags.pack_windows:
        print(f"each window's {plan.k} x {plan.micro_batch} examples packed "
              f"into rows of {self.flags.max_seq_length} tokens, at most "
              f"{self.flags.max_examples_per_row} a row (--pack_windows): a "
              f"micro-batch is at most {plan.micro_batch} rows (what the plan "
              f"counts and measures, at {self.flags.max_seq_length} tokens) "
              f"and holds {plan.micro_batch} examples on average", flush=True)
      elif self.flags.sort_windows_by_length and plan.k > 1:
        print(f"each window's {plan.k} x {plan.micro_batch} examples sorted "
              "by length into its micro-batches (--sort_windows_by_length)",
              flush=True)
      if self.flags.unpadded:
        print("the layers' dense parts compute real tokens only, attention "
              "the padded rows (--unpadded)", flush=True)

    def estimator_for(plan):
      return self._estimator(bert_config, self._training_config(
          plan, num_train_updates, len(label_list), init_checkpoint), plan,
                        strategy, replicas)

    def train(plan):
      started = time.perf_counter()
      self._train(estimator_for(plan), plan, train_file, num_train_updates)
      print(_training_report(time.perf_counter() - started,
                             num_train_updates * plan.k), flush=True)

    if self.flags.do_train:
      # One process only: on a cluster every worker would have to halve.
      if self.flags.micro_batch_size == "auto" and (
          self.flags.distribution_strategy in ("none", "mirrored")):
        plan = estimator_accum.train_halving_on_oom(
            train, plan, self.output_dir, log=self._replanned)
      else:
        train(plan)
    if not self.distribution.is_chief:
      return
    self._evaluate_and_predict(estimator_for(plan), processor, tokenizer,
                          label_list)
    if self.flags.export_dir:
      self._export(estimator_for(plan), processor, bert_config)
    print(f"{self.output_dir}: {_directory_size(self.output_dir) / 2**20:.1f}"
          f" MB (the last {self.flags.keep_checkpoint_max} checkpoints, "
          "features, "
          "events)", flush=True)

  def _export(self, estimator, processor, bert_config):
    """Writes the SavedModel for serving (models/bert/export.py) of the
    latest checkpoint under --export_dir, and says where."""
    del bert_config
    from models.bert import export  # noqa: PLC0415 (TensorFlow Text's ops)

    self._require_checkpoint("export")
    pair = any(e.text_b is not None
               for e in processor.get_dev_examples(self.flags.data_dir))
    path = export.export_classifier(
        estimator, self.flags.export_dir, self.vocab_file,
        self.flags.do_lower_case, self.flags.max_seq_length, pair=pair)
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

  def _batch_plan(self, bert_config, train_file, ways, num_labels):
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
    if not self.flags.do_train and self.flags.micro_batch_size == "auto":
      return estimator_accum.MicroBatchPlan.given(effective, effective // ways,
                                                  ways)
    training = self._training_config(estimator_accum.MicroBatchPlan.given(
        effective, effective // ways, ways), 1, num_labels, None)
    try:
      return batch_plan.resolve(
          self.flags,
          build=self._planning_step(bert_config, training, train_file),
          effective_batch=effective, replicas=ways, run_dir=self.output_dir,
          is_chief=self.distribution.is_chief)
    except batch_plan.PlanError as error:
      raise UsageError(str(error)) from None

  def _planning_step(self, bert_config, training, train_file):
    """build(micro_batch, k) for the planner: the training step on batches of
    the train file at the full --max_seq_length (the longest a batch gets)."""

    def build(micro_batch, k, recompute=False,
              accumulator_placement="device"):
      if train_file is None:
        raise UsageError("--micro_batch_size=auto measures training: it needs "
                         "--do_train.")
      tf.compat.v1.train.get_or_create_global_step()
      dataset = bert_features.input_fn_builder(
          train_file, self.flags.max_seq_length, micro_batch, is_training=True,
          drop_remainder=True, seed=self.flags.seed, trim=False)()
      features = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
      step = dataclasses.replace(
          training, k=k, micro_batch_size=micro_batch, recompute=recompute,
          accumulator_placement=accumulator_placement)
      return classifier.model_fn_builder(bert_config, step)(
          features, None, session_runner.TRAIN).train_op

    return build

  def _training_config(self, plan, num_train_updates, num_labels,
                       init_checkpoint):
    return classifier.TrainingConfig(
        num_labels=num_labels, learning_rate=self.flags.learning_rate,
        num_train_updates=num_train_updates,
        num_warmup_updates=int(num_train_updates *
                               self.flags.warmup_proportion),
        k=plan.k, clip_norm=self.flags.clip_norm or None,
        optimizer=self.flags.optimizer,
        init_checkpoint=init_checkpoint, micro_batch_size=plan.micro_batch,
        total_micro_batches=num_train_updates * plan.k,
        log_every_n_micro_batches=self.flags.log_every,
        use_fp16=self.flags.use_fp16,
        max_consecutive_skipped_windows=(
            self.flags.max_consecutive_skipped_windows or None),
        classifier_dropout=self.flags.classifier_dropout,
        recompute=self.flags.recompute or plan.recompute,
        accumulator_placement=plan.accumulator_placement,
        fused_apply=self.flags.fused_apply, unpadded=self.flags.unpadded)

  def _estimator(self, bert_config, training, plan, strategy, replicas):
    session_config = None
    if strategy is not None and not tf.config.list_physical_devices("GPU"):
      session_config = tf.compat.v1.ConfigProto(
          device_count={"CPU": max(replicas, 1)})
    save_every = self.flags.save_checkpoints_steps
    if self.flags.micro_batch_size == "auto":  # Window boundaries, for halving.
      save_every = batch_plan.save_every(plan, save_every)
    model_fn = classifier.model_fn_builder(bert_config, training)
    if estimator_accum.releases.estimator() is None:
      # TensorFlow 2.16+: the same model_fn through the library's sessions
      # (one device; _check_release refused the rest).
      return session_runner.SessionEstimator(
          model_fn, session_runner.RunSettings(
              model_dir=self.output_dir, tf_random_seed=self.flags.seed,
              session_config=session_config,
              save_checkpoints_steps=save_every,
              keep_checkpoint_max=self.flags.keep_checkpoint_max))
    run_config = tf.estimator.RunConfig(
        model_dir=self.output_dir, tf_random_seed=self.flags.seed,
        train_distribute=strategy, session_config=session_config,
        save_checkpoints_steps=save_every,
        keep_checkpoint_max=self.flags.keep_checkpoint_max,
        log_step_count_steps=self.flags.log_every * 1000,
        # No graph.pbtxt and no .meta beside each checkpoint: the events
        # file holds the graph for TensorBoard, and printing BERT's graph as
        # text took about 1 s of an 8 s tiny-BERT run (2 layers).
        checkpoint_save_graph_def=False)
    return tf.estimator.Estimator(model_fn, config=run_config)

  def _train(self, estimator, plan, train_file, num_train_updates):
    between_graph = self.flags.distribution_strategy == "parameter_server"
    packing = self.flags.pack_windows

    def train_input_fn(arranged):
      return bert_features.input_fn_builder(
          train_file, self.flags.max_seq_length, plan.micro_batch,
          is_training=True, drop_remainder=True, seed=self.flags.seed,
          shard=self.distribution.trainer_shard() if between_graph else None,
          skip_batches=0 if between_graph else self._resumed_at(),
          sort_window=plan.k if (arranged and not packing and
                                 self.flags.sort_windows_by_length) else None,
          pack_window=plan.k if (arranged and packing) else None,
          max_examples_per_row=self.flags.max_examples_per_row,
          pad_to_multiple_of=self.flags.pad_to_multiple_of)

    train_input = train_input_fn(arranged=True)
    max_steps = num_train_updates * plan.k
    if self.flags.distribution_strategy in ("multi_worker", "parameter_server"):
      # (The evaluation train_and_evaluate asks for reads one example a row.)
      tf.estimator.train_and_evaluate(
          estimator, tf.estimator.TrainSpec(train_input, max_steps=max_steps),
          tf.estimator.EvalSpec(train_input_fn(arranged=False), steps=1,
                                start_delay_secs=0, throttle_secs=0))
    else:
      estimator.train(train_input, max_steps=max_steps)

  def _evaluate_and_predict(self, estimator, processor, tokenizer, label_list):
    if self.flags.do_eval:
      _, eval_file, num_eval = self._features(processor, "dev", tokenizer,
                                         label_list)
      self._require_checkpoint("evaluate")
      result = estimator.evaluate(bert_features.input_fn_builder(
          eval_file, self.flags.max_seq_length, self.flags.eval_batch_size,
          is_training=False, drop_remainder=False,
          pad_to_multiple_of=self.flags.pad_to_multiple_of))
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
      _, test_file, num_test = self._features(processor, "test", tokenizer,
                                         label_list)
      self._require_checkpoint("predict")
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


def _hold_output_dir(output_dir, cluster):
  """The lock of --output_dir for this run (shared by the tasks of one
  TF_CONFIG cluster); a UsageError naming the live run that holds it."""
  try:
    return run_lock.hold(output_dir, cluster=cluster,
                         report=lambda line: print(line, flush=True))
  except run_lock.DirectoryInUse as error:
    raise UsageError(str(error)) from None


def main(argv):
  del argv
  values = FlagValues.of(FLAGS)  # The flags, read once.
  console.quiet_tensorflow(values.verbose)
  batch_plan.use_bfc_on_cpu(values)
  logging.set_verbosity(logging.INFO)
  tf.get_logger().propagate = False  # Else absl prints TF's lines twice.
  try:
    run = ClassifierRun(values)
    try:
      run.run()
    except (tf.errors.OpError, OSError) as error:
      if run.output_dir is None or not full_disk.is_full_disk(error):
        raise
      raise DiskFull(full_disk.describe(run.output_dir, error)) from None
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


if __name__ == "__main__":
  app.run(main)
