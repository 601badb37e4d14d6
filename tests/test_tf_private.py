"""Each function of estimator_accum.tf_private against the installed
TensorFlow: an upgrade that moves a private name fails here."""

import tensorflow as tf

from estimator_accum import tf_private


def test_reroute_moves_every_consumer():
  graph = tf.Graph()
  with graph.as_default():
    old = tf.constant(1.0)
    new = tf.constant(5.0)
    doubled = old * 2.0
    tripled = 3.0 * old
    both = old + old
    tf_private.reroute(old, new)
    assert not old.consumers()
    with tf.compat.v1.Session() as session:
      assert session.run([doubled, tripled, both]) == [10.0, 15.0, 10.0]
