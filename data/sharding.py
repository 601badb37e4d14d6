"""Input sharding shared by the input_fns."""


def shard(dataset, input_context=None, num_shards=None, index=None):
  """Each input pipeline's own shard: from the strategy's input_context, or
  from (num_shards, index) without a strategy; unchanged for one pipeline."""
  if input_context is not None:
    num_shards = input_context.num_input_pipelines
    index = input_context.input_pipeline_id
  if num_shards is None or num_shards <= 1:
    return dataset
  return dataset.shard(num_shards, index)
