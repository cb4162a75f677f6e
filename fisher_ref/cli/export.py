"""``python -m fisher_ref export`` (one task's golden file) and ``python -m fisher_ref
regenerate`` (rewrite the shipped golden files)."""
from __future__ import annotations

import hashlib

from fisher_ref.cli._common import task_from_args
from fisher_ref.golden.check import GOLDEN_DIR
from fisher_ref.golden.export import (GOLDEN_CASES, export_golden, regenerate_golden_files,
                                      size_table_row)
from fisher_ref.golden.format import MATRIX_MAX_PARAMS
from fisher_ref.golden.format import load_golden

__all__ = ["add_arguments", "run", "add_regenerate_arguments", "run_regenerate"]


def add_arguments(parser):
    """``export`` options: ``--out FILE.npz`` (required), ``--matrices auto|yes|no``."""
    parser.add_argument("--out", required=True, metavar="FILE.npz",
                        help="where to write the golden file")
    parser.add_argument("--matrices", choices=("auto", "yes", "no"), default="auto",
                        help=f"write the P x P matrices (auto: when P <= {MATRIX_MAX_PARAMS})")


def run(args):
    """``python -m fisher_ref export``: write the golden file and say what was written."""
    task = task_from_args(args)
    matrices = {"auto": "auto", "yes": True, "no": False}[args.matrices]
    path = export_golden(task, args.out, matrices=matrices)
    data = path.read_bytes()
    g = load_golden(path)
    print(f"wrote {path}: {len(data):,} bytes, {len(g.arrays)} arrays "
          f"(task {task.name!r}, P={g.sizes['P']}, N={g.sizes['N']} states, "
          f"M={g.sizes['M']} responses, matrices {'yes' if g.meta['matrices'] else 'no'}), "
          f"sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


def add_regenerate_arguments(parser):
    """``[DIR]`` and ``--names NAME ...`` for ``python -m fisher_ref regenerate``."""
    parser.add_argument("directory", nargs="?", default=str(GOLDEN_DIR), metavar="DIR",
                        help="directory to write into (default: the package's golden_data)")
    parser.add_argument("--names", nargs="+", default=list(GOLDEN_CASES), choices=GOLDEN_CASES,
                        metavar="NAME", help="only these cases")


def run_regenerate(args):
    """``python -m fisher_ref regenerate [DIR]``: rewrite the shipped golden files. ``DIR``
    must exist (as for ``--out``: a typo is refused, not created), and each file written
    must be a regular file or new."""
    from pathlib import Path
    from fisher_ref.fileio import FileProblem, check_output_path
    directory = Path(args.directory)
    if not directory.is_dir():
        raise FileProblem(f"regenerate {str(directory)!r}: " + (
            "not a directory" if directory.exists() else "the directory does not exist"))
    for name in args.names:
        check_output_path(directory / f"{name}.npz", "regenerate output")
    total = 0
    for path in regenerate_golden_files(args.directory, args.names):
        total += path.stat().st_size
        print(size_table_row(path))
    print(f"total {total:,} bytes")
    return 0
