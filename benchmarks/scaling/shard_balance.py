"""Where two parameter shards of an MLP run are even: the measurements behind
``fisher_ref.engine.plan.WORK`` and ``LAST_SHARE`` (records:
docs/bench/shards/balance_*.txt).

Usage: python benchmarks/scaling/shard_balance.py [--config v16] [--units 90 98 105 112 120]
       [--repeats 15]

For each cut ``u`` between hidden units (shard 0: ``E`` and units ``0..u``; shard 1: units
``u..H`` and ``W2``'s family, ``fisher_ref.engine.mlp_columns.UnitColumns``), prints the
median wall time of

- both shards as a shard before the last (no records), one after the other in a fresh
  spawned process in glibc's default memory: the cost of their parameters alone, which
  ``WORK`` models;
- shard 1 as the caller of ``exact(task, workers=2)`` runs it: the last shard (it forms the
  records: per-state and per-response rows, the autodiff gradient), in this process, in
  glibc's default memory;
- shard 0 as ``exact(task, workers=2)`` runs it: in a spawned worker process set up as the
  pool's are (one BLAS thread, freed memory kept);

then the whole run (``workers=1``) in this process, and the cut the planner takes for two
shards (``fisher_ref.engine.factored.shard_columns``). One process runs at a time: no
contention between them. Prints the machine and the commit.
"""
import argparse
import os
import platform
import sys
import time

for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ[_k] = "1"  # before numpy is imported

import multiprocessing  # noqa: E402

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's package
import fisher_ref.engine.fast as fast  # noqa: E402
from benchmarks.common import MADE_BY, made_by  # noqa: E402
from fisher_ref.engine.factored import shard_columns  # noqa: E402
from fisher_ref.parallel.worker_process import init_worker  # noqa: E402
from fisher_ref.engine.mlp_columns import mlp_blocks, order_columns  # noqa: E402
from fisher_ref.perf.scaling import git_commit, load_scale_config  # noqa: E402
from fisher_ref.parallel import exact_param_shard  # noqa: E402


def _cut(task, u):
    """The two shards' parameters for a cut after hidden unit ``u``."""
    spec = task.model.spec
    blocks = {name: (start, stop) for name, start, stop in mlp_blocks(spec)}
    nE, P = blocks["E"][1], blocks["b2"][1]
    end = nE + spec.hidden + P - blocks["W2"][0]
    return [order_columns(spec, blocks, 0, nE + u), order_columns(spec, blocks, nE + u, end)]


def _time_shard(task, cols, i, repeats):
    """Median wall seconds of ``exact(task, param_shard=(i, 2))`` over the parameters
    ``cols`` (the engine's own run, its shards' parameters given)."""
    planned = fast.shard_columns
    fast.shard_columns = lambda t, n: cols
    try:
        exact_param_shard(task, (i, 2))  # warm
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            exact_param_shard(task, (i, 2))
            times.append(time.perf_counter() - t0)
    finally:
        fast.shard_columns = planned
    return float(np.median(times))


def _as_worker(config, units, repeats):
    """In a spawned process set up as a pool's worker: shard 0's time at each cut."""
    task = load_scale_config(config)
    return [_time_shard(task, _cut(task, u), 0, repeats) for u in units]


def _alone(config, units, repeats):
    """In a fresh process: each shard's time at each cut as a shard before the last."""
    task = load_scale_config(config)
    return [[_time_shard(task, [c, c], 0, repeats) for c in _cut(task, u)] for u in units]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="v16")
    ap.add_argument("--units", type=int, nargs="+", default=[90, 98, 105, 112, 120])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    task = load_scale_config(args.config)
    H = task.model.spec.hidden
    if not all(0 < u < H for u in args.units) or args.repeats < 1:
        ap.error(f"--units must lie in 1..{H - 1} and --repeats be positive")
    print(MADE_BY + made_by(argv, __file__))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; python "
          f"{platform.python_version()}, numpy {np.__version__}; commit {git_commit()}")
    print(f"task: {args.config}, P={task.model.num_params:,}, hidden units {H}; medians of "
          f"{args.repeats}, wall seconds, one process at a time")
    caller = [_time_shard(task, _cut(task, u), 1, args.repeats) for u in args.units]
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(1, maxtasksperchild=1) as pool:
        alone = pool.apply(_alone, (args.config, args.units, args.repeats))
    with spawn.Pool(1, initializer=init_worker) as pool:
        worker = pool.apply(_as_worker, (args.config, args.units, args.repeats))
    print(f"{'cut':>5} {'shard 0 alone':>14} {'shard 1 alone':>14} {'shard 0 worker':>15} "
          f"{'shard 1 caller':>15}")
    for u, (a0, a1), w0, c1 in zip(args.units, alone, worker, caller):
        print(f"{u:>5} {a0:>14.4f} {a1:>14.4f} {w0:>15.4f} {c1:>15.4f}")
    whole = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        fast.exact(task, progress=False)
        whole.append(time.perf_counter() - t0)
    print(f"whole run (workers=1): {np.median(whole):.4f} s")
    print(f"the planner's two shards: {shard_columns(task, 2)}")


if __name__ == "__main__":
    main()
