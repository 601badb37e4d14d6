"""The gradients of estimator_accum.native's ops, registered once a process
by `register(ops)` (`ops`: the loaded kernels' op wrappers). Each op's
own outputs that its wrapper never hands out (statistics, slopes, kept
probabilities, sums) get TensorFlow's zeros or None as their gradients,
which these functions drop."""

import contextlib
import functools

import tensorflow as tf


def _keyed_dropout(ops, op, gradient):
  # The same mask and scale on the incoming gradient.
  return [ops.ea_keyed_dropout(
      gradient, op.inputs[1], op.inputs[2],
      threshold=op.get_attr("threshold"), scale=op.get_attr("scale")),
          None, None]


def _attention(ops, op, gradient, probs_gradient):
  del probs_gradient
  attributes = {name: op.get_attr(name)
                for name in ("heads", "divisor", "threshold", "scale")}
  return [*ops.ea_attention_grad(*op.inputs, op.outputs[1], gradient,
                                 **attributes), None, None, None, None]


def _gelu(ops, op, gradient):
  return ops.ea_gelu_grad(gradient, op.inputs[0])


def _bias_gelu(ops, op, gradient, slopes_gradient):
  del slopes_gradient
  return list(ops.ea_bias_gelu_grad(gradient, op.outputs[1]))


def _bias_widen(ops, op, gradient):
  del op
  return list(ops.ea_bias_widen_grad(gradient))


def _normalize(ops, op, gradient, *statistics):
  del statistics
  return ops.ea_normalize_grad(gradient, op.inputs[0], op.outputs[1],
                               op.outputs[2])


def _incoming(op, gradient, rest):
  """A layer norm's incoming gradients: its output's and its bfloat16
  twins' (`rest`'s first `twins`), zeros where TensorFlow gave None."""
  twins = op.get_attr("twins")
  narrow = [tf.zeros_like(op.outputs[1]) if g is None else g
            for g in rest[:twins]]
  if gradient is None:
    gradient = tf.zeros_like(op.outputs[0])
  return gradient, narrow, twins


def _layer_norm(ops, op, gradient, *rest):
  gradient, narrow, twins = _incoming(op, gradient, rest)
  return list(ops.ea_layer_norm_grad(
      gradient, narrow, op.inputs[0], op.inputs[1], op.outputs[1 + twins],
      op.outputs[2 + twins]))


def _residual_layer_norm(ops, op, gradient, *rest):
  gradient, narrow, twins = _incoming(op, gradient, rest)
  biases = op.get_attr("biases")
  inputs = list(op.inputs)
  gamma, rows, columns = (inputs[2 + biases], inputs[4 + biases],
                          inputs[5 + biases])
  residual, products, bias, gamma_gradient, beta_gradient = (
      ops.ea_residual_layer_norm_grad(
          gradient, narrow, op.outputs[3 + twins], gamma,
          op.outputs[1 + twins], op.outputs[2 + twins], rows, columns,
          T=op.get_attr("T"), biases=biases,
          threshold=op.get_attr("threshold"), scale=op.get_attr("scale")))
  return [products, *bias, residual, gamma_gradient, beta_gradient, None,
          None]


_GRADIENTS = {"EaKeyedDropout": _keyed_dropout, "EaAttention": _attention,
              "EaGelu": _gelu, "EaBiasGelu": _bias_gelu,
              "EaBiasWiden": _bias_widen, "EaNormalize": _normalize,
              "EaLayerNorm": _layer_norm,
              "EaResidualLayerNorm": _residual_layer_norm}


def register(ops):
  """Registers the gradients of the loaded kernels' ops (`ops`), once a
  process (an earlier `load()`'s stay)."""
  for name, function in _GRADIENTS.items():
    with contextlib.suppress(KeyError):  # registered by an earlier load()
      tf.RegisterGradient(name)(functools.partial(function, ops))
