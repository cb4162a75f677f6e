"""What the sub-block budget of the last level (``Budgets.sub_elements``) costs ``exact``
in each memory condition: one thread, a scale task per row, each budget in a new process
started in glibc's default memory and in one started with freed memory kept
(``fisher_ref.perf.bench.KEEP_MEMORY``; each start checked first with an allocator probe in
a process started alike). A process times ``--repeats`` runs after a warm-up, with the minor
page faults and system time of each. The processes run by turns, ``--rounds`` times over,
and the medians are over every run of every round. With ``--instructions``, valgrind's
cachegrind also counts the instructions of one run per task and budget (the count for
three runs less that for one, halved), a number the machine's load does not move. It is
counted once, in default memory, and shown on both memory rows: valgrind puts its own
malloc in place of glibc's and counts user-space instructions only, so the memory
condition cannot move it.

Usage: python benchmarks/memory/sub_block_effects.py [--configs medium v16]
           [--budgets 1048576 4194304] [--repeats 5] [--rounds 1] [--instructions]
"""
import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import MADE_BY, made_by, positive  # noqa: E402
from fisher_ref.perf.bench import condition_env  # noqa: E402  the harness's conditions
from fisher_ref.perf.memory import (MemoryConditionError, check_memory_condition,  # noqa: E402
                                    probe_process)
from fisher_ref.engine.plan import EngineOptions


def _runs(config, budget, repeats, warm_up=True):
    """``repeats`` runs of ``exact`` on scale config ``config`` with sub-block budget
    ``budget``, after a warm-up run where ``warm_up``: their times, faults and system
    seconds."""
    import resource

    from fisher_ref import exact
    from fisher_ref.engine.plan import Budgets
    from fisher_ref.perf.scaling import load_scale_config
    task, budgets = load_scale_config(config), Budgets(sub_elements=budget)
    out = {"times": [], "faults": [], "sys_s": []}
    if warm_up:
        exact(task, progress=False, workers=1, options=EngineOptions(budgets=budgets))
    for _ in range(repeats):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        exact(task, progress=False, workers=1, options=EngineOptions(budgets=budgets))
        t, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        out["times"].append(t)
        out["faults"].append(r1.ru_minflt - r0.ru_minflt)
        out["sys_s"].append(r1.ru_stime - r0.ru_stime)
    return out


def instructions_of(stderr):
    """The instruction count (``I refs``) in cachegrind's summary ``stderr``."""
    found = re.search(r"I\s+refs:\s+([\d,]+)", stderr)
    if found is None:
        raise ValueError(f"no 'I refs' line in valgrind's output: {stderr[-500:]!r}")
    return int(found.group(1).replace(",", ""))


def _instructions(config, budget):
    """Instructions of one run: cachegrind's count for three runs less that for one, halved
    (the imports and the first run's setup cancel)."""
    counts = []
    for runs in (1, 3):
        out = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no",
                              "--cachegrind-out-file=/dev/null", sys.executable, __file__,
                              "--count", config, str(budget), str(runs)],
                             env=condition_env(False), capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"valgrind on {config}, budget {budget} failed:\n{out.stderr[-2000:]}")
        counts.append(instructions_of(out.stderr))
    return (counts[1] - counts[0]) / 2


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["medium", "v16"])
    ap.add_argument("--budgets", nargs="+", type=positive, default=[2 ** 20, 2 ** 22])
    ap.add_argument("--repeats", type=positive, default=5)
    ap.add_argument("--rounds", type=positive, default=1)
    ap.add_argument("--instructions", action="store_true",
                    help="also count one run's instructions with valgrind's cachegrind")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--count", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_runs(args.child[0], int(args.child[1]), args.repeats)))
        return 0
    if args.count:
        _runs(args.count[0], int(args.count[1]), int(args.count[2]), warm_up=False)
        return 0
    from fisher_ref.perf.scaling import git_commit, load_scale_config, machine
    for config in args.configs:
        try:
            load_scale_config(config)
        except ValueError as exc:
            ap.error(f"--configs: {exc}")
    if args.instructions and shutil.which("valgrind") is None:
        ap.error("--instructions needs valgrind on PATH (Debian: apt-get install valgrind)")
    import numpy as np
    print(MADE_BY + made_by(argv, __file__))
    print(f"commit {git_commit()}; {machine()}")
    print(f"{args.rounds} round(s) of {args.repeats} runs in a new process per task, budget "
          "and memory condition, by turns; one thread")
    for keep in (False, True):
        env = condition_env(keep)
        try:
            check_memory_condition(keep, probe_process(env), "sub_block_effects.py", env)
        except MemoryConditionError as exc:
            sys.exit(str(exc))
    cells = [(c, b, keep) for c in args.configs for b in args.budgets for keep in (False, True)]
    runs = {cell: {"times": [], "faults": [], "sys_s": []} for cell in cells}
    for _ in range(args.rounds):
        for config, budget, keep in cells:
            out = subprocess.run([sys.executable, __file__, "--repeats", str(args.repeats),
                                  "--child", config, str(budget)],
                                 env=condition_env(keep), capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"the {config}/{budget}/{'kept' if keep else 'default'} process "
                         f"failed:\n{out.stderr[-2000:]}")
            for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items():
                runs[config, budget, keep][k] += v
    count = {(c, b): _instructions(c, b) for c in args.configs for b in args.budgets} \
        if args.instructions else {}
    print("\n| task | memory | sub-block budget | median (s) | best (s) | minor faults, median "
          "| system time, median (s) | instructions a run |\n|---|---|---|---|---|---|---|---|")
    for (config, budget, keep), r in runs.items():
        ins = count.get((config, budget))
        print(f"| {config} | {'kept' if keep else 'glibc default'} | "
              f"{f'2**{budget.bit_length() - 1}' if budget & (budget - 1) == 0 else budget} | "
              f"{np.median(r['times']):.3f} | {min(r['times']):.3f} | "
              f"{int(np.median(r['faults'])):,} | {np.median(r['sys_s']):.3f} | "
              f"{'-' if ins is None else f'{ins / 1e6:,.0f} M'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
