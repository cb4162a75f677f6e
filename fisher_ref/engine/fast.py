r"""The fast exact engine: every quantity of docs/theory.md §2-3 by enumerating
every response.

It computes what the readable judge :func:`fisher_ref.reference.exact_reference` computes —
the same streams (``"policy"``; with a sampler ``"raw"``, ``"centered"``,
``"top{k}"``), every response-level expectation as a sum over complete
responses of probability times the response's own value, every token-level one
as a sum over states of reach times the state's value — and nothing here
assumes the identities of docs/theory.md §2.9 that relate the two routes. The
judge holds it to 1e-10 (tests/test_reference.py).

The sums are regrouped (docs/theory.md §7.5):

- per distinct window (:class:`fisher_ref.engine.window_cache.WindowCache`): logits,
  ``j``, centers, scores and the sums :math:`y_l = \sum_a q_a \xi_a^l`, computed
  once; the autodiff gradient reuses the walk's window ids;
- per parent (:mod:`fisher_ref.engine.parent_sums`): a complete response has
  :math:`h = H + \xi`; the powers of ``h`` are expanded by the binomial theorem
  and summed over a parent's responses, a window's responses or the whole run,
  whichever keeps the same finite sum cheapest;
- cross terms per run of parents that share their first tokens.

The fast engine's walk carries per state its running score sum ``H``, its path
sum of token moments ``G``, the score of its last token and the window ids of
its ancestors (not the whole score history); with ``quantities="fisher"`` only ``H``
and the window ids. The sums over complete responses are in
:mod:`fisher_ref.engine.complete`; there the states of the last level, most of all
states, carry only their parents' rows: their ``H`` and path sums are formed from the
parents' a sub-block at a time (:func:`fisher_ref.engine.complete.last_level`).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from fisher_ref.engine.complete import complete, complete_fisher
from fisher_ref.engine.factored import factors_last_level
from fisher_ref.engine.keep_memory import memory_kept
from fisher_ref.engine.plan import Budgets, refuse_moved, resolve_options
from fisher_ref.engine.run import BlockArrays, Run, check_support, last_scores, state_places
from fisher_ref.engine.autodiff import parts_gradient
from fisher_ref.engine.window_cache import WindowCache
from fisher_ref.reference import exact_reference
from fisher_ref.numerics import topk_center
from fisher_ref.results import GatheredStates

__all__ = ["exact", "walk", "topk_center", "Budgets"]

class _AutodiffBatch:
    """Complete responses gathered for one :func:`fisher_ref.engine.autodiff.parts_gradient`
    call, by parent: the run-wide ids of the windows of a parent's states and of its own,
    its generated tokens and its children's last tokens (the walk's own)."""

    def __init__(self, task, cache, max_rows, enabled=True):
        self.task, self.cache, self.parts, self.rows = task, cache, [], 0
        self.max_rows = max_rows  # Budgets.autodiff_rows
        self.enabled = enabled  # not: a parameter shard but the last

    def add(self, paths, wid, gen, K, prompt, R):
        """Queue the responses of ``B`` parents: the window ids of their states
        ``paths (B, d)`` and of their own ``wid (B,)``, their generated tokens
        ``gen (B, d)``, the last tokens ``K (k,)`` of their children, their prompts
        ``(B,)`` and the children's rewards ``R (B, k)``. True once about ``max_rows``
        state rows wait."""
        if not self.enabled:
            return False
        self.parts.append((paths, wid, gen, K, self.task.prompt_weights[prompt], R))
        self.rows += paths.size + R.size
        return self.rows >= self.max_rows

    def flush(self):
        """Gradient ``(P,)`` of the queued responses' expected reward; empties the queue."""
        if not self.parts:
            return 0.0
        parts, self.parts, self.rows = self.parts, [], 0
        # run-wide ids are small integers: marked, not sorted; their rows as np.unique's
        seen = np.zeros(1 + max((int(max(p.max(initial=-1), wid.max(initial=-1)))
                                 for p, wid, *_ in parts), default=-1), dtype=bool)
        if not seen.size:  # no response queued
            return 0.0
        for paths, wid, *_ in parts:
            seen[paths] = True
            seen[wid] = True
        ids, row = np.flatnonzero(seen), np.cumsum(seen) - 1  # (U,), row of each id
        return parts_gradient(self.task, self.task.theta, self.cache.windows_of(ids),
                              [(row[paths], gen, row[wid], K, w, R)
                               for paths, wid, gen, K, w, R in parts])


#: At most this many windows of a block's descendants are computed with its own.
_AHEAD = 4096


def _windows_ahead(run, cache, block, W):
    """The run-wide ids of the windows of the states below a block of the MLP, level by
    level while they number at most :data:`_AHEAD` and fit in half the window cache: every
    child that does not end a response is a state (:func:`fisher_ref.engine.tree.terminal`:
    neither EOS nor at ``max_len``), and its window is its parent's shifted by its token.
    They are computed in one batch with the block's own (a call of the window arrays
    costs about as much as tens of windows, and the first levels hold a few each), so the
    later blocks find them cached; ``block.ahead`` counts the levels covered, and its
    children inherit one less (:func:`_carry`). A run over a cut of the tree (``run.cut``, a
    subtree shard), whose blocks hold only some children, computes none ahead. (The order
    in which ids are given depends on the cache's capacity, so parameter slices of one run
    may number the windows differently: their tables are matched by window,
    :func:`fisher_ref.parallel.param_shards.merge_params`.)"""
    task, none = run.task, np.empty(0, dtype=np.int64)
    levels = task.max_len - 1 - block.depth  # of states below the block
    if block.ahead >= levels or run.cut is not None or block.silent or \
            not cache.factored_last:
        return none
    toks = np.arange(1 if task.model.eos else 0, task.model.vocab_size)  # a state's last token
    room = min(_AHEAD, cache.capacity // 2 - cache.n - W.shape[0] * (block.depth + 1))
    if room <= 0:
        return none
    level, ahead = W, []
    for _ in range(levels):
        ids = np.unique(cache.ids(np.concatenate([np.repeat(level[:, 1:], len(toks), axis=0),
                                                  np.tile(toks, len(level))[:, None]],
                                                 axis=1)))
        room -= len(ids)
        if room < 0:
            break
        ahead.append(ids)
        level = cache.windows_of(ids)
    block.ahead = len(ahead)
    return np.concatenate(ahead) if ahead else none


def _block_arrays(run, cache, block):
    """A block's per-state arrays, gathered from the per-window cache; hands the cache
    its states' reach for the token-level sums (taken per window when the cache is
    flushed, :meth:`WindowCache.accumulate_states`) and keeps its state records.

    A block of the last level (:func:`_carry`) carries no per-state arrays: its
    path sums are formed per sub-block (:func:`fisher_ref.engine.complete.last_level`), and ``G`` is ``None`` (as in
    every block with ``quantities="fisher"``, which forms no path sums)."""
    task, S = run.task, len(run.streams)
    B, d = block.size, block.depth
    W = task.model.windows(block.tokens, block.length)  # (B, k)
    block.wid = cache.ids(W)  # (B,) run-wide window ids
    both = cache.rows(np.concatenate([block.wid, block.wpath[:, :d].ravel(),
                                      _windows_ahead(run, cache, block, W)]))
    rows, block.path_rows = both[:B], both[B:B + B * d].reshape(B, d)  # states', ancestors'
    a = cache.arrays
    p, q = a["p"][rows], a["q"][rows]  # (B, V)
    if task.sampler is not None:
        check_support(block, p, q)
    silent = block.silent  # above a shard's units: added by another shard
    for s, (_, wname, _) in enumerate(run.streams if not silent else ()):
        cache.accumulate_states(s, rows, block.reach(wname), d)  # per window, later
    run.bar.update(0 if silent else B)
    if run.keep_states and run.records and not silent:  # per-window arrays: by window id
        run.keep_state_arrays(block, p, q, {"window": block.wid},
                              at=state_places(task, block))
    xiT = [cache.scores(stream.center) for stream in run.streams]  # S arrays (n, V, P)
    G = block.G  # (S, B, P): this block's own rows (depth_first splits without overlap)
    for s in range(S if G is not None else 0):
        G[s] += a[f"y{s}_2"][rows]
    return BlockArrays(p, q, rows, xiT, G)


def _kept_by_window(task):
    """Kept per-state arrays that are per-window arrays of the cache (stream 0 the
    policy's; with a sampler, stream 1 raw: from mu, centered at p; stream 2 centered)."""
    kept = {"token_fisher": "y0_2", "uniform": "uniform", "score_mean": "y0_1"}
    if task.sampler is not None:
        kept.update({"sampler_token_fisher": "y2_2", "raw_score_mean": "y1_1"})
    return kept


def _carry(run, block, par, tok, arrs):
    """What the children of parents ``par (C,)`` (last tokens ``tok (C,)``) carry: the
    run-wide window ids of their ancestors ``wpath (C, T)``; running score sums
    ``H (S, C, P)``, path sums ``G (S, C, P)`` (the parents' own ``m`` included) and the
    score of their last token ``last (C, S, P)``.

    Children of the last level (every child of theirs ends a response, most of all
    states) carry instead their parent rows ``src (C,)`` and the parents' ``H``, ``G`` and
    last scores (``parents``): :func:`fisher_ref.engine.complete.last_level` forms theirs a
    sub-block at a time, so that the arrays of a whole level are never written out."""
    path = block.wpath[par]  # (C, T)
    path[:, block.depth] = block.wid[par]
    ahead = max(block.ahead - 1, 0)  # levels below the children with windows computed
    if block.depth + 2 == run.task.max_len:
        return {"wpath": path, "src": par, "parents": (block.H, arrs.G, block.last),
                "ahead": ahead}
    xi = last_scores(arrs, par, tok)
    xi = xi[0][None] if len(xi) == 1 else np.stack(xi)  # (S, C, P)
    H = np.take(block.H, par, axis=1, mode="clip")  # (S, C, P): par holds valid rows
    H += xi
    if run.quantities == "fisher":  # neither path sums nor cross terms
        return {"H": H, "wpath": path, "ahead": ahead}
    return {"H": H, "G": np.take(arrs.G, par, axis=1, mode="clip"),
            "last": xi.transpose(1, 0, 2), "wpath": path, "ahead": ahead}


def _accumulated(run):
    """Per stream, the sums the per-(window, token) weights of :func:`fisher_ref.engine.complete.complete` add to,
    with the power of the score each takes (:meth:`WindowCache.accumulate`)."""
    on = [("Rh", 1), ("Rh2", 2), ("R2h2", 2)]
    return {s: on if wname == "p" else [("is_h", 1), ("is_Rh", 1)] + on
            for s, (_, wname, _) in enumerate(run.streams)}


def _finish(run, cache):
    """Add what the window cache accumulated; a stream drawn from the policy has
    :math:`\rho = 1`, so its importance-weighted sums are its plain ones."""
    cache.flush(last=True)
    T = run.task.max_len
    for s, stream in enumerate(run.streams):
        name, wname = stream.name, stream.drawn_from
        mom, sums = run.moments[name], dict(cache.sums[s])
        by_depth = sums.pop("token_sum_by_depth")  # (T, P)
        mom.add_sums(token_sum=by_depth.sum(axis=0), token_sum_by_depth=by_depth)
        mom.cond_mean_max = np.maximum(mom.cond_mean_max, sums.pop("cond_max"))
        if run.quantities == "fisher":
            mom.add_sums(h=sums["h"], h2=sums["h2"])
            continue
        diag, diag4 = np.zeros((T, T, mom.h.shape[0])), np.zeros((T, T, mom.h.shape[0]))
        diag[np.arange(T), np.arange(T)] = sums.pop("cross")
        diag4[np.arange(T), np.arange(T)] = sums.pop("cross4")
        mom.add_sums(cross=diag, cross4=diag4, **sums)
        if wname == "p":
            mom.is_h, mom.is_Rh = mom.h.copy(), mom.Rh.copy()


def exact(task, *, topk=(), quantities="all", progress=True, reference=False, options=None,
          **moved):
    r"""Every quantity of docs/theory.md §2-3 for ``task``, exactly, in float64, in this
    process: :func:`fisher_ref.exact` with ``workers=1`` (which is this function's run).

    Args:
        task, topk, quantities, progress, reference, options: as for
            :func:`fisher_ref.exact`: what is computed as keywords, and the knobs that
            never change a number in one :class:`fisher_ref.engine.plan.EngineOptions`.

    Returns:
        :class:`fisher_ref.results.ExactResult`.

    Raises:
        TypeError: a keyword it does not take; ``shard=`` and ``param_shard=`` name the
            functions that return a shard (:func:`fisher_ref.parallel.exact_shard`,
            :func:`fisher_ref.parallel.exact_param_shard`), the knobs ``options=``.

    Example:
        >>> from fisher_ref import load_config
        >>> r = exact(load_config("default"))
        >>> bool(np.allclose(r.sequence_fisher, r.token_fisher_sum, rtol=1e-10, atol=0))
        True
    """
    refuse_moved("exact", moved)
    options = resolve_options(options, topk=topk, quantities=quantities, progress=progress)
    if reference:
        return exact_reference(task, **{k: v for k, v in options.as_kwargs().items()
                                        if k != "chunk"})  # the judge holds whole levels
    run = Run(task, options)
    result, cache = walk(run)
    if run.keep_states:
        states = dict(result.states)
        result.states = GatheredStates(states, cache.kept_tables(), states.pop("window"))
    return result


def walk(run):
    """Walk ``run`` (a :class:`fisher_ref.engine.run.Run`: the whole tree or a cut of it, all
    the parameters or some columns, the records formed or not) with the fast engine.

    Returns:
        ``(result, cache)``: what ``run.finish()`` returns and the
        :class:`fisher_ref.engine.window_cache.WindowCache` (whose per-window arrays the
        kept per-state arrays point into, :meth:`~WindowCache.kept_tables`).
    """
    task, budgets = run.task, run.budgets
    if budgets.memory_kept is None:  # this process's: a worker's own
        budgets = run.budgets = replace(budgets, memory_kept=memory_kept())
    V, k, fisher = task.model.vocab_size, task.model.context, run.quantities == "fisher"
    cache = WindowCache(task, run.streams, run.keep_states, budgets.window_cache_bytes,
                        {} if fisher else _accumulated(run), moments=2 if fisher else 4,
                        expected=min(run.cost.n_states, (V + 2) ** min(k, 8)),
                        defer_bytes=min(budgets.defer_bytes,
                                        8 * run.cost.chunk * V * run.P
                                        * len(run.streams) * (task.max_len + 2)),
                        dense_keys=budgets.dense_keys,
                        kept=_kept_by_window(task) if run.keep_states else None,
                        columns=run.columns, factored_last=factors_last_level(task))
    # the autodiff gradient: wherever the records are kept (of parameter shards, the last,
    # which workers=N runs in the caller)
    batch = _AutodiffBatch(task, cache, budgets.autodiff_rows, enabled=run.records)

    def block_arrays(block):
        if block.wpath is None:  # the root: nothing generated yet
            n, S, P = block.size, len(run.streams), run.P
            block.update(wpath=np.zeros((n, task.max_len), dtype=np.int64),
                         last=np.zeros((n, S, P)))
        return _block_arrays(run, cache, block)

    on_complete = (lambda *args: complete_fisher(run, cache, *args)) if fisher else \
        (lambda *args: complete(run, cache, batch, *args))
    # the factored last level sums in bounded pieces of its own: blocks of every child, as
    # long as their windows fit the window cache with room for their ancestors'
    last_chunk = max(run.cost.chunk, min(run.cost.chunk * V, cache.capacity // 2)) \
        if cache.factored_last else None
    run.walk(("H",) if fisher else ("H", "G"), block_arrays, on_complete,
             lambda *args: _carry(run, *args), last_chunk=last_chunk)
    run.grad_ad += batch.flush()
    _finish(run, cache)
    return run.finish(), cache
