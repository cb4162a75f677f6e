r"""The last level of an MLP run, summed from the factors of its scores.

The parents ``b`` of the last level (every child a complete response) sit in groups
under their grandparents ``g``, with running sums :math:`H_b = H_g + \xi_b`
(:math:`\xi_b` the score of the parent's last token, a row of the grandparent's window).
Every sum a run adds there has the form
:math:`\sum_b c_b\,H_b^n \odot Y_b` (``c`` a weight per parent, ``Y`` a product of rows
per parent: powers of :math:`\xi_b`, the moments :math:`y_l` of the parent's own window, the
reward-weighted products :math:`Z_b = \sum_a C_{b,a}\,\xi_{b,a}`), and the binomial theorem
gives

.. math::

   \sum_b c_b\,H_b^n \odot Y_b = \sum_{l=0}^{n} \binom{n}{l} \sum_g H_g^{\,n-l} \odot
   \sum_{b \in g} c_b\,\xi_b^{\,l}\,Y_b

(:meth:`LastLevel.hsum`; the path sums and the cross terms likewise, with the grandparents'
path sums and histories). For the window MLP every block of a score row is an outer
product of two short factors (:mod:`fisher_ref.engine.mlp_scores`):
:math:`\xi = e \otimes \hat g` on ``W1`` and :math:`\mathrm{hid} \otimes D` on ``W2``, and
so are :math:`y_l` and :math:`Z`. Elementwise products of such rows keep the form, and a sum
over parents of them is a small matrix product,
:math:`\sum_b c_b\,(\alpha_b \otimes \beta_b) = \alpha^\top \mathrm{diag}(c)\,\beta`, per
grandparent a batched one (:func:`wsum`, :func:`gsum`). So no ``(parents, P)`` array is
formed, only ``(grandparents, P)`` ones: the same finite sums, regrouped (no identity of
docs/theory.md §2.9 is used). A bias block (``b1``, ``b2``) is its weight block's second
factor, and follows that block in the flat layout: so the first factor is held with a last
entry 1 (:func:`augment`), and the outer product covers the weight block and its bias as
one ``(m + 1, l)`` block, summed in the same matrix product; the ``E`` block is held by
slot, only its rows of the tokens a group's rows read (:class:`Slots`).
:func:`last_level_fisher` adds what ``quantities="fisher"`` needs, :func:`last_level_all`
everything else a default run adds there (the reward sums, the fourth powers, the path sums,
the cross terms and the products the window cache would otherwise defer).
``tests/engine/test_factored.py`` holds both to the dense route
(:mod:`fisher_ref.engine.complete`, :mod:`fisher_ref.engine.parent_sums`) at 1e-12.
"""
from __future__ import annotations

import math

import numpy as np

from fisher_ref.engine.columns import param_columns
from fisher_ref.engine.parent_sums import coarse_cross, segment_sum
from fisher_ref.models.mlp import MLPModel
from fisher_ref.engine.factors import (Layout, Rows, Slots, augment, factored_sums, groups,
                                       gsum, wsum)
from fisher_ref.engine.mlp_columns import mlp_param_shards

__all__ = ["factors_last_level", "shard_columns", "LastLevel", "last_level_fisher",
           "last_level_all", "window_sums"]


def factors_last_level(task):
    """Whether the last level of a run of ``task`` is summed here (the MLP's; over a slice of
    its parameters too, ``param_shard``: only the blocks inside it)."""
    return isinstance(task.model, MLPModel)


def shard_columns(task, n):
    """The parameters of each of ``n`` parameter shards of ``task``
    (``fisher_ref.parallel.exact_param_shard(task, (i, n))``): for the MLP, cut between its
    factor families
    and between hidden units, balanced by their work
    (:func:`fisher_ref.engine.mlp_columns.mlp_param_shards`); for other models, whose
    windows' sensitivities are formed whole in every shard, consecutive slices as equal as
    whole parameters allow (:func:`fisher_ref.engine.columns.param_columns`)."""
    cols = mlp_param_shards(task.model.spec, n) if factors_last_level(task) else None
    return param_columns(task.model.num_params, n) if cols is None else cols


class LastLevel:
    r"""One stream's last-level parents ``sl`` of a block, in factored form and in groups
    (one per grandparent), and the sums of one term over them.

    Rows by ``(l, Y)`` (:meth:`rows`): :math:`\xi_b^l \odot Y_b`, with :math:`\xi_b` the
    score of a parent's last token and ``Y`` the name of a row of its own: ``"y1"``..``"y3"``
    the moments :math:`y_l` of its window (:meth:`y`), or one given to :meth:`name`. The
    grandparent's window is the same for every parent of a group, so the factors of
    :math:`\xi_b` from that window (``e`` on ``W1``, ``hid`` on ``W2``) are held once per
    group and come out of the group's sums (:func:`factored_sums`). Weights by name
    (:meth:`weight`). The sums of one term over the parents, per group (:meth:`gsum`) or in
    all (:meth:`wsum`), are kept: a term several quantities share is summed once.
    :meth:`hsum` and :meth:`totals` expand the sums over the parents' running sums
    :math:`H_b = H_g + \xi_b`, with the grandparents' ``Hg (n, P)``."""

    def __init__(self, cache, block, arrs, s, sl, gen):
        spec, a = cache.task.model.spec, cache.arrays
        self.s, self.a, self.spec = s, a, spec
        self.lay = lay = Layout(spec, cache.columns)
        self.i = i = cache.centers.index(cache.streams[s].center)
        d, src = block.depth, block.src[sl]
        runs = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])  # parents of one grandparent
        self.runs, self.gsrc = runs, src[runs]  # the grandparents' rows in the parents' arrays
        self.idx, self.valid = groups(runs, len(src))
        self._H = {1: np.take(block.parents[0][s], self.gsrc, axis=0, mode="clip")}  # (n, P)
        # the grandparents' last scores (n_g, P) (a root's are 0: no slot d - 2 is read)
        last = block.parents[2] if len(block.parents) > 2 else None
        self.parents_last = None if last is None else last[:, s]
        g = lambda x: x[self.idx]  # (b, ...) -> (n, k, ...)
        u, tok = g(block.path_rows[sl, d - 1]), g(gen[sl, d - 1])  # (n, k) each
        self.own = g(arrs.rows[sl])
        gc = D = None  # ghat of each parent's last token (n, k, H); D (n, k, V)
        if "G" in lay.families:
            gc = a[f"gc{i}"][u, tok]
        if "D" in lay.families:
            D = np.eye(spec.vocab_size)[tok] - a[f"c{i}"][u]
        ug = u[:, :1]  # (n, 1): the grandparent's window, one per group
        self.slots = E = None
        if lay.has("E"):
            win = a["win"][u[:, 0]].astype(np.int64)  # (n, kw)
            self.slots = Slots(lay, spec, win, a["dup"][u[:, 0]] > 0,
                               a["win"][self.own][:, :, -1].astype(np.int64), self.valid)
            E = self.slots.group(a[f"Ec{i}"][u, tok])
        self._rows = {(1, None): Rows(lay.pair("W1", augment(a["e"][ug]), gc),
                                      lay.pair("W2", augment(a["hid"][ug]), D), E, self.slots)}
        # the first factors of the parents' own windows, with the bias's 1 (augment)
        e, hid = augment(a["e"][self.own]), augment(a["hid"][self.own])
        self._own = [None, (e, hid), (e * e, hid * hid), (e * e * e, hid * hid * hid)]
        self._w, self._sums = {}, {}
        self.theta_W2 = cache.task.model.unpack(cache.task.theta)["W2"]  # (H, V): products()

    def weights(self, c):
        """``c (b,)`` in groups, ``(n, k)``, 0 past a group's end."""
        return np.where(self.valid, c[self.idx], 0.0)

    def weight(self, name, c):
        """Name the weights ``c (b,)`` for :meth:`hsum`, :meth:`gsum` and :meth:`wsum`."""
        self._w[name] = self.weights(c)

    def name(self, name, rows):
        """Name a parent's row ``rows`` (:class:`Rows`) for :meth:`rows` (``Y``)."""
        self._rows[(0, name)] = rows

    def Hg(self, k):
        """The grandparents' :math:`H_g^k` ``(n, P)``."""
        if k not in self._H:
            self._H[k] = self.Hg(k - 1) * self._H[1]
        return self._H[k]

    def rows(self, l, Y=None):
        r""":math:`\xi_b^l \odot Y_b` as :class:`Rows` (``Y`` a name, or ``None``: ``l >= 1``)."""
        key = (l, Y)
        if key not in self._rows:
            if Y is None:
                x = self.rows(l - 1) * self.rows(1)
            elif l == 0:  # y1..y3: the moments of the parent's own window
                x = self.y(int(Y[1:]))
            else:  # summed once: formed where it is summed
                x = self.rows(l).lazy(self.rows(0, Y))
            self._rows[key] = x
        return self._rows[key]

    def y(self, l):
        """:math:`y_l` of the parents' own windows (the stream's moments, ``l <= 3``), as
        :class:`Rows`."""
        a, s, own, lay = self.a, self.s, self.own, self.lay
        G = a[f"mG{s}_{l}"][own] if "G" in lay.families else None
        Dw = a[f"mD{s}_{l}"][own] if "D" in lay.families else None
        el, hl = self._own[l]
        E = self.slots.own(a[f"mE{s}_{l}"][own]) if lay.has("E") else None
        return Rows(lay.pair("W1", el, G), lay.pair("W2", hl, Dw), E, self.slots)

    def products(self, C):
        r""":math:`Z_{b,j} = \sum_a C_{b,j,a}\,\xi_{\text{own}_b, a}` of weights
        ``C (b, m, V)``, the scores of the parents' own windows: ``m`` :class:`Rows`, each
        block's factor formed only when the run holds the block or its bias. On ``W1``,
        :math:`\hat g_{a,h} = (W2_{h,a} - \sum_c c_c W2_{h,c})(1 - \mathrm{hid}_h^2)`, so
        :math:`\sum_a C_a \hat g_{a,h} = (1 - \mathrm{hid}_h^2) \sum_a (C_a - c_a \sum_{a'}
        C_{a'}) W2_{h,a}`, ``W2``'s factor summed with ``C``: one matrix product with ``W2``,
        not one per parent with its window's ``(V, H)`` factor."""
        a, i, own, lay = self.a, self.i, self.own, self.lay
        Cg = C[self.idx]  # (n, k, m, V)
        n, k, m, V = Cg.shape
        c = a[f"c{i}"][own]  # (n, k, V): each parent's window's center
        Cs = Cg.sum(axis=3, keepdims=True)  # (n, k, m, 1)
        (e, hid), hid_own = self._own[1], a["hid"][own][:, :, lay.hidden]  # the run's units
        gz = Ez = None
        Dz = Cg - Cs * c[:, :, None]  # (n, k, m, V): C summed with [c' = a] - c_c'
        if "G" in lay.families:  # sum_a Dz_a W2_{h,a}, times 1 - hid_h^2
            gz = (Dz.reshape(-1, V) @ self.theta_W2[lay.hidden].T).reshape(n, k, m, -1)
            gz *= (1.0 - hid_own * hid_own)[:, :, None]  # (n, k, m, H)
        if lay.has("E"):
            Ez = np.matmul(Cg, a[f"Ec{i}"][own])  # (n, k, m, k d)
        return [Rows(None if gz is None else lay.pair("W1", e, gz[:, :, j]),
                     lay.pair("W2", hid, Dz[:, :, j]),
                     None if Ez is None else self.slots.own(Ez[:, :, j]), self.slots)
                for j in range(m)]

    def gsum(self, c, l, Y=None):
        r""":math:`\sum_{b \in g} c_b\,\xi_b^l Y_b` for each group, ``(n, P)`` (kept)."""
        key = ("g", c, l, Y)
        if key not in self._sums:
            self._sums[key] = gsum(self.lay, self._w[c], self.rows(l, Y))
        return self._sums[key]

    def wsum(self, c, l, Y=None):
        r""":math:`\sum_b c_b\,\xi_b^l Y_b` ``(P,)`` (kept; from the groups' sums when formed)."""
        key = ("w", c, l, Y)
        if key not in self._sums:
            g = self._sums.get(("g", c, l, Y))
            self._sums[key] = g.sum(axis=0) if g is not None else \
                wsum(self.lay, self._w[c], self.rows(l, Y))
        return self._sums[key]

    def hsum(self, c, n, Y=None, coef=1.0):
        r"""The terms of :math:`\mathrm{coef} \sum_b c_b\,H_b^n \odot Y_b` (``c`` a name of
        :meth:`weight`, ``Y`` one of :meth:`rows` or none) by the binomial theorem:
        :math:`\sum_l \binom{n}{l} \sum_g H_g^{n-l} \odot \sum_{b \in g} c_b\,\xi_b^l Y_b`,
        as ``[(n - l, coef, c, l, Y)]``; :meth:`totals` adds them."""
        return [(n - l, coef * math.comb(n, l), c, l, Y) for l in range(n + 1)]

    def totals(self, sums):
        """The sums ``{name: (P,)}`` of :meth:`hsum`'s terms ``{name: terms}``: per power
        ``k`` of ``H_g``, each of the groups' sums of a name's terms (:meth:`parts`: those
        kept, and one fused sum of the others) contracted with ``H_g^k`` (no ``(n, P)``
        array is written to add them up first), and the terms without a row (the weights
        alone) of every name in one product with ``H_g^k``; the terms without ``H_g``, the
        sums over every parent, added up (:meth:`combined`)."""
        out = {name: 0.0 for name in sums}
        for k in sorted({t[0] for terms in sums.values() for t in terms}, reverse=True):
            pure = []  # (name, (n,) weights): the terms c H_g^k without a row
            for name, terms in sums.items():
                at = [(coef, (c, l, Y)) for kk, coef, c, l, Y in terms
                      if kk == k and (l or Y)]
                w = [coef * self._w[c].sum(axis=1) for kk, coef, c, l, Y in terms
                     if kk == k and not (l or Y)]  # (n,) each
                if k == 0:
                    out[name] = out[name] + self.combined(at, grouped=False) + \
                        sum(x.sum() for x in w)
                    continue
                for coef, g in self.parts(at):  # each contracted: no (n, P) sum of them
                    out[name] = out[name] + coef * np.einsum("gp,gp->p", self.Hg(k), g)
                if w:
                    pure.append((name, sum(w)))
            if pure:  # one product for every name's
                for (name, _), v in zip(pure, np.stack([x for _, x in pure]) @ self.Hg(k)):
                    out[name] = out[name] + v
        return out

    def parts(self, terms, grouped=True):
        r"""The sums of the terms ``[(coef, (c, l, Y)), ...]`` (:math:`\mathrm{coef}
        \sum_{b \in g} c_b\,\xi_b^l Y_b`), per group (``(n, P)`` each) or over every parent
        (``(P,)``), as ``[(coef, sum), ...]`` that add up to their total: the sums kept
        already (:meth:`gsum`; over every parent also :meth:`wsum`) are read with their
        coefficient, every other term goes into one fused sum (:func:`factored_sums`: one matrix
        product per block; coefficient 1), which is kept when it holds a single term."""
        kept, rest = [], []
        for coef, key in terms:
            if ("g",) + key in self._sums or (not grouped and ("w",) + key in self._sums):
                kept.append((coef, self.gsum(*key) if grouped else self.wsum(*key)))
            else:
                rest.append((coef, key))
        if len(rest) == 1:
            kept.append((rest[0][0], self.gsum(*rest[0][1]) if grouped
                         else self.wsum(*rest[0][1])))
        elif rest:
            kept.append((1.0, factored_sums(self.lay, [(coef * self._w[c], self.rows(l, Y))
                                               for coef, (c, l, Y) in rest], grouped)))
        return kept

    def combined(self, terms, grouped=True):
        r""":math:`\sum_j \mathrm{coef}_j \sum_{b \in g} c_b\,\xi_b^l Y_b` over the terms
        ``[(coef, (c, l, Y)), ...]``, per group ``(n, P)`` (or over every parent, ``(P,)``;
        ``0.0`` for no term): :meth:`parts` added up."""
        out = None
        for coef, s in self.parts(terms, grouped):
            if out is None:
                out = s.copy() if coef == 1.0 else coef * s
            else:
                out += coef * s
        return 0.0 if out is None else out


def last_level_fisher(cache, block, arrs, s, sl, gen, W, r):
    r"""The sums of :func:`fisher_ref.engine.complete._last_level_fisher` (``mass``, ``h``,
    ``h2``) of stream ``s`` over the last level's parents ``sl``, from the factors of the
    MLP's :class:`fisher_ref.engine.window_cache.WindowCache` (module docstring).

    Args:
        W: ``(b,)`` total weight of each parent's complete responses; ``r``: ``(b,)`` the
            parents' reach; ``gen``: the block's generated tokens ``(B, d)``.
    """
    L = LastLevel(cache, block, arrs, s, sl, gen)
    L.weight("W", W)
    L.weight("r", r)
    return dict(L.totals({"h2": L.hsum("W", 2) + L.hsum("r", 1, "y1", 2.0),
                          "h": L.hsum("W", 1)}), mass=W.sum())


def last_level_all(cache, block, arrs, s, sl, gen, w, Rc, rho_w, C, r, starts):
    r"""Every sum a default run adds at the last level
    (:func:`fisher_ref.engine.complete.last_level`,
    :func:`fisher_ref.engine.parent_sums.level_sums` and the products the window cache would
    defer, :meth:`fisher_ref.engine.window_cache.WindowCache.defer`) for stream ``s`` over
    parents ``sl``, from the factors (module docstring): a dict for
    :meth:`fisher_ref.engine.moments.Moments.add_sums`.

    Args:
        w, Rc: ``(b, V)`` the responses' weights and rewards (relative to ``r0``);
        rho_w: ``(b, V)`` importance-weighted weights or ``None``; ``C``: ``(b, 2, V)``
        the weights ``w R``, ``w R^2`` of the deferred products; ``r``: ``(b,)`` reach;
        ``starts``: :func:`fisher_ref.engine.parent_sums.prefix_starts` of the parents.
    """
    L = LastLevel(cache, block, arrs, s, sl, gen)
    wR = w * Rc
    W = w.sum(axis=1)
    for name, c in (("W", W), ("WR", wR.sum(axis=1)), ("WR2", (wR * Rc).sum(axis=1)),
                    ("r", r), ("one", np.ones(len(W)))):
        L.weight(name, c)
    for j, Z in enumerate(L.products(C)):
        L.name(f"Z{j}", Z)
    L.name("y2y2", L.rows(0, "y2") * L.rows(0, "y2"))
    out = {"mass": W.sum(), "R": wR.sum()}
    # the groups' sums read one by one (the cross terms' columns, the path sums) first: the
    # sums below read them, and fuse each power's other terms into one product per block
    cross_keys = (("r", 0, "y1"), ("r", 0, "y2"), ("W", 1, None), ("W", 2, None))
    slot_keys = (("W", 2, None), ("W", 4, None), ("r", 1, "y1"), ("r", 2, "y2"))  # c, c4
    for key in cross_keys + (("W", 0, "y2"),):
        L.gsum(*key)
    for key in (("W", 4, None), ("r", 2, "y2")):  # read by the cross terms and by h4's
        L.wsum(*key)  # sum over every parent: formed once, kept (not inside a fused sum)
    sums = [("h4", L.hsum("W", 4) + L.hsum("r", 3, "y1", 4.0) + L.hsum("r", 2, "y2", 6.0)
             + L.hsum("r", 1, "y3", 4.0)),
            ("h2", L.hsum("W", 2) + L.hsum("r", 1, "y1", 2.0)),
            ("Rh2", L.hsum("WR", 2) + L.hsum("one", 1, "Z0", 2.0)),
            ("R2h2", L.hsum("WR2", 2) + L.hsum("one", 1, "Z1", 2.0)),
            ("h", L.hsum("W", 1)), ("Rh", L.hsum("WR", 1))]
    out.update(L.totals(dict(sums)))
    if rho_w is not None:
        L.weight("rho", rho_w.sum(axis=1))
        L.weight("rhoR", (rho_w * Rc).sum(axis=1))
        out.update(L.totals({"is_h": L.hsum("rho", 1), "is_Rh": L.hsum("rhoR", 1)}))
    # cross terms: the parents' last slot d - 1 and the response's slot d here, the earlier
    # slots from the groups' sums (coarse_cross)
    d, P = len(starts), len(out["h"])
    cols = [L.gsum(*key) for key in cross_keys] if d > 1 else None
    # path sums g = G_g + m_b (m = y_2 of the parent's own window), expanded per grandparent
    Gp = np.take(block.parents[1][s], L.gsrc, axis=0, mode="clip")  # (n, P)
    Wg = segment_sum(W, L.runs)
    out["g2"] = Wg @ (Gp * Gp) + L.wsum("W", 0, "y2y2") \
        + 2 * np.einsum("gp,gp->p", Gp, L.gsum("W", 0, "y2"))
    out["g"] = Wg @ Gp + L.wsum("W", 0, "y2")
    c, c4 = np.zeros((d + 1, d + 1, P)), np.zeros((d + 1, d + 1, P))
    (c[d - 1, d - 1], c4[d - 1, d - 1], c[d - 1, d], c4[d - 1, d]) = \
        (L.wsum(*key) for key in slot_keys)
    hist_at = _history(arrs.xiT[s], block.path_rows[sl], gen[sl], d, L)
    out["cross"], out["cross4"] = coarse_cross(c, c4, cols, hist_at, W, starts)
    return out


def _history(xi, prow, gen, d, L):
    r"""``hist_at(t, at)``, the parents' score :math:`\xi_t` at rows ``at``, ``t < d - 1``
    (their ancestors'); at ``t = d - 2`` for the first row of each group (``at`` the groups'
    starts, ``L.runs``), the grandparents' last scores, which they carry
    (:class:`fisher_ref.engine.tree.Block` ``parents``), not formed again."""
    last = L.parents_last

    def hist_at(t, at):
        if t == d - 2 and last is not None and np.array_equal(at, L.runs):
            return np.take(last, L.gsrc, axis=0, mode="clip")
        return xi[prow[at, t], gen[at, t]]
    return hist_at


def window_sums(cache, s, acc, powers, lo, hi):
    r""":math:`\sum_{u,a} A_{u,i,a}\,\xi_{u,a}^{\,n_i}` ``(m, P)`` for the weights per
    (window, token) ``acc (hi - lo, m, V)`` of stream ``s`` at cache rows ``lo..hi`` and
    their powers ``powers (m,)``, from the windows' factors (the window cache's
    :meth:`~fisher_ref.engine.window_cache.WindowCache.flush` of a factored cache): the
    scores of every (window, token) pair as :class:`Rows`, one group per window."""
    a, spec = cache.arrays, cache.task.model.spec
    i = cache.centers.index(cache.streams[s].center)
    lay, V = Layout(spec, cache.columns), spec.vocab_size
    gc = a[f"gc{i}"][lo:hi] if "G" in lay.families else None  # (n, V, H)
    D = np.eye(V)[None] - a[f"c{i}"][lo:hi][:, None, :] \
        if "D" in lay.families else None  # (n, V, V)
    slots = E = None
    if lay.has("E"):
        slots = Slots(lay, spec, a["win"][lo:hi].astype(np.int64), a["dup"][lo:hi] > 0)
        E = slots.group(a[f"Ec{i}"][lo:hi])  # (n, V, k, d)
    # (n, 1, kd + 1), (n, 1, H + 1): per window, with the bias's 1 (augment)
    e, hid = augment(a["e"][lo:hi, None]), augment(a["hid"][lo:hi, None])
    xi = Rows(lay.pair("W1", e, gc), lay.pair("W2", hid, D), E, slots)
    out, x = np.empty((len(powers), lay.width)), xi
    for p in range(1, int(max(powers)) + 1):
        if p > 1:
            x = x * xi
        for j in np.flatnonzero(powers == p):
            out[j] = wsum(lay, acc[:, j, :], x)
    return out
