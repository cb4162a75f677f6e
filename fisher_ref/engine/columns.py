"""The parameters a run forms its sums over: all ``P``, a slice of ``0..P``, or for the MLP a
set cut between hidden units (:class:`fisher_ref.engine.mlp_scores.UnitColumns`). Every sum
the engine forms is a sum per parameter, so a run over some columns holds exactly those
columns of a whole run's sums (the parameter shards of :mod:`fisher_ref.parallel.param_shards`
are such runs)."""
from __future__ import annotations

import numpy as np

__all__ = ["param_columns", "column_index", "column_count"]


def param_columns(P, n):
    """``n`` slices of the ``P`` parameters: consecutive, as equal as whole parameters
    allow (their sizes differ by one at most): the parameter shards of a model other than the
    MLP (:func:`fisher_ref.engine.factored.shard_columns`).

    Example:
        >>> param_columns(5, 2)
        [slice(0, 2, None), slice(2, 5, None)]
    """
    return [slice(i * P // n, (i + 1) * P // n) for i in range(n)]


def column_index(columns, P):
    """The parameters a run over ``columns`` holds, ``(width,)`` in the order of its
    columns: a slice of ``0..P``, or a set with an ``index`` (as
    :class:`fisher_ref.engine.mlp_scores.UnitColumns`)."""
    return np.arange(P)[columns] if isinstance(columns, slice) else columns.index


def column_count(columns, P):
    """How many parameters a run over ``columns`` (:func:`column_index`) holds."""
    return len(range(P)[columns]) if isinstance(columns, slice) else columns.width
