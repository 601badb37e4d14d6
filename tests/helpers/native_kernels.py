"""What the tests of estimator_accum.native share: the kernels loaded (or
the test fails saying why), and a small BERT's gradients (or pooled output)
with the op types its graph holds, to run with a kernel and without."""

import numpy as np
import tensorflow as tf

from estimator_accum import native
from models.bert import modeling

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def loaded():
  ops = native.load()
  assert ops is not None, (
      "the native kernels did not build here (its line above says why): "
      "this test needs g++ and TensorFlow's headers")
  return ops


def threads_config(threads):
  """A session's config running ops one at a time on `threads` threads
  each (None: TensorFlow's defaults)."""
  if threads is None:
    return None
  return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads,
                                  inter_op_parallelism_threads=1)


def tiny_bert(training=True, config=None, inspect=None, **model_arguments):
  """(the gradients of every trained variable in training, else the
  pooled output; the graph's op types) of a 2-layer BERT of hidden size 16
  (`config`: BertConfig fields over those) on 3 rows of 9 tokens, one
  padded after 6. `model_arguments` go to BertModel (numpy arrays as
  constants of its graph); `inspect`, if given, is called with the graph
  before it runs."""
  bert_config = modeling.BertConfig(
      **dict(dict(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                  num_attention_heads=2, intermediate_size=24),
             **(config or {})))
  rng = np.random.RandomState(0)
  ids = rng.randint(0, 50, [3, 9]).astype(np.int32)
  mask = np.ones([3, 9], np.int32)
  mask[1, 6:] = 0
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(1)
    model = modeling.BertModel(
        bert_config, training, tf.constant(ids), tf.constant(mask),
        **{name: tf.constant(value) if isinstance(value, np.ndarray)
           else value for name, value in model_arguments.items()})
    fetches = model.get_pooled_output()
    if training:
      loss = tf.reduce_sum(tf.square(fetches))
      fetches = [tf.convert_to_tensor(g) for g in tf.gradients(
          loss, tf.compat.v1.trainable_variables())]
    graph = tf.compat.v1.get_default_graph()
    if inspect is not None:
      inspect(graph)
    types = {op.type for op in graph.get_operations()}
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return session.run(fetches), types
