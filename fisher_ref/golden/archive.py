"""The ``.npz`` container of a golden file, read without trusting it.

A golden file is a zip of ``.npy`` entries. Before anything is allocated the reader
checks that the file is a regular file of at most
:data:`fisher_ref.limits.MAX_GOLDEN_BYTES`, that the sizes its zip entries declare add
up to no more than that, that no entry name repeats, and that each ``.npy`` header's
shape and dtype account for exactly the bytes its entry holds; so a 200-byte file
claiming 10^12 floats, or a zip bomb, is a :class:`GoldenFileError`, not a
``MemoryError``. Shipped files (``fisher_ref/golden_data``) must also match the
SHA-256 recorded for them in :mod:`fisher_ref.golden.manifest`.

Standard library and numpy only, like the rest of the reader.
"""
from __future__ import annotations

import hashlib
import io
import math
import zipfile
import zlib
from importlib import resources
from pathlib import Path

import numpy as np

from fisher_ref.fileio import FileProblem, read_bytes
from fisher_ref.limits import MAX_GOLDEN_BYTES

__all__ = ["GoldenFileError", "read_raw", "members_of", "check_shipped",
           "check_claimed_name", "differs_from_shipped", "SHIPPED_DIR", "MAX_MEMBERS"]

#: Entries a golden file may hold (a file with a sampler and the matrices has 53).
MAX_MEMBERS = 256
_MAX_HEADER = 10_000  # bytes of one .npy header (numpy's own default limit)
SHIPPED_DIR = Path(str(resources.files("fisher_ref") / "golden_data"))


class GoldenFileError(ValueError):
    """A golden file is unreadable or inconsistent; the message names what is wrong."""


def read_raw(path):
    """The bytes of the golden file ``path``: a regular file of at most
    ``MAX_GOLDEN_BYTES``, else :class:`GoldenFileError` naming it."""
    try:
        return read_bytes(path, "golden file", MAX_GOLDEN_BYTES)
    except (OSError, FileProblem) as exc:
        raise GoldenFileError(f"cannot read golden file {path}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None


def check_shipped(path, raw):
    """A file in the shipped ``golden_data`` directory under a shipped name must have the
    SHA-256 the manifest records for that name (a check the file's own unkeyed hashes
    cannot give: a forger who rewrites them does not rewrite the installed manifest)."""
    from fisher_ref.golden.manifest import SHA256
    try:
        shipped = Path(path).resolve().parent == SHIPPED_DIR.resolve()
    except (OSError, RuntimeError):
        return
    if not shipped:
        return
    name = Path(path).stem
    want = SHA256.get(name)
    got = hashlib.sha256(raw).hexdigest()
    if want is None:  # not a shipped name (your own export written there): nothing to hold
        return
    if got != want:
        raise GoldenFileError(
            f"{path}: this shipped golden file's SHA-256 is {got[:16]}..., but the manifest "
            f"shipped with fisher_ref says {want[:16]}...: the file was changed after release; "
            "reinstall fisher_ref, or regenerate with `python -m fisher_ref.golden --regenerate`")


#: Meta fields a regeneration of a shipped file may change: the generator's version, the
#: hashes (rounding-level differences in the arrays change those) and whether the
#: matrices are stored (the arrays both files hold are compared).
_REGENERATED_FIELDS = ("generator", "sha256", "meta_sha256", "matrices")
#: How far a regenerated array may be from the shipped one, relative to the largest
#: value of the shipped file (rounding of another machine or version is about 1e-16).
CLAIM_RTOL = 1e-9


def check_claimed_name(path, raw, meta, arrays):
    """A golden file anywhere whose meta claims a shipped name (``meta["name"]``, say
    ``"default"``) must be that shipped file: its bytes hash to the SHA-256 of
    :mod:`fisher_ref.golden.manifest`, or it is a regeneration of it (the same meta but
    for :data:`_REGENERATED_FIELDS`; of the arrays both hold, integer ones equal and
    float ones within :data:`CLAIM_RTOL` of the shipped file's largest value). Else
    :class:`GoldenFileError`: an edited copy that rewrote its own unkeyed hashes cannot
    pass for the shipped file."""
    from fisher_ref.golden.manifest import SHA256
    name = meta.get("name")
    want = SHA256.get(name) if isinstance(name, str) else None
    got = hashlib.sha256(raw).hexdigest()
    if want is None or got == want:
        return
    differ = differs_from_shipped(meta, arrays)
    if not differ:
        return
    raise GoldenFileError(
        f"{path}: its meta claims the shipped name {name!r}, but it is not the shipped "
        f"golden file {name!r} ({differ}; its SHA-256 is {got[:16]}... where the manifest "
        f"shipped with fisher_ref records {want[:16]}...): edited after release? A golden "
        "file of your own must carry a name of its own (export it from task.with_(name=...))")


def differs_from_shipped(meta, arrays):
    """What makes a file (``meta``, ``arrays``) that claims a shipped name other than a
    regeneration of that shipped file, in words ("" if nothing, or if the name is not a
    shipped one)."""
    from fisher_ref.golden.manifest import SHA256
    name = meta.get("name")
    want = SHA256.get(name) if isinstance(name, str) else None
    if want is None:
        return ""
    shipped = _shipped_members(name, want)
    return "the shipped file cannot be read" if shipped is None else \
        _differences(meta, arrays, *shipped)


def _shipped_members(name, want):
    """``(meta, arrays)`` of the shipped file ``name`` if its bytes hash to ``want``."""
    import json
    path = SHIPPED_DIR / f"{name}.npz"
    try:
        raw = read_raw(path)
        if hashlib.sha256(raw).hexdigest() != want:
            return None
        members = members_of(path, raw)
        return json.loads(str(members.pop("meta"))), members
    except (GoldenFileError, KeyError, ValueError):
        return None


def _differences(meta, arrays, ship_meta, ship_arrays):
    """What differs between a file and the shipped one beyond a regeneration ("" if
    nothing)."""
    fields = sorted(k for k in set(meta) | set(ship_meta)
                    if k not in _REGENERATED_FIELDS and meta.get(k) != ship_meta.get(k))
    if fields:
        return f"meta {', '.join(fields)} differ from the shipped file's"
    floats = [np.abs(a).max(initial=0.0) for a in ship_arrays.values() if a.dtype.kind == "f"]
    tol = CLAIM_RTOL * float(max(floats, default=0.0))
    for key in sorted(set(arrays) & set(ship_arrays)):
        a, b = arrays[key], ship_arrays[key]
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"array {key!r} has another shape or dtype"
        same = np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
        if not same and (a.dtype.kind != "f" or not np.all(np.abs(a - b) <= tol)):
            return f"array {key!r} differs from the shipped file's"
    return ""


def _check_entry(path, zf, info):
    """The ``.npy`` header of one entry must account for exactly its declared size."""
    key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
    try:
        with zf.open(info) as fh:
            head = io.BytesIO(fh.read(_MAX_HEADER + 16))
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
        raise GoldenFileError(f"{path}: array {key!r} is corrupted: {exc}") from None
    try:
        version = np.lib.format.read_magic(head)
        reader = {(1, 0): np.lib.format.read_array_header_1_0,
                  (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if reader is None:
            raise ValueError(f"unsupported .npy version {version}")
        shape, _, dtype = reader(head)
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
        raise GoldenFileError(f"{path}: array {key!r} has no readable .npy header: {exc}") \
            from None
    if dtype.hasobject:
        raise GoldenFileError(f"{path}: array {key!r} holds Python objects; golden arrays "
                              "are float64, int64 or a string")
    need = head.tell() + math.prod(shape) * dtype.itemsize
    if need != info.file_size:
        raise GoldenFileError(
            f"{path}: array {key!r} claims shape {tuple(shape)} of {dtype.str} "
            f"({need:,} bytes with its header), but its entry holds {info.file_size:,} bytes")
    return key


def members_of(path, raw):
    """Every ``.npy`` entry of the zip ``raw`` as ``{key: array}``, checked as the module
    docstring says before it is read; :class:`GoldenFileError` for anything else."""
    if not zipfile.is_zipfile(io.BytesIO(raw)):
        raise GoldenFileError(
            f"{path} is not a golden file: not a valid .npz (zip) archive ({len(raw)} bytes; "
            "truncated or not an .npz)")
    out = {}
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            infos = zf.infolist()
            names = [n[:-4] if n.endswith(".npy") else n for n in (i.filename for i in infos)]
            if len(infos) > MAX_MEMBERS:
                raise GoldenFileError(f"{path}: {len(infos):,} zip entries, more than the "
                                      f"{MAX_MEMBERS} a golden file can hold")
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise GoldenFileError(f"{path}: zip entries {twice} appear more than once")
            declared = sum(i.file_size for i in infos)
            if declared > MAX_GOLDEN_BYTES:
                raise GoldenFileError(
                    f"{path}: its zip entries declare {declared:,} bytes uncompressed, more "
                    f"than the limit of {MAX_GOLDEN_BYTES:,} bytes (a zip bomb?)")
            for info in infos:
                key = _check_entry(path, zf, info)
                try:
                    data = zf.read(info)
                except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
                    raise GoldenFileError(f"{path}: array {key!r} is corrupted: {exc}") from None
                try:
                    out[key] = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
                except (ValueError, OSError, EOFError) as exc:
                    raise GoldenFileError(
                        f"{path}: array {key!r} is not a readable .npy array: {exc}") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError,
            ValueError, NotImplementedError) as exc:
        if isinstance(exc, GoldenFileError):
            raise
        raise GoldenFileError(f"{path}: broken .npz (zip) archive, truncated?: {exc}") from None
    return out
