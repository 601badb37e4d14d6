"""Input sharding shared by the input_fns."""


def pipeline(input_context=None, num_shards=None, index=None):
  """(pipelines, this one's index): from the strategy's input_context, or
  from (num_shards, index) without a strategy; (1, 0) for one pipeline."""
  if input_context is not None:
    return input_context.num_input_pipelines, input_context.input_pipeline_id
  if num_shards is None or num_shards <= 1:
    return 1, 0
  return num_shards, index


def shard(dataset, input_context=None, num_shards=None, index=None):
  """Each input pipeline's own shard (`pipeline`); unchanged for one."""
  num_shards, index = pipeline(input_context, num_shards, index)
  if num_shards <= 1:
    return dataset
  return dataset.shard(num_shards, index)
