"""BertModel(product_type=tf.bfloat16): the dense products take bfloat16
operands, everything else float32. Every trained variable gets a float32 gradient,
close to float32's at bfloat16's precision, on every layout the main job
trains with (padded, unpadded with the native attention, the last layer
for [CLS] only)."""

import numpy as np
import pytest
import tensorflow as tf

from harness import support
from tests.helpers import native_kernels


@pytest.mark.parametrize("layout", [
    {}, dict(unpadded=True), dict(unpadded=True, pooled_only=True)])
def test_bfloat16_products_give_float32_gradients_close_to_float32s(layout):
  expected, _ = native_kernels.tiny_bert(**layout)
  actual, types = native_kernels.tiny_bert(product_type=tf.bfloat16,
                                           **layout)
  assert len(actual) == len(expected)
  assert all(gradient.dtype == np.float32 for gradient in actual)
  # bfloat16's 8-bit mantissa: about 2**-8 relative per product. Some
  # gradients are zero but for rounding (the key's bias): each tensor is
  # held to the scale of all of them.
  every, reference = (np.concatenate([g.ravel() for g in gradients])
                      for gradients in (actual, expected))
  assert 0 < support.relative_distance([every], [reference]) < 0.02
  scale = np.abs(reference).max()
  for gradient, one in zip(actual, expected):
    np.testing.assert_allclose(gradient, one, rtol=0.05, atol=0.02 * scale)
  assert "Cast" in types
