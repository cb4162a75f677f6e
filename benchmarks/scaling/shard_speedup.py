"""exact(task, workers=N) against workers=1 on one task, side by side in one run.

Usage: python benchmarks/scaling/shard_speedup.py [--config v16] [--workers 2] [--repeats 5]

The first workers=N call starts the pool (spawned processes, one BLAS thread each):
it is timed and reported apart ("cold"). Then the two settings alternate, each run
timed by wall clock; the speed-up is the ratio of the medians (and of the best
times). The parent process is held to one BLAS thread too (threadpoolctl, or the
variables before numpy is imported), so both sides use one thread per process.
Prints the machine, the commit and whether the results agree at 1e-12; inside the
``workers=N`` runs, the medians of the calling process's shard, each worker's shard and
the wait and hand-over after the caller's is done (``fisher_ref.parallel.workers.last_run_times``);
the same split in CPU seconds; the CPU seconds of a shard of one parameter (the first and
the last, ``param_shard=(i, P)``): an upper bound on the work every shard repeats (the
walk, whatever the shard's width), since its blocks' overhead is split among shards of
more parameters; how many windows'
arrays the whole run and each subtree shard compute;
last, the machine's own ceiling: a fixed kernel that reads no fisher_ref code, alone in
this process and as N copies side by side (N - 1 in worker processes, one here, as the
shards run) (on a machine whose cores are shared with other load, N copies
of anything run slower than one).
"""
import argparse
import os
import platform
import sys
import time

for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ[_k] = "1"  # before numpy is imported

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's package
from benchmarks.common import MADE_BY, made_by  # noqa: E402
from fisher_ref import load_config  # noqa: E402
from fisher_ref.parallel.run import exact  # noqa: E402
from fisher_ref.parallel.shards import merge  # noqa: E402
from fisher_ref.parallel.workers import available_cores, last_run_times, shutdown  # noqa: E402
from fisher_ref.perf.scaling import git_commit, load_scale_config  # noqa: E402
from fisher_ref.parallel import exact_param_shard  # noqa: E402


def _load(name):
    try:
        return load_scale_config(name)
    except (ValueError, FileNotFoundError, KeyError):
        return load_config(name)


def _cpu(fn):
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def _windows(task, kw):
    """Distinct windows whose per-window arrays one run computes (counted at the cache)."""
    from fisher_ref.engine import window_cache
    seen, compute = [0], window_cache.WindowCache._compute

    def counting(self, Wu, lo):
        seen[0] += len(Wu)
        return compute(self, Wu, lo)
    window_cache.WindowCache._compute = counting
    try:
        exact(task, progress=False, workers=1, **kw)
    finally:
        window_cache.WindowCache._compute = compute
    return seen[0]


def _kernel(_=None):
    """A fixed piece of CPU work that reads no fisher_ref code: small matrix products and
    elementwise passes over arrays a core's cache holds, in a Python loop. Returns its
    wall time."""
    rng = np.random.default_rng(0)
    a, b = rng.random((48, 48)), rng.random((48, 48))
    t0 = time.perf_counter()
    for _ in range(6000):
        c = a @ b
        a = np.tanh(c * 1e-3)
    return time.perf_counter() - t0


def _machine_pairs(repeats, n):
    """The machine's own ceiling, laid out as ``exact(task, workers=n)`` lays out its
    shards: the kernel alone in this process (as ``workers=1`` runs), and ``n`` copies side
    by side, ``n - 1`` in worker processes and one in this process meanwhile (the pool's
    hand-offs included), alternating; ``(solo, together)`` medians, timed from this
    process. With ``n`` free cores the copies together take as long as one alone."""
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(n - 1) as pool:
        pool.map(_kernel, range(n - 1), chunksize=1)  # warm the workers
        _kernel()  # and this process
        solo, together = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            _kernel()
            solo.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            others = pool.map_async(_kernel, range(n - 1), chunksize=1)
            _kernel()
            others.get()
            together.append(time.perf_counter() - t0)
    return float(np.median(solo)), float(np.median(together))


def _timed(task, workers):
    t0 = time.perf_counter()
    r = exact(task, progress=False, workers=workers)
    return time.perf_counter() - t0, r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="v16")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    if args.workers < 2:
        ap.error(f"--workers must be at least 2, got {args.workers}")
    if args.repeats < 1:
        ap.error(f"--repeats must be a positive integer, got {args.repeats}")
    task = _load(args.config)
    print(MADE_BY + made_by(argv, __file__))
    print(f"machine: {platform.machine()} {platform.processor() or ''}, "
          f"{available_cores()} cores available; python {platform.python_version()}, "
          f"numpy {np.__version__}; commit {git_commit()}")
    print(f"load average before: {os.getloadavg()[0]:.2f} (other processes on the machine)")
    print(f"task: {args.config}: {exact.__module__}, P={task.model.num_params:,}, "
          f"V={task.model.vocab_size}, T={task.max_len}")
    cold, par = _timed(task, args.workers)
    print(f"workers={args.workers} cold (pool start included): {cold:.3f} s")
    _, one = _timed(task, 1)  # warm the single-process caches too
    times, sides = {1: [], args.workers: []}, []
    for _ in range(args.repeats):
        for w in (1, args.workers):
            times[w].append(_timed(task, w)[0])
            if w > 1:
                sides.append(last_run_times())
    err = float(np.max(np.abs(par.sequence_fisher - one.sequence_fisher))
                / np.max(np.abs(one.sequence_fisher)))
    med = {w: float(np.median(t)) for w, t in times.items()}
    best = {w: min(t) for w, t in times.items()}
    print(f"workers=1: median {med[1]:.3f} s, best {best[1]:.3f} s  ({args.repeats} runs)")
    print(f"workers={args.workers}: median {med[args.workers]:.3f} s, "
          f"best {best[args.workers]:.3f} s")
    print(f"speed-up (median): {med[1] / med[args.workers]:.2f}x; "
          f"(best): {best[1] / best[args.workers]:.2f}x; "
          f"sequence_fisher agrees to {err:.1e} relative")
    # Inside the workers=N runs: the calling process's shard, the workers' (each timed in
    # its process), and the wait for them with the hand-over after the caller's is done
    here = sides[0]["here"][0]
    work = {i: float(np.median([s["workers"][i] for s in sides])) for i in sides[0]["workers"]}
    print(f"inside the workers={args.workers} runs (medians): shard {here} in this process "
          f"{np.median([s['here'][1] for s in sides]):.3f} s; in workers: "
          + ", ".join(f"shard {i} {v:.3f} s" for i, v in work.items())
          + f"; after this process's shard, waiting and receiving "
          f"{np.median([s['after_here'] for s in sides]):.3f} s")
    # The same split by CPU time, which other processes on the machine do not inflate:
    # each shard run here in turn, the whole run against the slowest shard plus the merge.
    cpu_one = min(_cpu(lambda: exact(task, progress=False, workers=1)) for _ in range(3))
    # the shards workers=N runs: parameter shards, keeping what the whole run keeps
    shards = [min(_cpu(lambda i=i: exact_param_shard(task, (i, args.workers)))
                  for _ in range(3)) for i in range(args.workers)]
    parts = [exact_param_shard(task, (i, args.workers))
             for i in range(args.workers)]
    cpu_merge = _cpu(lambda: merge(task, parts))
    print(f"CPU seconds: whole run {cpu_one:.3f}; shards {', '.join(f'{x:.3f}' for x in shards)};"
          f" merge {cpu_merge:.3f}; whole / (slowest shard + merge) = "
          f"{cpu_one / (max(shards) + cpu_merge):.2f}x")
    # at most what every parameter shard repeats: the walk, with a single parameter (the
    # first shard's has no records; the last's keeps them and forms the autodiff gradient)
    P = task.model.num_params
    single = [min(_cpu(lambda i=i: exact_param_shard(task, (i, P)))
                  for _ in range(3)) for i in (0, P - 1)]
    print(f"CPU seconds of a shard of one parameter (at most what every shard repeats): "
          f"first {single[0]:.3f}, last {single[1]:.3f} (with the records); the whole run "
          f"{cpu_one:.3f}, the shards together {sum(shards):.3f}")
    print(f"windows whose arrays are computed: whole run {_windows(task, {})}; subtree "
          f"shards (shard=(i, n)) " + ", ".join(str(_windows(task, {"shard": (i, args.workers)}))
                                                for i in range(args.workers)) +
          "; parameter shards: every window, each for its columns only")
    shutdown()
    n = args.workers
    solo, together = _machine_pairs(args.repeats, n)
    print(f"the machine itself: a fixed kernel of numpy products took {solo:.3f} s alone and "
          f"{together:.3f} s as {n} copies side by side (medians of {args.repeats}, timed from "
          f"this process): {n} copies of such work ran {n * solo / together:.2f}x as fast as "
          "one after another (an indication of the machine's load, not a bound)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
