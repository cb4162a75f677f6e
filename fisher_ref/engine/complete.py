r"""The complete responses of the fast exact engine (:mod:`fisher_ref.engine.fast`): the
sums each stream adds over the responses that end at a block's children.

- :func:`complete` (every quantity): the rewards of a block's complete responses at once,
  each stream's weights per (window, token) handed to the window cache, the per-parent
  sums of :func:`fisher_ref.engine.parent_sums.level_sums` a sub-block at a time, the
  autodiff queue and the kept records;
- :func:`complete_fisher` (``quantities="fisher"``): only the probability, :math:`\sum w\,h`
  and :math:`\sum w\,h^2` of each stream; no reward is evaluated;
- :func:`last_level`: the parents of the last level (every child a complete response)
  carry no arrays of their own; their running sums and path sums are formed from their
  parents' rows, a sub-block at a time, so the arrays of a whole level are never
  written out.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.engine.factored import last_level_all, last_level_fisher
from fisher_ref.engine.factors import row_width
from fisher_ref.engine.moments import importance_weighted
from fisher_ref.engine.parent_sums import (fisher_sums, level_sums, one_token_sums, parent_powers,
                                           prefix_starts, segment_sum)
from fisher_ref.engine.tree import expand

__all__ = ["complete", "complete_fisher", "last_level"]


def _sub_arrays(block, arrs, s, sl, gen):
    """Stream ``s``'s running score sums ``H`` and path sums ``G`` (``(b, P)`` each) of the
    block's parents ``sl``, slices of the arrays they carry; and ``hist_at(t, rows)``,
    their score at slot ``t`` (:func:`fisher_ref.engine.parent_sums.history_cross`)."""
    H, G, last = block.H[s, sl], arrs.G[s, sl], block.last[sl, s]
    return H, G, _history(arrs.xiT[s], block.path_rows[sl], gen[sl], last)


def _history(xi, prow, gen, last):
    def hist_at(t, at):  # the parents' score xi_t, rows ``at``
        if t == prow.shape[1] - 1:
            return last if len(at) == len(last) else last[at]
        return xi[prow[at, t], gen[at, t]]
    return hist_at


def _last_H(block, arrs, s, sl, gen, out):
    r"""Stream ``s``'s running score sums of the last level's parents ``sl``,
    :math:`H = H_{parent} + \xi_{last}`, written into ``out (b, P)``; returns
    :math:`\xi_{last}`."""
    d, H0, src = block.depth, block.parents[0], block.src[sl]
    prow, g = block.path_rows[sl], gen[sl]
    last = arrs.xiT[s][prow[:, d - 1], g[:, d - 1]]  # (b, P)
    np.take(H0[s], src, axis=0, out=out, mode="clip")
    out += last
    return last


def last_level(cache, block, arrs, s, sl, gen, W, r):
    r"""Stream ``s``'s arrays of the last level's parents ``sl``, formed from their parents'
    (:func:`_carry`): ``H = H_parent + \xi_{last}`` written where
    :meth:`WindowCache.defer` holds it; ``X = (r y_1, r y_2)`` of their windows; the path
    sums :math:`\sum_g W_g G_g` and :math:`\sum_g W_g G_g^2` with
    :math:`G_g = G_{parent} + m_g`, expanded per parent (all terms nonnegative); and
    ``hist_at``."""
    G0, src, prow, g = block.parents[1], block.src[sl], block.path_rows[sl], gen[sl]
    rows, a = arrs.rows[sl], cache.arrays
    H = cache.reserve(len(src), arrs.xiT[s].shape[2])
    last = _last_H(block, arrs, s, sl, gen, H)
    m = a[f"y{s}_2"][rows]  # (b, P) the parents' own token moments
    runs = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])  # parents of one grandparent
    Wp, Gp = segment_sum(W, runs), np.take(G0[s], src[runs], axis=0, mode="clip")  # (n,), (n, P)
    path = Wp @ Gp + W @ m
    path2 = Wp @ (Gp * Gp) + 2 * np.einsum("gp,gp->p", Gp, segment_sum(m, runs, W)) + W @ (m * m)
    X1 = a[f"y{s}_1"][rows]
    X1 *= r[:, None]
    m *= r[:, None]  # now X2 = r y_2
    return H, (X1, m), path, path2, _history(arrs.xiT[s], prow, g, last)


def _terminal_children(task, block, arrs, idx):
    """The complete responses among the block's children ``idx`` (rows ``b*V + a``): ``B``
    parents, ``k`` terminal tokens ``K (k,)`` under each, the last token ``tok (B*k,)`` and
    the child block ``done`` of every response, the parents' generated tokens ``gen (B, d)``."""
    B, d = block.size, block.depth
    k = len(idx) // B
    _, tok, done = expand(task, block, idx, arrs.p, arrs.q, tokens=False)
    gen = block.tokens[np.arange(B)[:, None], (block.length - d)[:, None] + np.arange(d)]
    return B, k, idx[:k] % task.model.vocab_size, tok, done, gen


def _sub_blocks(B, P, elements):
    """``B`` parents in consecutive slices of equal size (to one parent), as many as rows of
    ``elements // P`` parents would make, rounded to the nearest (at least one): a
    sub-block's ``(b, P)`` arrays hold about ``elements`` (``Budgets.sub_block_elements``),
    at most half as many again. Each sub-block repeats the work per window group of its
    parents, so a short last slice would cost nearly a whole one: 450 parents at 210 a
    row are 2 sub-blocks of 225, not 210, 210 and 30."""
    step = max(1, elements // P)
    n = max(1, int(B / step + 0.5))
    return [slice(i * B // n, (i + 1) * B // n) for i in range(n) if B]


def complete(run, cache, batch, block, arrs, idx):
    """The complete responses among the block's children ``idx`` (the same tokens ``K``
    under every parent): their rewards at once, the sums of each stream (weights per
    window and token, then per parent), the autodiff queue and the kept records."""
    task, d = run.task, block.depth
    B, k, K, tok, done, gen = _terminal_children(task, block, arrs, idx)
    resp = np.full((B * k, task.max_len), -1, dtype=np.int64)  # (C, T)
    resp[:, :d], resp[:, d] = np.repeat(gen, k, axis=0), tok
    R = task.reward.batch(resp, np.full(B * k, d + 1), task.prompts, done.prompt)  # (C,)
    weights = [_stream_weights(run, cache, s, block, arrs, done, K, R)
               for s in range(len(run.streams))]
    _parent_sums(run, cache, block, arrs, gen, K, weights)
    if batch.add(block.wpath[:, :d], block.wid, gen, K, block.prompt, R.reshape(B, k)):
        run.grad_ad += batch.flush()
    run.keep_responses(done, resp, R)


def _stream_weights(run, cache, s, block, arrs, done, K, R):
    """Stream ``s``'s weights ``w (B, k)``, rewards ``R - r0``, importance weights; the
    weights of its per-(window, token) sums and of its sums without ``H`` handed to the
    window cache."""
    name, wname = run.streams[s].name, run.streams[s].drawn_from
    mom, r, B = run.moments[name], block.reach(wname), block.size
    w = done.reach(wname).reshape(B, len(K))  # (B, k)
    mom.add_reward_spread(w.ravel(), R)
    Rc = mom.centered(R).reshape(w.shape)
    wR = w * Rc
    rho_w = importance_weighted(w, done.rp.reshape(w.shape)) if wname == "q" else None
    acc = [wR, wR, wR * Rc] if rho_w is None else [rho_w, rho_w * Rc, wR, wR, wR * Rc]
    cache.accumulate(s, arrs.rows, K, np.stack(acc, axis=1))  # see _accumulated
    if len(K) == run.task.model.vocab_size:  # w = r q: the sums without H, per window
        cache.accumulate_reach(s, arrs.rows, r, block.depth)
    return mom, arrs.xiT[s], w, Rc, rho_w, r


def _parent_sums(run, cache, block, arrs, gen, K, weights):
    """Every sum of :func:`fisher_ref.engine.parent_sums.level_sums`, parents in sub-blocks
    (bounded temporaries): at the last level from the factors (the MLP,
    :func:`fisher_ref.engine.factored.last_level_all`) or from the parents' rows, with the
    reward-weighted products per window later; before it, where EOS alone ends a response,
    one response per parent (:func:`fisher_ref.engine.parent_sums.one_token_sums`)."""
    B, full = block.size, len(K) == run.task.model.vocab_size
    factored = block.src is not None and cache.factored_last
    width = row_width(run.task.model.spec, cache.columns) if factored else run.P
    for sl in _sub_blocks(B, width, run.budgets.sub_block_elements(factored)):
        starts = prefix_starts(block.prompt[sl], gen[sl])
        rows = arrs.rows[sl]
        for s, (mom, xi, w, Rc, rho_w, r) in enumerate(weights):
            w, Rc, rho_w = w[sl], Rc[sl], None if rho_w is None else rho_w[sl]
            C = np.stack([w * Rc, w * Rc * Rc], axis=1)  # (b, 2, k)
            if factored:  # the MLP's last level from the factors of its scores
                mom.add_sums(**last_level_all(cache, block, arrs, s, sl, gen, w, Rc, rho_w,
                                              C, r[sl], starts))
                continue
            if block.src is not None:  # the last level: every token terminal
                H, X, g, g2, hist_at = last_level(cache, block, arrs, s, sl, gen,
                                                   w.sum(axis=1), r[sl])
                cache.defer(s, rows, C, H, ("Rh2", "R2h2"), r[sl])
                sums = level_sums(H, None, hist_at, w, Rc, rho_w, X, starts)
                sums["g"], sums["g2"] = g, g2
                mom.add_sums(**sums)
                continue
            H, G, hist_at = _sub_arrays(block, arrs, s, sl, gen)
            if not full:  # before the last depth only EOS ends a response: one per parent,
                if len(K) != 1:  # its h formed whole (terminal())
                    raise RuntimeError(f"{len(K)} terminal tokens under a parent at depth "
                                       f"{block.depth}: only EOS ends a response there")
                mom.add_sums(**one_token_sums(H, G, hist_at, w, Rc, rho_w, xi[rows, K[0]],
                                              starts))
                continue
            # every token ends a response (max_len 1): the sums without H and the products
            # with per-window arrays later, per window
            X = parent_powers(cache.arrays, s, xi, rows, K, r[sl], w, 2)
            cache.defer(s, rows, C, H, ("Rh2", "R2h2"), r[sl])
            mom.add_sums(**level_sums(H, G, hist_at, w, Rc, rho_w, X, starts))


def complete_fisher(run, cache, block, arrs, idx):
    r"""``quantities="fisher"``: the complete responses among the block's children ``idx``
    add only their probability, :math:`\sum w\,h` and :math:`\sum w\,h^2` per stream
    (:func:`fisher_ref.engine.parent_sums.fisher_sums`; with every token terminal, the terms without
    ``H`` per window, :meth:`WindowCache.accumulate_reach`). No rewards are evaluated."""
    task, d, P = run.task, block.depth, run.P
    B, k, K, _, done, gen = _terminal_children(task, block, arrs, idx)
    full = k == task.model.vocab_size
    for s, stream in enumerate(run.streams):
        name, wname = stream.name, stream.drawn_from
        r, w = block.reach(wname), done.reach(wname).reshape(B, k)  # (B,), (B, k)
        if full:
            cache.accumulate_reach(s, arrs.rows, r, d)
        factored = block.src is not None and cache.factored_last
        width = row_width(task.model.spec, cache.columns) if factored else P
        for sl in _sub_blocks(B, width, run.budgets.sub_block_elements(factored)):
            if block.src is not None:  # the last level: from the grandparents' H
                # the MLP's from the factors of its scores (engine/factored.py)
                last = last_level_fisher if factored else _last_level_fisher
                run.moments[name].add_sums(**last(cache, block, arrs, s, sl, gen,
                                                  w[sl].sum(axis=1), r[sl]))
                continue
            X = parent_powers(cache.arrays, s, arrs.xiT[s], arrs.rows[sl], K, r[sl], w[sl],
                              1 if full else 2)  # X_1 (and X_2 when summed here)
            run.moments[name].add_sums(**fisher_sums(block.H[s, sl], w[sl].sum(axis=1), *X))


def _last_level_fisher(cache, block, arrs, s, sl, gen, W, r):
    r"""``quantities="fisher"`` at the last level (every child a complete response): the
    sums of :func:`fisher_ref.engine.parent_sums.fisher_sums` over parents ``sl`` without
    forming their running sums. A parent ``b`` under grandparent ``g`` has
    :math:`H_b = H_g + \xi_b` (:math:`\xi_b` the score of its last token), so, with
    :math:`X_{1,b} = r_b\,y_1(b)`,

    .. math::

       \sum_b W_b H_b = \sum_g W_g H_g + \sum_b W_b \xi_b,\qquad
       \sum_b W_b H_b^2 + 2 H_b \odot X_{1,b} = \sum_g \bigl(W_g H_g^2 + 2 H_g \odot M_g\bigr)
       + \sum_b W_b \xi_b^2 + 2 \sum_b r_b\,\xi_b \odot y_1(b),

    :math:`W_g = \sum_{b \in g} W_b`, :math:`M_g = \sum_{b \in g} W_b \xi_b + r_b y_1(b)`:
    the same finite sums, regrouped by grandparent (the terms without any ``H`` are the
    window cache's, :meth:`WindowCache.accumulate_reach`)."""
    d, H0, src = block.depth, block.parents[0][s], block.src[sl]
    prow, g = block.path_rows[sl], gen[sl]
    xi = arrs.xiT[s][prow[:, d - 1], g[:, d - 1]]  # (b, P)
    y1 = cache.arrays[f"y{s}_1"][arrs.rows[sl]]  # (b, P)
    runs = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])  # parents of one grandparent
    Hg = np.take(H0, src[runs], axis=0, mode="clip")  # (n, P)
    Wg = segment_sum(W, runs)  # (n,)
    M = segment_sum(xi, runs, W) + segment_sum(y1, runs, r)  # (n, P)
    h2 = (Wg @ (Hg * Hg) + 2 * np.einsum("gp,gp->p", Hg, M)
          + np.einsum("b,bp,bp->p", W, xi, xi) + 2 * np.einsum("b,bp,bp->p", r, xi, y1))
    return {"mass": W.sum(), "h": Wg @ Hg + W @ xi, "h2": h2}
