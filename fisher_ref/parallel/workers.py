"""The shards of one exact run in local processes: ``exact(task, workers=N)``.

Shard ``i`` of ``N`` is ``exact_param_shard(task, (i, N))``: the whole tree, for the
``i``-th set of the parameters (:func:`fisher_ref.engine.factored.shard_columns`). Every
sum the engine forms per parameter is that parameter's alone, so the sets split the
work per window and per state instead of repeating it (subtrees, ``shard=(i, N)``, would
each compute the windows they share; that cut serves the Ray cluster, where what crosses
the network must be small). Only the MLP forms just its columns of the sensitivities;
other models form all of a window's and keep their columns. Shards ``0..N-2`` run in
``N - 1`` worker processes (:mod:`fisher_ref.parallel.worker_process`), which send back
their sums, each shard with the checksum of its payload (arrays past
:data:`fisher_ref.parallel.worker_memory.SHARED_BYTES`, the per-window tables of a
parameter shard, through a shared-memory block that each worker keeps and writes again
run after run, unless the caller still holds arrays read from it: the caller reads them
in place, :mod:`fisher_ref.parallel.worker_memory`); the last shard runs in the calling
process meanwhile (which would otherwise wait idle, and whose result then needs no
pickling nor checksum), and the caller merges them once. The last shard keeps the
per-state and per-response records and forms the autodiff gradient, so none of them is
sent; for the MLP it holds ``W2``'s family and the last hidden units, a smaller share of
the work (:data:`fisher_ref.engine.plan.LAST_SHARE`). (Subtree shards: shard 0 runs
in the caller.) A worker (a process of ours alone) has glibc keep the memory its shards
free for the next one (:mod:`fisher_ref.engine.keep_memory`), and ends when its caller
dies. Workers are started with the ``spawn`` method, with the BLAS thread counts set to 1
in their environment before they import numpy, and through ``threadpoolctl`` too; the
caller's own BLAS is held to one thread by ``threadpoolctl`` while it runs its shard. So
``N`` shards use ``N`` cores, not ``N`` times the BLAS
threads. The pool is kept for the next call of the same size (starting a process and
importing numpy costs about a second), and ended at exit.

Because the last shard runs in the calling process, a reward or model that ends its
process ends the caller's (as with ``workers=1``), and one that raises there raises as
it would with ``workers=1``; in a worker, either is a ``RuntimeError`` that names the shard. A
failed run ends the pool, the other shards still running with it.

An explicit ``N`` is capped at the cores this process may use and at the parameters, with
a :class:`WorkersCapped` warning. ``workers="auto"`` takes the cores this process may
use, and 1 (no process at all)
when the single-core estimate (:func:`fisher_ref.engine.plan.estimate_cost`) is under
:data:`AUTO_MIN_SECONDS`, where starting the workers costs more than they save, when
``tracemalloc`` is tracing (it would see only this process: memory measurements stay
whole), or when the task cannot be sent to a worker.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import pickle
import sys
import threading
import tracemalloc
import types
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager

from threadpoolctl import threadpool_limits

from fisher_ref._progress import Progress
from fisher_ref.engine.keep_memory import OLD_MMAP_CAP, keep_freed_memory
from fisher_ref.engine.run import plan
from fisher_ref.parallel.worker_memory import busy_blocks, close_attached, unpack
from fisher_ref.parallel.worker_process import init_worker, shard_in_worker

__all__ = ["AUTO_MIN_SECONDS", "BLAS_THREAD_VARS", "available_cores", "check_workers",
           "environment", "last_run_times", "local_workers", "WorkersCapped",
           "unsendable", "resolve_workers", "run_shards", "shutdown"]

#: ``workers="auto"`` stays in this process below this many estimated seconds on one core.
AUTO_MIN_SECONDS = 10.0
#: Environment variables that set the thread count of the BLAS libraries numpy may use.
BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")

_POOL = {}  # {"n": workers, "executor": ProcessPoolExecutor}
#: One run at a time on the kept pool (calls from several threads wait their turn): a
#: worker reuses a shared-memory block of a run before only once the caller holds no array
#: read from it (:func:`fisher_ref.parallel.worker_memory.busy_blocks`), which the caller tells it as the run starts. ``count``:
#: the runs started, each run's number.
_RUNS = {"lock": threading.Lock(), "count": 0}
#: The wall times of the last finished run of :func:`run_shards` (:func:`last_run_times`):
#: ``{"last": dict}``, the dict replaced whole (never changed in place), so that a reader
#: in another thread sees one run's times or none.
_TIMES = {"last": {}}


def last_run_times():
    """Where the last finished :func:`run_shards` run (``exact(task, workers=N)``) spent
    its wall time, in seconds, for diagnosis (``benchmarks/scaling/shard_speedup.py`` prints them):
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
    parameter shards, ``exact_param_shard(task, (i, N))``) and one per core this process
    may use (:func:`available_cores`): an explicit count past either is capped, with a
    :class:`WorkersCapped` warning that names the cap and why."""
    workers = check_workers(workers)
    if workers == 1:
        return 1
    sized = options.unlimited()  # sized only: the run itself checks the limits for its workers
    cost = plan(task, sized)[1]
    n = resolve_workers(workers, cost)
    if n > 1 and workers == "auto" and (unsendable(task) or tracemalloc.is_tracing()):
        return 1  # explicit workers say why they cannot (run_shards); a trace sees one process
    n = _capped(n, workers, task.model.num_params)
    while workers == "auto" and n > 1 and (  # "auto": as many as fit in max_bytes
            plan(task, sized, workers=n)[1].bytes > options.max_bytes):
        n -= 1
    return n


class WorkersCapped(UserWarning):
    """``exact(task, workers=N)`` runs fewer processes than asked: more than the cores this
    process may use only wait their turn (and each costs a second to start), and each needs
    a parameter of its own (:func:`local_workers`)."""


def _capped(n, workers, P):
    """``n`` processes capped at the cores (:func:`available_cores`) and the ``P``
    parameters; an explicit ``workers`` that is cut is told so (:class:`WorkersCapped`)."""
    cores = available_cores()
    cap, why = min((cores, f"this process may run on {cores} cores "
                           "(its CPU affinity), and more processes than cores only wait "
                           "their turn"),
                   (P, f"the model has {P} parameters, and each worker's shard holds at "
                       "least one"), key=lambda c: c[0])
    if n <= max(cap, 1):
        return n
    if workers != "auto":
        warnings.warn(f"workers={workers} capped at {cap}: {why}", WorkersCapped,
                      stacklevel=4)
    return max(cap, 1)


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
            n, mp_context=multiprocessing.get_context("spawn"), initializer=init_worker))
    return _POOL["executor"]


def shutdown():
    """End the kept worker processes (at exit, or before a pool of another size)."""
    ex = _POOL.pop("executor", None)
    _POOL.clear()
    if ex is not None:
        ex.shutdown(wait=True, cancel_futures=True)
    close_attached()


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
    busy = busy_blocks()  # the blocks whose arrays a result here still holds: not to be written
    return {ex.submit(shard_in_worker, engine, task, {by: (i, n)}, kw, run, busy): i
            for i in range(n) if i != _here(n, by)}



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
                out[i] = unpack(out[i])
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
                unpack(f.result()[1])
        except Exception:  # noqa: BLE001 (the run's own error is the one raised)
            pass
    close_attached()  # the pool is gone: its blocks too


def _discard():
    """End the kept pool now, its running shards included (their results are not wanted)."""
    ex = _POOL.pop("executor", None)
    _POOL.clear()
    close_attached()
    if ex is None:
        return
    for proc in list((getattr(ex, "_processes", None) or {}).values()):
        if proc.is_alive():
            proc.terminate()
    ex.shutdown(wait=True, cancel_futures=True)
