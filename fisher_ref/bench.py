r"""``python -m fisher_ref bench``: the exact engine against torch doing the same exact work.

Measurements (each a function ``task -> zero-argument callable`` in
:data:`MEASUREMENTS`, so a scaling sweep can reuse them per task size):

- ``fisher_ref`` — :func:`fisher_ref.exact.exact` (numpy, CPU, float64);
- ``torch_cpu_float64`` — :func:`fisher_ref.torch.exact.torch_exact` on the CPU
  in float64: the same enumeration and the same quantities (every stream,
  cross terms, per-state arrays, the autograd gradient);
- ``torch_cuda_float64`` — the same on CUDA, synchronised, when present.

Each measurement is run once to warm up, then all are run in turn
(interleaved) ``repeats`` times, so drifts in machine load hit all alike.
Reported: the median and minimum wall time of each, and the ratio
``median(fisher_ref) / median(torch)`` (below 1: fisher_ref is faster).
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from .command import task_from_args

__all__ = ["MEASUREMENTS", "measurements", "time_call", "bench", "format_table",
           "add_arguments", "run", "DEFAULT_REPEATS"]

DEFAULT_REPEATS = 5
REFERENCE = "fisher_ref"


def measure_fisher_ref(task):
    """``exact(task)`` — the numpy engine, CPU float64."""
    from .exact import exact
    return lambda: exact(task, progress=False)


def _measure_torch(device):
    def make(task):
        import torch
        from .torch.exact import torch_exact

        def call():
            out = torch_exact(task, device=device, dtype="float64")
            if device == "cuda":
                torch.cuda.synchronize()
            return out
        return call
    make.__doc__ = f"``torch_exact(task)`` on {device} in float64 (the same quantities)."
    return make


MEASUREMENTS = {
    REFERENCE: measure_fisher_ref,
    "torch_cpu_float64": _measure_torch("cpu"),
    "torch_cuda_float64": _measure_torch("cuda"),
}


def measurements(device=None):
    """Names of the measurements to run: fisher_ref, torch on the CPU, and torch on
    CUDA when ``device`` is ``"cuda"`` or (``device=None``) when CUDA is present."""
    import torch
    names = [REFERENCE, "torch_cpu_float64"]
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    if device == "cuda" or (device is None and torch.cuda.is_available()):
        names.append("torch_cuda_float64")
    return names


def time_call(fn):
    """Wall time of one call of ``fn`` in seconds (``time.perf_counter``)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench(task, repeats=DEFAULT_REPEATS, names=None):
    """Time the measurements side by side, interleaved, ``repeats`` times each.

    Args:
        task: a :class:`fisher_ref.tasks.Task` with an MLP model.
        repeats: timed runs of each measurement (after one warm-up run).
        names: measurement names (default :func:`measurements`).

    Returns:
        dict: ``task``, ``repeats``, ``n_states``, ``n_responses``, ``num_params``,
        ``times`` {name: [s, ...]}, ``median`` {name: s}, ``min`` {name: s} and
        ``ratio`` {torch name: median(fisher_ref) / median(name)}.
    """
    from .enumeration import estimate_cost
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    names = measurements() if names is None else list(names)
    unknown = [n for n in names if n not in MEASUREMENTS]
    if unknown:
        raise ValueError(f"unknown measurements {unknown}; known: {sorted(MEASUREMENTS)}")
    fns = {n: MEASUREMENTS[n](task) for n in names}
    for fn in fns.values():
        fn()  # warm-up: imports, allocator, kernels
    times = {n: [] for n in names}
    for _ in range(repeats):
        for n, fn in fns.items():
            times[n].append(time_call(fn))
    median = {n: statistics.median(t) for n, t in times.items()}
    cost = estimate_cost(task)
    ratio = {n: median[REFERENCE] / median[n] for n in names
             if n != REFERENCE and REFERENCE in median and median[n] > 0}
    return {"task": task.name, "repeats": repeats, "n_states": cost.n_states,
            "n_responses": cost.n_responses, "num_params": cost.num_params,
            "times": times, "median": median, "min": {n: min(t) for n, t in times.items()},
            "ratio": ratio}


def format_table(res):
    """The timings as a text table plus one ratio line per torch measurement."""
    lines = [f"fisher_ref bench: task {res['task']!r} ({res['n_states']:,} states, "
             f"{res['n_responses']:,} responses, P={res['num_params']}), "
             f"{res['repeats']} interleaved repeats",
             f"{'measurement':<22} {'median s':>10} {'min s':>10} {'fisher_ref/this':>16}",
             "-" * 61]
    for n, med in res["median"].items():
        r = res["ratio"].get(n)
        lines.append(f"{n:<22} {med:>10.4f} {res['min'][n]:>10.4f} "
                     f"{('%.3f' % r) if r is not None else '-':>16}")
    for n, r in res["ratio"].items():
        lines.append(f"ratio fisher_ref/{n} = {r:.3f} "
                     f"({'fisher_ref faster' if r < 1 else 'torch faster'})")
    return "\n".join(lines)


def add_arguments(parser):
    """``--repeats``, ``--device``, ``--json``."""
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help=f"timed runs of each measurement (default {DEFAULT_REPEATS})")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="cpu: torch on the CPU only; cuda: also on CUDA "
                             "(default: also CUDA when present)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the timings as JSON")
    parser.add_argument("--scaling", nargs="?", const="docs", default=None, metavar="DIR",
                        help="instead: time and peak memory of exact() over a grid of task "
                             "sizes (fisher_ref.scaling); writes DIR/scaling.csv, .md, .png "
                             "(DIR default: docs)")


def run(args):
    """Print the timing table and the ratio (or, with ``--scaling``, the scaling
    table); exit code 0."""
    if getattr(args, "scaling", None):
        from .scaling import main as scaling_main
        return scaling_main(["--out", args.scaling])
    task = task_from_args(args)
    try:
        res = bench(task, repeats=args.repeats, names=measurements(args.device))
    except NotImplementedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_table(res))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0
