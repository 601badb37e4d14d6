"""Graph variants timed side by side in one process (`harness.bench`'s rule:
these machines are shared and noisy, so the variants take turns)."""

import time

import tensorflow as tf


class SessionSteps:
  """A session of `graph` that runs `fetch` once a step: `init`, then one
  untimed run (Grappler's rewrite and the first allocations), then each
  `step()`'s wall time in `times`."""

  def __init__(self, name, graph, fetch, init, config=None):
    self.name, self.fetch, self.times = name, fetch, []
    self.session = tf.compat.v1.Session(graph=graph, config=config)
    self.session.run(init)
    self.session.run(fetch)

  def step(self):
    start = time.perf_counter()
    self.session.run(self.fetch)
    self.times.append(time.perf_counter() - start)


def interleave(variants, rounds, steps_per_round):
  """Each round, `steps_per_round` steps of each variant in turn: a busier
  minute of the machine falls on every variant alike."""
  for _ in range(rounds):
    for variant in variants:
      for _ in range(steps_per_round):
        variant.step()
