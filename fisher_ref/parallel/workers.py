"""The shards of one exact run in local processes: ``exact(task, workers=N)``.

Shard ``i`` of ``N`` is ``exact_param_shard(task, (i, N))``: the whole tree, for the
``i``-th set of the parameters (:func:`fisher_ref.engine.factored.shard_columns`). Every
sum the engine forms per parameter is that parameter's alone, so the sets split the
work per window and per state instead of repeating it (subtrees, ``shard=(i, N)``, would
each compute the windows they share; that cut serves the Ray cluster, where what crosses
the network must be small). Only the MLP forms just its columns of the sensitivities;
other models form all of a window's and keep their columns. Shards ``0..N-2`` run in
``N - 1`` worker processes, which send back their sums (arrays past
:data:`SHARED_BYTES`, the per-window tables of a parameter shard, through a
shared-memory block that each worker keeps and writes again run after run, unless the
caller still holds arrays read from it: the caller reads them in place); the last shard
runs in the calling process meanwhile (which would otherwise wait idle, and whose result
then needs no pickling), and the
caller merges them once. The last shard keeps the per-state and per-response records
and forms the autodiff gradient, so none of them is sent; for the MLP it holds ``W2``'s
family and the last hidden units, a smaller share of the work
(:data:`fisher_ref.engine.plan.LAST_SHARE`). (Subtree shards: shard 0 runs in the
caller.) A worker (a process of ours
alone) has glibc keep the memory its shards free for the next one. Workers are started with the ``spawn``
method, with the
BLAS thread counts set to 1 in their environment before they import numpy, and through
``threadpoolctl`` too; the caller's own BLAS is held to one thread by ``threadpoolctl``
while it runs its shard. So ``N`` shards use ``N`` cores, not ``N`` times the BLAS
threads. The pool is kept for the next call of the same size (starting a process and
importing numpy costs about a second), and ended at exit.

Because the last shard runs in the calling process, a reward or model that ends its
process ends the caller's (as with ``workers=1``), and one that raises there raises as
it would with ``workers=1``; in a worker, either is a ``RuntimeError`` that names the shard. A
failed run ends the pool, the other shards still running with it.

``workers="auto"`` takes the cores this process may use, and 1 (no process at all)
when the single-core estimate (:func:`fisher_ref.engine.plan.estimate_cost`) is under
:data:`AUTO_MIN_SECONDS`, where starting the workers costs more than they save, when
``tracemalloc`` is tracing (it would see only this process: memory measurements stay
whole), or when the task cannot be sent to a worker.
"""
from __future__ import annotations

import atexit
import mmap
import multiprocessing
import os
import pickle
import sys
import threading
import tracemalloc
import types
import weakref
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager

from threadpoolctl import threadpool_limits

from fisher_ref._progress import Progress
from fisher_ref.engine.keep_memory import OLD_MMAP_CAP, keep_freed_memory
from fisher_ref.engine.run import plan

__all__ = ["AUTO_MIN_SECONDS", "BLAS_THREAD_VARS", "SHARED_BYTES", "available_cores",
           "check_workers", "last_run_times", "local_workers",
           "unsendable", "resolve_workers", "run_shards", "shutdown"]

#: ``workers="auto"`` stays in this process below this many estimated seconds on one core.
AUTO_MIN_SECONDS = 10.0
#: Environment variables that set the thread count of the BLAS libraries numpy may use.
BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")

_POOL = {}  # {"n": workers, "executor": ProcessPoolExecutor}
#: One run at a time on the kept pool (calls from several threads wait their turn): a
#: worker reuses a shared-memory block of a run before only once the caller holds no array
#: read from it (:func:`_busy`), which the caller tells it as the run starts. ``count``:
#: the runs started, each run's number.
_RUNS = {"lock": threading.Lock(), "count": 0}
#: The wall times of the last finished run of :func:`run_shards` (:func:`last_run_times`):
#: ``{"last": dict}``, the dict replaced whole (never changed in place), so that a reader
#: in another thread sees one run's times or none.
_TIMES = {"last": {}}


def last_run_times():
    """Where the last finished :func:`run_shards` run (``exact(task, workers=N)``) spent
    its wall time, in seconds, for diagnosis (``scripts/shard_speedup.py`` prints them):
    ``{"here": (shard, s)}``, the shard the calling process ran and how long it took;
    ``"workers"``: ``{shard: s}``, each worker's shard as timed in its process (the
    engine call only); ``"after_here"``: from the calling process's shard done to every
    worker's result received and unpacked (waiting for the workers, then the hand-over);
    ``"total"``: the whole of :func:`run_shards`. ``{}`` before any run, while one runs,
    and after a failed or refused one."""
    last = _TIMES["last"]  # one run's dict, replaced whole: no lock needed to read it
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in last.items()}


def available_cores():
    """Cores this process may run on (its CPU affinity where the system tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def check_workers(workers):
    """``workers`` checked: a positive integer or ``"auto"``."""
    if workers == "auto":
        return workers
    if isinstance(workers, bool) or not hasattr(workers, "__index__") or int(workers) < 1:
        raise ValueError(f"workers must be a positive integer or 'auto', got {workers!r}")
    return int(workers)


def resolve_workers(workers, cost):
    """The number of processes for a run of ``cost`` (:class:`fisher_ref.engine.plan.Cost`
    of one core): ``workers`` itself, or for ``"auto"`` the available cores, 1 below
    :data:`AUTO_MIN_SECONDS`."""
    workers = check_workers(workers)
    if workers != "auto":
        return workers
    return 1 if cost.seconds < AUTO_MIN_SECONDS else available_cores()


def local_workers(task, workers, options):
    """The processes ``exact(task, workers=workers, **options.as_kwargs())`` runs in
    (``options``: an :class:`fisher_ref.engine.plan.EngineOptions`): ``workers``
    (:func:`resolve_workers` of the single-core estimate for ``"auto"``, and no more than
    fit in ``options.max_bytes`` together), at most one per parameter (the workers run
    parameter shards, ``exact_param_shard(task, (i, N))``)."""
    workers = check_workers(workers)
    if workers == 1:
        return 1
    sized = options.unlimited()  # sized only: the run itself checks the limits for its workers
    cost = plan(task, sized)[1]
    n = resolve_workers(workers, cost)
    if n > 1 and workers == "auto" and (unsendable(task) or tracemalloc.is_tracing()):
        return 1  # explicit workers say why they cannot (run_shards); a trace sees one process
    n = max(1, min(n, task.model.num_params))
    while workers == "auto" and n > 1 and (  # "auto": as many as fit in max_bytes
            plan(task, sized, workers=n)[1].bytes > options.max_bytes):
        n -= 1
    return n


def _one_blas_thread():
    """The BLAS thread variables set to 1 while processes are started (they inherit the
    environment), then restored."""
    return environment({k: "1" for k in BLAS_THREAD_VARS})


@contextmanager
def environment(values):
    """The environment variables ``values`` (a dict of strings; ``None``: unset) set inside
    the block and restored after it, as they were (a variable that was unset is unset
    again)."""
    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _init_worker():
    threadpool_limits(1)  # the variables already hold BLAS to one thread; this too
    keep_freed_memory(max_block=OLD_MMAP_CAP, max_kept=1 << 30)  # the most glibc's own
    # dynamic mmap threshold reaches: a shard's arrays of the same sizes come and go


def _healthy(ex):
    """Whether a kept pool can take work: not marked broken, and every process it started
    still alive (a worker killed between runs is noticed only when work is sent)."""
    if getattr(ex, "_broken", False):
        return False
    procs = getattr(ex, "_processes", None) or {}
    return all(p.is_alive() for p in procs.values())


def _executor(n):
    """The kept pool of ``n`` workers; a new one when the size differs or the kept one is
    broken (a worker of an earlier run died)."""
    ex = _POOL.get("executor")
    if _POOL.get("n") != n or ex is None or not _healthy(ex):
        shutdown()
        _POOL.update(n=n, executor=ProcessPoolExecutor(
            n, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker))
    return _POOL["executor"]


def shutdown():
    """End the kept worker processes (at exit, or before a pool of another size)."""
    ex = _POOL.pop("executor", None)
    _POOL.clear()
    if ex is not None:
        ex.shutdown(wait=True, cancel_futures=True)
    _close_attached()


atexit.register(shutdown)


def unsendable(task):
    """Why ``task`` cannot be sent to a worker process, or ``None``: it does not pickle, or
    it holds objects defined in the ``__main__`` script (a reward function written there,
    say), which a worker could only find by running the script again."""
    try:
        data = pickle.dumps(task)
    except Exception as e:  # noqa: BLE001 (any reason a pickle fails)
        return f"it cannot be pickled ({type(e).__name__}: {e})"
    if b"__main__" in data:
        return ("it holds objects defined in the __main__ script (a reward or model written "
                "there); define them in an importable module")
    return None


@contextmanager
def _without_main():
    """Processes started here do not import the ``__main__`` script (``spawn`` would, and a
    script without ``if __name__ == "__main__":`` would run again in each of them): the
    workers need only this module."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _here(n, by):
    """The shard of ``n`` the calling process runs: the last parameter shard (which keeps
    the per-state and per-response records, :func:`fisher_ref.engine.fast.exact`, so they
    need no sending), else shard 0."""
    return n - 1 if by == "param_shard" else 0


def _submit(ex, engine, task, n, kw, by, run):
    busy = _busy()  # the blocks whose arrays a result here still holds: not to be written
    return {ex.submit(_shard_in_worker, engine, task, {by: (i, n)}, kw, run, busy): i
            for i in range(n) if i != _here(n, by)}


#: Arrays of a worker's result at least this large come back through shared memory: on
#: the development machine 12 MiB took 47 ms through the result pipe and 16 ms through
#: shared memory, written, named and copied out (scripts/ipc_cost.py).
SHARED_BYTES = 2 ** 20
_FIELDS = ("window_tables", "states", "sequences")  # the ShardResult dicts that grow

# A worker's shared-memory blocks, kept from run to run: a fresh block's pages cost far
# more to come by than to write (12 MiB: about 12 ms fresh against under 1 ms into a
# block written before, scripts/ipc_cost.py). ``mem[j]`` holds the blocks of the ``j``-th
# result the worker sends in one run (one result, unless it runs more than one shard of
# that run): the one last written first, and at most one other that the caller still
# held arrays of, so that a caller that keeps each result until the next run's is back
# (``r = exact(...)`` in a loop) finds the two blocks taking turns. In the caller, per
# worker slot, its mapping of each of those blocks by name: an ``mmap`` that the arrays
# of a result are read from in place (where the system names its shared memory in
# ``/dev/shm``), else a ``SharedMemory`` they are copied out of; and per block, weak
# references to the arrays read from it (:func:`_busy`).
_BLOCKS = {"run": None, "used": 0, "mem": []}
_ATTACHED = {}  # {(pid, j): {name: mmap.mmap or SharedMemory}}
_LENT = {}  # {name: [weakref.ref(array), ...]}


def _busy():
    """The names of the workers' blocks that still back an array of a result here: a
    worker does not write into them (:func:`_block`)."""
    for name in [n for n, refs in _LENT.items() if all(r() is None for r in refs)]:
        del _LENT[name]
    return frozenset(_LENT)


def _drop(mem):
    """A block given up: its name removed (unless the caller did already) and unmapped."""
    try:
        mem.unlink()
    except FileNotFoundError:  # the caller removed the name when it mapped the block
        pass
    mem.close()


def _drop_blocks():
    """At a worker's exit: its blocks given up (the caller's mappings keep theirs alive)."""
    for blocks in _BLOCKS["mem"]:
        for mem in blocks:
            _drop(mem)
    _BLOCKS["mem"] = []


def _block(run, size, busy=frozenset()):
    """A shared-memory block of at least ``size`` bytes for this worker's next result in
    run ``run``, and its slot: a block the same slot held in an earlier run when it is
    as large and no more than 4 times larger and the caller holds no array read from it
    (its name not in ``busy``, :func:`_busy`); else a new one (``run=None``: always new, in
    a slot of its own). The slot keeps that block and, of its others, one the caller still
    holds (:data:`_BLOCKS`); ``_BLOCKS["mem"][j]`` lists them, the one returned first."""
    from multiprocessing import shared_memory
    st = _BLOCKS
    if run is None:
        return shared_memory.SharedMemory(create=True, size=size), None
    if st["run"] != run:
        st["run"], st["used"] = run, 0
        if not st["mem"]:
            atexit.register(_drop_blocks)
    j, st["used"] = st["used"], st["used"] + 1
    mems = st["mem"]
    if j == len(mems):
        mems.append([])
    held = mems[j]
    mem = next((m for m in held if m.name not in busy and size <= m.size <= 4 * size), None)
    if mem is None:
        mem = shared_memory.SharedMemory(create=True, size=size)
    keep = [mem] + [m for m in held if m is not mem and m.name in busy][:1]
    for m in held:
        if all(m is not k for k in keep):
            _drop(m)
    mems[j] = keep
    return mem, j


def _shard_in_worker(engine, task, shard, kw, run=None, busy=frozenset()):
    """In a worker: ``(seconds, result)``, the wall time of the engine call and the
    shard's result, its large arrays moved to a shared-memory block
    (``result.shared``: ``(name, slot, [(field, key, offset, shape, dtype), ...], kept)``,
    ``kept`` the names of the blocks the slot keeps) that the caller reads them from
    (:func:`_unpack`). ``run``: the caller's number of the run, under which the worker
    reuses a block of an earlier run whose name is not in ``busy`` (:func:`_block`;
    ``run=None``: a block of its own, freed by the caller)."""
    import time
    import numpy as np
    t0 = time.perf_counter()
    out = engine(task, **shard, **kw)
    seconds = time.perf_counter() - t0  # the engine call alone (last_run_times)
    big = [(f, k, v) for f in _FIELDS for k, v in (getattr(out, f, None) or {}).items()
           if isinstance(v, np.ndarray) and v.nbytes >= SHARED_BYTES]
    if not big:
        return seconds, out
    align = lambda n: -(-n // 64) * 64  # each array at a multiple of 64 bytes
    mem, j = _block(run, sum(align(v.nbytes) for *_, v in big), busy)
    index, at = [], 0
    try:
        for f, k, v in big:
            np.ndarray(v.shape, v.dtype, buffer=mem.buf, offset=at)[...] = v
            index.append((f, k, at, v.shape, v.dtype.str))
            getattr(out, f)[k] = None
            at += align(v.nbytes)
    except BaseException:
        if j is None:
            _drop(mem)
        raise
    kept = () if j is None else tuple(m.name for m in _BLOCKS["mem"][j])
    out.shared = (mem.name, None if j is None else (os.getpid(), j), index, kept)
    if j is None:
        mem.close()  # the caller removes it once copied
    return seconds, out


def _unpack(out):
    """The arrays a worker left in shared memory (:func:`_shard_in_worker`), put back into
    the result. From a kept block (a slot's): read in place, from this process's mapping of
    it, made once per block (its name removed at once: the worker's mapping and this one
    hold it), the result's arrays keeping the mapping alive; while they live the worker
    writes elsewhere (:func:`_busy`). So no copy is made, and no fresh page of this process
    is faulted in for them. The mappings of blocks the slot no longer keeps are let go.
    Where a block cannot be mapped so (no ``/dev/shm``), and from a block of its own
    (freed here), the arrays are copied out."""
    shared = getattr(out, "shared", None)
    if shared is None:
        return out
    import numpy as np
    name, slot, index, kept = shared
    maps = _ATTACHED.setdefault(slot, {}) if slot is not None else {}
    for other in [n for n in maps if n not in kept]:  # blocks the worker has given up
        buf = maps.pop(other)
        if not isinstance(buf, mmap.mmap):
            buf.close()
    if name not in maps:
        maps[name] = _map(name, keep=slot is not None)
    buf = maps[name]
    views = isinstance(buf, mmap.mmap)
    lent = []
    try:
        for f, k, at, shape, dtype in index:
            dt = np.dtype(dtype)
            if views:  # every view of `flat` (the reshaped one too) has it as its base
                flat = np.frombuffer(buf, dt, int(np.prod(shape)), at)
                lent.append(flat)
                a = flat.reshape(shape)
            else:
                a = np.ndarray(shape, dt, buffer=buf.buf, offset=at).copy()
            getattr(out, f)[k] = a
    finally:
        if slot is None:
            buf.close()
    if lent:
        _LENT[name] = [weakref.ref(a) for a in lent]
    del out.shared
    return out


def _map(name, keep):
    """The block ``name``, its name removed: an ``mmap`` of it where the system names
    shared memory in ``/dev/shm`` and the block is kept (``keep``), which lives as long as
    the arrays read from it; else a ``SharedMemory`` (to copy out of and close)."""
    from multiprocessing import resource_tracker, shared_memory
    path = os.path.join("/dev/shm", name.lstrip("/"))
    if keep and os.path.exists(path):
        fd = os.open(path, os.O_RDWR)
        try:
            buf = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        os.unlink(path)  # as SharedMemory.unlink: the name, and the tracker's record of it
        resource_tracker.unregister("/" + name.lstrip("/"), "shared_memory")
        return buf
    mem = shared_memory.SharedMemory(name=name)
    try:
        mem.unlink()
    except BaseException:
        mem.close()
        raise
    return mem


def _close_attached():
    """The caller's mappings of the workers' blocks given up (their pool ended): an
    ``mmap`` goes with the last array read from it, a ``SharedMemory`` is closed."""
    for maps in _ATTACHED.values():
        for buf in maps.values():
            if not isinstance(buf, mmap.mmap):
                buf.close()
    _ATTACHED.clear()
    _LENT.clear()


def run_shards(engine, task, n, kw, progress=False, by="shard"):
    """``[engine(task, shard=(i, n), **kw) for i in range(n)]`` (the keyword ``by``:
    ``"shard"`` or ``"param_shard"``): one in this process (shard 0; the last parameter
    shard, which keeps the records), the others in ``n - 1`` worker processes, one each
    (``engine``: a module-level function, such as :func:`fisher_ref.exact`); with
    ``progress``, a bar of the shards done on stderr once the run exceeds 2 s.

    Raises:
        ValueError: the task cannot be sent to a worker (:func:`unsendable` says why).
        RuntimeError: a worker died or its shard raised (the message names the shard and
            the error). Whatever fails, the pool is ended, its running shards with it, so
            that no orphaned shard holds a core or the next run's worker.
    """
    _TIMES["last"] = {}  # until this run ends well
    why = unsendable(task)
    if why:
        raise ValueError(f"workers > 1 sends the task to worker processes, but {why}; or "
                         "use workers=1")
    with _RUNS["lock"]:
        _RUNS["count"] += 1
        _TIMES["last"] = {}
        return _run(engine, task, n, kw, progress, by, _RUNS["count"])


def _run(engine, task, n, kw, progress, by, run):
    """:func:`run_shards` for run number ``run``, the pool held by it alone."""
    import time
    t0 = time.perf_counter()
    with _one_blas_thread(), _without_main():  # processes start on submit, so set up
        try:
            futures = _submit(_executor(n - 1), engine, task, n, kw, by, run)
        except BrokenProcessPool:  # the kept pool broke since its last run: start afresh
            shutdown()
            futures = _submit(_executor(n - 1), engine, task, n, kw, by, run)
    out, bar = [None] * n, Progress(n, f"exact enumeration, shards of {n} workers",
                                    enabled=progress)
    try:
        try:
            here = _here(n, by)
            with threadpool_limits(1):  # the workers' cores are busy: one thread here too
                t1 = time.perf_counter()
                out[here] = engine(task, **{by: (here, n)}, **kw)
                t2 = time.perf_counter()
        except BaseException:
            _discard()  # nothing of a failed run is kept, nor left running
            _free(futures)
            raise
        bar.update(1)
        seconds = {}
        for f in as_completed(futures):
            i = futures[f]
            try:
                seconds[i], out[i] = f.result()
                out[i] = _unpack(out[i])
            except BrokenProcessPool as e:
                _discard()
                _free(futures)
                raise RuntimeError(f"the worker process of shard {i} of {n} died ({e}); no "
                                   "result is returned for a partial run") from e
            except Exception as e:  # noqa: BLE001 (whatever the shard raised, named)
                _discard()
                _free(futures)
                raise RuntimeError(f"shard {i} of {n} failed in its worker process: "
                                   f"{type(e).__name__}: {e}; no result is returned for a "
                                   "partial run") from e
            bar.update(1)
    finally:
        bar.close()
    end = time.perf_counter()
    _TIMES["last"] = {"here": (here, t2 - t1), "after_here": end - t2, "total": end - t0,
                      "workers": seconds}
    return out


def _free(futures):
    """Free the shared memory of the results that came back but will not be read (a run
    that failed)."""
    for f in futures:
        try:
            if f.done() and not f.cancelled() and f.exception() is None:
                _unpack(f.result()[1])
        except Exception:  # noqa: BLE001 (the run's own error is the one raised)
            pass
    _close_attached()  # the pool is gone: its blocks too


def _discard():
    """End the kept pool now, its running shards included (their results are not wanted)."""
    ex = _POOL.pop("executor", None)
    _POOL.clear()
    _close_attached()
    if ex is None:
        return
    for proc in list((getattr(ex, "_processes", None) or {}).values()):
        if proc.is_alive():
            proc.terminate()
    ex.shutdown(wait=True, cancel_futures=True)
