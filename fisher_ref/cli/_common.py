"""What every subcommand shares: the ``--config NAME`` / ``--task FILE`` arguments and
the task they name. Subcommand modules import it; the command line wires them."""
from __future__ import annotations

import argparse
import math

from fisher_ref.limits import check_seed
from fisher_ref.tasks import load_config, load_task

__all__ = ["add_task_arguments", "task_from_args", "count_arg", "seed_arg"]


def add_task_arguments(parser, default_config="default"):
    """``--config NAME`` or ``--task FILE`` (mutually exclusive)."""
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--config", default=None,
                   help=f"a named config shipped with fisher_ref (default: {default_config!r})")
    g.add_argument("--task", default=None, help="a task file (JSON; its keys are in docs/guide/tasks.md)")
    parser.set_defaults(_default_config=default_config)


def task_from_args(args):
    """Load the task named by ``--task`` or ``--config`` (default config otherwise);
    ``--task ""`` is refused (it names no file), not read as "no task"."""
    if getattr(args, "task", None) is not None:
        return load_task(args.task)
    return load_config(args._default_config if args.config is None else args.config)


def count_arg(text):
    """An argparse type: a non-negative whole number, written ``20000`` or ``2e4``.

    Example:
        >>> count_arg("2e4"), count_arg("7")
        (20000, 7)
    """
    try:
        return _count(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a non-negative whole number (such as 20000 or 2e4), got {text!r}") from None


def _count(text):
    text = text.strip()
    if text.lstrip("+").isdigit():
        return int(text)
    x = float(text)  # ValueError for words
    if not math.isfinite(x) or x < 0 or x != math.floor(x):
        raise ValueError(text)
    return int(x)


def seed_arg(text):
    """An argparse type: a seed, an integer from 0 to 2^63 - 1 (one rule for every command,
    checked before any work).

    Example:
        >>> seed_arg("7")
        7
    """
    try:
        return check_seed(_count(text), "seed")
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer from 0 to 2^63 - 1, got {text!r}") from None
