"""What a run_classifier.py run needs before it writes anything: its flags
checked against each other, the release and the environment, the task,
the model files, the BERT config and the tokenizer, and the TF_CONFIG
cluster, each problem a UsageError of one line."""

import dataclasses

import tensorflow as tf
from absl import logging

import estimator_accum
from data import classification
from models import strategies
from models.bert import modeling, pretrained, tokenization
from models.bert.classifier_errors import UsageError

TPU_FLAGS = ("tpu_name", "tpu_zone", "gcp_project", "master", "num_tpu_cores",
             "iterations_per_loop")


@dataclasses.dataclass(frozen=True)
class Setup:
  """The run's inputs, checked."""
  processor: classification.DataProcessor
  label_list: list
  bert_config: modeling.BertConfig
  vocab_file: str
  init_checkpoint: str | None
  tokenizer: tokenization.FullTokenizer
  cluster: dict | None   # TF_CONFIG's "cluster", None outside one


def check_flags(values):
  """The flags' own checks, before any file is read."""
  _check_tpu_flags(values)
  _check_xla_auto_jit(values)
  if not (values.do_train or values.do_eval or values.do_predict
          or values.export_dir):
    raise UsageError("at least one of --do_train, --do_eval, --do_predict "
                     "must be true, or --export_dir given.")


def setup(values):
  """The checked `Setup` of the flag values `values`."""
  check_flags(values)
  processor = classification.get_processor(values.task_name)
  bert_config_file, vocab_file, init_checkpoint = _model_files(values)
  bert_config = modeling.BertConfig.from_json_file(bert_config_file)
  try:
    modeling.check_config(bert_config)
  except ValueError as error:
    raise UsageError(f"--bert_config_file={bert_config_file}: {error}"
                     ) from None
  if values.max_seq_length > bert_config.max_position_embeddings:
    raise UsageError(
        f"--max_seq_length={values.max_seq_length} is above the model's "
        f"max_position_embeddings ({bert_config.max_position_embeddings}).")
  try:
    tokenization.validate_case_matches_vocab(values.do_lower_case,
                                             vocab_file)
  except ValueError as error:
    raise UsageError(str(error).replace("do_lower_case", "--do_lower_case")
                     ) from None
  tokenizer = tokenization.FullTokenizer(vocab_file, values.do_lower_case)
  try:  # A bad TF_CONFIG is refused here, before anything is written.
    cluster = strategies.tf_config(
        values.distribution_strategy).get("cluster")
  except strategies.StrategyError as error:
    raise UsageError(str(error)) from None
  return Setup(processor, processor.get_labels(), bert_config, vocab_file,
               init_checkpoint, tokenizer, cluster)


def _model_files(values):
  """(bert_config_file, vocab_file, init_checkpoint), the default model's
  when none of them is given."""
  given = (values.bert_config_file, values.vocab_file,
           values.init_checkpoint)
  if not any(given):
    checkpoint = pretrained.minilm_checkpoint()
    return (checkpoint.bert_config_file, checkpoint.vocab_file,
            checkpoint.init_checkpoint)
  if not values.bert_config_file or not values.vocab_file:
    raise UsageError("--bert_config_file and --vocab_file go together (and "
                     "--init_checkpoint with them unless training from "
                     "scratch).")
  for flag, path in (("bert_config_file", values.bert_config_file),
                     ("vocab_file", values.vocab_file)):
    if not tf.io.gfile.exists(path):
      raise UsageError(f"--{flag}={path} does not exist.")
  if values.init_checkpoint and not tf.io.gfile.exists(
      values.init_checkpoint + ".index"):
    raise UsageError(
        f"--init_checkpoint={values.init_checkpoint} is not a checkpoint "
        f"({values.init_checkpoint}.index is missing).")
  return given


def _check_tpu_flags(values):
  if values.use_tpu:
    raise UsageError(
        "--use_tpu=true: this script trains on CPUs and GPUs through "
        "tf.estimator.Estimator and has no TPU support; drop --use_tpu (use "
        "--distribution_strategy for several devices or machines).")
  given = [f"--{name}" for name in TPU_FLAGS if name in values.given]
  if given:
    logging.warning("%s: TPU flags, not used without --use_tpu (as in "
                    "google-research/bert).", ", ".join(given))


def _check_xla_auto_jit(values):
  """XLA's auto-clustering on CPU (TF_XLA_FLAGS) aborts the process on
  this script's training graph (the window of the word embeddings' sparse
  gradient; the library refuses it too): refused in one line, before any
  work, instead of a core dump mid-run."""
  value = estimator_accum.releases.xla_auto_clustering_on_cpu()
  if values.do_train and value is not None:
    raise UsageError(
        f"TF_XLA_FLAGS={value!r} clusters the training graph with XLA on "
        "CPU, which aborts the process on it (inside XLA, on the window "
        "of the word embeddings' gradient; measured on TensorFlow 2.15 and "
        "2.21, k=1, 2 and 4): unset it, or keep XLA to the ops it fuses "
        "(--tf_xla_ops_to_cluster=FUSIBLE; slower here, docs/bert.md); "
        "--fused_apply compiles the window's end alone with XLA.")
