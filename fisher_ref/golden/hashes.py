"""The hashes a golden file's meta records: the SHA-256 of every array's bytes and of the
canonical JSON of the meta itself (``meta_sha256``).
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

__all__ = ["array_sha256", "canonical_json", "meta_sha256"]


def array_sha256(a):
    """SHA-256 (hex) of an array's raw bytes in C order, as stored (little-endian).

    Example:
        >>> array_sha256(np.zeros(2))[:16]
        '374708fff7719dd5'
    """
    return hashlib.sha256(np.ascontiguousarray(a).tobytes(order="C")).hexdigest()


def canonical_json(obj):
    """``json.dumps`` with sorted keys, no spaces, ASCII only, NaN refused."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=True)


def meta_sha256(meta):
    """SHA-256 (hex) of the canonical JSON of ``meta`` without its ``meta_sha256`` field.

    Canonical JSON: ``json.dumps(meta, sort_keys=True, separators=(",", ":"),
    ensure_ascii=True)`` (Python's defaults otherwise), encoded as ASCII.

    Example:
        >>> meta_sha256({"b": 1, "a": [2.5], "meta_sha256": "ignored"})[:16]
        '11cf70519f8728b2'
    """
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()
