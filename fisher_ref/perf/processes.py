"""How a side of ``python -m fisher_ref bench`` is run and timed: in a process of its own
(:class:`SideProcess`, spawned with its thread and malloc variables set before numpy or torch
load) or in this one (:class:`InProcess`, threads pinned by :func:`pinned_here`); one call's
wall time, minor page faults and kernel seconds; the memory conditions
(:data:`KEEP_MEMORY`, :func:`condition_env`)."""
from __future__ import annotations

import contextlib
import os
import pickle
import sys
import time

from fisher_ref.parallel.workers import BLAS_THREAD_VARS, environment
from fisher_ref.perf.sides import MEASUREMENTS, NUMPY_SIDES

__all__ = ["KEEP_MEMORY", "THREAD_VARS", "MeasurementFailed", "SideProcess", "InProcess",
           "memory_vars", "condition_env", "time_call", "timed_call", "thread_report",
           "pinned_here", "check_keep_memory"]

THREAD_VARS = BLAS_THREAD_VARS  # set to ``threads`` in every side's process
#: glibc's settings of ``bench(keep_memory=True)``, read when a process starts: no freed
#: block is handed back to the system (an mmap threshold of 1 GiB, no trimming)
KEEP_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(2 ** 30), "MALLOC_TRIM_THRESHOLD_": str(2 ** 62)}


def time_call(fn):
    """Wall time of one call of ``fn`` in seconds (``time.perf_counter``)."""
    return timed_call(fn)[0]


def _kernel_counts():
    """``(minor page faults, system seconds)`` of this process so far; ``None`` without
    ``getrusage``."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_stime


def timed_call(fn):
    """``(wall seconds, minor page faults, system seconds)`` of one call of ``fn`` (the
    last two ``None`` where the system does not count them)."""
    k0 = _kernel_counts()
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    k1 = _kernel_counts()
    if k0 is None or k1 is None:
        return wall, None, None
    return wall, k1[0] - k0[0], k1[1] - k0[1]


def thread_report():
    """This process's thread settings: torch's intra-op threads (if torch is loaded), BLAS
    thread pools as threadpoolctl reports them)."""
    from threadpoolctl import threadpool_info
    out = {"torch_threads": None, "blas_source": "threadpoolctl"}
    if "torch" in sys.modules:
        out["torch_threads"] = sys.modules["torch"].get_num_threads()
    out["blas"] = [{"api": p.get("internal_api"), "threads": p.get("num_threads")}
                   for p in threadpool_info()]
    return out


def _max_rss_bytes():
    from fisher_ref.perf.memory import peak_rss_bytes
    return peak_rss_bytes()


def _worker(conn, name, task_bytes, threads):
    """A measurement's own process: build, warm up, then time one call per ``"run"``."""
    try:
        if threads and name not in NUMPY_SIDES:  # the numpy sides never load torch
            import torch
            torch.set_num_threads(threads)
        fn = MEASUREMENTS[name](pickle.loads(task_bytes))
        fn()  # warm-up: imports, allocator, kernels
        conn.send(("ready", None))
        while conn.recv() == "run":
            conn.send(("time", timed_call(fn)))
        conn.send(("done", dict(thread_report(), max_rss_bytes=_max_rss_bytes(),
                                malloc={k: os.environ.get(k) for k in KEEP_MEMORY})))
    except Exception as exc:  # reported to the parent, which raises
        import traceback
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class MeasurementFailed(RuntimeError):
    """A measurement's process raised, or ended without an answer (killed, crashed)."""


def memory_vars(keep):
    """The malloc variables of a memory condition, for
    :func:`fisher_ref.parallel.workers.environment`: :data:`KEEP_MEMORY`'s values, or each
    unset (``None``) for the C library's default even where this process has them set."""
    return dict(KEEP_MEMORY) if keep else dict.fromkeys(KEEP_MEMORY)


def condition_env(keep, threads=1):
    """A whole environment for a new process in a memory condition: this process's, the
    malloc variables set or unset (:func:`memory_vars`), and the BLAS thread variables at
    ``threads`` (left as they are when ``threads`` is 0)."""
    env = dict(os.environ)
    change = {**(dict.fromkeys(THREAD_VARS, str(threads)) if threads else {}),
              **memory_vars(keep)}
    for k, v in change.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


class SideProcess:
    """A measurement in a spawned process whose thread variables are set before start."""

    def __init__(self, name, task_bytes, threads, keep_memory=False):
        import multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.name, (self.conn, child) = name, ctx.Pipe()
        env = {v: str(threads) for v in THREAD_VARS} if threads else {}
        with environment({**env, **memory_vars(keep_memory)}):
            self.proc = ctx.Process(target=_worker, args=(child, name, task_bytes, threads),
                                    daemon=True)
            self.proc.start()
        child.close()  # the child's end lives in the child: its exit ends our recv()
        self._expect("ready")

    def _ended(self):
        self.close()
        code = self.proc.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else \
            f"exit code {code}"
        return MeasurementFailed(f"measurement {self.name!r}: its process ended without an "
                                 f"answer ({how})")

    def _send(self, message):
        try:
            self.conn.send(message)
        except (BrokenPipeError, OSError):  # the process is gone
            raise self._ended() from None

    def _expect(self, kind):
        try:
            got, value = self.conn.recv()
        except (EOFError, OSError):  # the process ended without a word: killed, crashed
            raise self._ended() from None
        if got == "error":
            self.close()
            raise MeasurementFailed(f"measurement {self.name!r} failed in its process: "
                                    f"{value}")
        return value

    def __call__(self):
        self._send("run")
        return self._expect("time")

    def finish(self):
        self._send("stop")
        info = self._expect("done")
        self.close()
        return info

    def close(self):
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.terminate()


class InProcess:
    """A measurement timed in this process (threads pinned by the caller)."""

    def __init__(self, name, task):
        self.fn = MEASUREMENTS[name](task)
        self.fn()  # warm-up

    def __call__(self):
        return timed_call(self.fn)

    def finish(self):
        return dict(thread_report(), max_rss_bytes=None,
                    malloc={k: os.environ.get(k) for k in KEEP_MEMORY})

    def close(self):
        pass


@contextlib.contextmanager
def pinned_here(threads):
    """Pin torch (and BLAS, with threadpoolctl) in this process; restore afterwards."""
    import torch
    from threadpoolctl import threadpool_limits
    old = torch.get_num_threads()
    try:
        with contextlib.ExitStack() as stack:
            if threads:  # BLAS (and OpenMP) limited first: torch's own count set after
                stack.enter_context(threadpool_limits(threads))
                torch.set_num_threads(threads)
            yield
    finally:  # after threadpoolctl restored the OpenMP pools it saw at entry
        torch.set_num_threads(old)


def check_keep_memory(keep_memory, isolate):
    """Refuse ``keep_memory`` that is not a bool, or True where glibc is not the C
    library or the sides run in this process (``isolate=False``)."""
    if not isinstance(keep_memory, bool):
        raise ValueError(f"keep_memory must be True or False, got {keep_memory!r}")
    if not keep_memory:
        return
    import platform
    libc = platform.libc_ver()[0]
    if libc != "glibc":
        raise ValueError(f"keep_memory=True sets glibc's malloc variables, and this Python "
                         f"runs on {libc or 'another C library'}")
    if isolate is False:
        raise ValueError("keep_memory=True needs one process per measurement (glibc reads "
                         "its malloc variables when a process starts), not isolate=False")
