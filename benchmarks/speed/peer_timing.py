r"""fisher_ref's ``exact`` against the independent torch peer (``benchmarks/speed/peer.py``),
timed in one process by turns (both sides pinned to one thread, interleaved repeats, wall-clock
medians and minima, the ratio of wall and of process-CPU medians, thread counts
and the load average; ``exact`` forms its per-state token Fisher, the peer's one
per-state output, and keeps its other per-state arrays per window; the peer runs both
ways, ``peer`` expanded and ``peer per h`` forming each response's ``h``). ``exact`` runs
twice: with every quantity (the default), and with ``quantities="fisher"``, which
computes what the peer computes (and E[h^2] of every stream, the uniform-reference
Fisher and E[xi|s] per state besides)::

    python benchmarks/speed/peer_timing.py [--repeats 5] [--tasks medium v16] [--keep-memory]
                                         [--sub-elements N] [--json FILE]

Each row is followed by what each side cost the kernel: its minor page faults and system
seconds per run (medians). With glibc's default settings a large freed block goes back to
the system, so every run touches fresh pages again; a page fault costs microseconds on a
virtual machine, and a side that allocates large arrays pays for it on every run.
``--keep-memory`` runs the script again with ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` set (``fisher_ref.perf.bench.KEEP_MEMORY``; glibc reads them at
start, other C libraries ignore them), so that freed memory is kept and reused between
runs: the two conditions bracket a run in a fresh process (every page fresh) and a run in
a process that has run before.

``--json FILE`` also writes the record (never over an existing file), with the command
that made it (``command``).
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # pin every thread pool before numpy and torch load
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # the package; the peer

from peer import peer_exact, peer_theta  # noqa: E402


def threads_line():
    """This process's torch threads and BLAS thread variables, in one line."""
    blas = {v: os.environ.get(v, "unset") for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                   "MKL_NUM_THREADS")}
    return f"torch threads {torch.get_num_threads()}, " + ", ".join(
        f"{k}={v}" for k, v in blas.items())


def kept_at_start(keep):
    """Whether this process started with every variable of ``keep`` set to its value."""
    return all(os.environ.get(k) == v for k, v in keep.items())


def memory_condition(keep):
    """The memory condition this process started in, in words."""
    return ("freed memory kept and reused between runs (" +
            ", ".join(f"{k}={v}" for k, v in keep.items()) + ")") if kept_at_start(keep) else \
        "the C library's default (glibc hands large freed blocks back to the system)"


def main(argv=None):
    import argparse
    import json
    import time
    from pathlib import Path

    ap = argparse.ArgumentParser(description="fisher_ref exact against the torch peer")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tasks", nargs="+", default=["medium", "v16"])
    ap.add_argument("--keep-memory", action="store_true",
                    help="rerun with glibc told to keep freed memory (module docstring)")
    ap.add_argument("--sub-elements", type=int, default=None, metavar="N",
                    help="exact's Budgets.sub_elements (default: the engine's own, "
                    "which depends on the memory condition)")
    ap.add_argument("--json", default=None, metavar="FILE",
                    help="also write every timing, the medians and ratios, the commit, the "
                         "machine and the memory condition to FILE (not overwritten)")
    args = ap.parse_args(argv)
    if args.json and Path(args.json).exists():
        ap.error(f"--json {args.json} exists; it is not overwritten")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        ap.error(f"--json {args.json}: the directory does not exist")
    if args.repeats < 1:
        ap.error(f"--repeats must be a positive integer, got {args.repeats}")
    if args.sub_elements is not None and args.sub_elements < 1:
        ap.error(f"--sub-elements must be a positive integer, got {args.sub_elements}")
    from fisher_ref.perf.bench import KEEP_MEMORY, condition_env  # the harness's
    if args.keep_memory and not kept_at_start(KEEP_MEMORY):
        import subprocess  # glibc reads the variables at start: run again with them set
        return subprocess.call([sys.executable, __file__] + list(sys.argv[1:] if argv is None
                                                                 else argv),
                               env=condition_env(True, threads=0))
    import resource
    from fisher_ref.perf.memory import (MEMORY_LABELS, MemoryConditionError,
                                        check_memory_condition, probe_process,
                                        startup_environ)
    reused = probe_process()  # a process started as this one was: this one's peak untouched
    try:
        check_memory_condition(kept_at_start(KEEP_MEMORY), reused, "peer_timing.py",
                               startup_environ())
    except MemoryConditionError as exc:
        sys.exit(str(exc))
    torch.set_num_threads(1)
    from fisher_ref import exact, task_from_json
    from fisher_ref.engine.plan import DEFAULT_BUDGETS, Budgets, EngineOptions
    from fisher_ref.engine.keep_memory import memory_kept
    budgets = DEFAULT_BUDGETS if args.sub_elements is None else \
        Budgets(sub_elements=args.sub_elements)
    sub = budgets.sub_block_elements(factored=True, kept=memory_kept())  # an MLP's last level
    from fisher_ref.perf.scaling import git_commit, machine
    # the code this process runs is the checkout's now, whatever changes during the runs
    from benchmarks.common import made_by
    record = {"command": made_by(argv, __file__), "commit": git_commit(ROOT), "machine": None,
              "threads": threads_line(),
              "memory": memory_condition(KEEP_MEMORY), "memory_kept": kept_at_start(KEEP_MEMORY),
              "freed_memory_reused": reused, "sub_elements": sub,
              "sub_elements_given": args.sub_elements,
              "repeats": args.repeats, "loadavg": [list(os.getloadavg())], "tasks": {}}
    print(f"threads: {threads_line()}; load average before: {os.getloadavg()}")
    print(f"memory: {memory_condition(KEEP_MEMORY)}; a freed 64 MiB block "
          f"{MEMORY_LABELS[reused]} in a process started alike; "
          f"exact's sub-block budget at the last level: {sub:,} elements"
          + (" (the engine's own in this memory)" if args.sub_elements is None else ""))
    cols = ["exact", "exact fisher", "peer", "peer per h"]
    print("| task | P | " + " | ".join(f"{c} median (min) s" for c in cols) +
          " | exact / peer, wall | exact / peer, CPU | exact fisher / peer, wall | "
          "exact fisher / peer, CPU | exact fisher / peer per h, wall |")
    print("|---|---|" + "---|" * len(cols) + "---|---|---|---|---|")
    for name in args.tasks:
        spec = json.loads((ROOT / "fisher_ref/configs/scale" / f"{name}.json").read_text())
        # the same outputs formed: the peer returns its token Fisher per state, exact
        # keeps its per-state arrays per window until read (ExactResult.gathered)
        options = EngineOptions(budgets=budgets)
        runs = {"exact": lambda: exact(task_from_json(spec), progress=False, workers=1,
                                       options=options).states["token_fisher"],
                # the peer's work: F, E[h], token Fisher sums and per-state arrays only
                "exact fisher": lambda: exact(task_from_json(spec), progress=False, workers=1,
                                              quantities="fisher",
                                              options=options).states["token_fisher"],
                "peer": lambda: peer_exact(spec),  # expanded per parent: the faster
                "peer per h": lambda: peer_exact(spec, expand=False)}  # issue 9's method
        wall, cpu = {c: [] for c in cols}, {c: [] for c in cols}
        faults, sys_s = {c: [] for c in cols}, {c: [] for c in cols}
        for c in cols:  # warm-up, not timed: imports, torch.func's first trace, allocator
            runs[c]()
        for _ in range(args.repeats):  # interleaved: each repeat runs every side once
            for c in cols:
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                t0, c0 = time.perf_counter(), time.process_time()
                runs[c]()
                wall[c].append(time.perf_counter() - t0)
                cpu[c].append(time.process_time() - c0)
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                faults[c].append(r1.ru_minflt - r0.ru_minflt)
                sys_s[c].append(r1.ru_stime - r0.ru_stime)
        med = {c: float(np.median(v)) for c, v in wall.items()}
        cmed = {c: float(np.median(v)) for c, v in cpu.items()}
        P = peer_theta(spec["model"]).size
        print(f"| {name} | {P:,} | " + " | ".join(
            f"{med[c]:.3f} ({min(wall[c]):.3f})" for c in cols) +
            f" | {med['exact'] / med['peer']:.2f} | {cmed['exact'] / cmed['peer']:.2f}"
            f" | {med['exact fisher'] / med['peer']:.2f}"
            f" | {cmed['exact fisher'] / cmed['peer']:.2f}"
            f" | {med['exact fisher'] / med['peer per h']:.2f} |", flush=True)
        print(f"  {name}, per run (medians): " + "; ".join(
            f"{c} {np.median(faults[c]):,.0f} page faults, {np.median(sys_s[c]):.3f} s in the "
            "kernel" for c in cols), flush=True)
        record["tasks"][name] = {
            "num_params": int(P), "wall": wall, "cpu": cpu, "page_faults": faults,
            "kernel_s": sys_s, "median": med,
            "ratio": {"exact / peer": med["exact"] / med["peer"],
                      "exact fisher / peer": med["exact fisher"] / med["peer"],
                      "exact / peer, CPU": cmed["exact"] / cmed["peer"],
                      "exact fisher / peer, CPU": cmed["exact fisher"] / cmed["peer"]}}
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        import datetime
        record["loadavg"].append(list(os.getloadavg()))
        record.update(machine=f"{machine()}, torch {torch.__version__}", date=datetime.datetime.now(
                          datetime.timezone.utc).isoformat(timespec="seconds"))
        with open(args.json, "x") as fh:
            json.dump(record, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    sys.exit(main())
