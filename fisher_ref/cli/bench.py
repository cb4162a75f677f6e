"""``python -m fisher_ref bench``: time the exact engine against torch doing the same work
(each side in its own process), or with ``--scaling DIR`` the scaling sweep."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from fisher_ref.cli._common import task_from_args
from fisher_ref.perf.bench import (DEFAULT_REPEATS, DEFAULT_THREADS, MeasurementFailed, bench,
                                   format_table, measurements)
from fisher_ref.perf.memory import MemoryConditionError

__all__ = ["add_arguments", "run", "scaling_main"]


def add_arguments(parser):
    """``--repeats``, ``--device``, ``--threads``, ``--in-process``, ``--keep-memory``,
    ``--no-peer``, ``--json``, ``--scaling``."""
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help=f"timed runs of each measurement (default {DEFAULT_REPEATS})")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="cpu: torch on the CPU only; cuda: also on CUDA "
                             "(default: also CUDA when present)")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                        help=f"threads of every side (default {DEFAULT_THREADS}; 0: unpinned)")
    parser.add_argument("--in-process", action="store_true",
                        help="time in this process instead of one process per measurement")
    parser.add_argument("--keep-memory", action="store_true",
                        help="start each side's process with glibc told to keep freed memory "
                             "and reuse it (fisher_ref.perf.bench.KEEP_MEMORY); default: "
                             "the C library's own settings")
    parser.add_argument("--no-peer", action="store_true",
                        help="leave out benchmarks/speed/peer.py even when it exists")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="also write the timings as JSON (atomically)")
    parser.add_argument("--scaling", nargs="?", const="docs", default=None, metavar="DIR",
                        help="instead: time and peak memory of exact() over a grid of task "
                             "sizes (fisher_ref.perf.scaling); writes DIR/scaling.csv, .md, .png "
                             "(DIR default: docs)")
    parser.add_argument("--quick", action="store_true",
                        help="with --scaling: only the first three grid sizes")
    parser.add_argument("--budget-run", action="store_true",
                        help="with --scaling: also run the >24 GiB task within a 2 GiB budget "
                             "(about 2 minutes); an earlier DIR/budget_run.json is plotted either way")


def run(args):
    """Print the timing table and the ratios (or, with ``--scaling``, the scaling table);
    exit code 0; 2 on bad input; 1 when a measurement's process fails or the allocator
    does not follow the memory condition (no timings to report)."""
    from fisher_ref.fileio import atomic_output
    if getattr(args, "scaling", None):
        import importlib.util
        if importlib.util.find_spec("matplotlib") is None:  # the sweep ends in a plot
            raise ValueError("bench --scaling draws a plot and needs matplotlib; install it "
                             "(pip install -e \".[lessons]\") or run without --scaling")
        return scaling_main(args.scaling, quick=args.quick, with_budget_run=args.budget_run)
    task = task_from_args(args)
    from fisher_ref.torch.registry import torch_model
    try:
        torch_model(task.model)
    except NotImplementedError as exc:
        raise ValueError(str(exc)) from None
    names = measurements(args.device, task, peer=not args.no_peer)
    try:
        res = bench(task, repeats=args.repeats, names=names, threads=args.threads,
                    isolate=False if args.in_process else None, keep_memory=args.keep_memory)
    except (MeasurementFailed, MemoryConditionError) as exc:  # no timings to report
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:  # the temporary file exists only while the timings are written
        with atomic_output(args.json, "--json file") as tmp, open(tmp, "w") as fh:
            json.dump(res, fh, indent=1)
    print(format_table(res))
    return 0


def scaling_main(out="docs", quick=False, with_budget_run=False):
    """``bench --scaling DIR``: write ``scaling.csv/.md/.png`` under ``DIR``, a directory
    that must exist (as for ``--out`` and ``--json``: a typo is refused, not created)."""
    from fisher_ref.fileio import FileProblem, check_output_path
    from fisher_ref.perf.scaling import GRID, budget_run, plot, sweep, write_table
    out = Path(out)
    if not out.is_dir():
        raise FileProblem(f"--scaling {str(out)!r}: " + (
            "not a directory" if out.exists() else "the directory does not exist") +
            "; give an existing directory")
    for name in ("scaling.csv", "scaling.md", "scaling.png", "budget_run.json"):
        check_output_path(out / name, "--scaling output")
    rows = sweep(GRID[:3] if quick else GRID)
    write_table(rows, out / "scaling.csv", out / "scaling.md")
    print((out / "scaling.md").read_text())
    budget_file = out / "budget_run.json"
    if with_budget_run:
        res = budget_run()
        print(json.dumps(res, indent=1))
        with open(budget_file, "w") as fh:
            json.dump(res, fh, indent=1)
    budget = json.loads(budget_file.read_text()) if budget_file.is_file() else None
    plot(rows, out / "scaling.png", budget)
    return 0
