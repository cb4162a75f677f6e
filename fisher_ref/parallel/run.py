"""The entry points of the parallel layer: :func:`exact` (``fisher_ref.exact``), the fast
engine's run (:func:`fisher_ref.engine.fast.exact`) in ``workers`` processes, and the runs
of one shard, whose names say that they return one: :func:`exact_shard` (subtrees cut by
prompt and first tokens) and :func:`exact_param_shard` (every state, a set of the
parameters). Each returns a :class:`fisher_ref.parallel.shard_result.ShardResult`, which
:func:`fisher_ref.parallel.shards.merge` adds to the other shards of its run."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from fisher_ref.engine import fast
from fisher_ref.engine.factored import shard_columns
from fisher_ref.engine.plan import refuse_moved, resolve_options
from fisher_ref.engine.run import Run, plan
from fisher_ref.parallel.param_shards import param_shard_result
from fisher_ref.parallel.shard_result import check_shard, merged_here
from fisher_ref.parallel.shards import ShardWalk, merge
from fisher_ref.parallel.workers import local_workers, run_shards

__all__ = ["exact", "exact_shard", "exact_param_shard"]


def exact(task, *, topk=(), quantities="all", progress=True, workers="auto", reference=False,
          options=None, **moved):
    r"""Every quantity of docs/theory.md §2-3 for ``task``, exactly, in float64.

    Args:
        task: a :class:`fisher_ref.tasks.Task`.
        topk: with a sampler, also center with only the top-``k`` tokens of ``mu``
            for each ``k`` here (what partial knowledge of ``mu`` costs).
        quantities: ``"all"`` (every quantity) or ``"fisher"``: per stream only
            :math:`E[h]`, :math:`E[h^2]`, ``token_fisher_sum``, ``token_fisher_by_depth``,
            the largest conditional score mean and the mass
            (:class:`fisher_ref.results.FisherStreamResult`),
            with the per-state arrays when kept and no per-response arrays; no
            reward is evaluated. Reading a skipped quantity raises an ``AttributeError``.
        progress: show a progress bar on stderr once the run exceeds 2 s.
        workers: processes to run parameter shards in (:mod:`fisher_ref.parallel.workers`):
            each walks the whole tree for its share of the parameters
            (:func:`fisher_ref.parallel.exact_param_shard`), so the per-window and
            per-state work is split, not repeated (the sensitivities too for the MLP;
            other models form all of a window's and keep their columns). ``"auto"``: the
            available cores, 1 (this process, :func:`fisher_ref.engine.fast.exact`) for a
            run estimated under 10 s. A count past the cores or the parameters is capped
            there, with a ``WorkersCapped`` warning. The result is the same to rounding.
        reference: run the readable judge (:func:`fisher_ref.reference.exact_reference`)
            instead, in this process (``options.chunk`` does not apply to it).
        options: an :class:`fisher_ref.engine.plan.EngineOptions`: the knobs that never
            change a number (``chunk``, ``keep_states``, ``keep_sequences``,
            ``max_seconds``, ``max_bytes``, ``budgets``); ``None``: the defaults.

    Returns:
        :class:`fisher_ref.results.ExactResult`.

    Raises:
        TypeError: a keyword it does not take; ``shard=`` and ``param_shard=`` name
            :func:`fisher_ref.parallel.exact_shard` and
            :func:`fisher_ref.parallel.exact_param_shard`, which return a shard; the
            knobs name ``options=``.
        fisher_ref.EnumerationTooLarge: past ``options.max_seconds`` or ``max_bytes``.

    Example:
        >>> from fisher_ref import load_config, exact
        >>> r = exact(load_config("default"))
        >>> bool(np.allclose(r.sequence_fisher, r.token_fisher_sum, rtol=1e-10, atol=0))
        True
    """
    refuse_moved("exact", moved)
    options = resolve_options(options, topk=topk, quantities=quantities, progress=progress)
    n = 1 if reference else local_workers(task, workers, options)
    if n == 1:
        return fast.exact(task, reference=reference, options=options)
    # parameter shards in processes, merged here (the arrays kept as one run)
    _, cost, keep_states, keep_sequences = plan(task, options, workers=n)
    each = options.unlimited().with_(progress=False, keep_states=keep_states,
                                     keep_sequences=keep_sequences)
    with merged_here():  # the shard run here is merged here: no checksum to take
        parts = run_shards(exact_param_shard, task, n, {"options": each}, progress=progress,
                           by="param_shard")
        result = merge(task, parts)
    result.cost = cost
    return result


def exact_shard(task, shard, *, topk=(), quantities="all", progress=False, options=None):
    """Shard ``shard = (i, n)`` of an exact run: the subtrees of ``task`` cut by prompt and
    first tokens that fall to shard ``i`` of ``n`` (:func:`fisher_ref.parallel.shards.plan_shards`).

    Args:
        task, topk, quantities, options: as for :func:`fisher_ref.exact` (the shard keeps
            its rows of the per-state and per-response arrays only when asked: ``"auto"``
            is not).
        progress: a bar of this shard's states on stderr once it exceeds 2 s.

    Returns:
        its :class:`fisher_ref.parallel.shard_result.ShardResult`, which
        :func:`fisher_ref.parallel.shards.merge` adds to the others.

    Example:
        >>> from fisher_ref import load_config, exact
        >>> from fisher_ref.parallel import merge
        >>> task = load_config("default")
        >>> r = merge(task, [exact_shard(task, (i, 2), options=None) for i in range(2)])
        >>> bool(np.allclose(r.sequence_fisher, exact(task).sequence_fisher, rtol=1e-12))
        True
    """
    options = resolve_options(options, topk=topk, quantities=quantities, progress=progress)
    cut = ShardWalk(task, shard)
    options = options.with_(**{k: False for k in ("keep_states", "keep_sequences")
                               if getattr(options, k) == "auto"})
    run = Run(task, options, cut=cut)
    result, cache = fast.walk(run)
    if run.keep_states:  # its checksum taken again with its tables in
        result = replace(result, window_tables=cache.kept_tables(), checksum=None)
    return result


def exact_param_shard(task, param_shard, *, topk=(), quantities="all", progress=False,
                      options=None):
    """Parameter shard ``param_shard = (i, n)`` of an exact run: every state and response,
    but only the sums of the parameters
    ``fisher_ref.engine.factored.shard_columns(task, n)[i]`` (for the MLP, cut between
    hidden units). The last shard forms the rows that hold no parameter (the per-state and
    per-response arrays, kept as in a whole run, and the autodiff gradient). What each
    process of ``exact(task, workers=n)`` runs.

    Args:
        task, topk, quantities, options: as for :func:`fisher_ref.exact`.
        progress: a bar of this shard's states on stderr once it exceeds 2 s.

    Returns:
        its :class:`fisher_ref.parallel.shard_result.ShardResult`, which
        :func:`fisher_ref.parallel.shards.merge` places at its parameters beside the
        others'.

    Raises:
        ValueError: ``n`` is past the model's parameter count.
    """
    options = resolve_options(options, topk=topk, quantities=quantities, progress=progress)
    i, n = check_shard(param_shard)
    if n > task.model.num_params:
        raise ValueError(f"param_shard=({i}, {n}) cuts the model's "
                         f"{task.model.num_params} parameters into more slices than "
                         "there are parameters")
    run = Run(task, options, columns=shard_columns(task, n)[i])
    keep = (run.keep_states, run.keep_sequences)  # as planned: the same in every shard
    if i < n - 1:  # the last keeps the rows without parameters (in the caller)
        run.records, run.keep_sequences = False, False
    result, cache = fast.walk(run)
    tables = cache.kept_tables() if run.keep_states else None
    # its tables' windows, by id: merged by content
    windows = cache.windows_of(np.arange(cache.n_ids)) if tables is not None else None
    return param_shard_result(run, result, (i, n), tables, keep, windows)
