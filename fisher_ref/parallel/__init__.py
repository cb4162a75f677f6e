"""The parallel layer over the fast exact engine (:mod:`fisher_ref.engine`): one exact run
cut into shards, run in processes or on a cluster, and merged back. The engine knows
nothing of it.

- :mod:`fisher_ref.parallel.run`: :func:`fisher_ref.exact` (``workers=``), and the runs of
  one shard, :func:`exact_shard` and :func:`exact_param_shard`;
- :mod:`fisher_ref.parallel.shards`: subtree shards (cut by prompt and first tokens) and
  :func:`merge`;
- :mod:`fisher_ref.parallel.param_shards`: parameter shards (every state, a set of the
  parameters);
- :mod:`fisher_ref.parallel.shard_result`: what a shard returns;
- :mod:`fisher_ref.parallel.workers`: local worker processes and their shared memory;
- :mod:`fisher_ref.parallel.distributed`: shards over a Ray cluster.
"""
from fisher_ref.parallel.run import exact_param_shard, exact_shard
from fisher_ref.parallel.shards import merge

__all__ = ["exact_shard", "exact_param_shard", "merge"]
