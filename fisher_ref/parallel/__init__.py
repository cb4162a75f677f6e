"""The parallel layer over the fast exact engine (:mod:`fisher_ref.engine`): one exact run
cut into shards and merged back.

- :mod:`fisher_ref.parallel.shards`: subtree shards (cut by prompt and first tokens) and
  :func:`~fisher_ref.parallel.shards.merge`;
- :mod:`fisher_ref.parallel.param_shards`: parameter shards (every state, a slice of the
  parameters);
- :mod:`fisher_ref.parallel.shard_result`: what a shard returns;
- :mod:`fisher_ref.parallel.workers`: local worker processes and their shared memory;
- :mod:`fisher_ref.parallel.distributed`: shards over a Ray cluster.
"""
