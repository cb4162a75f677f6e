"""What every subcommand shares: the ``--config NAME`` / ``--task FILE`` arguments and
the task they name. Subcommand modules import it; the command line wires them."""
from __future__ import annotations

from .tasks import load_config, load_task

__all__ = ["add_task_arguments", "task_from_args"]


def add_task_arguments(parser, default_config="default"):
    """``--config NAME`` or ``--task FILE`` (mutually exclusive)."""
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--config", default=None,
                   help=f"a named config shipped with fisher_ref (default: {default_config!r})")
    g.add_argument("--task", default=None, help="a task file in the JSON format of DESIGN §5")
    parser.set_defaults(_default_config=default_config)


def task_from_args(args):
    """Load the task named by ``--task`` or ``--config`` (default config otherwise)."""
    if getattr(args, "task", None):
        return load_task(args.task)
    return load_config(args.config or args._default_config)
