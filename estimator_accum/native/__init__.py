"""Kernels of our own, built for the running TensorFlow on first use.

`keyed_dropout` in one pass (`keyed_dropout.cc`): TensorFlow's own ops
take eleven passes over a tensor for it (the hash, the select, the scale)
and three more in the backward pass. The kernel makes the same masks, bit
for bit, so a graph trains to the same weights with it or without it.

Attention over unpadded tokens in one op (`attention.cc`): per example and
head the scores, the softmax, keyed dropout (the same masks) and the
context, forward and backward, on the [tokens, hidden] matrices, the
padded layout's function to float32 rounding (models.bert's
`fused_attention`).

The exact (erf) GELU in one pass forward and one backward (`gelu.cc`),
where TensorFlow's ops take five and seven, and layer normalization over
the last axis (`normalize.cc`) in three passes forward and three backward
where they take eight and about sixteen: forward, the values of
TensorFlow's ops bit for bit (the same Eigen reductions and functors,
built as its wheels build Eigen); the GELU's gradient too, the
normalization's within float rounding (its closed form). The whole layer
norm (`layer_norm_op`: gamma and beta too, and optionally the output
rounded to bfloat16 for the product that reads it) is one op each way,
and so is a transformer's residual block after its product
(`residual_layer_norm_op`: the product's bias, keyed dropout, the
residual's add and the layer norm).

What follows a bfloat16 product in a dense layer (`products.cc`): its
widening and bias (`bias_widen_op`), or those and the GELU narrowed again
for the next product (`bias_gelu_op`), one pass each way where
TensorFlow's ops take two to four: the forward values bit for bit, the
gradients within float rounding.

google-research/bert's AdamWeightDecay update of a variable in one pass,
in place (`adam_weight_decay.cc`, `adam_weight_decay_op`): the window's
gradient times its scale, the moments, the step and the three writes,
where TensorFlow's ops take about ten passes and XLA a compile at the
run's start; the values of TensorFlow's ops bit for bit.

`load()` compiles the kernels once per TensorFlow, compiler and CPU
(`g++`, or `$CXX`, with TensorFlow's own `tf.sysconfig` flags; the
sources of one kind of vector flags in one unit, so TensorFlow's headers
are parsed twice, not three times: 17-19 s on 2 Intel cores, 23-26 s with
a unit a source) into
`$ESTIMATOR_ACCUM_CACHE/native/<key>/`, then loads them with
`tf.load_op_library`. Where that cannot be done (no compiler, a compile
that fails, a GPU in the process: the kernels are the CPU's only,
`ESTIMATOR_ACCUM_NATIVE=0`) it says why in one line, once, and returns
None: the callers then build TensorFlow's own ops, the same function.

A graph holding these ops runs in a process that loaded them: one that
imports it (`import_meta_graph`) calls `estimator_accum.native.load()`
first, or the graph is built with `ESTIMATOR_ACCUM_NATIVE=0`.
"""

import concurrent.futures
import contextlib
import fcntl
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys

import tensorflow as tf

from estimator_accum import _files
from estimator_accum.native import gradients

# Each source with the vector extensions it is built for ("fast": the
# CPU's widest with fused multiply-add, for integer work and single
# products; "tensorflow's": AVX (AVX2 where the CPU has it) without fused
# multiply-add, so that float expressions round as TensorFlow's wheels'
# Eigen rounds them).
_SOURCES = {"keyed_dropout.cc": "fast", "attention.cc": "fast",
            "gelu.cc": "tensorflow's",
            "normalize.cc": "tensorflow's",
            "accumulate.cc": "tensorflow's",
            "adam_weight_decay.cc": "tensorflow's",
            "products.cc": "tensorflow's"}
_HERE = os.path.dirname(os.path.abspath(__file__))
_HEADER = "common.h"  # what the sources share (#include "common.h")
OFF = "ESTIMATOR_ACCUM_NATIVE"


def _say(message):
  print(f"estimator_accum: {message}", file=sys.stderr, flush=True)


def cache_root():
  """native/ in the library's cache directory (`_files.cache_dir`)."""
  return os.path.join(_files.cache_dir(), "native")


def cpu_flags():
  """The x86 vector extensions of this CPU (its /proc/cpuinfo flags): what
  the build may use, and what run_classifier.py asks of bfloat16."""
  if platform.machine() not in ("x86_64", "AMD64"):
    return set()
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
      for line in cpuinfo:
        if line.startswith("flags"):
          return set(line.split(":", 1)[1].split())
  except OSError:
    pass
  return set()


def _vector_flags(kind):
  """The compiler's vector flags for a source of `kind` (`_SOURCES`)."""
  cpu = cpu_flags()
  if kind == "fast":
    return ["-mavx2", "-mfma"] if {"avx2", "fma"} <= cpu else []
  # AVX2's integer lanes (Eigen's exp and erf build their powers of two
  # there) make those functions twice as fast as AVX's; without fused
  # multiply-add every float expression rounds as with AVX alone (tested
  # bit for bit against TensorFlow's kernels).
  if "avx2" in cpu:
    return ["-mavx2", "-mno-fma"]
  return ["-mavx", "-mno-fma"] if "avx" in cpu else []


def _units():
  """The sources grouped by kind, in `_SOURCES`' order: each group one
  translation unit (one parse of TensorFlow's headers, ~12 s of the
  compiler's time, for all of the group's sources)."""
  units = {}
  for name, kind in _SOURCES.items():
    units.setdefault(kind, []).append(name)
  return list(units.items())


def _unit_text(names):
  """A translation unit that includes each of `names` (sources here)."""
  return "".join(f'#include "{os.path.join(_HERE, name)}"\n'
                 for name in names)


def _commands(compiler, output):
  """The compiles (one object a unit of sources of one kind, its flags)
  and the link of `output`; the objects, and the files of units of more
  than one source, lie beside it (`output`.<n>.o, `output`.<n>.cc).
  Returns (commands, objects, {unit file: its text})."""
  objects, commands, unit_files = [], [], {}
  for index, (kind, names) in enumerate(_units()):
    if len(names) == 1:
      source = os.path.join(_HERE, names[0])
    else:
      source = f"{output}.{index}.cc"
      unit_files[source] = _unit_text(names)
    objects.append(f"{output}.{index}.o")
    commands.append([compiler, "-O3", "-fPIC", "-w", *_vector_flags(kind),
                     "-c", source, "-o", objects[-1],
                     *tf.sysconfig.get_compile_flags()])
  commands.append([compiler, "-shared", *objects, "-o", output,
                   *tf.sysconfig.get_link_flags()])
  return commands, objects, unit_files


def _key(compiler):
  """What the library depends on: the sources, the command, TensorFlow,
  the compiler's version and the machine."""
  digest = hashlib.sha256()
  for name in (*_SOURCES, _HEADER):
    with open(os.path.join(_HERE, name), "rb") as source:
      digest.update(source.read())
  try:
    version = subprocess.run([compiler, "--version"], capture_output=True,
                             text=True, timeout=60).stdout
  except (OSError, subprocess.SubprocessError):
    version = ""
  for part in (repr(_commands(compiler, "OUT")), tf.__version__,
               tf.sysconfig.get_lib(), version, platform.machine(),
               sys.version):
    digest.update(part.encode("utf-8", "replace") + b"\0")
  return f"tf{tf.__version__}-{digest.hexdigest()[:16]}"


@contextlib.contextmanager
def _locked(directory):
  """One process of many builds (the others wait, then load its file)."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, ".lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


class _BuildFailed(Exception):
  pass


def _run(command):
  return subprocess.run(command, capture_output=True, text=True, timeout=600)


def _check(compiler, done):
  """Raises _BuildFailed with the compiler's first error line."""
  if done.returncode != 0:
    lines = [line for line in done.stderr.splitlines()
             if "error" in line] or done.stderr.splitlines() or [""]
    raise _BuildFailed(f"{compiler} failed (exit {done.returncode}): "
                       f"{lines[0].strip()[:300]}")


def _build(compiler, library):
  """Compiles into a temporary file renamed over `library` when whole
  (`_files.whole`: removed when the build fails): a reader never sees a
  part-written library. Returns None, or why not (one line)."""
  try:
    with _files.whole(library) as partial:
      commands, objects, unit_files = _commands(compiler, partial)
      try:
        for path, text in unit_files.items():
          with open(path, "w", encoding="utf-8") as unit:
            unit.write(text)
        # The units compile side by side (each a process), then link.
        with concurrent.futures.ThreadPoolExecutor(len(commands)) as pool:
          for done in pool.map(_run, commands[:-1]):
            _check(compiler, done)
        _check(compiler, _run(commands[-1]))
      finally:
        for path in [*objects, *unit_files]:
          with contextlib.suppress(OSError):
            os.remove(path)
  except _BuildFailed as failed:
    return str(failed)
  except (OSError, subprocess.SubprocessError) as error:
    return f"{compiler} did not run ({error})"
  return None


@functools.cache
def load():
  """The loaded kernels (a module of op wrappers), or None with the reason
  said once in one line (see the module's docstring)."""
  if os.environ.get(OFF, "1").strip().lower() in ("0", "false", "no", "off"):
    return None
  if tf.config.list_physical_devices("GPU"):
    return None  # CPU kernels only: TensorFlow's ops run where a GPU is.
  compiler = os.environ.get("CXX") or "g++"
  if shutil.which(compiler) is None:
    _say(f"no C++ compiler ({compiler!r} not found): keyed dropout and "
         f"the GELU run TensorFlow's own ops (the same function, slower); "
         f"install g++ or set CXX, or {OFF}=0 to say nothing")
    return None
  directory = None
  try:
    directory = os.path.join(cache_root(), _key(compiler))
    library = os.path.join(directory, "estimator_accum_ops.so")
    failed = os.path.join(directory, "build_failed.txt")
    with _locked(directory):
      why = None
      if os.path.exists(failed):  # the same build failed before: not again
        with open(failed, encoding="utf-8") as reason:
          why = f"{reason.read().strip()} (remove {directory} to try again)"
      elif not os.path.exists(library):
        why = _build(compiler, library)
        if why:
          _files.write_whole(failed, why + "\n")
      if why:
        _say(f"the native kernels were not built: {why}; keyed dropout "
             f"and the GELU run TensorFlow's own ops (the same function, "
             f"slower); {OFF}=0 to say nothing")
        return None
    ops = tf.load_op_library(library)
  except Exception as error:  # noqa: BLE001 (any failure: TensorFlow's ops)
    where = f" in {directory}" if directory else ""
    _say(f"the native kernels could not be built or loaded{where} "
         f"({type(error).__name__}: {str(error).splitlines()[0][:300]}): "
         f"keyed dropout and the GELU run TensorFlow's own ops (the same "
         f"function, slower); {OFF}=0 to say nothing")
    return None

  gradients.register(ops)
  return ops


def keyed_dropout_op():
  """The one-pass keyed dropout op (`EaKeyedDropout`), its gradient
  registered; None where `load()` is None."""
  ops = load()
  return None if ops is None else ops.ea_keyed_dropout


def gelu_op():
  """The one-pass exact GELU op (`EaGelu`), its gradient (`EaGeluGrad`)
  registered; None where `load()` is None."""
  ops = load()
  return None if ops is None else ops.ea_gelu


def bias_widen_op():
  """A function (products, bias) -> `products` (bfloat16 [..., n]) widened
  to float32 plus `bias` (float32 [n]) in one pass (`EaBiasWiden`,
  products.cc: the cast's and the add's values bit for bit; its gradient,
  the products' in bfloat16 and the bias's in one pass, registered); None
  where `load()` is None."""
  ops = load()
  return None if ops is None else ops.ea_bias_widen


def bias_gelu_op():
  """A function (products, bias) -> the exact GELU of `products`
  (bfloat16 [..., n]) widened to float32 plus `bias` (float32 [n]),
  rounded to bfloat16, in one pass (`EaBiasGelu`, products.cc: the values
  of the cast, the add, EaGelu and the cast bit for bit; its gradient, one
  pass, registered); None where `load()` is None."""
  ops = load()
  if ops is None:
    return None

  def bias_gelu(products, bias):
    return ops.ea_bias_gelu(products, bias)[0]

  return bias_gelu


def normalize_op():
  """A function (inputs, epsilon) -> the normalization of `inputs` over
  its last axis in few passes (`EaNormalize`, its gradient registered);
  None where `load()` is None."""
  ops = load()
  if ops is None:
    return None

  def normalize(inputs, epsilon):
    return ops.ea_normalize(inputs, epsilon=epsilon)[0]

  return normalize


def layer_norm_op():
  """A function (inputs, gamma, beta, epsilon, narrow=False) -> layer
  normalization of `inputs` (float32 [..., n]) over its last axis times
  `gamma` plus `beta` (float32 [n]) in few passes (`EaLayerNorm`,
  normalize.cc: the values of `normalize_op()`'s, the product and the add
  bit for bit); with `narrow`, the pair (that, it rounded to bfloat16 as a
  Cast) for a bfloat16 product to read; its gradient, one op taking both
  outputs', registered. None where `load()` is None."""
  ops = load()
  if ops is None:
    return None

  def layer_norm(inputs, gamma, beta, epsilon, narrow=False):
    outputs = ops.ea_layer_norm(inputs, gamma, beta, epsilon=epsilon,
                                twins=int(bool(narrow)))
    return (outputs[0], outputs[1][0]) if narrow else outputs[0]

  return layer_norm


def residual_layer_norm_op():
  """A function (products, bias, residual, gamma, beta, epsilon, dropout,
  narrow=False) -> the layer norm (gamma, beta: float32 [n]) of keyed
  dropout of `products` (float32 or bfloat16 [..., n]) widened to float32
  plus `bias` (float32 [n], or None) plus `residual` (float32, `products`'
  shape), in one op each way (`EaResidualLayerNorm`, normalize.cc: the
  values of EaBiasWiden, EaKeyedDropout, AddV2 and EaLayerNorm bit for bit,
  their gradients too). `dropout`: (rows, columns, threshold, scale), the
  keyed dropout's words (`keyed_dropout.words`) and scale. With `narrow`,
  the pair (that, it rounded to bfloat16) for a bfloat16 product to read.
  None where `load()` is None."""
  ops = load()
  if ops is None:
    return None

  def residual_layer_norm(products, bias, residual, gamma, beta, epsilon,
                          dropout, narrow=False):
    rows, columns, threshold, scale = dropout
    outputs = ops.ea_residual_layer_norm(
        products, [] if bias is None else [bias], residual, gamma, beta,
        rows, columns, epsilon=epsilon, threshold=threshold, scale=scale,
        twins=int(bool(narrow)))
    return (outputs[0], outputs[1][0]) if narrow else outputs[0]

  return residual_layer_norm


def accumulate_op():
  """A function (total, value, weight) -> the op adding `weight` (a float32
  scalar) times `value` (bfloat16 or float16) into `total` (a float32
  resource variable's handle) in one pass (`EaAccumulate`, accumulate.cc:
  the values of a cast and an add bit for bit); None where `load()` is
  None."""
  ops = load()
  return None if ops is None else ops.ea_accumulate


def adam_weight_decay_op():
  """A function (variable, m, v, gradient, scale, learning_rate, beta_1,
  one_minus_beta_1, beta_2, one_minus_beta_2, epsilon, weight_decay_rate,
  *, decay) -> the op updating the float32 resource variables `variable`,
  `m` and `v` (their handles) in place by google-research/bert's
  AdamWeightDecay with the gradient `gradient` times `scale` (every
  argument from `scale` on a float32 scalar), in one pass
  (`EaAdamWeightDecay`, adam_weight_decay.cc: the values of TensorFlow's
  ops bit for bit); None where `load()` is None."""
  ops = load()
  return None if ops is None else ops.ea_adam_weight_decay


def attention_op():
  """A function (query, key, value, starts, positions, rows, columns, *,
  heads, divisor, threshold, scale) -> the context of attention over
  unpadded tokens (`EaAttention`, attention.cc; its gradient registered);
  None where `load()` is None."""
  ops = load()
  if ops is None:
    return None

  def attention(query, key, value, starts, positions, rows, columns, *,
                heads, divisor, threshold, scale):
    return ops.ea_attention(query, key, value, starts, positions, rows,
                            columns, heads=heads, divisor=divisor,
                            threshold=threshold, scale=scale)[0]

  return attention
