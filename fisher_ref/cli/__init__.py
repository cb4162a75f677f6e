"""Command line: ``python -m fisher_ref {verify,export,compare,bench} ...``.

Each subcommand is a module of this package (``fisher_ref.cli.verify`` ...) that provides
``add_arguments(parser)`` and ``run(args) -> exit code`` over the library; this module
only wires them together; the task arguments every subcommand shares
(``--config NAME`` / ``--task FILE``) live in :mod:`fisher_ref.cli._common`.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

from fisher_ref.cli._common import add_task_arguments
from fisher_ref.fileio import FileProblem, check_output_path, same_file

__all__ = ["main", "build_parser"]

OUTPUT_OPTIONS = ("out", "json")  # file paths the subcommands write

# name -> (module, help, task arguments?, the module's add_arguments, its run)
SUBCOMMANDS = {
    "verify": ("fisher_ref.cli.verify",
               "check every identity of docs/theory.md, exactly and by Monte Carlo", True,
               "add_arguments", "run"),
    "export": ("fisher_ref.cli.export", "write the golden .npz file of a task", True,
               "add_arguments", "run"),
    "regenerate": ("fisher_ref.cli.export", "rewrite the golden files shipped with fisher_ref",
                   False, "add_regenerate_arguments", "run_regenerate"),
    "compare": ("fisher_ref.cli.compare", "compare the torch implementation with fisher_ref",
                True, "add_arguments", "run"),
    "bench": ("fisher_ref.cli.bench", "time the exact engine against torch doing the same work",
              True, "add_arguments", "run"),
    "estimators": ("fisher_ref.cli.estimators",
                   "the exact expected gradient of every preset RL loss: scale, bias, variance",
                   True, "add_arguments", "run"),
}


def build_parser(command=None):
    """The argument parser; only ``command``'s module is imported (all when ``None``)."""
    parser = argparse.ArgumentParser(
        prog="python -m fisher_ref",
        description="Exact float64 Fisher information of sampling from a tiny softmax LM.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (modname, help_, task_args, add, run) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if command is not None and name != command:
            continue
        if task_args:
            add_task_arguments(p)
        mod = importlib.import_module(modname)
        getattr(mod, add)(p)
        p.set_defaults(_run=getattr(mod, run))
    return parser


def main(argv=None):
    """Run the command line on ``argv`` (``sys.argv[1:]`` by default); return the exit code.

    Exit codes: 0 success, 1 a check failed, 2 bad input (the message names it: a
    field of the task, an option, or a path that cannot be read or written).
    Output paths (``--out``, ``--json``) are checked before any work starts: each must
    be a regular file or not exist yet, in an existing directory, and neither may be
    the ``--task`` file or the other output. Text the terminal cannot encode is
    written escaped; a reader that closes the pipe early (``verify | head -1``) ends
    the run quietly with exit code 0. SIGTERM during a run removes the temporary files,
    leaves every output as it was and exits with 143; once the run is over (outputs in
    place), a process started with ``argv=None`` ignores SIGTERM while it exits.
    """
    argv_is_process = argv is None  # the program's own command line, not a caller's call
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in SUBCOMMANDS else "")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage and the problem
        return exc.code if isinstance(exc.code, int) else 2
    for stream in (sys.stdout, sys.stderr):  # names a terminal cannot encode: escaped
        with contextlib.suppress(AttributeError, ValueError):  # a stream without it
            stream.reconfigure(errors="backslashreplace")
    try:
        with _terminate_cleanly():
            _check_outputs(args)
            code = int(args._run(args) or 0)
            sys.stdout.flush()  # a closed pipe shows here, not at exit
        if argv_is_process:  # the outputs are complete: exit with the run's code
            _ignore_sigterm()
        return code
    except BrokenPipeError:  # the reader left (verify | head -1): quiet, as Unix tools are
        _silence_stdout()
        return 0
    except KeyboardInterrupt:  # Ctrl-C: temporary files are gone (their finally ran)
        print("error: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("error: terminated (SIGTERM)", file=sys.stderr)
        return 143
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        print(f"error: `{args.command}` needs torch; install it with "
              "pip install -e \".[torch]\" (for example torch==2.13.0, the CPU build)",
              file=sys.stderr)
        return 2
    except (ValueError, TypeError, OverflowError, OSError) as exc:
        # OSError: a path that is a directory, missing, unreadable or on a full disk
        # (its message names the path); FileProblem and EnumerationTooLarge are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 2


class _Terminated(BaseException):
    """SIGTERM, raised so that every ``finally`` (temporary files) runs before the exit."""


@contextlib.contextmanager
def _terminate_cleanly():
    """Turn SIGTERM into :class:`_Terminated` inside the block (main thread only; the
    previous handler is restored)."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, frame):
        raise _Terminated()
    old = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _ignore_sigterm():
    """Ignore SIGTERM from here on (main thread only): the run is over and its outputs in
    place, so the interpreter's shutdown (a second or so with torch loaded) ends with the
    run's exit code instead of a -15 that would say nothing was written."""
    import signal
    import threading
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _silence_stdout():
    """Point stdout at /dev/null, so that the flush at exit does not fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _check_outputs(args):
    """Every output path writable, none of them the task file or another output."""
    outputs = [(f"--{o}", getattr(args, o)) for o in OUTPUT_OPTIONS
               if getattr(args, o, None) is not None]
    for option, path in outputs:
        check_output_path(path, option)
        task = getattr(args, "task", None)
        if task and (same_file(path, task) or os.path.abspath(path) == os.path.abspath(task)):
            raise FileProblem(f"{option} {path!r} is the --task file; writing it would "
                              "destroy the task it is computed from")
    if len(outputs) == 2 and (same_file(outputs[0][1], outputs[1][1]) or os.path.abspath(
            outputs[0][1]) == os.path.abspath(outputs[1][1])):
        raise FileProblem(f"--out and --json name the same file {outputs[0][1]!r}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
