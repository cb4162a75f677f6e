"""What fresh memory costs ``exact``: one thread, a scale task (v16 by default), timed
alone and right after the independent torch peer (``scripts/torch_peer.py``) ran in the
same process, with the minor page faults and system time of one run; then the same in a
process whose glibc keeps freed memory (``fisher_ref.perf.bench.KEEP_MEMORY``), so that
later runs reuse pages instead of faulting in new ones; then in a process started with
glibc's defaults that calls ``fisher_ref.keep_freed_memory()`` first. Each condition is
first checked with an allocator probe in a process started alike.

Usage: python scripts/alloc_effects.py [--config v16] [--repeats 5]
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fisher_ref.perf.bench import condition_env  # noqa: E402  the harness's conditions
from fisher_ref.perf.memory import (MemoryConditionError, check_memory_condition,  # noqa: E402
                                    probe_process)


def _child(config, repeats, after_peer, call):
    import resource

    import numpy as np
    import torch
    torch.set_num_threads(1)
    sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
    from fisher_ref import exact, keep_freed_memory, task_from_json
    from torch_peer import peer_exact
    if call and not keep_freed_memory():
        raise SystemExit("keep_freed_memory() did not take: this C library is not glibc")
    spec = json.loads((ROOT / "fisher_ref/configs/scale" / f"{config}.json").read_text())

    def run():
        return exact(task_from_json(spec), progress=False, workers=1).states["token_fisher"]
    run()
    times, faults, sys_s = [], [], []
    for _ in range(repeats):
        if after_peer:
            peer_exact(spec)
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        run()
        t, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        times.append(t)
        faults.append(r1.ru_minflt - r0.ru_minflt)
        sys_s.append(r1.ru_stime - r0.ru_stime)
    return {"median_s": float(np.median(times)), "min_s": min(times),
            "minor_faults": int(np.median(faults)), "sys_s": float(np.median(sys_s))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="v16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be a positive integer, got {args.repeats}")
    if args.child:
        print(json.dumps(_child(args.config, args.repeats, args.child[1] == "peer",
                                args.child[0] == "call")))
        return 0
    from fisher_ref.perf.scaling import git_commit, machine
    print(f"commit {git_commit()}; {machine()}")
    print(f"{args.config}; {args.repeats} runs each; one thread")
    for malloc in ("default", "keep", "call"):
        for mode in ("alone", "peer"):
            env = condition_env(malloc == "keep")
            try:
                check_memory_condition(malloc == "keep", probe_process(env),
                                       "alloc_effects.py", env)
            except MemoryConditionError as exc:
                sys.exit(str(exc))
            out = subprocess.run([sys.executable, __file__, "--config", args.config,
                                  "--repeats", str(args.repeats), "--child", malloc, mode],
                                 env=env, capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"the {malloc}/{mode} process failed:\n{out.stderr}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            label = "keep_freed_memory()" if malloc == "call" else f"glibc {malloc}"
            print(f"{label:19s} exact {'after the peer' if mode == 'peer' else 'alone':14s}: "
                  f"median {r['median_s']:.3f} s (best {r['min_s']:.3f}); minor faults "
                  f"{r['minor_faults']:,}; system time {r['sys_s']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
