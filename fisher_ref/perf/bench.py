r"""``python -m fisher_ref bench``: the numpy exact engine against the torch engine, timed
side by side under the same thread settings.

Measurements (each a function ``task -> zero-argument callable`` in :data:`MEASUREMENTS`):

- ``fisher_ref`` — :func:`fisher_ref.exact.exact` (numpy, CPU, float64);
- ``torch_cpu_float64`` — :func:`fisher_ref.torch.exact.torch_exact` on the CPU in
  float64: the same enumeration and the same quantities (every stream, cross terms and
  their fourth moments, the exact variances, per-state and per-response arrays, the
  autograd gradient), depth-first in bounded blocks;
- ``torch_cuda_float64`` — the same on CUDA, synchronised, when present;
- ``torch_peer`` — when ``scripts/torch_peer.py`` exists in the checkout and the model
  is the MLP: an independent minimal torch implementation of ``F``, ``E[h]`` and the
  token Fisher per state only (:data:`WORK` says what each side computes);
- ``fisher_ref_fisher`` — with the peer: ``exact(task, quantities="fisher")``, the numpy
  engine doing the peer's work, so that the peer has a like-for-like ratio
  (:data:`LIKE_FOR_LIKE`).

Method. Each measurement runs in a process of its own (``multiprocessing`` spawn),
started with ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` set to
``threads`` before numpy or torch load, and ``torch.set_num_threads(threads)``: both
sides run with the same thread count, 1 by default (two threads on two busy cores made
torch 20-50x slower). Each is warmed up once; then the measurements run in turn,
``repeats`` rounds (interleaved, so drifts in machine load hit all alike), and the load
average is recorded before every round. Reported: median and minimum wall time of each,
the ratios ``median(fisher_ref) / median(other)`` and of the minima (below 1:
fisher_ref is faster), the like-for-like ratio of the peer, and per measurement its torch threads, its BLAS threads
(threadpoolctl's report), its peak RSS, and what each run cost in the kernel: minor page
faults and system seconds (``getrusage``; not counted on a system without it).

Memory. With glibc's default settings large freed blocks go back to the system, so every
run faults its pages in afresh, and a page fault costs microseconds on a virtual machine: a
side that allocates large arrays pays that on every run. ``keep_memory=True`` starts every
measurement's process with :data:`KEEP_MEMORY` (glibc's ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_``), so that freed memory stays in the process and is reused: the
two conditions bracket a run in a fresh process and one in a process that has run before,
and the ratio can differ between them (docs/performance/speed.md). Before the sides
start, a process started as they are probes the allocator
(:func:`fisher_ref.perf.memory.probe_process`, recorded as ``freed_memory_reused``): a
condition the allocator does not follow (a glibc that refuses the threshold under
``keep_memory=True``; ``MALLOC_*`` or ``GLIBC_TUNABLES`` settings that keep memory under
the default) is a :class:`fisher_ref.perf.memory.MemoryConditionError`, not a record
under the wrong condition.
``isolate=False`` times in this process instead (threads pinned with
``torch.set_num_threads`` and threadpoolctl), for tasks that cannot be
sent to another process (a Python callable reward).
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import pickle
import statistics
import sys
import time
from importlib import resources
from pathlib import Path

from fisher_ref.engine.keep_memory import kept_in_process
from fisher_ref.parallel.workers import BLAS_THREAD_VARS, environment
from fisher_ref.perf.memory import (MEMORY_LABELS, check_memory_condition, probe_process,
                                    startup_environ)


__all__ = ["MEASUREMENTS", "WORK", "LIKE_FOR_LIKE", "DEFAULT_REPEATS", "DEFAULT_THREADS", "PEER_SCRIPT",
           "KEEP_MEMORY", "THREAD_VARS", "MeasurementFailed", "memory_vars", "condition_env",
           "measurements", "time_call", "bench", "format_table", "thread_report"]

DEFAULT_REPEATS = 5
DEFAULT_THREADS = 1
REFERENCE = "fisher_ref"
# the independent torch peer of a source checkout (``--peer PATH`` names another)
PEER_SCRIPT = Path(str(resources.files("fisher_ref"))).parent / "scripts" / "torch_peer.py"
THREAD_VARS = BLAS_THREAD_VARS  # set to ``threads`` in every side's process
WORK = {
    "fisher_ref": "every quantity: all streams, E[h^4], cross terms and their 4th moments, "
                  "exact variances, autodiff gradient, per-state and per-response arrays",
    "torch_cpu_float64": "the same quantities as fisher_ref",
    "torch_cuda_float64": "the same quantities as fisher_ref",
    "torch_peer": "F, E[h] and the token Fisher per state only (scripts/torch_peer.py)",
    "fisher_ref_fisher": "quantities='fisher' on the policy stream (the sampler dropped, as "
                         "the peer ignores it): E[h], E[h^2], token_fisher_sum and by depth, "
                         "the token Fisher per state formed (the uniform Fisher and E[xi|s] "
                         "kept per window)",
}
#: glibc's settings of ``bench(keep_memory=True)``, read when a process starts: no freed
#: block is handed back to the system (an mmap threshold of 1 GiB, no trimming)
KEEP_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(2 ** 30), "MALLOC_TRIM_THRESHOLD_": str(2 ** 62)}
#: For a measurement that does less than fisher_ref, the fisher_ref measurement doing the
#: same work: ``ratio_like[name] = median(LIKE_FOR_LIKE[name]) / median(name)``.
LIKE_FOR_LIKE = {"torch_peer": "fisher_ref_fisher"}
NUMPY_SIDES = (REFERENCE, "fisher_ref_fisher")


def measure_fisher_ref(task):
    """``exact(task)`` — the numpy engine, CPU float64, with every per-state array formed
    (as the torch engine stores them)."""
    from fisher_ref.parallel.run import exact
    return lambda: exact(task, progress=False, workers=1).gathered()


def measure_fisher_only(task):
    """``exact(task, quantities="fisher")`` on the policy stream with its per-state token
    Fisher formed: the peer's work and output. The peer reads no sampler, so neither does
    this side: an off-policy task is timed without its sampler."""
    from fisher_ref.parallel.run import exact
    task = task.with_(sampler=None) if task.sampler is not None else task
    return lambda: exact(task, progress=False, quantities="fisher", workers=1).states["token_fisher"]


def _measure_torch(device):
    def make(task):
        import torch
        from fisher_ref.torch.exact import torch_exact

        def call():
            out = torch_exact(task, device=device, dtype="float64")
            if device == "cuda":
                torch.cuda.synchronize()
            return out
        return call
    make.__doc__ = f"``torch_exact(task)`` on {device} in float64 (the same quantities)."
    return make


def _load_peer():
    spec = importlib.util.spec_from_file_location("fisher_ref_torch_peer", PEER_SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure_peer(task):
    """``peer_exact(task JSON)`` of ``scripts/torch_peer.py`` (F, E[h], token Fisher only)."""
    peer = _load_peer()
    spec = dict(task.to_json(), theta=task.theta.tolist())
    return lambda: peer.peer_exact(spec)


MEASUREMENTS = {
    REFERENCE: measure_fisher_ref,
    "torch_cpu_float64": _measure_torch("cpu"),
    "torch_cuda_float64": _measure_torch("cuda"),
    "torch_peer": measure_peer,
    "fisher_ref_fisher": measure_fisher_only,
}


def peer_available(task=None):
    """Whether the optional peer row applies: the script exists and the model is the MLP."""
    arch = None if task is None else getattr(task.model, "name", None)
    return PEER_SCRIPT.is_file() and arch in (None, "mlp_window")


def measurements(device=None, task=None, peer=True):
    """Names to run: fisher_ref, torch on the CPU, torch on CUDA when ``device`` is
    ``"cuda"`` or (``device=None``) when CUDA is present, and the peer when available
    (with ``fisher_ref_fisher``, its like-for-like side)."""
    import torch
    names = [REFERENCE, "torch_cpu_float64"]
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    if device == "cuda" or (device is None and torch.cuda.is_available()):
        names.append("torch_cuda_float64")
    if peer and peer_available(task):
        names += ["torch_peer", LIKE_FOR_LIKE["torch_peer"]]
    return names


def time_call(fn):
    """Wall time of one call of ``fn`` in seconds (``time.perf_counter``)."""
    return _timed_call(fn)[0]


def _kernel_counts():
    """``(minor page faults, system seconds)`` of this process so far; ``None`` without
    ``getrusage``."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_stime


def _timed_call(fn):
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
            conn.send(("time", _timed_call(fn)))
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


class _Process:
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


class _InProcess:
    """A measurement timed in this process (threads pinned by the caller)."""

    def __init__(self, name, task):
        self.fn = MEASUREMENTS[name](task)
        self.fn()  # warm-up

    def __call__(self):
        return _timed_call(self.fn)

    def finish(self):
        return dict(thread_report(), max_rss_bytes=None,
                    malloc={k: os.environ.get(k) for k in KEEP_MEMORY})

    def close(self):
        pass


@contextlib.contextmanager
def _pinned_here(threads):
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


def _check_keep_memory(keep_memory, isolate):
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


def _check_args(repeats, threads, names):
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 0):
        raise ValueError(f"threads must be a non-negative integer (0: do not pin), "
                         f"got {threads!r}")
    unknown = [n for n in names if n not in MEASUREMENTS]
    if unknown:
        raise ValueError(f"unknown measurements {unknown}; known: {sorted(MEASUREMENTS)}")


def bench(task, repeats=DEFAULT_REPEATS, names=None, threads=DEFAULT_THREADS, isolate=None,
          keep_memory=False):
    """Time the measurements side by side, interleaved, ``repeats`` rounds.

    Args:
        task: a :class:`fisher_ref.tasks.Task` whose model has a torch adapter.
        repeats: timed runs of each measurement (after one warm-up run).
        names: measurement names (default :func:`measurements`).
        threads: thread count of every side (0: leave the settings as they are).
        isolate: one process per measurement (default: when the task can be pickled).
        keep_memory: start each measurement's process with :data:`KEEP_MEMORY`, so that
            freed memory is kept and reused from run to run (glibc only, and one process
            per measurement: module docstring).

    Returns:
        dict: ``task``, ``repeats``, ``n_states``, ``n_responses``, ``num_params``,
        ``threads``, ``isolated``, ``times`` {name: [s, ...]}, ``median``, ``min``,
        ``ratio`` and ``ratio_min`` {name: fisher_ref / name}, ``ratio_like`` and
        ``ratio_like_min`` {name: LIKE_FOR_LIKE[name] / name}, ``loadavg`` (1, 5, 15-minute
        load before each round and at the end), ``env`` {name: threads, peak RSS and the
        malloc variables its process saw}, ``freed_memory_reused`` (the allocator probe),
        ``work`` {name: what it computes}, ``keep_memory``, ``kernel`` {name:
        {"page_faults": [...], "seconds": [...]}} per round (``None`` entries where the
        system does not count them).

    Raises:
        ValueError: a bad argument (named).
        fisher_ref.perf.memory.MemoryConditionError: the allocator does not follow the
            memory condition asked for.
        MeasurementFailed: a measurement's process raised or ended without an answer.
    """
    from fisher_ref.engine.plan import estimate_cost
    names = measurements(task=task) if names is None else list(names)
    _check_args(repeats, threads, names)
    _check_keep_memory(keep_memory, isolate)
    try:
        task_bytes = pickle.dumps(task)
    except Exception as exc:
        if isolate or keep_memory:
            raise ValueError(f"{'isolate' if isolate else 'keep_memory'}=True needs a task "
                             f"that can be pickled: {exc}") from None
        task_bytes, isolate = None, False
    isolate = True if isolate is None else isolate
    # what the sides' allocator does with freed memory, probed in a process started as
    # theirs are (a probe in a side's own process would raise its peak RSS); in-process,
    # as this one started (glibc read its settings then, whatever os.environ says now)
    env = condition_env(keep_memory, threads) if isolate else startup_environ()
    reused = probe_process(env)
    kept_here = None if isolate else kept_in_process()  # keep_freed_memory() ran here
    check_memory_condition(keep_memory, reused, "bench" + ("" if isolate else " in-process"),
                           env, kept_here)
    runs, times, loadavg = {}, {n: [] for n in names}, []
    kernel = {n: {"page_faults": [], "seconds": []} for n in names}
    with contextlib.ExitStack() as stack:
        if not isolate:
            stack.enter_context(_pinned_here(threads))
        try:
            for n in names:
                runs[n] = _Process(n, task_bytes, threads, keep_memory) if isolate else \
                    _InProcess(n, task)
            for _ in range(repeats):
                loadavg.append(list(os.getloadavg()))
                for n in names:
                    wall, faults, seconds = runs[n]()
                    times[n].append(wall)
                    kernel[n]["page_faults"].append(faults)
                    kernel[n]["seconds"].append(seconds)
            loadavg.append(list(os.getloadavg()))
            env = {n: r.finish() for n, r in runs.items()}
        finally:
            for r in runs.values():
                r.close()
    median = {n: statistics.median(t) for n, t in times.items()}
    minimum = {n: min(t) for n, t in times.items()}
    # a like-for-like side is compared with what it stands in for, not with fisher_ref
    others = [n for n in names if n != REFERENCE and REFERENCE in names
              and n not in LIKE_FOR_LIKE.values()]
    like = {n: m for n, m in LIKE_FOR_LIKE.items() if n in names and m in names}
    cost = estimate_cost(task)
    return {"task": task.name, "repeats": repeats, "n_states": cost.n_states,
            "n_responses": cost.n_responses, "num_params": cost.num_params,
            "threads": threads, "isolated": bool(isolate), "times": times, "median": median,
            "min": minimum, "ratio": {n: median[REFERENCE] / median[n] for n in others},
            "ratio_min": {n: minimum[REFERENCE] / minimum[n] for n in others},
            "ratio_like": {n: median[m] / median[n] for n, m in like.items()},
            "ratio_like_min": {n: minimum[m] / minimum[n] for n, m in like.items()},
            "loadavg": loadavg, "env": env, "work": {n: WORK[n] for n in names},
            "machine": _machine(), "keep_memory": keep_memory, "kernel": kernel,
            "freed_memory_reused": reused}


def _machine():
    from fisher_ref.perf.scaling import machine
    return machine()


def format_table(res):
    """The timings as a text table, the ratio lines and the thread/load record."""
    loads = [l[0] for l in res["loadavg"]]
    lines = [f"fisher_ref bench: task {res['task']!r} ({res['n_states']:,} states, "
             f"{res['n_responses']:,} responses, P={res['num_params']:,}), "
             f"{res['repeats']} interleaved repeats, threads={res['threads'] or 'unpinned'}, "
             f"{'one process per measurement' if res['isolated'] else 'in-process'}; "
             f"{res['machine']}; 1-min load average {min(loads):.2f}-{max(loads):.2f}; "
             f"memory: {'freed memory kept (KEEP_MEMORY)' if res.get('keep_memory') else 'the C library default'}",
             f"{'measurement':<20} {'median s':>9} {'min s':>9} {'ref/this':>9} "
             f"{'ref/this(min)':>13} {'torch thr':>9} {'peak RSS MiB':>12} "
             f"{'faults/run':>10} {'kernel s':>8}", "-" * 107]
    for n, med in res["median"].items():
        e = res["env"].get(n, {})
        r, rm = res["ratio"].get(n), res["ratio_min"].get(n)
        rss = e.get("max_rss_bytes")
        k = res.get("kernel", {}).get(n, {})
        faults = [x for x in k.get("page_faults", []) if x is not None]
        secs = [x for x in k.get("seconds", []) if x is not None]
        lines.append(f"{n:<20} {med:>9.4f} {res['min'][n]:>9.4f} "
                     f"{('%.3f' % r) if r is not None else '-':>9} "
                     f"{('%.3f' % rm) if rm is not None else '-':>13} "
                     f"{str(e.get('torch_threads')):>9} "
                     f"{('%.0f' % (rss / 2 ** 20)) if rss else '-':>12} "
                     f"{('%.0f' % statistics.median(faults)) if faults else '-':>10} "
                     f"{('%.3f' % statistics.median(secs)) if secs else '-':>8}")
    for n, r in res["ratio"].items():
        lines.append(f"ratio fisher_ref/{n} = {r:.3f} (medians; "
                     f"{'fisher_ref faster' if r < 1 else 'fisher_ref slower'})")
    for n, r in res.get("ratio_like", {}).items():
        m = LIKE_FOR_LIKE[n]
        lines.append(f"ratio {m}/{n} = {r:.3f} (medians; minima {res['ratio_like_min'][n]:.3f};"
                     f" the same work; {'fisher_ref faster' if r < 1 else 'fisher_ref slower'})")
    if "freed_memory_reused" in res:
        lines.append(f"allocator probe: a freed 64 MiB block "
                     f"{MEMORY_LABELS[res['freed_memory_reused']]} in a process started as "
                     + ("the sides are" if res["isolated"] else "this one was"))
    for n, e in res["env"].items():
        lines.append(f"{n}: BLAS threads ({e['blas_source']}) {e['blas']}; computes "
                     f"{res['work'][n]}")
    return "\n".join(lines)


