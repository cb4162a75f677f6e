r"""The golden-file format: its keys, its comparison scales, the writer and the checked reader.

This module imports only numpy and the standard library (plus
:mod:`fisher_ref.fileio`, itself standard library only), so checking an
implementation against a golden file never loads autograd, scipy or the
engines. The export side, which runs the exact engine, is :mod:`fisher_ref.golden`.

A golden file is an ``.npz``; key ``meta`` holds a JSON string (schema,
version, model, task, parameter layout, sizes, a SHA-256 of every other array,
and ``meta_sha256``, the SHA-256 of the canonical JSON of the meta itself
without that field); every other key is a little-endian float64 or int64 array.
The format is written out key by key in ``docs/golden_format.md``.

Files are byte-for-byte reproducible on one machine: the zip is written by hand
with fixed timestamps, no compression and sorted keys, and the JSON with sorted
keys and ``repr`` floats.

The keys and scales are defined in :mod:`fisher_ref.golden.schema`, the hashes in
:mod:`fisher_ref.golden.hashes` and the reader's checks in
:mod:`fisher_ref.golden.validation`; this module writes and reads a file.
"""
from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

from fisher_ref.fileio import atomic_output
from fisher_ref.golden.archive import (GoldenFileError, check_claimed_name, check_shipped,
                                      members_of, read_raw)
from fisher_ref.golden.hashes import array_sha256, canonical_json, meta_sha256
from fisher_ref.golden.schema import (MATRIX_KEYS, MATRIX_MAX_PARAMS,  # noqa: F401
                                      OFF_POLICY_KEYS, OLDEST_READABLE_VERSION, ON_POLICY_KEYS,
                                      REGENERATE_HINT, SCALE_KINDS, SCHEMA, SCHEMA_VERSION,
                                      expected_keys, scale_kind)
from fisher_ref.golden.validation import (VALUE_RTOL, check_arrays,  # noqa: F401
                                          check_meta, check_values)
from fisher_ref.limits import MAX_GOLDEN_BYTES

__all__ = ["SCHEMA", "SCHEMA_VERSION", "OLDEST_READABLE_VERSION", "MATRIX_MAX_PARAMS",
           "ON_POLICY_KEYS", "OFF_POLICY_KEYS", "MATRIX_KEYS", "SCALE_KINDS", "expected_keys",
           "scale_kind", "GoldenFileError", "Golden", "array_sha256", "meta_sha256",
           "canonical_json", "write_npz", "read_members", "load_golden"]

_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip entry can hold


def write_npz(path, meta, arrays):
    """Write a deterministic ``.npz`` atomically: sorted entries, fixed date, stored
    (no compression). A failed write leaves no file behind (and an old file intact)."""
    entries = dict(arrays)
    entries["meta"] = np.array(canonical_json(meta))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for key in sorted(entries):
            info = zipfile.ZipInfo(key + ".npy", date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3
            info.external_attr = 0o644 << 16
            data = io.BytesIO()
            np.lib.format.write_array(data, np.asarray(entries[key]), version=(1, 0),
                                      allow_pickle=False)
            zf.writestr(info, data.getvalue())
    if buf.tell() > MAX_GOLDEN_BYTES:
        raise ValueError(f"the golden file would be {buf.tell():,} bytes, more than the limit "
                         f"of {MAX_GOLDEN_BYTES:,} bytes (fisher_ref.limits.MAX_GOLDEN_BYTES)")
    with atomic_output(path, "golden file") as tmp:
        Path(tmp).write_bytes(buf.getvalue())
    return Path(path)


class Golden:
    """A loaded golden file: ``meta`` (dict) and ``arrays`` (dict); ``g[key]`` reads an array."""

    def __init__(self, meta, arrays, path=None):
        self.meta, self.arrays, self.path = meta, arrays, path

    def __getitem__(self, key):
        return self.arrays[key]

    def __contains__(self, key):
        return key in self.arrays

    def keys(self):
        return self.arrays.keys()

    @property
    def name(self):
        return self.meta.get("name")

    @property
    def sizes(self):
        return self.meta["sizes"]

    def __repr__(self):
        return f"Golden({self.name!r}, {len(self.arrays)} arrays, sizes={self.sizes})"


def read_members(path):
    """Every ``.npy`` entry of the ``.npz`` at ``path`` as ``{key: array}`` (no checks
    beyond readability and the bounds of :mod:`fisher_ref.golden.archive`);
    :class:`GoldenFileError` for anything unreadable."""
    return members_of(path, read_raw(path))


def load_golden(path):
    """Load and check a golden file: a regular file within the size limit, the shipped
    manifest (for the shipped files), zip, meta, schema, version, hashes (meta's own,
    then the arrays'), keys, dtypes, shapes, cheap identities of the values
    (:func:`check_values`), and a shipped name claimed by the meta (the file must then
    be the shipped one or a regeneration of it:
    :func:`~fisher_ref.golden.archive.check_claimed_name`).

    Raises:
        GoldenFileError: naming the first thing that is wrong, in that order.

    Returns:
        :class:`Golden` with ``meta`` and ``arrays``.
    """
    raw = read_raw(path)
    check_shipped(path, raw)
    members = members_of(path, raw)
    try:
        meta = check_meta(path, members)
        check_arrays(path, meta, members)
        check_values(path, meta, members)
        check_claimed_name(path, raw, meta, members)
    except GoldenFileError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError,
            RecursionError, MemoryError) as exc:  # a malformed file no check above foresaw
        raise GoldenFileError(f"{path}: malformed golden file ({type(exc).__name__}: "
                              f"{exc})") from None
    return Golden(meta, members, path)
