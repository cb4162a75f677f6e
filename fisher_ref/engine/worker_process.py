"""What a worker process of ``exact(task, workers=N)`` runs: its set-up
(:func:`init_worker`: one BLAS thread, freed memory kept) and each shard sent to it
(:func:`shard_in_worker`, its large arrays sent back through shared memory,
:mod:`fisher_ref.engine.worker_memory`)."""
from __future__ import annotations

from threadpoolctl import threadpool_limits

from fisher_ref.engine.keep_memory import OLD_MMAP_CAP, keep_freed_memory
from fisher_ref.engine.worker_memory import share

__all__ = ["init_worker", "shard_in_worker"]


def init_worker():
    """A worker's set-up, as it starts: BLAS held to one thread, and glibc told to keep the
    memory the shards free (:func:`fisher_ref.engine.keep_memory.keep_freed_memory`)."""
    threadpool_limits(1)  # the variables already hold BLAS to one thread; this too
    keep_freed_memory(max_block=OLD_MMAP_CAP, max_kept=1 << 30)  # the most glibc's own
    # dynamic mmap threshold reaches: a shard's arrays of the same sizes come and go


def shard_in_worker(engine, task, shard, kw, run=None, busy=frozenset()):
    """In a worker: ``(seconds, result)``, the wall time of the engine call
    ``engine(task, **shard, **kw)`` and the shard's result, its large arrays moved to a
    shared-memory block (:func:`fisher_ref.engine.worker_memory.share`, under the caller's
    run number ``run``, the blocks ``busy`` left alone)."""
    import time
    t0 = time.perf_counter()
    out = engine(task, **shard, **kw)
    seconds = time.perf_counter() - t0  # the engine call alone (last_run_times)
    return seconds, share(out, run, busy)
