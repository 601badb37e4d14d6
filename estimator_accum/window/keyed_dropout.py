"""Dropout whose masks follow the examples, not the batch they sit in.

`tf.nn.dropout` draws a mask for the tensor it is given: which examples
share a micro-batch, in which order and padded to which length, decides
the mask each one meets. So micro-batch 8 x k=4 and micro-batch 32 x k=1
train on the same 32 examples a window with other masks: the same update
in distribution, not in value.

`keyed_dropout(inputs, rate, keys, seed=..., site=...)` makes each
element's keep decision a hash of (the seed, the site, its row's key, its
column): the same for an example wherever it sits. With keys that name the
examples (each example's place in the input stream, `Dataset.enumerate()`;
a token's from its example's and its position), any split of a window
trains to the same weights, dropout on, up to float32 rounding, and a
recomputed block (`recompute`) or a resumed run meets the same masks.

The hash is lowbias32 (Chris Wellons' hash prospector: two multiplies and
three xor-shifts on 32 bits), in TensorFlow's own element-wise ops: on
uint32 on a CPU, on 32-bit words held in int64 where a GPU is seen (the same
masks; `word_dtype`).
On 2 cores (AMD EPYC without AVX-512) a [220, 384] mask took 66-76 µs
against 452-532 µs for `tf.nn.dropout`'s (Philox), alone in a graph.

Where it builds (`estimator_accum.native`: float32 on the CPU), a kernel of
our own does the hash, the keep test and the scale in one pass, forward
and backward, with the same masks bit for bit: the main job's steady
training 1.12x (docs/bert.md, "Keyed dropout").
"""

import functools
import zlib

import numpy as np
import tensorflow as tf

from estimator_accum import native

_MULTIPLY = (0x7FEB352D, 0x846CA68B)
_MASK32 = 0xFFFFFFFF


def _mix_int(value):
  """lowbias32 of a Python int, as an int in [0, 2**32)."""
  value &= _MASK32
  value ^= value >> 16
  value = (value * _MULTIPLY[0]) & _MASK32
  value ^= value >> 15
  value = (value * _MULTIPLY[1]) & _MASK32
  return value ^ (value >> 16)


def salt(seed, site):
  """The 32-bit word a site's masks are salted with (at graph build)."""
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
    raise ValueError(f"dropout seed must be an integer, got {seed!r}")
  return _mix_int(_mix_int(int(seed) ^ 0x9E3779B9) ^
                  zlib.crc32(site.encode("utf-8")))


@functools.cache
def word_dtype():
  """The dtype the hash's 32-bit words are held in: uint32 in a process that
  sees no GPU (on a CPU the fastest), int64 in one that sees a GPU (uint32
  compares lack GPU kernels in some releases, and int32 sits in host memory
  there), multiplying by multipliers in [-2**31, 2**31) and keeping the low
  32 bits. The masks are the same bit for bit."""
  return tf.int64 if tf.config.list_physical_devices("GPU") else tf.uint32


def _word(values):
  """An integer tensor's low 32 bits, as a word (`word_dtype`)."""
  dtype = word_dtype()
  if values.dtype != dtype:
    values = tf.cast(values, dtype)
  if dtype == tf.uint32:
    return values
  return tf.bitwise.bitwise_and(values, tf.constant(_MASK32, dtype))


def _times(values, multiplier):
  """(values * multiplier) mod 2**32, on words."""
  if values.dtype == tf.uint32:
    return values * tf.constant(multiplier, tf.uint32)
  signed = multiplier - 2**32 if multiplier >= 2**31 else multiplier
  return tf.bitwise.bitwise_and(values * tf.constant(signed, values.dtype),
                                tf.constant(_MASK32, values.dtype))


def _xor(values, value):
  """Words xor a Python int (a salt)."""
  return tf.bitwise.bitwise_xor(values, tf.constant(value, values.dtype))


def _xor_shift(values, bits):
  return tf.bitwise.bitwise_xor(
      values, tf.bitwise.right_shift(values, tf.constant(bits, values.dtype)))


def mix(values, last_shift=True):
  """lowbias32 of words, element by element (`last_shift=False`: without
  its last xor-shift, for a test of the high bits)."""
  values = _times(_xor_shift(values, 16), _MULTIPLY[0])
  values = _times(_xor_shift(values, 15), _MULTIPLY[1])
  return _xor_shift(values, 16) if last_shift else values


def example_keys(keys, seed):
  """Words [batch]: each example's hashed key (`keys`: integers [batch],
  one per example, e.g. its place in the training stream)."""
  keys = tf.convert_to_tensor(keys)
  if not keys.dtype.is_integer or keys.shape.rank != 1:
    raise ValueError(f"dropout keys must be integers of shape [batch], got "
                     f"{keys.dtype.name} {keys.shape}")
  return mix(_xor(_word(keys), salt(seed, "examples")))


def token_keys(hashed_examples, length, seed):
  """Words [batch, length]: each token's key, from its example's hashed
  key (`example_keys`) and its position in the row."""
  positions = mix(_xor(_word(tf.range(length)), salt(seed, "positions")))
  return mix(tf.bitwise.bitwise_xor(hashed_examples[:, tf.newaxis],
                                    positions[tf.newaxis, :]))


def per_head(row_keys, heads, seed):
  """Words [batch, heads, rows]: `row_keys` [batch, rows] once a head."""
  head_salts = tf.constant([salt(seed, f"head {head}") for head in range(heads)],
                         row_keys.dtype)
  return mix(tf.bitwise.bitwise_xor(row_keys[:, tf.newaxis, :],
                                    head_salts[tf.newaxis, :, tf.newaxis]))


def keyed_dropout(inputs, rate, keys, *, seed=0, site, one_pass=None):
  """Dropout of `inputs` [..., columns] whose mask follows `keys`.

  Each element is kept with probability 1 - `rate` and scaled by
  1 / (1 - rate), as `tf.nn.dropout` does, by a hash of its row's key, its
  column, `seed` and `site`; not by the batch it sits in.

  Args:
    inputs: floating-point Tensor [..., columns].
    rate: float in [0, 1), the share dropped (0: `inputs` unchanged).
    keys: integer Tensor of shape `inputs.shape[:-1]`, one key a row that
      names what the row is (an example's place in the input stream, or a
      token's key from its example's and its position), not where it sits.
    seed: int; another seed, other masks.
    site: str naming the place in the model (each dropout its own).
    one_pass: None (default): the native one-pass kernel where it serves
      (`estimator_accum.native`: float32 on the CPU, built once), else
      TensorFlow's own ops; False: TensorFlow's own ops (a graph that a
      process without the kernel will import). The same masks either way.

  Returns `inputs`' shape and dtype; ValueError (one line) for a bad rate,
  seed or keys.
  """
  if not rate:
    return inputs
  if (isinstance(rate, bool) or not isinstance(rate, (int, float)) or
      not 0 < rate < 1):
    raise ValueError(f"dropout rate must be in [0, 1), got {rate!r}")
  inputs = tf.convert_to_tensor(inputs)
  keys = tf.convert_to_tensor(keys)
  if not keys.dtype.is_integer:
    raise ValueError(f"keys must be integers, one a row of inputs, got "
                     f"{keys.dtype.name}")
  if (keys.shape.rank is not None and inputs.shape.rank is not None and
      keys.shape.rank != inputs.shape.rank - 1):
    raise ValueError(f"keys must have the shape of inputs without its last "
                     f"axis, {inputs.shape[:-1]}, got {keys.shape}")
  if one_pass not in (None, False):
    raise ValueError(f"one_pass must be None or False, got {one_pass!r}")
  kernel = None if one_pass is False else _one_pass_op(inputs)
  if kernel is not None:
    rows, columns, threshold = _words(inputs, rate, keys, seed=seed,
                                      site=site)
    return kernel(inputs, rows, columns, threshold=threshold,
                  scale=1.0 / (1.0 - rate))
  scaled = inputs * tf.cast(1.0 / (1.0 - rate), inputs.dtype)
  return tf.where(keep_mask(inputs, rate, keys, seed=seed, site=site), scaled,
                  tf.zeros_like(scaled))


def _one_pass_op(inputs):
  """The native one-pass kernel (`estimator_accum.native`) where it serves
  (float32 on the CPU, the words uint32), else None."""
  if inputs.dtype != tf.float32 or word_dtype() != tf.uint32:
    return None
  return native.keyed_dropout_op()


def _words(inputs, rate, keys, *, seed, site):
  """(rows, columns, threshold): each row's and each column's hashed word
  and the keep test's bound; an element is kept where lowbias32 of its
  row's word xor its column's (without the last xor-shift) reaches the
  bound."""
  return words(rate, keys, tf.shape(inputs)[-1], seed=seed, site=site)


def keep_mask(inputs, rate, keys, *, seed, site):
  """bool, `inputs`' shape: which elements `keyed_dropout` keeps (its
  arguments, checked there)."""
  rows, columns, threshold = _words(inputs, rate, keys, seed=seed, site=site)
  # The keep test reads the high bits: the last xor-shift adds nothing.
  values = mix(tf.bitwise.bitwise_xor(rows[..., tf.newaxis], columns),
               last_shift=False)
  return values >= tf.constant(threshold, values.dtype)


def words(rate, keys, width, *, seed, site):
  """(rows, columns, threshold) of `keyed_dropout(inputs, rate, keys, ...)`
  for inputs of `width` columns: each row's and each column's hashed word
  and the keep test's bound, for a kernel that drops inside (the native
  attention's probabilities: the same masks)."""
  site_salt = salt(seed, site)
  rows = mix(_xor(_word(keys), site_salt))
  columns = mix(_xor(_word(tf.range(width)),
                     _mix_int(site_salt ^ 0x85EBCA6B)))
  return rows, columns, min(round(rate * 2.0**32), _MASK32)
