"""What a shard of an exact run returns, and how shards are told apart: the
:class:`ShardResult` both kinds of shard return (subtrees, :mod:`fisher_ref.parallel.shards`;
parameter slices, :mod:`fisher_ref.parallel.param_shards`), the :class:`ShardError` a merge
raises, the check of ``(i, n)``, and the task digest that keeps shards of different tasks
apart."""
from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import dataclass

import numpy as np

from fisher_ref.engine.plan import Cost

__all__ = ["ShardError", "ShardResult", "check_shard", "task_key"]


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

    @property
    def nbytes(self):
        """Bytes of the arrays held (what a worker sends back)."""
        parts = [v for m in self.moments.values() for v in m.values()] + [self.grad_ad]
        for d in (self.states, self.sequences, self.window_tables):
            parts += list((d or {}).values())
        return sum(getattr(v, "nbytes", 8) for v in parts)
