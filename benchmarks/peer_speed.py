"""The main job beside Hugging Face Trainer on PyTorch, on this machine:
the same model, split, batch, schedule and epochs, interleaved.

The main job is `python run_classifier.py` with its defaults (MiniLM on the
movie-disjoint Rotten Tomatoes split, micro-batch 8 x k=4, AdamW 5e-5, 10%
warmup then linear decay, weight decay 0.01, clip 1.0, max length 128),
each run in a fresh output directory (its features written anew, as a new
user's first run). Hugging Face Trainer (benchmarks/peer_hf_trainer.py, in
a venv of its own: requirements-peer.txt, never the library's or the
README's) fine-tunes the same all-MiniLM-L6-v2 folder on the same train
examples with the same recipe, padding per batch (its default), and with
`group_by_length=True` (its best arrangement here). Each arrangement runs
`--rounds` times, interleaved (A B C A B C: a busier minute falls on each
alike).

Printed per arrangement (medians over the rounds; with several rounds,
each round's whole seconds and ratio too): whole-process seconds
(start to exit: imports, data, model, training, evaluation), training
seconds (Trainer's `train()`; the main job's "trained N micro-batches in S
s", graph build and first compiles included), training examples a second,
dev accuracy, and the whole process against Trainer's best. Then the FLOP
floor measured here: TensorFlow's float32 matmul rate (2048 x 2048) and the
job's work, 6 x the non-embedding parameters x the real tokens it trains
on (attention's own products left out, as is usual): the training seconds
no implementation can beat at that rate. The rate is measured before the
first run and after each run, and the floor takes their median: this
machine's speed moves between half hours.

The main job's steady training is also printed against the floor: its
seconds a micro-batch from its progress lines after the first 90
micro-batches (the session's start, Grappler and XLA's first compiles left
out; the checkpoints inside), times every micro-batch it trained.

The 2048 x 2048 rate is not what the job's own products reach: a default
micro-batch is ~216 token rows unpadded. So the rate of one layer's
products at that height (forward and both gradients, nothing else; sampled
beside the 2048^2 rate) is printed too, with the job's FLOPs at it: what
the products alone take, and steady training against that. The floor's
products run on the main job's CPU path (oneDNN on, as run_classifier.py
sets it, unless TF_ENABLE_ONEDNN_OPTS says otherwise).

With `--splits 16x2,...` the main job also runs at those splits of its
effective batch 32 (`--train_batch_size`, `--gradient_accumulation_multiplier`:
every update the mean over the same 32 examples); `--splits fastest`
runs it with `--micro_batch_size fastest` instead (the planner times the
splits that fit `--fastest_budget_mb`, default 4000, and trains the
fastest: its planning counts in the whole process), then once more in a
new directory, which reads that plan from the plan cache. `--no_padded` leaves
out Trainer's padding per batch (its slowest arrangement). With
`--peer_splits 16x2,...` Trainer (group_by_length) also runs at those
splits (`per_device_train_batch_size`, `gradient_accumulation_steps`), and
Trainer's best is the fastest of all its arrangements.

With `--avx2`, every library on both sides is held to its AVX2 kernels,
as on a CPU without AVX-512 (measured on this one, not on such a CPU):
oneDNN by `ONEDNN_MAX_CPU_ISA=AVX2` (TensorFlow's and PyTorch's), PyTorch's
own kernels by `ATEN_CPU_CAPABILITY=avx2`, and MKL by
`MKL_ENABLE_INSTRUCTIONS=AVX2`; the floor's matmul too. TensorFlow's own
kernels are built for AVX either way.

  python benchmarks/peer_speed.py [--epochs 1] [--rounds 1] [--seed 42]
      [--splits 16x2,fastest] [--peer_splits 16x2] [--no_padded] [--avx2]
      [--precision bfloat16] [--peer_python .venv-peer/bin/python]

With `--precision bfloat16`, both sides train in bfloat16: the main job
with `--precision bfloat16` (bfloat16 products, float32 weights, slots and
accumulators), Trainer with `bf16=True` (autocast); the floor stays
float32's.

The peer venv is made on first use (`--peer_python` names another): Python
3.11's venv, `pip install --find-links /opt/wheels -r
requirements-peer.txt` (this machine kind's disk holds PyTorch's CPU
build; elsewhere pip takes PyTorch from the registry).
"""

import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The floor's products on the main job's own CPU path: run_classifier.py
# turns oneDNN on on every CPU, and TensorFlow's own default is on only with
# AVX-512 (without it, the floor was once Eigen's rate, not the job's).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

from harness import bench  # noqa: E402

PEER_VENV = os.path.join(ROOT, ".venv-peer")
LOCAL_WHEELS = "/opt/wheels"
ACCURACY = re.compile(r"eval on \d+ held-out examples: accuracy ([\d.]+)")
SPLIT = re.compile(r"effective batch \d+ = .*x micro-batch (\d+) x k=(\d+);")
PLANNED = re.compile(r"planned in ([\d.]+) s")
# Progress lines at or before this micro-batch are left out of the steady
# rate (40 micro-batches of one-time costs, and the line that spans them).
STEADY_AFTER = 90
MAX_LENGTH = 128
MICRO_BATCH = 8  # run_classifier.py's default micro-batch (k=4).
DEFAULT_SPLIT = (MICRO_BATCH, 4)  # Trainer's too, unless --peer_splits.
OURS = "run_classifier.py (its defaults)"
FASTEST = "run_classifier.py --micro_batch_size fastest"
FASTEST_CACHED = ("run_classifier.py --micro_batch_size fastest, its plan "
                  "cached")
PADDED = "Hugging Face Trainer, padding per batch"
GROUPED = "Hugging Face Trainer, group_by_length=True"
# --avx2: each library's kernels held to AVX2 (inherited by both sides'
# processes; set before this process imports TensorFlow for the floor).
AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def cpu_name():
  """The CPU's model name, and whether it has AVX-512."""
  name, avx512 = "unknown CPU", False
  try:
    with open("/proc/cpuinfo") as file:
      for line in file:
        if line.startswith("model name") and name == "unknown CPU":
          name = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
          avx512 = " avx512f" in line
  except OSError:
    pass
  return f"{name}, {'with' if avx512 else 'without'} AVX-512, " \
         f"{os.cpu_count()} cores"


def peer_python(path):
  """The peer venv's Python, made on first use."""
  if path:
    return path
  python = os.path.join(PEER_VENV, "bin", "python")
  if not os.path.exists(python):
    print(f"making {PEER_VENV} (PyTorch, transformers: "
          f"requirements-peer.txt)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", PEER_VENV], check=True)
    links = ["--find-links", LOCAL_WHEELS] if os.path.isdir(
        LOCAL_WHEELS) else []
    subprocess.run([python, "-m", "pip", "install", "-q", *links, "-r",
                    os.path.join(ROOT, "requirements-peer.txt")], check=True)
  return python


def write_examples(directory):
  """The main job's train and dev examples as JSON lines of text and
  label index; returns the train texts."""
  from data import classification  # noqa: PLC0415

  processor = classification.get_processor("rotten_tomatoes")
  labels = processor.get_labels()
  texts = {}
  for split, examples in (("train", processor.get_train_examples(None)),
                          ("dev", processor.get_dev_examples(None))):
    with open(os.path.join(directory, f"{split}.jsonl"), "w") as file:
      for example in examples:
        file.write(json.dumps({"text": example.text_a,
                               "label": labels.index(example.label)}) + "\n")
    texts[split] = [example.text_a for example in examples]
  return texts["train"]


def matmul_rate():
  """TensorFlow's float32 matmul rate here now (2048 x 2048), GFLOP/s."""
  import tensorflow as tf  # noqa: PLC0415

  size = 2048
  a = tf.random.normal([size, size])
  matmul = tf.function(lambda: tf.matmul(a, a), autograph=False)
  return _gflops(matmul, 2 * size ** 3, repeats=20)


def layer_products_rate(rows, hidden, intermediate):
  """TensorFlow's float32 rate on the main job's own products, GFLOP/s:
  one layer's six weight products ([rows, hidden] x the query, key, value
  and output kernels, x [hidden, intermediate], [rows, intermediate] x
  [intermediate, hidden]) forward, and each one's input gradient (x the
  kernel transposed) and kernel gradient (the input transposed x the
  output's gradient), at `rows` token rows (a micro-batch unpadded), in
  one graph as a training step runs them: the independent products side
  by side on the inter-op threads, nothing but products."""
  import tensorflow as tf  # noqa: PLC0415

  shapes = [(hidden, hidden)] * 4 + [(hidden, intermediate),
                                     (intermediate, hidden)]
  inputs = [tf.random.normal([rows, a]) for a, _ in shapes]
  kernels = [tf.random.normal([a, b]) for a, b in shapes]
  outputs = [tf.random.normal([rows, b]) for _, b in shapes]

  @tf.function(autograph=False)
  def products():
    done = []
    for x, w, dy in zip(inputs, kernels, outputs):
      done += [tf.reduce_sum(tf.matmul(x, w)[:1, :1]),
               tf.reduce_sum(tf.matmul(dy, w, transpose_b=True)[:1, :1]),
               tf.reduce_sum(tf.matmul(x, dy, transpose_a=True)[:1, :1])]
    return tf.add_n(done)

  return _gflops(products, 3 * 2 * rows * sum(a * b for a, b in shapes),
                 repeats=50)


def _gflops(run, flops, repeats):
  """GFLOP/s of `run` (a tf.function of `flops` each call), traced and run
  once first, then timed over `repeats` calls."""
  run().numpy()
  started = time.perf_counter()
  for _ in range(repeats):
    run().numpy()
  return flops * repeats / (time.perf_counter() - started) / 1e9


Work = collections.namedtuple(
    "Work", ["tokens", "parameters", "hidden", "intermediate"])


def job_work(train_texts, epochs):
  """The main job's training: its real tokens, non-embedding parameters,
  hidden and intermediate sizes (a `Work`)."""
  from models.bert import modeling, pretrained, tokenization  # noqa: PLC0415

  checkpoint = pretrained.minilm_checkpoint()
  config = modeling.BertConfig.from_json_file(checkpoint.bert_config_file)
  tokenizer = tokenization.FullTokenizer(checkpoint.vocab_file,
                                         checkpoint.do_lower_case)
  tokens = epochs * sum(min(len(tokenizer.tokenize(text)) + 2, MAX_LENGTH)
                        for text in train_texts)
  h, i = config.hidden_size, config.intermediate_size
  per_layer = 4 * (h * h + h) + 2 * h * i + i + h + 4 * h
  parameters = config.num_hidden_layers * per_layer + h * h + h + 2 * h + 2
  return Work(int(tokens), parameters, h, i)


def floor(work, rates):
  """(matmul GFLOP/s, TFLOP, floor seconds) of the job's `work` on this
  machine: the median of `rates` (GFLOP/s measured around the runs)."""
  rate = statistics.median(rates) * 1e9
  flops = 6 * work.parameters * work.tokens
  return rate / 1e9, flops / 1e12, flops / rate


def steady_seconds(stderr, micro_batches):
  """The main job's steady training seconds: its progress lines' rates
  after STEADY_AFTER micro-batches (each over the micro-batches since the
  line before), over every micro-batch it trained; None when it logged
  too few."""
  covered = seconds = 0.0
  previous = None
  for step, rate in bench.progress_rates(stderr):
    if previous is not None and step > STEADY_AFTER and rate > 0:
      covered += step - previous
      seconds += (step - previous) / rate
    previous = step
  if not covered:
    return None
  return seconds * micro_batches / covered


def parse_split(flag, text):
  """(micro-batch, k) from `text`, MICROxK, a split of the batch 32; a
  ValueError naming `flag` and the value otherwise."""
  try:
    micro, k = (int(part) for part in text.lower().split("x"))
  except ValueError:
    raise ValueError(f"{flag} {text}: must be MICROxK, e.g. 16x2") from None
  if micro < 1 or k < 1 or micro * k != 32:
    raise ValueError(f"{flag} {text}: micro-batch x k must be 32")
  return micro, k


# --precision bfloat16: each side's own bfloat16 (run_classifier.py
# --precision bfloat16, Trainer's bf16=True); float32 against float32,
# bfloat16 against bfloat16, never across.
PRECISION = {"flags": [], "peer": []}


def run_ours(root, epochs, seed, flags=(), env=None):
  output_dir = tempfile.mkdtemp(prefix="ours-", dir=root)
  started = time.perf_counter()
  done = subprocess.run(
      [sys.executable, "run_classifier.py", f"--output_dir={output_dir}",
       f"--num_train_epochs={epochs}", f"--seed={seed}", *flags,
       *PRECISION["flags"]],
      cwd=ROOT, capture_output=True, text=True, check=False,
      env=None if env is None else dict(os.environ, **env))
  whole = time.perf_counter() - started
  trained = bench.TRAINED.search(done.stdout)
  accuracy = ACCURACY.search(done.stdout)
  if done.returncode or not trained or not accuracy:
    raise RuntimeError(f"run_classifier.py: exit {done.returncode}: "
                       f"{done.stdout[-1500:]}{done.stderr[-1500:]}")
  micro_batches = int(trained.group(1))
  split = SPLIT.search(done.stdout)
  planned = PLANNED.search(done.stdout)
  return {"whole": whole, "train": float(trained.group(2)),
          "steady": steady_seconds(done.stderr, micro_batches),
          "examples": micro_batches * int(split.group(1)),
          "accuracy": float(accuracy.group(1)),
          "split": f"{split.group(1)} x k={split.group(2)}",
          "planning": float(planned.group(1)) if planned else 0.0}


def run_peer(python, data, model, epochs, seed, grouped,
             split=DEFAULT_SPLIT):
  started = time.perf_counter()
  done = subprocess.run(
      [python, os.path.join(ROOT, "benchmarks", "peer_hf_trainer.py"),
       "--model", model, "--data", data, f"--epochs={epochs}",
       f"--seed={seed}", f"--micro_batch={split[0]}",
       f"--accumulation={split[1]}",
       *(["--group_by_length"] if grouped else []), *PRECISION["peer"]],
      capture_output=True, text=True, check=False)
  whole = time.perf_counter() - started
  line = next((li for li in done.stdout.splitlines()
               if li.startswith("RESULT ")), None)
  if done.returncode or line is None:
    raise RuntimeError(f"Hugging Face Trainer: exit {done.returncode}: "
                       f"{done.stderr[-2500:]}")
  found = json.loads(line[len("RESULT "):])
  return {"whole": whole, "train": found["train_seconds"],
          "examples": found["examples"], "accuracy": found["accuracy"],
          "versions": f"torch {found['torch']}, transformers "
                      f"{found['transformers']}"}


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--epochs", type=float, default=1.0)
  parser.add_argument("--rounds", type=int, default=1)
  parser.add_argument("--seed", type=int, default=42)
  parser.add_argument("--splits", default="",
                      help="comma-separated MICROxK splits of the batch 32 "
                           "the main job also runs at, e.g. 16x2")
  parser.add_argument("--peer_splits", default="",
                      help="comma-separated MICROxK splits of the batch 32 "
                           "Trainer (group_by_length) also runs at")
  parser.add_argument("--fastest_budget_mb", type=float, default=4000,
                      help="--memory_budget_mb of --splits fastest")
  parser.add_argument("--no_padded", action="store_true",
                      help="leave out Trainer's padding per batch")
  parser.add_argument("--avx2", action="store_true",
                      help="hold every library on both sides to its AVX2 "
                           "kernels, as on a CPU without AVX-512")
  parser.add_argument("--peer_python", default=None,
                      help="a Python with torch and transformers "
                           "(default: .venv-peer, made on first use)")
  parser.add_argument("--precision", choices=("float32", "bfloat16"),
                      default="float32",
                      help="both sides in this precision: bfloat16 is "
                           "run_classifier.py --precision bfloat16 beside "
                           "Trainer's bf16=True")
  args = parser.parse_args()
  if args.precision == "bfloat16":
    PRECISION.update(flags=["--precision=bfloat16"], peer=["--bf16"])
  if args.avx2:
    os.environ.update(AVX2)
  from models.bert import pretrained  # noqa: PLC0415

  python = peer_python(args.peer_python)
  print(f"machine: {cpu_name()}; both sides in {args.precision}" + (
      "; every library held to AVX2 (" +
      " ".join(f"{k}={v}" for k, v in AVX2.items()) + ")"
      if args.avx2 else ""), flush=True)
  rows = bench.Rows(f"The main job beside Hugging Face Trainer, "
                    f"{args.epochs:g} epoch(s), {args.rounds} round(s), "
                    f"seed {args.seed}", args.json, markdown=True,
                    formats={"whole s": ".1f", "training s": ".1f",
                             "examples/s": ".1f", "accuracy": ".4f",
                             "whole vs Trainer's best": ".2f"})
  with tempfile.TemporaryDirectory() as root:
    data = os.path.join(root, "data")
    os.makedirs(data)
    train_texts = write_examples(data)
    model = pretrained.minilm_hf_dir()
    work = job_work(train_texts, args.epochs)
    # A default micro-batch's token rows, unpadded: its products' height.
    token_rows = round(MICRO_BATCH * work.tokens /
                       (args.epochs * len(train_texts)))
    ours = {OURS: []}
    peers = {GROUPED: DEFAULT_SPLIT} if args.no_padded else {
        PADDED: DEFAULT_SPLIT, GROUPED: DEFAULT_SPLIT}
    try:
      for split in filter(None, args.splits.split(",")):
        if split == "fastest":
          # Planned in a plan cache of each round's own, then read from it
          # by the next run (a new directory).
          ours[FASTEST] = ours[FASTEST_CACHED] = [
              "--micro_batch_size=fastest", "--effective_batch_size=32",
              f"--memory_budget_mb={args.fastest_budget_mb:g}"]
          continue
        micro, k = parse_split("--splits", split)
        ours[f"run_classifier.py, micro-batch {micro} x k={k}"] = [
            f"--train_batch_size={micro}",
            f"--gradient_accumulation_multiplier={k}"]
      for split in filter(None, args.peer_splits.split(",")):
        micro, k = parse_split("--peer_splits", split)
        peers[f"{GROUPED}, micro-batch {micro} x {k}"] = (micro, k)
    except ValueError as error:
      rows.fail(str(error))
      return rows.exit_code()
    ours[OURS] = []
    arrangements = [*ours, *peers]
    results = {name: [] for name in arrangements}
    versions = ""
    rates, layer_rates = [], []

    def sample():
      rates.append(matmul_rate())
      layer_rates.append(layer_products_rate(token_rows, work.hidden,
                                             work.intermediate))

    sample()
    for round_number in range(args.rounds):
      plans = {"ESTIMATOR_ACCUM_PLAN_CACHE": os.path.join(
          root, f"plans-{round_number}")}
      for name in arrangements:
        try:
          if name in ours:
            result = run_ours(root, args.epochs, args.seed, ours[name],
                              plans if name in (FASTEST, FASTEST_CACHED)
                              else None)
          else:
            result = run_peer(python, data, model, args.epochs, args.seed,
                              grouped=name != PADDED, split=peers[name])
            versions = result["versions"]
        except RuntimeError as error:
          rows.fail(str(error))
          return rows.exit_code()
        results[name].append(result)
        sample()
    medians = {name: {key: statistics.median(r[key] for r in runs)
                      for key in ("whole", "train", "examples", "accuracy")}
               for name, runs in results.items()}
    if FASTEST in results:
      print("--micro_batch_size fastest chose " + ", ".join(
          f"{r['split']} (planned in {r['planning']:.1f} s)"
          for r in results[FASTEST]) + "; from the plan cache: " + ", ".join(
              r["split"] for r in results[FASTEST_CACHED]), flush=True)
    if args.rounds > 1:
      _print_rounds(results, ours, peers)
    best = min(medians[name]["whole"] for name in peers)
    for name in arrangements:
      found = medians[name]
      rows.add(**{"arrangement": name, "whole s": found["whole"],
                  "training s": found["train"],
                  "examples/s": found["examples"] / found["train"],
                  "accuracy": found["accuracy"],
                  "whole vs Trainer's best": best / found["whole"]})
    rate, tflop, seconds = floor(work, rates)
    rows.add(**{"arrangement": f"FLOP floor: {tflop:.1f} TFLOP (6 x "
                               f"{work.parameters / 1e6:.1f}M non-embedding "
                               f"parameters x {work.tokens:,} real tokens) at "
                               f"{rate:.0f} GFLOP/s (tf.matmul 2048^2)",
                "whole s": "", "training s": seconds, "examples/s": "",
                "accuracy": "", "whole vs Trainer's best": ""})
    print(f"peer: {versions}; training vs the floor: main job "
          f"{medians[OURS]['train'] / seconds:.2f}x, Trainer's "
          f"best {min(medians[n]['train'] for n in peers) / seconds:.2f}x",
          flush=True)
    print("matmul GFLOP/s before the runs and after each run: " +
          ", ".join(f"{r:.0f}" for r in rates), flush=True)
    # Each sample's two rates come from the same minute: their ratio moves
    # less than either rate across a run.
    ratio = statistics.median(b / a for a, b in zip(rates, layer_rates))
    layer_rate, layer_seconds = rate * ratio, seconds / ratio
    print(f"the job's own products (a layer's six weight products forward "
          f"and both their gradients, at micro-batch {MICRO_BATCH}'s mean "
          f"{token_rows} token rows, products only): GFLOP/s beside each "
          f"2048^2 sample: " + ", ".join(f"{r:.0f}" for r in layer_rates) +
          f"; {ratio:.2f}x the 2048^2 rate (the median ratio): at "
          f"{layer_rate:.0f} GFLOP/s the job's FLOPs take "
          f"{layer_seconds:.1f} s, {layer_seconds / seconds:.2f}x the floor",
          flush=True)
    for name in ours:
      steady = [r["steady"] for r in results[name] if r["steady"]]
      if not steady:
        print(f"{name}: steady training not measured: no progress line "
              f"after micro-batch {STEADY_AFTER} (give more --epochs)",
              flush=True)
        continue
      median = statistics.median(steady)
      print(f"{name}: steady training {median:.1f} s (its progress lines "
            f"after micro-batch {STEADY_AFTER}), {median / seconds:.2f}x "
            f"the floor" + (
                f", {median / layer_seconds:.2f}x its products at their own "
                f"shapes' rate ({layer_rate:.0f} GFLOP/s)" if name == OURS
                else ""), flush=True)
  return rows.exit_code()


def _print_rounds(results, ours, peers):
  """Each round's whole seconds, and each of ours against that round's best
  peer: the spread the medians hide."""
  for name in [*ours, *peers]:
    print(f"{name}: whole s by round " + ", ".join(
        f"{r['whole']:.1f}" for r in results[name]), flush=True)
  for name in ours:
    ratios = [min(results[p][i]["whole"] for p in peers) / r["whole"]
              for i, r in enumerate(results[name])]
    print(f"{name}: whole vs that round's Trainer's best " + ", ".join(
        f"{ratio:.2f}x" for ratio in ratios), flush=True)


if __name__ == "__main__":
  sys.exit(main())
