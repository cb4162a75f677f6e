"""What fresh memory costs ``exact``: one thread, a scale task (v16 by default), timed
alone and right after the independent torch peer (``benchmarks/speed/peer.py``) ran in the
same process, with the minor page faults and system time of one run; then the same in a
process whose glibc keeps freed memory (``fisher_ref.perf.bench.KEEP_MEMORY``), so that
later runs reuse pages instead of faulting in new ones; then in a process started with
glibc's defaults that calls ``fisher_ref.engine.keep_memory.keep_freed_memory()`` first. The default and kept
starts are first checked with an allocator probe in a process started alike; the call, by
what it returns. With ``--rounds R``
the six processes run by turns, ``R`` times over, so that the machine's load drifts hit
every condition alike; the medians are over every run of every round.

Usage: python benchmarks/memory/alloc_effects.py [--config v16] [--repeats 5] [--rounds 1]
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import MADE_BY, made_by  # noqa: E402
from fisher_ref.perf.bench import condition_env  # noqa: E402  the harness's conditions
from fisher_ref.perf.memory import (MemoryConditionError, check_memory_condition,  # noqa: E402
                                    probe_process)


def _child(config, repeats, after_peer, call):
    import resource

    import numpy as np
    import torch
    torch.set_num_threads(1)
    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks" / "speed")]  # the peer
    from fisher_ref import exact, task_from_json
    from fisher_ref.engine.keep_memory import keep_freed_memory
    from peer import peer_exact
    if call and not keep_freed_memory():
        raise SystemExit("keep_freed_memory() returned False: this C library has no mallopt "
                         "or refused a setting")
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
    return {"times": times, "faults": faults, "sys_s": sys_s}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="v16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the six processes by turns this many times (default 1)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for name in ("repeats", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.child:
        print(json.dumps(_child(args.config, args.repeats, args.child[1] == "peer",
                                args.child[0] == "call")))
        return 0
    import numpy as np

    from fisher_ref.perf.scaling import git_commit, machine
    print(MADE_BY + made_by(argv, __file__))
    print(f"commit {git_commit()}; {machine()}")
    print(f"{args.config}; {args.rounds} round(s) of {args.repeats} runs in a new process per "
          "condition, the conditions by turns; one thread")
    conditions = [(m, mode) for m in ("default", "keep", "call") for mode in ("alone", "peer")]
    for malloc in ("default", "keep"):  # "call" starts in the default
        env = condition_env(malloc == "keep")
        try:
            check_memory_condition(malloc == "keep", probe_process(env), "alloc_effects.py",
                                   env)
        except MemoryConditionError as exc:
            sys.exit(str(exc))
    runs = {c: {"times": [], "faults": [], "sys_s": []} for c in conditions}
    for _ in range(args.rounds):
        for malloc, mode in conditions:
            out = subprocess.run([sys.executable, __file__, "--config", args.config,
                                  "--repeats", str(args.repeats), "--child", malloc, mode],
                                 env=condition_env(malloc == "keep"), capture_output=True,
                                 text=True)
            if out.returncode:
                sys.exit(f"the {malloc}/{mode} process failed:\n{out.stderr}")
            for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items():
                runs[malloc, mode][k] += v
    print("\n| started in | calls keep_freed_memory() | exact runs | median (s) | best (s) "
          "| minor faults, median | system time, median (s) |\n|---|---|---|---|---|---|---|")
    for (malloc, mode), r in runs.items():
        print(f"| {'kept memory' if malloc == 'keep' else 'glibc default'} | "
              f"{'yes' if malloc == 'call' else 'no'} | "
              f"{'after the peer' if mode == 'peer' else 'alone'} | "
              f"{np.median(r['times']):.3f} | {min(r['times']):.3f} | "
              f"{int(np.median(r['faults'])):,} | {np.median(r['sys_s']):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
