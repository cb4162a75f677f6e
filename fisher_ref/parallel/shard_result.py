"""What a shard of an exact run returns, and how shards are told apart: the
:class:`ShardResult` both kinds of shard return (subtrees, :mod:`fisher_ref.parallel.shards`;
parameter slices, :mod:`fisher_ref.parallel.param_shards`), the :class:`ShardError` a merge
raises, the check of ``(i, n)``, the task digest that keeps shards of different tasks
apart, and the checksum of a shard's payload (:meth:`ShardResult.digest`), taken when the
shard is made and checked before a merge reads it (:func:`check_payload`)."""
from __future__ import annotations

import contextvars
import hashlib
import json
import pickle
from contextlib import contextmanager
from dataclasses import dataclass, fields

import numpy as np

from fisher_ref.engine.moments import Moments
from fisher_ref.engine.plan import Cost

__all__ = ["ShardError", "ShardResult", "check_arrays", "check_payload", "check_shard",
           "merged_here", "task_key"]

#: Inside :func:`merged_here`: shards are made without their checksum, and one without a
#: checksum is merged.
_HERE = contextvars.ContextVar("fisher_ref_merged_here", default=False)


@contextmanager
def merged_here():
    """Shards made inside the block (in this thread) carry no checksum, and a merge inside it
    takes a shard without one: for shards made and merged by the same call, which no one
    else holds in between (the caller's own shard of ``exact(task, workers=N)``, whose
    per-state and per-response records would otherwise be hashed twice for nothing). A
    shard with a checksum is checked as anywhere; the workers' shards, made in their own
    processes, carry theirs."""
    token = _HERE.set(True)
    try:
        yield
    finally:
        _HERE.reset(token)


class ShardError(ValueError):
    """Shard results that do not make one whole run (missing, repeated or foreign)."""


def check_shard(shard):
    """``shard`` as a pair of ints ``(i, n)`` with ``0 <= i < n``."""
    ok = isinstance(shard, (tuple, list)) and len(shard) == 2 and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in shard)
    if not ok or not 0 <= shard[0] < shard[1]:
        raise ValueError(f"shard must be a pair (i, n) of integers with 0 <= i < n "
                         f"(shard i of n), got {shard!r}")
    return int(shard[0]), int(shard[1])


def task_key(task):
    """A digest of the task (its file form and parameters, else its pickle): shards of
    different tasks are not merged."""
    try:
        text = json.dumps(task.to_json(), sort_keys=True, default=str).encode()
    except (TypeError, ValueError, AttributeError):
        try:
            text = pickle.dumps(task)
        except Exception:  # noqa: BLE001 (a task that neither writes nor pickles)
            return None
    h = hashlib.sha256(text)
    h.update(np.ascontiguousarray(task.theta, dtype=float).tobytes())
    h.update(np.ascontiguousarray(task.prompt_weights, dtype=float).tobytes())
    return h.hexdigest()


@dataclass
class ShardResult:
    """The raw sums of one shard (picklable; small unless rows were kept).

    Attributes:
        shard: ``(i, n)``; key: the task's digest and the options that shape the result.
        quantities, streams, cost: as in the whole run (``cost`` of the whole run).
        moments: ``{stream: {field: value}}``, the fields of
            :class:`fisher_ref.engine.moments.Moments`.
        grad_ad: ``(P,)`` the shard's part of the autodiff gradient.
        states, sequences: this shard's per-state / per-response rows (``None`` when
            not kept), each with ``place``, its row in the sorted arrays.
        window_tables: per-window arrays the kept states read through ``states["window"]``.
        windows: a parameter shard's ``(U, k)`` window of each row of its ``window_tables``
            (each shard numbers the windows in the order its own walk first meets them,
            which its block sizes, set by its width, can change).
        n_states: states the shard added.
        columns: a parameter shard's parameters (a slice, or the MLP's
            :class:`fisher_ref.engine.mlp_columns.UnitColumns`); ``None`` for a subtree cut.
        checksum: the SHA-256 of all the above (:meth:`digest`), taken when the result is
            made (left ``None``, it is taken then; not inside :func:`merged_here`); a merge
            refuses a shard whose payload no longer matches it (:func:`check_payload`).
    """

    shard: tuple
    key: tuple
    quantities: str
    streams: list
    cost: Cost
    moments: dict
    grad_ad: np.ndarray
    states: dict = None
    sequences: dict = None
    window_tables: dict = None
    windows: np.ndarray = None
    n_states: int = 0
    # a parameter shard: the parameters it holds, a slice or (the MLP's hidden units) a
    # fisher_ref.engine.mlp_columns.UnitColumns; None for a subtree cut
    columns: object = None
    checksum: str = None

    def __post_init__(self):
        if self.checksum is None and not _HERE.get():
            self.checksum = self.digest()

    @property
    def label(self):
        """``"shard i of n"`` (``"parameter shard i of n"``): how messages name it."""
        kind = "shard" if self.columns is None else "parameter shard"
        return f"{kind} {self.shard[0]} of {self.shard[1]}"

    def digest(self):
        """The SHA-256 (hex) of what a merge reads: every field but :attr:`checksum`, each
        array by its dtype, shape and bytes (read in place where it is contiguous, as a
        worker's arrays read from shared memory are), dicts in the order of their keys."""
        h = hashlib.sha256()
        for f in fields(self):
            if f.name != "checksum":
                _feed(h, f.name, getattr(self, f.name))
        return h.hexdigest()

    @property
    def nbytes(self):
        """Bytes of the arrays held (what a worker sends back)."""
        parts = [v for m in self.moments.values() for v in m.values()] + [self.grad_ad]
        for d in (self.states, self.sequences, self.window_tables):
            parts += list((d or {}).values())
        return sum(getattr(v, "nbytes", 8) for v in parts)


def _feed(h, name, value):
    """``value`` into the hash ``h`` under ``name``: arrays by dtype, shape and bytes, dicts
    key by key (sorted), numbers by their float64 or int64 bytes, the rest by ``repr``."""
    h.update(f"|{name}:".encode())
    if isinstance(value, np.ndarray):
        h.update(f"{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).reshape(-1).view(np.uint8))
    elif isinstance(value, dict):
        h.update(b"{")
        for k in sorted(value, key=str):
            _feed(h, str(k), value[k])
        h.update(b"}")
    elif isinstance(value, (float, np.floating)):
        h.update(b"f" + np.float64(value).tobytes())
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        h.update(b"i" + np.int64(value).tobytes())
    else:
        h.update(repr(value).encode())


def check_payload(part):
    """Raise :class:`ShardError`, naming the shard, unless ``part``'s payload still has the
    checksum it was made with (:meth:`ShardResult.digest`): a sum scaled, an array cut short
    or a field changed since the shard was made is refused, never merged."""
    if part.checksum is None and _HERE.get():  # made by this very call (merged_here)
        return
    if part.checksum is None or part.digest() != part.checksum:
        raise ShardError(f"{part.label}: its sums or arrays differ from those it was made with "
                         "(its checksum, a SHA-256 of its payload, does not match): it was "
                         "changed or damaged since; run the shard again")


def check_arrays(part, P, T, width):
    """Raise :class:`ShardError`, naming the shard, unless ``part``'s sums have the shapes of
    a run of ``P`` parameters, ``T`` steps, ``width`` of them held by the shard (``P`` for a
    subtree shard): every field of :class:`fisher_ref.engine.moments.Moments` per stream at
    its shape with ``width`` columns, and the autodiff gradient ``(P,)``."""
    want = {k: v.shape for k, v in vars(Moments(width, T)).items() if isinstance(v, np.ndarray)}
    for stream, m in part.moments.items():
        for field, shape in want.items():
            got = getattr(m.get(field), "shape", None)
            if got != shape:
                raise ShardError(f"{part.label}: the sum {field!r} of stream {stream!r} has "
                                 f"shape {got}, not {shape} ({width} parameters held, "
                                 f"{T} steps): the shard is truncated or of another run")
    got = getattr(part.grad_ad, "shape", None)
    if got != (P,):
        raise ShardError(f"{part.label}: its autodiff gradient has shape {got}, not ({P},): "
                         "the shard is truncated or of another run")
    for what in ("states", "sequences"):  # kept rows: one length per part
        lengths = {k: len(v) for k, v in (getattr(part, what) or {}).items()
                   if isinstance(v, np.ndarray) and v.ndim}
        if len(set(lengths.values())) > 1:
            raise ShardError(f"{part.label}: its per-{what[:-1]} arrays differ in length "
                             f"({lengths}): the shard is truncated")
