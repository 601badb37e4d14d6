"""run_classifier.py's flags: google-research/bert's (its TPU flags
accepted and unused) and the accumulation's, defined when this module is
imported. Only run_classifier.py imports it: Google's own scripts, which
run on models.bert unchanged, define theirs."""

from absl import flags

from data import classification
from models import batch_plan
from models.bert import optimization

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
flags.DEFINE_integer("save_checkpoints_steps", 1000, "Micro-batches between "
                     "checkpoints (and one at the end; a stop on SIGTERM "
                     "saves too): a run stopped or killed resumes from the "
                     "last one, on the batches it would have trained on. "
                     "1000 as Google's run_classifier.py: each save writes "
                     "about 4x the model.",
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
flags.DEFINE_bool("fused_apply", True, "The window's end in one pass "
                  "over memory a variable instead of about ten: "
                  "--optimizer=lamb's update (or on a GPU, adamw's) "
                  "compiled by XLA into one function, in place, a few "
                  "seconds' compile at the first window's end, the same "
                  "update up to float32 rounding; and the window's sums "
                  "zeroed in place (the window option fused_apply). "
                  "adamw on the CPU updates each variable in one native op "
                  "either way, TensorFlow's ops' values bit for bit, with "
                  "no compile. --nofused_apply: TensorFlow's ops, one by "
                  "one, for the rest.")
flags.DEFINE_bool("unpadded", True, "The transformer layers' dense "
                  "parts (projections, feed-forward, layer norms: most of "
                  "the work) compute the real tokens only, gathered into "
                  "one matrix; attention runs on the padded rows unless "
                  "--fused_attention runs it too. The same "
                  "outputs and update (dropout's keyed masks too; "
                  "--nokeyed_dropout draws them in other shapes), no work "
                  "on the padding that trimming and sorting leave. "
                  "--nounpadded: every position computed.")
flags.DEFINE_bool("pooled_only", True, "The last transformer layer "
                  "computes only each example's first token ([CLS]), the "
                  "one the classifier reads: its queries attend to every "
                  "token, its feed-forward block and layer norms run on one "
                  "row an example (BertModel pooled_only). The same logits "
                  "and update (keyed dropout's masks too), "
                  "~13% of MiniLM's matrix products less. --nopooled_only: "
                  "every token of the last layer computed.")
flags.DEFINE_bool("fused_attention", True, "With --unpadded, in training: "
                  "attention as one native op over the real tokens "
                  "(scores, softmax, keyed dropout and context per example "
                  "and head; no padding, transposes, scatter or gather), "
                  "where the native kernels build (float32, one example a "
                  "row). The same function to float32 rounding, the same "
                  "dropout masks. --nofused_attention: TensorFlow's ops.")
flags.DEFINE_bool("keyed_dropout", True, "Dropout's masks drawn from each "
                  "example's place in the training stream (a hash of the "
                  "seed, the layer, the example, the position, the column), "
                  "not from the batch it sits in: every split of a window "
                  "(--train_batch_size x k), sorted or not, padded or not, "
                  "trains to the same weights. Packed rows keep "
                  "tf.nn.dropout. --nokeyed_dropout: tf.nn.dropout.")
flags.DEFINE_bool("lean_grappler", True, "Sessions skip Grappler's passes "
                  "that change nothing a step computes on a CPU (TFG's, the "
                  "memory and layout optimizers; "
                  "estimator_accum.lean_grappler): the same weights, a "
                  "shorter start. One process only; a GPU keeps "
                  "them. --nolean_grappler: TensorFlow's full Grappler.")
flags.DEFINE_bool("sort_windows_by_length", True, "Sort the examples of "
                  "each window (k micro-batches) by length before cutting "
                  "them into micro-batches, each trimmed to its longest: the "
                  "same update (the mean over the same examples), computed "
                  "over less padding.")
flags.DEFINE_bool("sort_eval_by_length", True, "Evaluate the dev split's "
                  "examples sorted by length, 64 batches at a time, each "
                  "batch trimmed to its longest: the same examples and "
                  "accuracy (the mean loss up to float32's order of "
                  "summation), less padding. Prediction keeps the file's "
                  "order.")
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
flags.DEFINE_bool("trace_window", False, "Trace one window's "
                  "micro-batches after 3 whole windows: say where its time "
                  "went (matmuls, element-wise, gathers, the window's end, "
                  "outside the ops) in one line, and write "
                  "<output_dir>/window_trace.json (a Chrome trace).")
flags.DEFINE_integer("max_examples_per_row", 8, "With --pack_windows, the "
                     "most examples one row holds.", lower_bound=1)
flags.DEFINE_enum("optimizer", "adamw", optimization.OPTIMIZERS, "Optimizer.")
flags.DEFINE_enum("precision", "float32", ["float32", "bfloat16", "float16"],
                  "The layers' products: float32; bfloat16 (the dense "
                  "products' operands in bfloat16, everything else, the "
                  "weights, slots and accumulators float32, no loss "
                  "scaling; pays where the CPU or GPU multiplies bfloat16 "
                  "natively: AVX512-BF16, AMX, Ampere); float16 (float16 "
                  "compute, float32 variables, dynamic loss scaling).")
flags.DEFINE_bool("use_fp16", False, "The same as --precision float16.")


@flags.multi_flags_validator(
    ["precision", "use_fp16"],
    message="--use_fp16 is --precision float16; give one of them.")
def _one_precision(values):
  return not values["use_fp16"] or values["precision"] in ("float32",
                                                           "float16")
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
