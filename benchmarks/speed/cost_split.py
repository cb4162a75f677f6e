r"""How a run's time splits into a part fixed by the prefix tree and a part per parameter,
for ``exact`` (every quantity), ``exact(quantities="fisher")`` and the independent peer
(``benchmarks/speed/peer.py``), side by side.

The tree of a task (its states and responses) is set by the vocabulary, the length, the
prompts and EOS; the number of parameters P by the model's width. This script keeps a scale
config's tree and varies its hidden width, so that P changes and nothing else does, and
times the three sides by turns in one process, one thread each, after a warm-up. For each
side it fits :math:`t = a + b P` by least squares over the widths: :math:`a` is the cost of
the tree (the walk, the per-state and per-response work, and every numpy call's own
overhead), :math:`b` the cost of one more parameter. The fits show which of the two a
side's lead or lag comes from.

Usage: python benchmarks/speed/cost_split.py [--configs medium v16] [--hidden 1 16 64]
           [--repeats 5] [--keep-memory] [--out FILE]

The config's own hidden width is always among the widths, so the ratio at the task as
shipped is measured too. ``--keep-memory`` runs the script again with glibc told to keep
freed memory (``fisher_ref.perf.bench.KEEP_MEMORY``), as ``peer_timing.py --keep-memory``
does. ``--out FILE`` also writes the output to FILE (never over an existing file).
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # pin every thread pool before numpy and torch load
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]  # the package; the peer
SIDES = ("exact", "exact fisher", "peer")

from benchmarks.common import MADE_BY, made_by, positive  # noqa: E402


def fit_line(P, t):
    """Least squares :math:`t = a + b P` over the points ``(P, t)``: ``(a, b, worst)``,
    ``worst`` the largest residual relative to its point's time. Needs two distinct P."""
    P, t = np.asarray(P, dtype=float), np.asarray(t, dtype=float)
    if len(np.unique(P)) < 2:
        raise ValueError("a line needs at least two distinct numbers of parameters")
    b, a = np.polyfit(P, t, 1)
    return float(a), float(b), float(np.max(np.abs(a + b * P - t) / t))


def _spec(config, hidden=None):
    """Scale config ``config``'s task file, with hidden width ``hidden`` (as shipped when
    ``None``)."""
    spec = json.loads((ROOT / "fisher_ref/configs/scale" / f"{config}.json").read_text())
    if hidden is not None:
        spec["model"]["hidden"] = int(hidden)
    return spec


def time_sides(spec, repeats):
    """Medians (s) of ``repeats`` runs of each side on task file ``spec``, by turns."""
    from fisher_ref import exact, task_from_json
    from peer import peer_exact
    runs = {"exact": lambda: exact(task_from_json(spec), progress=False, workers=1)
            .states["token_fisher"],
            "exact fisher": lambda: exact(task_from_json(spec), progress=False, workers=1,
                                          quantities="fisher").states["token_fisher"],
            "peer": lambda: peer_exact(spec)}
    for run in runs.values():  # warm-up, not timed
        run()
    times = {side: [] for side in runs}
    for _ in range(repeats):
        for side, run in runs.items():
            t0 = time.perf_counter()
            run()
            times[side].append(time.perf_counter() - t0)
    return {side: float(np.median(v)) for side, v in times.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["medium", "v16"])
    ap.add_argument("--hidden", nargs="+", type=positive, default=[1, 16, 64],
                    help="hidden widths besides the config's own")
    ap.add_argument("--repeats", type=positive, default=5)
    ap.add_argument("--keep-memory", action="store_true",
                    help="run again with glibc told to keep freed memory")
    ap.add_argument("--out", default=None, metavar="FILE",
                    help="also write the output to FILE (not overwritten)")
    args = ap.parse_args(argv)
    if args.out and Path(args.out).exists():
        ap.error(f"--out {args.out} exists; it is not overwritten")
    if args.out and not Path(args.out).resolve().parent.is_dir():
        ap.error(f"--out {args.out}: the directory does not exist")
    from fisher_ref.perf.scaling import load_scale_config
    for config in args.configs:
        try:
            load_scale_config(config)
        except ValueError as exc:
            ap.error(f"--configs: {exc}")
        if "hidden" not in _spec(config)["model"]:
            ap.error(f"--configs: {config} is not an MLP config (no hidden width)")
    from fisher_ref.perf.bench import KEEP_MEMORY, condition_env
    from peer_timing import kept_at_start, memory_condition, threads_line
    if args.keep_memory and not kept_at_start(KEEP_MEMORY):
        import subprocess  # glibc reads the variables at start: run again with them set
        return subprocess.call([sys.executable, __file__] + list(sys.argv[1:] if argv is None
                                                                 else argv),
                               env=condition_env(True, threads=0))
    import torch

    from fisher_ref.perf.memory import (MemoryConditionError, check_memory_condition,
                                        probe_process, startup_environ)
    from fisher_ref import task_from_json
    from fisher_ref.perf.scaling import git_commit, machine
    try:
        check_memory_condition(kept_at_start(KEEP_MEMORY), probe_process(), "cost_split.py",
                               startup_environ())
    except MemoryConditionError as exc:
        sys.exit(str(exc))
    torch.set_num_threads(1)
    lines = [MADE_BY + made_by(argv, __file__), f"commit {git_commit(ROOT)}; {machine()}",
             f"{args.repeats} runs a side by turns after a warm-up, medians; {threads_line()}; "
             f"memory: {memory_condition(KEEP_MEMORY)}", "",
             "| task | hidden | P | exact (s) | exact fisher (s) | peer (s) | exact / peer |",
             "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    fits = []
    for config in args.configs:
        own = load_scale_config(config).model.spec.hidden
        points = []
        for hidden in sorted(set(args.hidden) | {own}):
            spec = _spec(config, hidden)
            P = task_from_json(spec).model.num_params
            med = time_sides(spec, args.repeats)
            points.append((P, med))
            mark = " (the config's)" if hidden == own else ""
            lines.append(f"| {config} | {hidden}{mark} | {P:,} | {med['exact']:.4f} | "
                         f"{med['exact fisher']:.4f} | {med['peer']:.4f} | "
                         f"{med['exact'] / med['peer']:.2f} |")
            print(lines[-1], flush=True)
        own_P = load_scale_config(config).model.num_params
        for side in SIDES:
            a, b, worst = fit_line([p for p, _ in points], [m[side] for _, m in points])
            fits.append(f"| {config} | {side} | {a * 1e3:.1f} | {b * 1e6:.2f} | "
                        f"{a / (a + b * own_P):.0%} | {worst:.0%} |")
    lines += ["", "| task | side | fixed cost a (ms) | per parameter b (µs) | "
              "a's share at the config's P | largest residual |", "|---|---|---|---|---|---|",
              *fits]
    print("\n".join(lines[-len(fits) - 3:]))
    if args.out:
        text = "\n".join(lines)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
