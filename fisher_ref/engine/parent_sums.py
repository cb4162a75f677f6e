r"""The sums over one block's complete responses, regrouped (the fast engine).

The complete responses of a block are the terminal children :math:`(g, a)` of
its ``B`` parents; every parent has the same terminal tokens ``K`` (all ``V``
tokens at depth ``T - 1``, EOS alone before). Response :math:`(g, a)` has weight
:math:`w_{g,a} = r_g\,q_a(g)` (the parent's reach times the token's
probability), reward :math:`R_{g,a}`, and score sum
:math:`h_{g,a} = H_g + \xi_{g,a}`: the parent's running sum plus the score of
the last token, a row of the parent's window. Each power of :math:`h` is
expanded by the binomial theorem and the sum over responses distributes over
the terms (for any weights :math:`c`, ``n = 1, 2`` and for :math:`w` up to 4):

.. math::

   \sum_{g,a} c_{g,a} h_{g,a}^n
   = \sum_{l=0}^{n} \binom{n}{l} \sum_g H_g^{\,n-l} \odot \sum_a c_{g,a}\,\xi_{g,a}^{\,l}.

These are the same finite sums over responses, with each response's own
weight and reward; no identity of docs/theory.md §2.9 (vanishing conditional
means, probabilities summing to 1) is used. Where the weight factorises,
:math:`\sum_a w_{g,a}\xi_{g,a}^l = r_g\,y_l(u_g)` with the per-window sums
:math:`y_l(u) = \sum_a q_a(u)\,\xi_{u,a}^l`; the reward-weighted products
:math:`\sum_a c_{g,a}\xi_{g,a}` are one matrix product per window; the pure
:math:`\sum c\,\xi^2` terms of reward weights are collected per (window,
token) by :class:`fisher_ref.engine.window_cache.WindowCache`.

Rounding: a response's expanded terms can be larger than its :math:`h^n`
(:math:`H \approx -\xi`), so the error of a sum is of order
:math:`\epsilon\,\sum c\,(|H| + |\xi|)^n` rather than
:math:`\epsilon \sum c\,h^n`; for nonnegative weights, and since
:math:`E[h^2] = E[H^2] + E[\xi^2]` on a centered stream, that is a few
:math:`\epsilon` relative. tests/engine/test_fast.py holds every result to the
plain engine at 1e-10.

Cross terms (:math:`E[\xi_u\xi_t]`, :math:`E[\xi_u^2\xi_t^2]`) use the
responses' shared history: the parents of a block are in prefix order, and
parents with the same first ``t + 1`` generated tokens share
:math:`\xi_0..\xi_t`, so their weights are summed (:func:`segment_sum`)
before they are multiplied by the shared scores.
"""
from __future__ import annotations

import numpy as np
from scipy import sparse

__all__ = ["parent_powers", "window_products", "prefix_starts", "segment_sum", "history_cross",
           "coarse_cross", "level_sums", "one_token_sums", "fisher_sums", "held_products"]


def parent_powers(a, s, xi, rows, K, r, w, n=4, x=None):
    r""":math:`X_l = \sum_{a \in K} w_{g,a}\,\xi_{g,a}^{\,l}`, ``l = 1..n``: ``n`` arrays
    ``(B, P)``.

    Args:
        a: the window cache's arrays; ``s`` the stream; ``xi`` its ``(n, V, P)`` scores.
        rows: ``(B,)`` cache row of each parent's window; ``K``: ``(k,)`` terminal tokens.
        r: ``(B,)`` parents' reach; ``w``: ``(B, k)`` the responses' weights.
        x: the scores ``xi[rows[:, None], K[None, :]]`` ``(B, k, P)`` when formed already.
    """
    if len(K) == xi.shape[1]:  # every token ends a response: w = r q factorises
        out = [a[f"y{s}_{l}"][rows] for l in range(1, n + 1)]  # (B, P) each
        for y in out:
            y *= r[:, None]
        return out
    x = xi[rows[:, None], K[None, :]] if x is None else x  # (B, k, P)
    if x.shape[1] == 1:  # one terminal token (EOS): w x^l by running products
        out = [w[:, :1] * x[:, 0]]
        for _ in range(n - 1):
            out.append(out[-1] * x[:, 0])
        return out
    x2 = x * x
    terms = [lambda: np.einsum("bk,bkp->bp", w, x), lambda: np.einsum("bk,bkp->bp", w, x2),
             lambda: np.einsum("bk,bkp,bkp->bp", w, x2, x),
             lambda: np.einsum("bk,bkp,bkp->bp", w, x2, x2)]
    return [f() for f in terms[:n]]


def window_products(C, xi, rows, K, x=None):
    r""":math:`Z_{g,i} = \sum_{a \in K} C_{g,i,a}\,\xi_{g,a}`: ``(B, n, P)``.

    Args:
        C: ``(B, n, k)`` weights of each parent's responses.
        xi: ``(m, V, P)`` scores of the cached windows; ``rows``: ``(B,)``; ``K``: ``(k,)``.
        x: the scores ``xi[rows[:, None], K[None, :]]`` ``(B, k, P)`` when formed already.

    With every token terminal, the parents are grouped by window and each group
    is one matrix product with its window's ``(V, P)`` scores.
    """
    B, n, k = C.shape
    if k != xi.shape[1]:
        x = xi[rows[:, None], K[None, :]] if x is None else x  # (B, k, P)
        return C * x if k == 1 else np.einsum("bik,bkp->bip", C, x)
    Z = np.empty((B, n, xi.shape[2]))
    order = np.argsort(rows, kind="stable")  # (B,)
    srt = rows[order]
    cuts = np.flatnonzero(np.r_[True, srt[1:] != srt[:-1], True])
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        if hi - lo == 1:
            b = order[lo]
            np.dot(C[b], xi[srt[lo]], out=Z[b])
        else:
            idx = order[lo:hi]
            Z[idx] = (C[idx].reshape(-1, k) @ xi[srt[lo]]).reshape(hi - lo, n, -1)
    return Z


def prefix_starts(prompt, gen):
    """First row of each run of parents sharing their prompt and first ``t + 1``
    generated tokens, for ``t = 0..d-1``.

    Args:
        prompt: ``(B,)`` prompt index; ``gen``: ``(B, d)`` generated tokens.

    Example:
        >>> gen = np.array([[1, 1], [1, 2], [2, 1]])
        >>> [s.tolist() for s in prefix_starts(np.zeros(3, int), gen)]
        [[0, 2], [0, 1, 2]]
    """
    new = np.r_[True, prompt[1:] != prompt[:-1]]  # (B,)
    out = []
    for t in range(gen.shape[1]):
        new[1:] |= gen[1:, t] != gen[:-1, t]
        out.append(np.flatnonzero(new))
    return out


def segment_sum(x, starts, w=None):
    """Sums of the runs of rows of ``x (n, ...)`` beginning at ``starts``: ``(len(starts), ...)``;
    with weights ``w (n,)``, of the rows times their weights (without forming the product).

    Runs of one length (all but perhaps the first and last, where a block cut a
    run) are summed as a reshape (weighted: one small matrix product per run); other
    patterns by a sparse indicator product (``numpy.add.reduceat`` along the rows is
    several times slower)."""
    n, G = x.shape[0], len(starts)
    if n and n % G == 0 and (starts == np.arange(0, n, n // G)).all():  # every run one size
        k = n // G
        if w is None:
            return x.reshape((G, k) + x.shape[1:]).sum(axis=1)
        out = np.einsum("gk,gkm->gm", w.reshape(G, k), x.reshape(G, k, -1))
        return out.reshape((G,) + x.shape[1:])
    size = np.diff(np.r_[starts, n])  # (G,)
    if G <= 2 or (size[1:-1] == size[1]).all():
        out = np.empty((G,) + x.shape[1:])
        lo, hi = (1, G - 1) if G > 2 else (0, 0)
        if hi > lo:
            mid = x[starts[lo]:starts[hi]].reshape((hi - lo, size[1]) + x.shape[1:])
            if w is None:
                out[lo:hi] = mid.sum(axis=1)
            else:  # (g, size) weights of (g, size, m) rows; numpy's batched matmul is slower
                wm = w[starts[lo]:starts[hi]].reshape(hi - lo, size[1])
                out[lo:hi] = np.einsum("gk,gkm->gm", wm, mid.reshape(hi - lo, size[1], -1)
                                       ).reshape(out[lo:hi].shape)
        for g in [0, G - 1] if G > 2 else range(G):
            part = slice(starts[g], starts[g] + size[g])
            out[g] = x[part].sum(axis=0) if w is None else np.tensordot(w[part], x[part], 1)
        return out
    lab = np.repeat(np.arange(G), size)  # (n,)
    val = np.ones(n) if w is None else w
    S = sparse.csr_matrix((val, (lab, np.arange(n))), shape=(G, n))
    return np.asarray(S @ x.reshape(n, -1)).reshape((G,) + x.shape[1:])


def history_cross(hist_at, W, X1, X2, starts, weights=None):
    r"""Cross terms of the responses ending under ``B`` parents at depth ``d``:
    ``(c, c4)``, each ``(d + 1, d + 1, P)``, slot ``[d, d]`` left 0.

    .. math::

       c_{u,t} = \sum_g W_g\,\xi_u(g)\,\xi_t(g),\quad
       c_{u,d} = \sum_g \xi_u(g) \odot X_{1,g} \qquad (u \le t < d),

    and :math:`c^{(4)}` the same with squared scores and :math:`X_2`.

    Args:
        hist_at: ``(t, rows) -> (len(rows), P)``, the parents' score :math:`\xi_t`.
        W: ``(B,)`` total weight of each parent's complete responses.
        X1, X2: ``(B, P)`` :math:`\sum_a w_a \xi_d(a)` and :math:`\sum_a w_a \xi_d(a)^2`;
            with ``weights``, the unweighted :math:`\xi_d` and :math:`\xi_d^2` of one
            response per parent, whose weights ``weights (B,)`` are taken inside the sums
            (the weighted arrays are not written).
        starts: :func:`prefix_starts` of the parents (``d`` levels).
    """
    d, P = len(starts), X1.shape[1]
    c, c4 = np.zeros((d + 1, d + 1, P)), np.zeros((d + 1, d + 1, P))
    if d == 0:
        return c, c4
    h = hist_at(d - 1, starts[d - 1])  # (B, P): one row per parent
    h2 = h * h
    Wd = W if len(starts[d - 1]) == len(W) else segment_sum(W, starts[d - 1])  # (B,)
    c[d - 1, d - 1], c4[d - 1, d - 1] = Wd @ h2, Wd @ (h2 * h2)
    if weights is None:
        c[d - 1, d] = np.einsum("gp,gp->p", h, X1)
        c4[d - 1, d] = np.einsum("gp,gp->p", h2, X2)
    else:
        c[d - 1, d] = np.einsum("g,gp,gp->p", weights, h, X1)
        c4[d - 1, d] = np.einsum("g,gp,gp->p", weights, h2, X2)
    cols = None
    if d > 1:  # coarser runs: the sums over each run, slots t = d, d-1, then each coarser one
        pos = np.searchsorted(starts[d - 1], starts[d - 2])
        cols = [segment_sum(x, pos, wx) for x, wx in [(X1, weights), (X2, weights), (h, Wd),
                                                      (h2, Wd)]]
    return coarse_cross(c, c4, cols, hist_at, W, starts)


def coarse_cross(c, c4, cols, hist_at, W, starts):
    r"""The cross terms of :func:`history_cross` with an earlier slot ``L < d - 1``, from
    ``cols``, four ``(n, P)`` arrays over each of the ``n`` runs of parents sharing their
    first ``d - 1`` generated tokens: :math:`\sum X_1`, :math:`\sum X_2`,
    :math:`\sum W \xi_{d-1}` and :math:`\sum W \xi_{d-1}^2` (``None`` when ``d = 1``);
    then ``c``, ``c4`` made symmetric. Returns ``(c, c4)``.

    At each earlier slot ``L`` (the runs sharing their first ``L + 1`` tokens) the columns
    gain :math:`\sum W \xi_L` and :math:`\sum W \xi_L^2`; those of even place pair with
    :math:`\xi_L` (into ``c``), those of odd place with :math:`\xi_L^2` (into ``c4``), each
    contracted over the runs on its own (no stacked copy), then all are summed over the runs
    one level up."""
    d = len(starts)
    if d > 1:
        ts, cols = [d, d - 1], list(cols)  # the slots the columns' pairs belong to
        for L in range(d - 2, -1, -1):
            h = hist_at(L, starts[L])  # (n_L, P)
            wh = segment_sum(W, starts[L])[:, None] * h
            cols += [wh, wh * h]
            ts = ts + [L]
            h2 = h * h
            for j, t in enumerate(ts):
                c[L, t] = np.einsum("gp,gp->p", h, cols[2 * j])
                c4[L, t] = np.einsum("gp,gp->p", h2, cols[2 * j + 1])
            if L:  # the runs one level up: every column summed over them
                pos = np.searchsorted(starts[L], starts[L - 1])
                cols = [segment_sum(x, pos) for x in cols]
    for u in range(d):
        c[u + 1:d, u], c4[u + 1:d, u] = c[u, u + 1:d], c4[u, u + 1:d]
    c[d, :d], c4[d, :d] = c[:d, d], c4[:d, d]
    return c, c4


def level_sums(H, G, hist_at, w, Rc, rho_w, X, starts, Z=None, pure=None):
    r"""The response-level sums of one stream over a block's complete responses.

    Args:
        H, G: ``(B, P)`` parents' running score sums and path sums of ``m`` (their own
            included); ``G`` ``None`` when :math:`\sum W G` and :math:`\sum W G^2` are formed
            elsewhere.
        hist_at: the parents' scores (:func:`history_cross`); ``starts``: :func:`prefix_starts`.
        w, Rc: ``(B, k)`` weights and rewards (relative to the stream's ``r0``).
        rho_w: ``(B, k)`` importance-weighted weights, or ``None`` when the stream is
            drawn from the policy (then :math:`\rho w = w` and the caller copies).
        X: :math:`X_1, X_2, X_3` of :func:`parent_powers`, or only :math:`X_1, X_2` when
            :math:`2\sum_g H_g X_1` and :math:`4\sum_g H_g X_3` are added elsewhere.
        Z: :func:`window_products` of ``[w R, w R^2]``, or ``None`` when the terms
            :math:`2\sum_g H_g \odot Z_g` are added elsewhere (deferred per window).
        pure: :math:`(\sum_g X_1, \sum_g X_2, \sum_g X_4)`, the terms without
            :math:`H`, or ``None`` when they are added elsewhere (per window).

    Returns:
        ``{name: sum}`` for :meth:`fisher_ref.engine.moments.Moments.add_sums`. Never here:
        the per-(window, token) terms :math:`\sum c\,\xi^n` of the reward and importance
        weights (``c = wR, wR^2, \rho w, \rho w R``), which are accumulated.
    """
    wR = w * Rc  # (B, k)
    W, WR, WR2 = w.sum(axis=1), wR.sum(axis=1), (wR * Rc).sum(axis=1)  # (B,) each
    X1, X2 = X[:2]
    H2 = H * H  # (B, P)
    h4 = W @ (H2 * H2) + 4 * np.einsum("bp,bp,bp->p", H2, H, X1) \
        + 6 * np.einsum("bp,bp->p", H2, X2)
    # one matrix-vector product per weight (faster here than one with a few rows)
    out = {"mass": W.sum(), "R": WR.sum(), "h": W @ H, "Rh": WR @ H,
           "h2": W @ H2, "Rh2": WR @ H2, "R2h2": WR2 @ H2, "h4": h4}
    if G is not None:  # else the path sums are added elsewhere
        out["g"], out["g2"] = W @ G, W @ (G * G)
    if len(X) > 2:  # else the terms H X_1, H X_3 are added per window elsewhere
        out["h2"] = out["h2"] + 2 * np.einsum("bp,bp->p", H, X1)
        out["h4"] = out["h4"] + 4 * np.einsum("bp,bp->p", H, X[2])
    if Z is not None:
        mix = np.einsum("bp,bip->ip", H, Z)  # (2, P)
        out["Rh2"], out["R2h2"] = out["Rh2"] + 2 * mix[0], out["R2h2"] + 2 * mix[1]
    if rho_w is not None:
        out["is_h"], out["is_Rh"] = np.stack([rho_w.sum(axis=1), (rho_w * Rc).sum(axis=1)]) @ H
    c, c4 = history_cross(hist_at, W, X1, X2, starts)
    if pure is not None:
        S1, S2, S4 = pure
        out["h"], out["h2"], out["h4"] = out["h"] + S1, out["h2"] + S2, out["h4"] + S4
        c[-1, -1], c4[-1, -1] = S2, S4
    out["cross"], out["cross4"] = c, c4
    return out


def one_token_sums(H, G, hist_at, w, Rc, rho_w, x, starts):
    r""":func:`level_sums` where each parent has one complete response (one terminal token,
    EOS before the last level): its score sum :math:`h = H + \xi` formed whole, and every
    power of it summed with the weights (one product of a few weights with ``h`` or
    :math:`h^2`), not expanded by the binomial theorem, which pays only where several
    responses share :math:`H`. The same finite sums (rounded once per response, not per
    term of the expansion); as in :func:`level_sums`, the terms :math:`\sum c\,\xi^n` of
    the reward and importance weights are not here (accumulated per window and token).

    Args:
        H, G, hist_at, w, Rc, rho_w, starts: as :func:`level_sums` (``w``, ``Rc`` and
            ``rho_w`` ``(B, 1)``).
        x: ``(B, P)`` the score of each parent's terminal token.
    """
    W, Rc = w[:, 0], Rc[:, 0]
    WR = W * Rc
    h, x2 = H + x, x * x  # (B, P)
    h2 = h * h
    out = {"mass": W.sum(), "R": WR.sum(), "h": W @ h, "h2": W @ h2,
           "h4": np.einsum("b,bp,bp->p", W, h2, h2)}
    # the reward and importance weights' terms without H are accumulated per (window,
    # token) (as level_sums): here h - xi = H and h^2 - xi^2
    out["Rh2"], out["R2h2"] = np.stack([WR, WR * Rc]) @ (h2 - x2)
    if rho_w is None:
        out["Rh"] = WR @ H
    else:
        out["Rh"], out["is_h"], out["is_Rh"] = np.stack([WR, rho_w[:, 0], rho_w[:, 0] * Rc]) @ H
    if G is not None:
        out["g"], out["g2"] = W @ G, np.einsum("b,bp,bp->p", W, G, G)
    c, c4 = history_cross(hist_at, W, x, x2, starts, weights=W)  # W x, W x^2 not written
    c[-1, -1], c4[-1, -1] = W @ x2, np.einsum("b,bp,bp->p", W, x2, x2)
    out["cross"], out["cross4"] = c, c4
    return out


def fisher_sums(H, W, X1, X2=None):
    r"""The sums of ``exact(..., quantities="fisher")`` over a block's complete responses:
    probability, :math:`\sum w\,h = \sum_g W_g H_g + \sum_g X_{1,g}` and
    :math:`\sum w\,h^2 = \sum_g W_g H_g^2 + 2 \sum_g H_g \odot X_{1,g} + \sum_g X_{2,g}`.

    Args:
        H: ``(B, P)`` parents' running score sums; ``W``: ``(B,)`` their responses' total
            weight; ``X1, X2``: :func:`parent_powers`. Without ``X2`` the terms without
            ``H`` are left out (summed per window elsewhere).
    """
    out = {"mass": W.sum(), "h": W @ H, "h2": W @ (H * H) + 2 * np.einsum("bp,bp->p", H, X1)}
    if X2 is not None:
        out["h"], out["h2"] = out["h"] + X1.sum(axis=0), out["h2"] + X2.sum(axis=0)
    return out


def held_products(xi, y1, y3, held, rows, C, r, src, chunk_elements=2 ** 18):
    r"""The deferred per-window products of the window cache
    (:meth:`fisher_ref.engine.window_cache.WindowCache.defer`): :math:`\sum_g H_g \odot Z_g`
    with :math:`Z_g = C_g\,\xi_{\text{row}_g}` ``(n, P)`` and
    :math:`\sum_g r_g H_g \odot y_l(\text{row}_g)`, ``l = 1, 3`` ``(2, P)``, for parents at
    cache rows ``rows (B,)`` whose running sums are the rows ``src (B,)`` of ``held``.
    Windows with ``g`` parents each go through one batched matrix product
    ``(m, g n, V) @ (m, V, P)``, a few windows at a time (about ``chunk_elements``).

    Args:
        xi: ``(U, V, P)`` the stream's scores; y1, y3: ``(U, P)`` its moments.
        held: ``(., P)`` the parents' running sums; C: ``(B, n, V)`` token weights;
        r: ``(B,)`` the parents' reach.
    """
    n = C.shape[1]
    V, P = xi.shape[1:]
    order = np.argsort(rows, kind="stable")  # (B,): parents in window order
    us, first, count = np.unique(rows[order], return_index=True, return_counts=True)
    total, ry = np.zeros((n, P)), np.zeros((2, P))
    for g in np.unique(count):
        sel = np.flatnonzero(count == g)  # windows with g parents
        step = max(1, chunk_elements // (g * (n + 1) * P))
        for lo in range(0, len(sel), step):
            c = sel[lo:lo + step]
            m, u = len(c), us[c]
            idx = order[first[c][:, None] + np.arange(g)]  # (m, g)
            Hs = held[src[idx]]  # (m, g, P)
            x = xi[u[0]:u[-1] + 1] if u[-1] - u[0] == m - 1 else xi[u]  # (m, V, P)
            Z = np.matmul(C[idx].reshape(m, g * n, V), x)  # (m, g*n, P)
            total += np.einsum("mgp,mgip->ip", Hs, Z.reshape(m, g, n, P))
            rH = np.einsum("mg,mgp->mp", r[idx], Hs)  # (m, P)
            ry[0] += np.einsum("mp,mp->p", rH, y1[u])
            ry[1] += np.einsum("mp,mp->p", rH, y3[u])
    return total, ry
