"""Files the package reads and writes: bounded reads, atomic writes, OS errors as clear input errors.

**Reads** (:func:`read_text`, :func:`read_bytes`) take only a regular file (a FIFO, a
device such as ``/dev/zero``, a socket or a directory is refused before it is opened,
so nothing blocks or reads without end) of at most a given number of bytes.

**Writes** (:func:`atomic_output`) go to a temporary file created in the target's
directory only when the data is ready, moved onto the target with :func:`os.replace`
once complete, so a failed export, a full disk or a signal never leaves a truncated
file behind. The file gets the mode a new file gets from the umask (``0o666 &
~umask``), not the temporary file's ``0600``. An output path must be a regular file
or not exist yet: a FIFO, a device, a socket or a directory is refused (replacing
``/dev/null`` with a regular file would break the system), and so is a path written
as a directory (``out/``). A **symlink** as the output path is followed: the regular
file it points to is replaced (the link stays a link); a link that points nowhere or
to something that is not a regular file is refused.

OS errors (a missing directory, permission denied, disk full) become
:class:`FileProblem` (a ``ValueError``) naming the path, which the command line turns
into exit code 2. :func:`strict_json` parses JSON refusing what Python's ``json``
accepts silently (duplicate keys, ``NaN``, integers of thousands of digits).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
from pathlib import Path

__all__ = ["FileProblem", "atomic_output", "read_text", "read_bytes", "check_output_path",
           "check_input_path", "same_file", "strict_json", "MAX_JSON_DEPTH"]

#: Deepest nesting of arrays and objects :func:`strict_json` takes (a task file needs 3).
MAX_JSON_DEPTH = 64
_INT_DIGITS = 4300  # longer JSON integers (past Python's own limit) are read as floats: inf


class FileProblem(ValueError):
    """A file could not be read or written; the message names the path and the reason."""


def _path(path, what):
    if not isinstance(path, (str, os.PathLike)) or str(path) == "":
        raise FileProblem(f"{what}: a file path is required, got {path!r}")
    return Path(path)


def _describe(exc):
    return exc.strerror or type(exc).__name__


def _kind(mode):
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def check_output_path(path, what="output file"):
    """``path`` as a ``Path`` if a file could be written there; else :class:`FileProblem`
    naming it: empty, ``-`` (standard output, which is not written to), written as a
    directory (``out/``), an existing directory, FIFO,
    device or socket, a symlink to nothing or to such a thing, or in a directory that
    does not exist. Run before a long computation, so that a bad ``--out`` is refused
    at once.

    Example:
        >>> check_output_path("")
        Traceback (most recent call last):
        ...
        fisher_ref.fileio.FileProblem: output file: a file path is required, got ''
    """
    _path(path, what)
    text = os.fspath(path)  # as given: Path("out/") would drop the slash
    path = Path(text)
    if text == "-":
        raise FileProblem(f"{what} '-' would be a file literally named '-' (writing to "
                          "standard output is not supported): give a file name (./- for a "
                          "file named '-')")
    if text.endswith(("/", os.sep)) or (os.altsep and text.endswith(os.altsep)):
        raise FileProblem(f"{what} {text!r} names a directory (it ends with a slash); "
                          "give a file name")
    if path.is_dir():
        raise FileProblem(f"{what} {text!r} is a directory, not a file")
    if path.is_symlink() and not path.exists():
        raise FileProblem(f"{what} {text!r} is a symlink to {os.readlink(path)!r}, which "
                          "does not exist; refusing to create a file through it")
    with contextlib.suppress(OSError):
        mode = path.stat().st_mode  # follows a symlink
        if not stat.S_ISREG(mode):
            raise FileProblem(f"{what} {text!r} exists and is {_kind(mode)}, not a regular "
                              "file; refusing to replace it")
    parent = path.resolve().parent if path.is_symlink() else path.parent
    if not parent.is_dir():
        raise FileProblem(f"{what} {text!r}: the directory {str(parent)!r} does not exist")
    return path


def same_file(a, b):
    """True when paths ``a`` and ``b`` name one existing file (after symlinks)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError, TypeError):
        return False


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(path, what="output file"):
    """Yield a temporary path beside ``path``; move it onto ``path`` when the block ends
    without error, delete it otherwise. Enter the block only when the data is ready:
    the temporary file exists only inside it. A symlink ``path`` is followed (the file
    it points to is replaced); the file's mode follows the umask.

    Raises:
        FileProblem: ``path`` is refused by :func:`check_output_path`, or the write
            fails (permission, disk full), naming the path.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> with atomic_output(d / "x.txt") as tmp:
        ...     _ = pathlib.Path(tmp).write_text("done")
        >>> (d / "x.txt").read_text(), sorted(p.name for p in d.iterdir())
        ('done', ['x.txt'])
    """
    path = check_output_path(path, what)
    target = path.resolve() if path.is_symlink() else path
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise FileProblem(f"cannot write {what} {str(path)!r}: {_describe(exc)}") from None
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        check_output_path(path, what)  # nothing else appeared there meanwhile
        os.replace(tmp, target)
    except OSError as exc:
        raise FileProblem(f"cannot write {what} {str(path)!r}: {_describe(exc)}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def check_input_path(path, what="input file", max_bytes=None):
    """``path`` as a ``Path`` if it is a regular file of at most ``max_bytes`` bytes;
    ``FileNotFoundError`` if it does not exist, else :class:`FileProblem` naming it (a
    directory, FIFO, device or socket is refused without being opened)."""
    path = _path(path, what)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {str(path)!r}") from None
    except OSError as exc:
        raise FileProblem(f"cannot read {what} {str(path)!r}: {_describe(exc)}") from None
    if stat.S_ISDIR(st.st_mode):
        raise FileProblem(f"{what} {str(path)!r} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise FileProblem(f"{what} {str(path)!r} is {_kind(st.st_mode)}, not a regular file; "
                          "only regular files are read")
    if max_bytes is not None and st.st_size > max_bytes:
        raise FileProblem(f"{what} {str(path)!r} is {st.st_size:,} bytes, more than the "
                          f"limit of {max_bytes:,} bytes")
    return path


def read_bytes(path, what="input file", max_bytes=None):
    """The bytes of the regular file ``path`` (at most ``max_bytes``); errors as
    :func:`check_input_path`, and :class:`FileProblem` if it grew past the limit."""
    path = check_input_path(path, what, max_bytes)
    try:
        with open(path, "rb") as fh:
            data = fh.read() if max_bytes is None else fh.read(max_bytes + 1)
    except OSError as exc:
        raise FileProblem(f"cannot read {what} {str(path)!r}: {_describe(exc)}") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise FileProblem(f"{what} {str(path)!r} is more than the limit of {max_bytes:,} bytes")
    return data


def read_text(path, what="input file", max_bytes=None):
    """The UTF-8 text of the regular file ``path`` (at most ``max_bytes`` bytes, checked
    before it is read); :class:`FileProblem` naming the path on any OS or decoding error
    (``FileNotFoundError`` is kept for a missing file)."""
    path = check_input_path(path, what, max_bytes)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise FileProblem(f"{what} {str(path)!r} is not UTF-8 text ({exc.reason} at byte "
                          f"{exc.start})") from None
    except OSError as exc:
        raise FileProblem(f"cannot read {what} {str(path)!r}: {_describe(exc)}") from None
    if max_bytes is not None and len(text) > max_bytes:  # it grew since it was checked
        raise FileProblem(f"{what} {str(path)!r} is more than the limit of {max_bytes:,} bytes")
    return text


def _pairs_hook(what, error):
    def hook(pairs):
        out = {}
        for key, value in pairs:
            if key in out:
                raise error(f"{what}: the key {key!r} appears twice in one object; "
                            "JSON keys must be unique")
            out[key] = value
        return out
    return hook


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")
_LONG_INT = re.compile(r"\d{%d}" % (_INT_DIGITS + 1))


def _depth(bare):
    """Deepest nesting of arrays and objects in JSON text whose strings were removed
    (one pass of a regular expression: a 9 MB file takes a fraction of a second)."""
    depth = deepest = 0
    for m in _BRACKETS.finditer(bare):
        depth += 1 if m.group() in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def strict_json(text, what="JSON", error=ValueError):
    """``json.loads(text)`` refusing duplicate keys, ``NaN``/``Infinity`` and nesting
    deeper than :data:`MAX_JSON_DEPTH` (``error`` naming ``what``); integers longer
    than 4,300 digits (Python's conversion limit) are read as floats (inf), so a field's own check refuses them by name
    instead of Python's integer-conversion limit.

    Example:
        >>> strict_json('{"a": 1, "a": 2}', "task file")
        Traceback (most recent call last):
        ...
        ValueError: task file: the key 'a' appears twice in one object; JSON keys must be unique
    """
    def constant(name):
        raise error(f"{what}: {name} is not a JSON number (write a finite number)")

    def integer(digits):
        return int(digits) if len(digits.lstrip("-")) <= _INT_DIGITS else float(digits)

    bare = _STRINGS.sub('""', text)
    if _depth(bare) > MAX_JSON_DEPTH:  # before parsing: no RecursionError
        raise error(f"{what} is nested too deeply (more than {MAX_JSON_DEPTH} levels)")
    long_int = _LONG_INT.search(bare) is not None  # the hook costs a call per integer
    try:
        return json.loads(text, object_pairs_hook=_pairs_hook(what, error),
                          parse_constant=constant, parse_int=integer if long_int else None)
    except json.JSONDecodeError as exc:
        raise error(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise error(f"{what} is nested too deeply (more than {MAX_JSON_DEPTH} levels)") \
            from None
