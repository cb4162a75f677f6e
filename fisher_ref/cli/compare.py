"""``python -m fisher_ref compare``: the torch engine against the exact engine, as a table
(and ``--json``)."""
from __future__ import annotations

import contextlib
import json
import sys

from fisher_ref.checks.compare import (DEFAULT_DTYPES, DEFAULT_MC, check_dtypes, compare,
                                       format_table)
from fisher_ref.checks.tolerances import TOLERANCES
from fisher_ref.cli._common import count_arg, seed_arg, task_from_args
from fisher_ref.fileio import atomic_output

__all__ = ["add_arguments", "run"]


def _default_device():
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def _dtype_list(values):
    """``--dtype`` values (repeated, comma separated) as a checked list without repeats."""
    out = []
    for v in values or [",".join(DEFAULT_DTYPES)]:
        for d in v.split(","):
            d = d.strip()
            if d and d not in out:
                out.append(d)
    return check_dtypes(out)


def add_arguments(parser):
    """``--device``, ``--dtype`` (repeatable or comma list), ``--json``, ``--mc``, ``--seed``."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--dtype", action="append", default=None,
                        help="float64, float32, bfloat16; repeatable or comma separated "
                             "(default: float64,float32)")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="also write the rows as JSON (atomically: a failed run leaves no file)")
    parser.add_argument("--mc", type=count_arg, default=DEFAULT_MC,
                        help=f"Monte Carlo draws for the Bernstein rows (default {DEFAULT_MC}; 0: none)")
    parser.add_argument("--seed", type=seed_arg, default=0,
                        help="seed of the torch.Generator (an integer from 0 to 2^63 - 1)")


RELATIVE_ERROR = "max_i |torch - exact|_i / scale_i (fisher_ref.checks.tolerances)"


def run(args):
    """Print the table (and write ``--json``); exit code 1 if any row fails, 2 on bad input."""
    task = task_from_args(args)
    device = args.device or _default_device()
    dtypes = _dtype_list(args.dtype)
    try:
        rows = compare(task, device=device, dtypes=dtypes, mc=args.mc, seed=args.seed)
    except NotImplementedError as exc:  # a model without a torch twin: bad input
        raise ValueError(str(exc)) from None
    failed = [r for r in rows if not r["passed"]]
    with contextlib.ExitStack() as stack:  # --json: renamed into place once all is printed
        if args.json:
            tmp = stack.enter_context(atomic_output(args.json, "--json file"))
            with open(tmp, "w") as fh:
                json.dump({"task": task.name, "device": device, "dtypes": dtypes,
                           "relative_error": RELATIVE_ERROR, "tolerances": TOLERANCES,
                           "rows": rows}, fh, indent=1)
        print(format_table(rows, title=f"fisher_ref compare: task {task.name!r}, device "
                                       f"{device}; rel = {RELATIVE_ERROR}"))
        print(f"{len(rows) - len(failed)}/{len(rows)} rows pass"
              + (f"; FAILED: {', '.join(r['quantity'] + ' ' + r['dtype'] for r in failed)}"
                 if failed else ""))
        sys.stdout.flush()
    return 1 if failed else 0
