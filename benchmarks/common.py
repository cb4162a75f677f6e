"""What the benchmark scripts share: the repository root, the line that names the command
that made a record, and the scripts' check of a positive integer argument."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the first line of a text record: ``# made by: python benchmarks/... args``
MADE_BY = "# made by: "


def made_by(argv, script):
    """The command line that runs ``script`` with ``argv`` (``None``: this process's
    ``sys.argv[1:]``), from the repository root.

    >>> made_by(["--json", "a b.json"], ROOT / "benchmarks" / "speed" / "peer_timing.py")
    "python benchmarks/speed/peer_timing.py --json 'a b.json'"
    """
    script = Path(script).resolve()
    try:
        script = script.relative_to(ROOT)
    except ValueError:  # run from elsewhere: the path as given
        pass
    args = sys.argv[1:] if argv is None else list(argv)
    return shlex.join(["python", script.as_posix(), *map(str, args)])


def positive(text):
    """``int(text)`` when it is at least 1, else an argparse error naming the value."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return n
