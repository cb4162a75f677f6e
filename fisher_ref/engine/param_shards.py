"""Parameter shards of one exact run: ``exact(task, param_shard=(i, n))`` walks the whole
tree for the ``i``-th slice of the parameters (:func:`param_columns`); every sum the engine
forms is a sum per parameter, so the slices are placed side by side (:func:`merge_params`,
which :func:`fisher_ref.engine.shards.merge` calls for them). What ``exact(task,
workers=N)`` runs."""
from __future__ import annotations

import numpy as np

from fisher_ref.engine.moments import Moments, finish_fisher, finish_stream
from fisher_ref.engine.shard_result import ShardError, ShardResult, task_key
from fisher_ref.results import ExactResult, GatheredStates

__all__ = ["param_columns", "param_shard_result", "merge_params"]


def param_columns(P, n, cuts=()):
    """The ``n`` parameter slices of ``exact(task, param_shard=(i, n))``: consecutive,
    as equal as whole parameters allow (the first ``P mod n`` one wider), each bound moved
    to the nearest of ``cuts`` within a quarter of a slice's width, where there is one.

    ``cuts``: places where a cut saves work (:func:`fisher_ref.models.mlp_scores.family_cuts`
    for the MLP: a slice that holds part of a block that shares its factors with its bias
    forms those factors whole, so a slice cut inside ``W1``'s family and the next both pay
    for them). A bound that would not stay between its neighbours stays where it was, so
    every slice keeps at least one parameter."""
    bounds = [i * P // n for i in range(n + 1)]
    reach = P / (4 * n)
    for i in range(1, n):
        near = [c for c in cuts
                if abs(c - bounds[i]) <= reach and bounds[i - 1] < c < bounds[i + 1]]
        if near:
            bounds[i] = min(near, key=lambda c: (abs(c - bounds[i]), c))
    return [slice(bounds[i], bounds[i + 1]) for i in range(n)]


def param_shard_result(run, result, shard, tables, keep, windows=None):
    """The :class:`ShardResult` of a parameter shard: ``run`` (a finished
    :class:`fisher_ref.engine.run.Run` over the parameters ``run.columns``) and its
    ``result``; the per-state records and per-response arrays (which do not depend on the
    parameters; the last shard only, which forms the autodiff gradient too) and ``tables``, the
    per-window arrays of its parameters, when kept, with ``windows``, the window of each
    of their rows; ``keep``: the run's planned ``(keep_states, keep_sequences)``, the same
    in every shard of it."""
    key = (task_key(run.task), repr(run.streams), run.quantities, bool(keep[0]), bool(keep[1]),
           "params")
    states = None
    if run.keep_states and run.records:
        states = dict(result.states)
    return ShardResult(shard=shard, key=key, quantities=run.quantities,
                       streams=list(run.streams), cost=run.cost,
                       moments={k: dict(vars(m)) for k, m in run.moments.items()},
                       grad_ad=run.grad_ad, states=states,
                       sequences=result.sequences,
                       window_tables=tables, windows=windows, n_states=run.cost.n_states,
                       columns=run.columns)


def merge_params(task, parts):
    """Parameter shards (sorted) into one result: every parameter-indexed sum is its
    shard's columns, placed side by side; the sums that hold no parameter (probability
    mass, rewards, their spread) are the same in every shard and are taken from the first;
    the per-state and per-response rows and the autodiff gradient are the last's (the shard
    that formed them)."""
    P, T, head, last = task.model.num_params, task.max_len, parts[0], parts[-1]
    cols = [p.columns for p in parts]
    if cols[0].start != 0 or cols[-1].stop != P or any(
            a.stop != b.start for a, b in zip(cols, cols[1:])):
        raise ShardError(f"the parameter shards hold columns {[(c.start, c.stop) for c in cols]}"
                         f", which do not tile 0..{P}")
    for p in parts[1:]:  # the sums without parameters: the same walk gave the same numbers
        for name, m in p.moments.items():  # (to rounding: the sub-blocks follow the width)
            h = head.moments[name]
            if m["r0"] != h["r0"] or not abs(m["mass"] - h["mass"]) <= 1e-12 * h["mass"]:
                raise ShardError(f"parameter shards {head.shard} and {p.shard} disagree on "
                                 f"the probability mass or reference reward of stream "
                                 f"{name!r}: they did not walk the same tree")
    kept_states, kept_seqs = head.key[3], head.key[4] and head.quantities == "all"
    if (kept_states and last.states is None) or (kept_seqs and last.sequences is None):
        raise ShardError(f"parameter shard {last.shard} holds no per-state or per-response "
                         f"records, which its run kept: it did not run as the last shard")
    results = {}
    for stream in head.streams:
        name, m = stream.name, Moments(P, T)
        for field, value in head.moments[stream.name].items():
            if isinstance(value, np.ndarray):
                value = np.concatenate([p.moments[name][field] for p in parts], axis=-1)
            setattr(m, field, value)
        results[name] = finish_fisher(m) if head.quantities == "fisher" else \
            finish_stream(m, task.baseline)
    seqs = last.sequences if head.quantities == "all" else None
    out = ExactResult.build(task, head.cost, results, last.grad_ad, None, seqs,
                            head.quantities)
    if last.states is not None:
        states = dict(last.states)
        # each shard's columns side by side, placed when a state array is first read; the
        # states read the windows by the last shard's ids: another shard's rows in that order
        order = [_rows_of(last.windows, p) for p in parts]
        tables = {k: [p.window_tables[k] if at is None else p.window_tables[k][at]
                      for p, at in zip(parts, order)] for k in head.window_tables}
        out.states = GatheredStates(states, tables, states.pop("window"))
    return out


def _rows_of(windows, part):
    """The row of each window of ``windows (U, k)`` (the last shard's ids) among the rows
    of ``part``'s window tables (``part.windows``, matched by content): ``None`` when they
    are the same windows in the same order (as a rule). Raises :class:`ShardError` when a
    window has no row there (the shards did not walk the same tree)."""
    own = part.windows
    if own is None or windows is None:
        raise ShardError(f"parameter shard {part.shard} keeps its window tables without their "
                         "windows: its rows cannot be matched to the others'")
    if own.shape == windows.shape and np.array_equal(own, windows):
        return None
    _, inv = np.unique(np.concatenate([own, windows]), axis=0, return_inverse=True)
    inv = inv.ravel()
    row = np.full(inv.max() + 1, -1, dtype=np.int64)
    row[inv[:len(own)]] = np.arange(len(own))
    at = row[inv[len(own):]]
    if (at < 0).any():
        raise ShardError(f"parameter shard {part.shard} holds no per-window row for "
                         f"{int((at < 0).sum())} windows of the last shard's states: the "
                         "shards did not walk the same tree")
    return at
