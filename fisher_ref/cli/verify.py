"""``python -m fisher_ref verify``: every identity of docs/theory.md on one task, as a table."""
from __future__ import annotations

import argparse
import textwrap

from fisher_ref.checks.identities import format_table, verify_task
from fisher_ref.checks.table import TABLE_WIDTH
from fisher_ref.parallel.workers import check_workers
from fisher_ref.cli._common import count_arg, seed_arg, task_from_args

__all__ = ["add_arguments", "run"]


def add_arguments(parser):
    """``--mc N``, ``--seed S`` and ``--quiet`` for ``python -m fisher_ref verify``."""
    parser.add_argument("--mc", type=count_arg, default=20000,
                        help="Monte Carlo samples for the z-tests (default 20000; 0: exact checks "
                             "only; 2e4 is read as 20000)")
    parser.add_argument("--seed", type=seed_arg, default=0,
                        help="seed of the Monte Carlo generator (an integer from 0 to 2^63 - 1)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--workers", type=workers_arg, default="auto",
                        help="processes for the exact enumeration: a number or 'auto' (the "
                             "available cores for a run estimated at 10 s or more, else 1)")


def workers_arg(text):
    """An argparse type: ``auto`` or a positive whole number of worker processes."""
    try:
        return check_workers(text if text == "auto" else int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a positive whole number of processes or 'auto', got {text!r}") from None


def run(args):
    """Run ``verify``: print the table; return 0 if every check passed, else 1."""
    task = task_from_args(args)
    result, rows = verify_task(task, mc=args.mc, seed=args.seed, progress=not args.quiet,
                               workers=args.workers)
    c = result.cost
    head = (f"task {task.name}: V={c.vocab_size}, T={c.max_len}, P={c.num_params}, "
            f"{c.n_states} states, {c.n_responses} responses, prompts={len(task.prompts)}, "
            f"sampler={'none' if task.sampler is None else task.sampler.to_json()}")
    print("\n".join(textwrap.wrap(head, TABLE_WIDTH, subsequent_indent="  ")))
    print(format_table(rows))
    failed = [r for r in rows if not r.passed]
    tail = (f"{len(rows) - len(failed)} of {len(rows)} checks passed"
            + (f"; FAILED: {', '.join(r.check for r in failed)}" if failed else ""))
    print("\n" + "\n".join(textwrap.wrap(tail, TABLE_WIDTH, subsequent_indent="  ")))
    return 1 if failed else 0
