"""What a worker process of ``exact(task, workers=N)`` runs: its set-up
(:func:`init_worker`: one BLAS thread, freed memory kept, its caller watched) and each
shard sent to it (:func:`shard_in_worker`, its large arrays sent back through shared
memory, :mod:`fisher_ref.parallel.worker_memory`).

A worker whose caller dies without ending the pool (killed with SIGKILL, say) ends too,
at once, whatever it is doing (:func:`watch_parent`): it would otherwise wait forever on
the pipes it shares with its caller, both ends of which it holds. It removes the names of
its shared-memory blocks first; the resource tracker, once every process of the pool is
gone, removes what else the pool had named in ``/dev/shm`` (its queues' semaphores)."""
from __future__ import annotations

import multiprocessing
import os
import threading

from threadpoolctl import threadpool_limits

from fisher_ref.engine.keep_memory import OLD_MMAP_CAP, keep_freed_memory
from fisher_ref.parallel.worker_memory import unlink_blocks, share

__all__ = ["ORPHAN_EXIT", "init_worker", "shard_in_worker", "watch_parent"]

#: The exit status of a worker that ended because its caller died.
ORPHAN_EXIT = 70


def init_worker():
    """A worker's set-up, as it starts: its caller watched (:func:`watch_parent`), BLAS held
    to one thread, and glibc told to keep the memory the shards free
    (:func:`fisher_ref.engine.keep_memory.keep_freed_memory`)."""
    watch_parent()
    threadpool_limits(1)  # the variables already hold BLAS to one thread; this too
    keep_freed_memory(max_block=OLD_MMAP_CAP, max_kept=1 << 30)  # the most glibc's own
    # dynamic mmap threshold reaches: a shard's arrays of the same sizes come and go


def shard_in_worker(engine, task, shard, kw, run=None, busy=frozenset()):
    """In a worker: ``(seconds, result)``, the wall time of the engine call
    ``engine(task, **shard, **kw)`` and the shard's result, its large arrays moved to a
    shared-memory block (:func:`fisher_ref.parallel.worker_memory.share`, under the caller's
    run number ``run``, the blocks ``busy`` left alone)."""
    import time
    t0 = time.perf_counter()
    out = engine(task, **shard, **kw)
    seconds = time.perf_counter() - t0  # the engine call alone (last_run_times)
    return seconds, share(out, run, busy)


def watch_parent():
    """In a process started by :mod:`multiprocessing`: a daemon thread that waits on the pipe
    whose other end only the parent holds (``multiprocessing.parent_process().sentinel``,
    readable once the parent is gone, however it ended) and then ends this process
    (status :data:`ORPHAN_EXIT`), its shared-memory blocks' names removed first
    (:func:`fisher_ref.parallel.worker_memory.unlink_blocks`). Nothing where this process has no
    such parent."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return None

    def wait():
        parent.join()  # the parent's end of the pipe closed: it exited or was killed
        try:
            unlink_blocks()
        finally:
            os._exit(ORPHAN_EXIT)  # the main thread may be blocked on the dead caller's pipe

    watcher = threading.Thread(target=wait, name="fisher_ref-parent-watch", daemon=True)
    watcher.start()
    return watcher
