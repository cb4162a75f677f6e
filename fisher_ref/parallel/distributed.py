"""The shards of one exact run as Ray tasks, on one machine or a cluster.

:func:`exact_ray` runs ``exact_shard(task, (i, n))`` (:mod:`fisher_ref.parallel.run`)
as one Ray task per shard and merges their sums once, in the calling process: the
same :class:`fisher_ref.ExactResult` as ``exact(task)``, to rounding. What
crosses the network: the task (put once in Ray's object store, a task file's worth of
data: the model's description, its parameters, prompts, reward) and each shard's sums
(a ``ShardResult``: a few ``(P,)`` and ``(T, T, P)`` arrays
per stream, plus the shard's rows of the per-state and per-response arrays when those
are kept).

A shard whose task raises or whose worker dies is run again, up to ``max_retries``
times; a shard that fails for good ends the run with :class:`ShardFailed`, which names
it. The shards that did finish are not summed into a result: a partial sum is never
returned as a whole one.

Needs the optional extra ``distributed`` (``pip install "fisher-ref[distributed]"``:
``ray>=2``); ``fisher_ref`` must be importable on every node of the cluster.
"""
from __future__ import annotations

from dataclasses import replace

from fisher_ref.engine.plan import DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, EngineOptions, check_cost
from fisher_ref.engine.run import plan
from fisher_ref.parallel.shards import merge, plan_shards

__all__ = ["exact_ray", "ShardFailed", "run_shard"]


class ShardFailed(RuntimeError):
    """A shard of :func:`exact_ray` failed on every attempt; ``shard`` is its ``(i, n)``."""

    def __init__(self, message, shard):
        super().__init__(message)
        self.shard = shard


def run_shard(task, shard, options):
    """What one Ray task runs: :func:`fisher_ref.parallel.exact_shard` of ``shard`` with
    ``options`` (an :class:`fisher_ref.engine.plan.EngineOptions`)."""
    from fisher_ref.parallel.run import exact_shard
    return exact_shard(task, shard, options=options)


def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - CI installs the extra
        raise ImportError("fisher_ref.parallel.distributed needs Ray: pip install "
                          "'fisher-ref[distributed]' (or pip install 'ray>=2')") from e
    return ray


def exact_ray(task, address=None, shards=None, *, max_retries=2, runner=None, topk=(),
              chunk=None, keep_states=False, keep_sequences=False,
              max_seconds=DEFAULT_MAX_SECONDS, max_bytes=DEFAULT_MAX_BYTES,
              quantities="all"):
    """``exact(task, ...)`` with its shards run as Ray tasks, merged here.

    Args:
        task: a :class:`fisher_ref.Task`.
        address: the Ray cluster to join (``"ray://host:10001"``, ``"host:6379"``,
            ``"auto"``); ``None`` joins the Ray this process already runs, else starts a
            local one (or joins the one ``RAY_ADDRESS`` names, as ``ray.init`` does).
        shards: how many shards (one Ray task each); default: the cluster's CPUs. Never
            more than the task has subtrees at the cut (``plan_shards``).
        max_retries: extra attempts of a shard that raised or whose worker died.
        runner: ``(task, shard, options) -> ShardResult`` run in each Ray task, ``options``
            an :class:`fisher_ref.engine.plan.EngineOptions` (default :func:`run_shard`, the
            numpy engine); it must be picklable.
        topk, chunk, keep_states, keep_sequences, max_seconds, max_bytes, quantities: as
            for :func:`fisher_ref.exact` and its options. The per-state and per-response
            arrays are not
            kept unless asked (they would cross the network); the limits apply to the
            whole run, its time shared by the shards and its memory by each.

    Raises:
        ShardFailed: a shard failed on every attempt (the message names it and the
            last error).
        fisher_ref.EnumerationTooLarge, ValueError: as :func:`fisher_ref.exact`.
    """
    ray = _ray()
    if not isinstance(max_retries, int) or isinstance(max_retries, bool) or max_retries < 0:
        raise ValueError(f"max_retries must be a non-negative integer, got {max_retries!r}")
    if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int)
                               or shards < 1):
        raise ValueError(f"shards must be a positive integer or None, got {shards!r}")
    options = EngineOptions(topk=topk, chunk=chunk, keep_states=keep_states,
                            keep_sequences=keep_sequences, quantities=quantities,
                            progress=False).unlimited()  # checked here, for the whole run
    one = plan(task, options)[1]
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    n = shards or max(1, int(ray.cluster_resources().get("CPU", 1)))
    n = max(1, min(n, plan_shards(task, n).bounds[-1]))
    # the limits: the time of n shards side by side, the memory of one worker
    seconds = plan(task, options, workers=n)[1].seconds
    check_cost(replace(one, seconds=seconds, workers=n), max_seconds, max_bytes)
    remote = ray.remote(num_cpus=1, max_retries=max_retries, retry_exceptions=True)(
        runner or run_shard)
    task_ref = ray.put(task)
    refs = [remote.remote(task_ref, (i, n), options) for i in range(n)]
    parts = []
    for i, ref in enumerate(refs):
        try:
            parts.append(ray.get(ref))
        except ray.exceptions.RayError as e:
            for other in refs[i + 1:]:
                ray.cancel(other, force=True)
            raise ShardFailed(f"shard {i} of {n} failed after {max_retries + 1} attempt(s); "
                              f"no result is returned for a partial run. Last error: "
                              f"{type(e).__name__}: {str(e).strip()[-600:]}", (i, n)) from e
    return merge(task, parts)
