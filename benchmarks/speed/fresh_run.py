"""The first exact() run of a fresh process, with glibc's default malloc settings and with
freed memory kept (:data:`fisher_ref.perf.bench.KEEP_MEMORY`), by turns.

    python benchmarks/speed/fresh_run.py [--tasks medium v16] [--repeats 5] [--peer] [--json FILE]

Each repeat starts one new process per side and condition (one BLAS thread, one torch
thread; a process started alike first checks that the allocator keeps, or hands back, a
freed block as the condition says); the process runs the tiny default config first
(imports and code paths warm, little memory touched), then times one ``exact(task, workers=1)`` (with ``--peer``, also
one ``peer_exact`` of ``benchmarks/speed/peer.py``, in processes of its own) and reports its wall, user and kernel seconds, minor page faults
and peak RSS. Prints the medians per task and condition; ``--json FILE`` writes them with
the commit and the machine.
"""
import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import made_by  # noqa: E402
from fisher_ref.perf.bench import KEEP_MEMORY, condition_env  # noqa: E402
from fisher_ref.perf.memory import (MemoryConditionError, check_memory_condition,  # noqa: E402
                                    probe_process)
from fisher_ref.perf.scaling import git_commit, machine  # noqa: E402

CHILD = r"""
import os, sys, time, json, resource
side, name, root = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, root)
from fisher_ref import load_config
from fisher_ref.parallel.run import exact
from fisher_ref.perf.scaling import load_scale_config
if side == "peer":
    import importlib.util
    import torch
    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("peer", root + "/benchmarks/speed/peer.py")
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    read = lambda path: json.loads(open(path).read())
    peer.peer_exact(read(root + "/fisher_ref/configs/default.json"))  # warm: a tiny task
    task = read(root + "/fisher_ref/configs/scale/" + name + ".json")
    run = lambda: peer.peer_exact(task)
else:
    exact(load_config("default"), progress=False)  # warm: a tiny task
    task = load_scale_config(name)
    run = lambda: exact(task, progress=False, workers=1)
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
run()
wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall": wall, "user": r1.ru_utime - r0.ru_utime,
                  "kernel": r1.ru_stime - r0.ru_stime, "faults": r1.ru_minflt - r0.ru_minflt,
                  "max_rss_mib": r1.ru_maxrss / 1024}))
"""


def _check_condition(keep):
    """A process started as the condition's are must keep (or hand back) a freed block as
    the condition says (probed in a process of its own: in a timed one, the probe's freed
    block would be memory the run reuses); returns the probe's answer."""
    env = condition_env(keep)
    reused = probe_process(env)
    try:
        check_memory_condition(keep, reused, f"fresh_run's {'kept' if keep else 'default'} "
                                             "condition", env)
    except MemoryConditionError as exc:
        raise SystemExit(str(exc)) from None
    return reused


def _one(side, task, keep):
    """One fresh process's first run; a failure shows the process's own message."""
    out = subprocess.run([sys.executable, "-c", CHILD, side, task, str(ROOT)],
                         env=condition_env(keep), capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{side} on {task} failed (exit {out.returncode}):\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=["medium", "v16"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--peer", action="store_true",
                    help="also the torch peer (benchmarks/speed/peer.py), its first run likewise")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be a positive integer, got {args.repeats}")
    if args.json and Path(args.json).exists():
        ap.error(f"--json {args.json} exists; it is not overwritten")
    commit = git_commit(ROOT)  # the code the processes run, whatever changes meanwhile
    print(f"machine: {machine()}; commit {commit}")
    probes = {"default" if not keep else "kept": _check_condition(keep) for keep in (False, True)}
    rows = []
    sides = ["exact"] + (["peer"] if args.peer else [])
    for task in args.tasks:
        cases = [(side, cond) for side in sides for cond in ("default", "kept")]
        runs = {c: [] for c in cases}
        for i in range(args.repeats):  # by turns, the order alternating
            for c in (cases if i % 2 == 0 else cases[::-1]):
                runs[c].append(_one(c[0], task, c[1] == "kept"))
        for (side, cond), rs in runs.items():
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            rows.append({"task": task, "side": side, "memory": cond, "repeats": len(rs), **med})
            print(f"{task} {side} {cond:>7}: wall {med['wall']:.3f} s (user {med['user']:.3f}, kernel "
                  f"{med['kernel']:.3f}), {med['faults']:,.0f} page faults, peak RSS "
                  f"{med['max_rss_mib']:.0f} MiB (medians of {len(rs)})", flush=True)
    if args.json:
        with open(args.json, "x") as fh:  # checked above: never over a record
            fh.write(json.dumps(
                {"command": made_by(argv, __file__), "commit": commit, "machine": machine(),
                 "keep_memory": KEEP_MEMORY,
                 "freed_memory_reused": probes, "rows": rows,
                 "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                     timespec="seconds")}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
