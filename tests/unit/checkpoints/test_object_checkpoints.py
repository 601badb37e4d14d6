"""The accumulating wrappers in object-based checkpoints (tf.train.Checkpoint
in a graph): each trained variable's window state is keyed as its slot, by
the variable's path in the checkpointed objects, not by its name; window
state a checkpoint holds that the window does not have is refused."""

import numpy as np
import pytest
import tensorflow as tf

import estimator_accum as ea

_X = np.arange(32, dtype=np.float32).reshape(8, 4) / 10


def _build(variable_name, **settings):
  """A graph's weight, wrapper, train op and checkpoint (the weight under
  the same path whatever its variable's name)."""
  weight = tf.compat.v1.get_variable(
      variable_name, initializer=np.ones([4, 1], np.float32))
  loss = tf.reduce_mean(tf.square(tf.matmul(tf.constant(_X), weight) - 1.0))
  wrapper = ea.AccumulatingOptimizer(
      tf.compat.v1.train.AdamOptimizer(0.1), 3, **settings)
  step = tf.compat.v1.train.get_or_create_global_step()
  train = wrapper.minimize(loss, global_step=step)
  checkpoint = tf.compat.v1.train.Checkpoint(
      weight=weight, optimizer=wrapper, step=step)
  return weight, wrapper, train, checkpoint


def _save_mid_window(prefix, **settings):
  """Two micro-batches of a window of 3, saved; returns the path and the
  window's accumulator."""
  with tf.Graph().as_default():
    weight, wrapper, train, checkpoint = _build("w", **settings)
    assert "window_accum" in wrapper.get_slot_names()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train)
      session.run(train)
      accumulator = session.run(wrapper.get_slot(weight, "window_accum"))
      return checkpoint.save(prefix, session=session), accumulator


def test_window_is_restored_into_a_variable_named_otherwise(tmp_path):
  path, saved = _save_mid_window(str(tmp_path / "ckpt"))
  assert np.abs(saved).max() > 0
  keys = tf.train.load_checkpoint(path).get_variable_to_shape_map()
  assert "weight/.OPTIMIZER_SLOT/optimizer/window_accum/.ATTRIBUTES/" \
      "VARIABLE_VALUE" in keys, sorted(keys)
  assert "optimizer/window.Swindow_micro_batches/.ATTRIBUTES/" \
      "VARIABLE_VALUE" in keys, sorted(keys)
  with tf.Graph().as_default():
    weight, wrapper, train, checkpoint = _build("renamed")
    with tf.compat.v1.Session() as session:
      checkpoint.restore(path).assert_consumed().run_restore_ops(session)
      np.testing.assert_array_equal(
          session.run(wrapper.get_slot(weight, "window_accum")), saved)
      # The window's third micro-batch applies: its count was restored.
      session.run(train)
      assert session.run(ea.get_accumulation_state().updates_applied) == 1


def test_window_state_the_window_does_not_have_is_refused(tmp_path):
  """Saved with loss scaling, restored into a window without: its loss
  scale and count of good windows would be dropped silently."""
  path, _ = _save_mid_window(str(tmp_path / "ckpt"), loss_scale="dynamic")
  with tf.Graph().as_default():
    _, _, _, checkpoint = _build("w")
    with tf.compat.v1.Session() as session:
      with pytest.raises(ValueError, match=r"holds window state "
                         r"\['window/good_windows'\]"):
        checkpoint.restore(path).run_restore_ops(session)


@pytest.mark.parametrize("compact, slots", [
    (False, ["window_accum", "window_accum_rows"]),
    (True, ["window_accum_indices", "window_accum_values"])])
def test_sparse_window_is_restored_into_a_table_named_otherwise(
    compact, slots, tmp_path):
  """An embedding table's window, dense with a row mask or compact (the
  rows touched, of a shape known only at run time), saved mid-window and
  restored into a table of another name: the update the window ends with
  is the uninterrupted run's."""
  def build(name):
    table = tf.compat.v1.get_variable(
        name, initializer=np.ones([50, 3], np.float32))
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    loss = tf.reduce_sum(tf.square(tf.nn.embedding_lookup(table, ids)))
    wrapper = ea.AccumulatingOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1), 3,
        sparse_accumulation=compact)
    step = tf.compat.v1.train.get_or_create_global_step()
    train = wrapper.minimize(loss, global_step=step)
    return table, ids, wrapper, train, tf.compat.v1.train.Checkpoint(
        table=table, optimizer=wrapper, step=step)

  with tf.Graph().as_default():
    table, ids, wrapper, train, checkpoint = build("table")
    assert [n for n in wrapper.get_slot_names() if "window" in n] == slots
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train, {ids: [1, 2]})
      session.run(train, {ids: [2, 7]})
      saved = {n: session.run(wrapper.get_slot(table, n)) for n in slots}
      path = checkpoint.save(str(tmp_path / "ckpt"), session=session)
      session.run(train, {ids: [5]})
      expected = session.run(table)
  with tf.Graph().as_default():
    table, ids, wrapper, train, checkpoint = build("renamed")
    with tf.compat.v1.Session() as session:
      checkpoint.restore(path).assert_consumed().run_restore_ops(session)
      for name in slots:
        np.testing.assert_array_equal(
            session.run(wrapper.get_slot(table, name)), saved[name])
      session.run(train, {ids: [5]})
      np.testing.assert_array_equal(session.run(table), expected)
      assert not np.array_equal(expected, np.ones([50, 3]))


def _keras_window(**settings):
  """A graph's weight, Keras wrapper (Adam inside) and train op."""
  weight = tf.compat.v1.get_variable(
      "w", initializer=np.ones([4, 1], np.float32))
  loss = tf.reduce_mean(tf.square(tf.matmul(tf.constant(_X), weight) - 1.0))
  wrapper = ea.AccumulatingKerasOptimizer(
      tf.keras.optimizers.legacy.Adam(0.1), 3, **settings)
  return weight, wrapper, lambda: wrapper.minimize(loss, [weight])


@pytest.mark.keras2
def test_keras_weights_are_the_whole_state_and_set_before_the_build():
  """get_weights holds the micro-batch count, the inner optimizer's weights
  and the window's; set_weights before the window is built (as Keras's
  load_model of an .h5 file does) sets them when it is built."""
  with tf.Graph().as_default():
    weight, wrapper, make_train = _keras_window()
    train = make_train()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(4):  # One update, and one micro-batch of the next.
        session.run(train)
      names = [v.name for v in wrapper.weights]
      saved = session.run(wrapper.weights)
      accumulator = session.run(wrapper.get_slot(weight, "window_accum"))
  assert names[:4] == ["micro_batches:0", "Adam/iter:0", "Adam/w/m:0",
                       "Adam/w/v:0"], names
  assert "w/accum:0" in names and len(names) == len(set(names)), names
  assert saved[0] == 4 and saved[1] == 1
  with tf.Graph().as_default():
    weight, wrapper, make_train = _keras_window()
    with tf.compat.v1.Session().as_default() as session:
      tf.compat.v1.keras.backend.set_session(session)
      wrapper.set_weights(saved)
      make_train()
      restored = session.run(wrapper.weights)
      for value, expected in zip(restored, saved):
        np.testing.assert_array_equal(value, expected)
      np.testing.assert_array_equal(
          session.run(wrapper.get_slot(weight, "window_accum")), accumulator)
  tf.compat.v1.keras.backend.clear_session()


@pytest.mark.keras2
def test_keras_weights_of_another_window_are_refused_at_the_build():
  with tf.Graph().as_default():
    _, wrapper, make_train = _keras_window()
    wrapper.set_weights([np.int64(4), np.int64(1), np.zeros([2, 2])])
    with pytest.raises(ValueError, match=r"set_weights was given 3 values"):
      make_train()


def test_v1_variables_include_the_window():
  with tf.Graph().as_default():
    weight, wrapper, _, _ = _build("w")
    names = [v.name for v in wrapper.variables()]
  assert names[:4] == ["beta1_power:0", "beta2_power:0", "w/Adam:0",
                       "w/Adam_1:0"], names
  assert "w/accum:0" in names, names
  assert "gradient_accumulation/window_micro_batches:0" in names, names
  assert "global_step:0" not in names, names
