"""The main job's training speed, its arrangements side by side: today's
input (each micro-batch trimmed to its longest example, the window's end as
TensorFlow's ops), windows sorted by length, then with the window's end
compiled by XLA as one function (`--fused_apply`), and with the layers'
dense parts computing real tokens only (`--unpadded`), with the last layer
computing each example's first token only (`--pooled_only`; the four
together are run_classifier's defaults), and packed rows with them.

Each variant is `python run_classifier.py` (MiniLM on Rotten Tomatoes,
micro-batch 8 x k=4, its defaults) training `--epochs` of an epoch, no
evaluation. Steady training only: the rate of its progress lines (every
20 micro-batches) after the first 40 micro-batches, which leaves out the
process start, the graph's build and optimization and XLA's compiles (all
paid once a run: "trained N micro-batches in S s" with them is printed
too). The variants run interleaved, one at a time, `--rounds` times (ABCD
ABCD: a busier minute of the machine falls on every variant alike).
Figures: the median seconds per micro-batch, examples a second, and the
speed-up over today's.

With `--splits`, the variants are instead the defaults at each split of
the effective batch 32 into micro-batch x k (8 x 4, 16 x 2, 32 x 1): the
same windows' means, the matmuls on more rows at once (k=1 sorts nothing).

With `--cpu_paths`, the variants are instead the default run on each of
TensorFlow's CPU paths: Eigen's kernels (`TF_ENABLE_ONEDNN_OPTS=0`, the
default on a CPU without AVX-512), oneDNN's, and oneDNN's held to AVX2
(`ONEDNN_MAX_CPU_ISA=AVX2`: the kernels oneDNN picks on an AVX2-only CPU,
measured on one with AVX-512; TensorFlow's own kernels are built for AVX
either way).

With `--threads`, the variants are instead the default run with
TensorFlow's thread pools set by its own environment variables
(`TF_NUM_INTEROP_THREADS`, `TF_NUM_INTRAOP_THREADS`; both default to the
cores): ops one at a time on every core, or two at a time on one core each.

With `--attention`, the variants are instead the default run with
attention as TensorFlow's ops (`--nofused_attention`) and as one native
op over the real tokens (`--fused_attention`, the default).

With `--precision`, the variants are instead the default run in float32
and with bfloat16 products (`--precision bfloat16`), each also with
oneDNN held to AVX-512 without its bf16 instructions
(`ONEDNN_MAX_CPU_ISA=AVX512_CORE`: what a CPU without avx512_bf16 or
amx_bf16 runs, measured on one with them).

With `--grappler`, the variants are instead the default run with
TensorFlow's full Grappler (`--nolean_grappler`) and without its passes
that change nothing a CPU step computes (`--lean_grappler`, the default):
"all told" (the start included) is what differs, the steady rate should
not.

With `--dropout`, the variants are instead the default run with
dropout's masks drawn by `tf.nn.dropout` (`--nokeyed_dropout`), keyed by
example in TensorFlow's own ops (`ESTIMATOR_ACCUM_NATIVE=0`, which turns
the GELU's kernel off too), and keyed by example in one pass (the native
kernel, the default).

With `--native`, the variants are instead the default run with every
kernel of `estimator_accum.native` off (`ESTIMATOR_ACCUM_NATIVE=0`:
keyed dropout, the GELU and the layer norms in TensorFlow's own ops) and on
(the default).

With `--trees .,DIR`, each variant runs from each tree (this checkout and
another, e.g. a `git worktree` of an earlier commit), interleaved: a
change's speed against the code before it, on the same data and machine.

  python benchmarks/main_job_speed.py [--epochs 0.1] [--rounds 2] [--cpu_paths]
      [--splits] [--threads] [--dropout] [--native] [--grappler]
      [--skip WORD,...] [--trees .,DIR]
"""

import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness import bench  # noqa: E402

MICRO_BATCH = 8
_FULL = "--nopooled_only"
VARIANTS = {
    "today: trimmed, TensorFlow's ops": [
        "--nosort_windows_by_length", "--nofused_apply", "--nounpadded",
        _FULL],
    "sorted, TensorFlow's ops": ["--nofused_apply", "--nounpadded", _FULL],
    "sorted, fused_apply": ["--nounpadded", _FULL],
    "packed, fused_apply": ["--pack_windows", "--nounpadded", _FULL],
    "sorted, fused_apply, unpadded": [_FULL],
    "packed, fused_apply, unpadded": ["--pack_windows", _FULL],
    "sorted, fused_apply, unpadded, pooled_only (default)": [],
    "packed, fused_apply, unpadded, pooled_only": ["--pack_windows"],
}
# (flags, environment) of each CPU path, with the default flags.
CPU_PATHS = {
    "Eigen (TF_ENABLE_ONEDNN_OPTS=0)": ([], {"TF_ENABLE_ONEDNN_OPTS": "0"}),
    "oneDNN (TF_ENABLE_ONEDNN_OPTS=1)": ([], {"TF_ENABLE_ONEDNN_OPTS": "1"}),
    "oneDNN held to AVX2": ([], {"TF_ENABLE_ONEDNN_OPTS": "1",
                                 "ONEDNN_MAX_CPU_ISA": "AVX2"}),
}
# (flags, environment) of each thread arrangement, with the default flags.
THREADS = {
    "TensorFlow's pools (default)": ([], {}),
    "one op at a time (TF_NUM_INTEROP_THREADS=1)": (
        [], {"TF_NUM_INTEROP_THREADS": "1"}),
    "one core an op (TF_NUM_INTRAOP_THREADS=1)": (
        [], {"TF_NUM_INTRAOP_THREADS": "1"}),
}
# (flags, environment) of each way of drawing dropout's masks.
DROPOUT = {
    "tf.nn.dropout (--nokeyed_dropout)": (["--nokeyed_dropout"], {}),
    "keyed, TensorFlow's ops (ESTIMATOR_ACCUM_NATIVE=0, the GELU's too)": (
        [], {"ESTIMATOR_ACCUM_NATIVE": "0"}),
    "keyed, one pass (default)": ([], {}),
}
# (flags, environment) with estimator_accum.native's kernels off and on.
NATIVE = {
    "TensorFlow's ops (ESTIMATOR_ACCUM_NATIVE=0)": (
        [], {"ESTIMATOR_ACCUM_NATIVE": "0"}),
    "native kernels: dropout, GELU, layer norm (default)": ([], {}),
}
# (flags, environment) of each attention: TensorFlow's ops or the native op.
ATTENTION = {
    "attention, TensorFlow's ops (--nofused_attention)": (
        ["--nofused_attention"], {}),
    "attention, one native op (default)": ([], {}),
}
# (flags, environment) of each precision: float32, bfloat16 products, and
# bfloat16 with oneDNN held to AVX2 and AVX-512 without its bf16
# instructions (what a CPU without avx512_bf16 or amx_bf16 runs).
PRECISION = {
    "float32 (default)": ([], {}),
    "bfloat16 products (--precision bfloat16)": (
        ["--precision=bfloat16"], {}),
    "bfloat16, oneDNN without bf16 instructions (ONEDNN_MAX_CPU_ISA="
    "AVX512_CORE)": (["--precision=bfloat16"],
                     {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
                      "ESTIMATOR_ACCUM_BFLOAT16_ANYWHERE": "1"}),
}
# (flags, environment) of each Grappler setting.
GRAPPLER = {
    "TensorFlow's full Grappler (--nolean_grappler)": (
        ["--nolean_grappler"], {}),
    "lean Grappler (default)": ([], {}),
}
# (flags, environment, micro-batch) of each split of the effective batch 32.
SPLITS = {
    f"micro-batch {micro} x k={32 // micro}": (
        [f"--train_batch_size={micro}",
         f"--gradient_accumulation_multiplier={32 // micro}"], {}, micro)
    for micro in (8, 16, 32)}
# Examples between two progress lines (20 micro-batches of 8).
LOG_EXAMPLES = 160
# Examples left out (40 micro-batches of 8): the first steps' one-time costs.
WARM_EXAMPLES = 320


def _run(flags, epochs, root, name, env=None, micro_batch=MICRO_BATCH,
         tree=ROOT):
  output_dir = os.path.join(root, re.sub(r"\W+", "_", name))
  log_every = max(1, LOG_EXAMPLES // micro_batch)
  result = subprocess.run(
      [sys.executable, "run_classifier.py", f"--output_dir={output_dir}",
       f"--num_train_epochs={epochs}", "--do_eval=false",
       f"--log_every={log_every}", *flags],
      cwd=tree, capture_output=True, text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {})))
  found = bench.TRAINED.search(result.stdout)
  warm = WARM_EXAMPLES // micro_batch
  # Each line's rate is over the micro-batches since the line before.
  rates = [rate for step, rate in bench.progress_rates(result.stderr)
           if step > warm + log_every]
  if result.returncode or not found:
    raise RuntimeError(f"{name}: exit {result.returncode}\n"
                       f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
  if not rates:
    raise RuntimeError(
        f"{name}: no progress line after its first {warm + log_every} "
        f"micro-batches of {micro_batch} (it trained {found.group(1)}): "
        "give more --epochs")
  return int(found.group(1)), float(found.group(2)), rates


def main():
  parser = bench.parser(__doc__)
  parser.add_argument("--epochs", type=float, default=0.1)
  parser.add_argument("--rounds", type=int, default=2)
  instead = parser.add_mutually_exclusive_group()
  instead.add_argument("--cpu_paths", action="store_true",
                       help="compare TensorFlow's CPU paths instead")
  instead.add_argument("--threads", action="store_true",
                       help="compare TensorFlow's thread pools instead")
  instead.add_argument("--splits", action="store_true",
                       help="compare splits of the effective batch instead")
  instead.add_argument("--dropout", action="store_true",
                       help="compare tf.nn.dropout's masks and keyed ones "
                            "instead")
  instead.add_argument("--native", action="store_true",
                       help="compare estimator_accum.native's kernels off "
                            "and on instead")
  instead.add_argument("--attention", action="store_true",
                       help="compare attention as TensorFlow's ops and as "
                            "the native op instead")
  instead.add_argument("--precision", action="store_true",
                       help="compare float32 and bfloat16 products "
                            "instead, with and without oneDNN's bf16 "
                            "instructions")
  instead.add_argument("--grappler", action="store_true",
                       help="compare TensorFlow's full Grappler and the "
                            "lean one instead")
  parser.add_argument("--skip", default="",
                      help="comma-separated words: leave out the variants "
                           "whose name holds one (today's always runs)")
  parser.add_argument("--trees", default=".",
                      help="comma-separated checkouts to run each variant "
                           "from (relative to this one), interleaved")
  args = parser.parse_args()
  trees = [os.path.abspath(os.path.join(ROOT, tree))
           for tree in args.trees.split(",") if tree.strip()]
  for tree in trees:
    if not os.path.isfile(os.path.join(tree, "run_classifier.py")):
      parser.error(f"--trees: {tree} holds no run_classifier.py")
  skipped = [word.strip() for word in args.skip.split(",") if word.strip()]
  environments = (CPU_PATHS if args.cpu_paths else
                  THREADS if args.threads else
                  DROPOUT if args.dropout else
                  NATIVE if args.native else
                  GRAPPLER if args.grappler else
                  PRECISION if args.precision else
                  ATTENTION if args.attention else None)
  if environments:
    variants = {name: (flags, env, MICRO_BATCH)
                for index, (name, (flags, env)) in
                enumerate(environments.items())
                if index == 0 or not any(word in name for word in skipped)}
  elif args.splits:
    variants = SPLITS
  else:
    variants = {name: (flags, {}, MICRO_BATCH) for index, (name, flags) in
                enumerate(VARIANTS.items())
                if index == 0 or not any(word in name for word in skipped)}
  if len(trees) > 1:
    variants = {f"{name} [{os.path.relpath(tree, ROOT)}]":
                (*variant, tree)
                for name, variant in variants.items() for tree in trees}
  else:
    variants = {name: (*variant, ROOT) for name, variant in variants.items()}
  seconds = {name: [] for name in variants}
  totals = {name: [] for name in variants}
  with tempfile.TemporaryDirectory() as root:
    for round_index in range(args.rounds):
      for name, (flags, env, micro_batch, tree) in variants.items():
        micro_batches, took, rates = _run(flags, args.epochs, root,
                                          f"{name}_{round_index}", env,
                                          micro_batch, tree)
        seconds[name] += [1.0 / rate for rate in rates]
        totals[name].append(took)
        print(f"round {round_index + 1}: {name}: {micro_batches} "
              f"micro-batches in {took:.1f} s all told; steady "
              f"{statistics.median(rates):.2f} micro-batches/sec", flush=True)
  rows = bench.Rows(
      f"the main job's training, effective batch 32, "
      f"{args.epochs} epoch a run, {args.rounds} interleaved rounds",
      args.json, markdown=True,
      formats={"s/micro-batch": ".3f", "examples/s": ".1f", "x today": ".2f",
               "x tf.nn.dropout": ".2f", "x full Grappler": ".2f",
               "x TensorFlow's ops": ".2f",
               "all told s": ".1f",
               "x Eigen": ".2f"})
  # Against the first variant: today's input, or Eigen's kernels.
  against = ("x Eigen" if args.cpu_paths else
             "x tf.nn.dropout" if args.dropout else
             "x TensorFlow's ops" if args.native else
             "x full Grappler" if args.grappler else "x today")
  def per_example(name):
    return statistics.median(seconds[name]) / variants[name][2]

  baseline = per_example(next(iter(variants)))
  for name, values in seconds.items():
    each = statistics.median(values)
    rows.add(variant=name, **{"s/micro-batch": each,
                              "examples/s": variants[name][2] / each,
                              against: baseline / per_example(name),
                              "all told s": statistics.median(totals[name])})
  return rows.exit_code()


if __name__ == "__main__":
  sys.exit(main())
