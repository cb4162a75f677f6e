"""Parameter shards of one exact run: ``exact_param_shard(task, (i, n))`` walks the whole
tree for the ``i``-th set of the parameters (:func:`fisher_ref.engine.factored.shard_columns`:
the slices of :func:`fisher_ref.engine.columns.param_columns`, or for the MLP sets cut
between hidden units); every sum the engine forms is a sum per parameter, so each set's
columns are placed at its parameters (:func:`merge_params`, which
:func:`fisher_ref.parallel.shards.merge` calls for them). What
``exact(task, workers=N)`` runs."""
from __future__ import annotations

import numpy as np

from fisher_ref.engine.columns import column_index
from fisher_ref.engine.moments import Moments, finish_fisher, finish_stream
from fisher_ref.parallel.shard_result import ShardError, ShardResult, check_arrays, task_key
from fisher_ref.results import ExactResult, GatheredStates

__all__ = ["param_shard_result", "merge_params"]


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
    shard's columns, each placed at its parameter (:func:`column_index`; side by side,
    for slices); the sums that hold no parameter (probability
    mass, rewards, their spread) are the same in every shard and are taken from the first;
    the per-state and per-response rows and the autodiff gradient are the last's (the shard
    that formed them)."""
    P, T, head, last = task.model.num_params, task.max_len, parts[0], parts[-1]
    cols = [p.columns for p in parts]
    index = [column_index(c, P) for c in cols]
    held = np.bincount(np.concatenate(index), minlength=P) if P else np.zeros(0, int)
    if len(held) != P or (held != 1).any():
        raise ShardError(f"the parameter shards hold {int((held > 0).sum())} distinct of the "
                         f"{P} parameters, {int((held > 1).sum())} of them in more than one "
                         f"shard ({cols}): they do not hold each parameter once")
    for p, at in zip(parts, index):  # each shard's sums as wide as the parameters it names
        widths = {v.shape[-1] for m in p.moments.values() for v in m.values()
                  if isinstance(v, np.ndarray) and v.ndim}
        if widths != {len(at)}:
            raise ShardError(f"{p.label} names {len(at)} parameters "
                             f"({p.columns}) but holds sums {sorted(widths)} wide")
        check_arrays(p, P, T, len(at))
    places = [c if isinstance(c, slice) else at for c, at in zip(cols, index)]
    for p in parts[1:]:  # the sums without parameters: the same walk gave the same numbers
        for name, m in p.moments.items():  # (to rounding: the sub-blocks follow the width)
            h = head.moments[name]
            if m["r0"] != h["r0"] or not abs(m["mass"] - h["mass"]) <= 1e-12 * h["mass"]:
                raise ShardError(f"{head.label} and {p.label} disagree on "
                                 f"the probability mass or reference reward of stream "
                                 f"{name!r}: they did not walk the same tree")
    kept_states, kept_seqs = head.key[3], head.key[4] and head.quantities == "all"
    if (kept_states and last.states is None) or (kept_seqs and last.sequences is None):
        raise ShardError(f"{last.label} holds no per-state or per-response "
                         f"records, which its run kept: it did not run as the last shard")
    results = {}
    for stream in head.streams:
        name, m = stream.name, Moments(P, T)
        for field, value in head.moments[stream.name].items():
            if isinstance(value, np.ndarray):  # each shard's columns at its parameters
                value = _placed([p.moments[name][field] for p in parts], places, P)
            setattr(m, field, value)
        results[name] = finish_fisher(m) if head.quantities == "fisher" else \
            finish_stream(m, task.baseline)
    seqs = last.sequences if head.quantities == "all" else None
    out = ExactResult.build(task, head.cost, results, last.grad_ad, None, seqs,
                            head.quantities)
    if last.states is not None:
        states = dict(last.states)
        # each shard's columns at its parameters, placed when a state array is first read; the
        # states read the windows by the last shard's ids: another shard's rows in that order
        rows = [_rows_of(last.windows, p) for p in parts]
        tables = {k: [(place, p.window_tables[k] if at is None else p.window_tables[k][at])
                      for p, at, place in zip(parts, rows, places)]
                  for k in head.window_tables}
        out.states = GatheredStates(states, tables, states.pop("window"))
    return out


def _placed(arrays, places, P):
    """One ``(..., P)`` array from the shards' ``(..., P_i)`` arrays, each at its
    parameters ``places[i]`` (a slice, or an index array)."""
    out = np.empty(arrays[0].shape[:-1] + (P,), dtype=arrays[0].dtype)
    for a, at in zip(arrays, places):
        out[..., at] = a
    return out


def _rows_of(windows, part):
    """The row of each window of ``windows (U, k)`` (the last shard's ids) among the rows
    of ``part``'s window tables (``part.windows``, matched by content): ``None`` when they
    are the same windows in the same order (as a rule). Raises :class:`ShardError` when a
    window has no row there (the shards did not walk the same tree)."""
    own = part.windows
    if own is None or windows is None:
        raise ShardError(f"{part.label} keeps its window tables without their "
                         "windows: its rows cannot be matched to the others'")
    if own.shape == windows.shape and np.array_equal(own, windows):
        return None
    _, inv = np.unique(np.concatenate([own, windows]), axis=0, return_inverse=True)
    inv = inv.ravel()
    row = np.full(inv.max() + 1, -1, dtype=np.int64)
    row[inv[:len(own)]] = np.arange(len(own))
    at = row[inv[len(own):]]
    if (at < 0).any():
        raise ShardError(f"{part.label} holds no per-window row for "
                         f"{int((at < 0).sum())} windows of the last shard's states: the "
                         "shards did not walk the same tree")
    return at
