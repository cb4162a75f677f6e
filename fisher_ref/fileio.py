"""Files the package reads and writes: atomic writes and OS errors as clear input errors.

A write goes to a temporary file in the target's directory and is moved onto the
target with :func:`os.replace` only once complete, so a failed export or a full
disk never leaves a truncated file behind. OS errors (a directory where a file is
expected, a missing directory, permission denied, disk full) become
:class:`FileProblem` (a ``ValueError``) naming the path, which the command line
turns into exit code 2.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["FileProblem", "atomic_output", "read_text", "check_output_path"]


class FileProblem(ValueError):
    """A file could not be read or written; the message names the path and the reason."""


def _path(path, what):
    if not isinstance(path, (str, os.PathLike)) or str(path) == "":
        raise FileProblem(f"{what}: a file path is required, got {path!r}")
    return Path(path)


def _describe(exc):
    return exc.strerror or type(exc).__name__


def check_output_path(path, what="output file"):
    """``path`` as a ``Path`` if a file could be written there; else :class:`FileProblem`
    naming it (empty, a directory, or in a directory that does not exist). Run before
    a long computation, so that a bad ``--out`` is refused at once.

    Example:
        >>> check_output_path("")
        Traceback (most recent call last):
        ...
        fisher_ref.fileio.FileProblem: output file: a file path is required, got ''
    """
    path = _path(path, what)
    if path.is_dir():
        raise FileProblem(f"{what} {str(path)!r} is a directory, not a file")
    parent = path.parent
    if not parent.is_dir():
        raise FileProblem(f"{what} {str(path)!r}: the directory {str(parent)!r} does not exist")
    return path


@contextlib.contextmanager
def atomic_output(path, what="output file"):
    """Yield a temporary path beside ``path``; move it onto ``path`` when the block ends
    without error, delete it otherwise.

    Raises:
        FileProblem: ``path`` is empty, a directory, in a missing directory, or the
            write fails (permission, disk full), naming the path.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> with atomic_output(d / "x.txt") as tmp:
        ...     _ = pathlib.Path(tmp).write_text("done")
        >>> (d / "x.txt").read_text(), sorted(p.name for p in d.iterdir())
        ('done', ['x.txt'])
    """
    path = check_output_path(path, what)
    parent = path.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise FileProblem(f"cannot write {what} {str(path)!r}: {_describe(exc)}") from None
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        raise FileProblem(f"cannot write {what} {str(path)!r}: {_describe(exc)}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def read_text(path, what="input file"):
    """The UTF-8 text of ``path``; :class:`FileProblem` naming the path on any OS or
    decoding error (``FileNotFoundError`` is kept for a missing file)."""
    path = _path(path, what)
    if path.is_dir():
        raise FileProblem(f"{what} {str(path)!r} is a directory, not a file")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {str(path)!r}") from None
    except UnicodeDecodeError as exc:
        raise FileProblem(f"{what} {str(path)!r} is not UTF-8 text ({exc.reason} at byte "
                          f"{exc.start})") from None
    except OSError as exc:
        raise FileProblem(f"cannot read {what} {str(path)!r}: {_describe(exc)}") from None
