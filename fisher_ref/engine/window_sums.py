r"""The sums a :class:`fisher_ref.engine.window_cache.WindowCache` collects per window and
hands on when its windows leave the cache: the per-(window, token) weights of complete
responses (:meth:`WindowSums.accumulate`, :meth:`~WindowSums.accumulate_reach`), the
reach of states (:meth:`~WindowSums.accumulate_states`) and the parents' running sums held
for the per-window products (:meth:`~WindowSums.reserve`, :meth:`~WindowSums.defer`), each
contracted with the window's arrays once (:meth:`~WindowSums.flush`): the distributive law
on the same finite sums.

``tests/engine/test_window_sums.py`` holds the flushed sums to the same sums formed
directly.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.engine.factored import window_sums
from fisher_ref.engine.factors import row_width
from fisher_ref.engine.parent_sums import held_products

__all__ = ["WindowSums", "CHUNK_ELEMENTS", "J_ELEMENTS"]

#: Elements of the (windows, V, P) arrays of one pass over a few windows (about 2 MiB).
CHUNK_ELEMENTS = 2 ** 18
#: Elements of one sensitivities call (about 16 MiB).
J_ELEMENTS = 2 ** 21


class WindowSums:
    """The accumulated and deferred sums of a :class:`fisher_ref.engine.window_cache.WindowCache`
    (which derives from this class: its ids, rows, arrays and streams are what these
    methods read, and its ``acc``, ``sums``, ``pending`` and held buffer what they write)."""

    def accumulate(self, s, rows, tokens, weights):
        r"""Add weights ``(B, n, k)`` of tokens ``(k,)`` at rows ``(B,)`` for stream ``s``:
        at :meth:`flush`, weight ``i`` adds
        :math:`\sum_{b,a} w_{b,i,a}\,\xi_{\text{row}_b, a}^{\,n_i}` to ``sums[s][name_i]``."""
        acc = self.acc[s]  # (size, n, V)
        n = weights.shape[1]
        idx = (rows[:, None, None] * n + np.arange(n)[None, :, None]) * acc.shape[2] \
            + tokens[None, None, :]  # (B, n, k)
        used = acc[:int(rows.max()) + 1].reshape(-1)  # the rows in use (add.at is slow)
        used += np.bincount(idx.ravel(), weights.ravel(), minlength=used.size)

    def accumulate_reach(self, s, rows, r, depth):
        r"""Add reach ``r (B,)`` of parents at rows ``(B,)`` and ``depth`` whose every token
        ends a response (weights :math:`w_{g,a} = r_g q_a`): at :meth:`flush`, the sums
        without :math:`H`, :math:`\sum_g r_g\,y_n(u_g)`, go to ``h`` (``n = 1``), ``h2``
        and ``cross[depth]`` (2), ``h4`` and ``cross4[depth]`` (4; not with ``moments=2``)."""
        m = int(rows.max()) + 1
        self.acc[("r", s)][:m, depth] += np.bincount(rows, r, minlength=m)

    def accumulate_states(self, s, rows, reach, depth):
        r"""Add the reach ``(B,)`` of states at rows ``(B,)`` and ``depth`` under stream
        ``s``'s distribution: at :meth:`flush`, :math:`\sum_s \pi(s)\,m(s)` (the token
        moment ``y_2`` of each state's window) goes to ``token_sum_by_depth[depth]``, and
        :math:`|E[\xi \mid s]|` (``y_1``) of every window with a state of positive reach
        to the largest so far, ``cond_max``."""
        m = int(rows.max()) + 1
        self.acc[("st", s)][:m, depth] += np.bincount(rows, reach, minlength=m)

    def reserve(self, B, P):
        """Room for the running sums of ``B`` parents in the held buffer, ``(B, P)``: the
        caller writes them there and passes that view to :meth:`defer` (no copy). Uses
        what is held first when the buffer would pass ``defer_bytes``."""
        if self.held + B > len(self.held_H):
            cap = self.defer_bytes // (8 * P)
            if self.held + B > cap:  # past defer_bytes: use what is held first
                self._products()
            if self.held + B > len(self.held_H):  # grow (fourfold, up to defer_bytes)
                grown = np.empty((max(self.held + B, min(cap, 4 * max(len(self.held_H), B))), P))
                grown[:self.held] = self.held_H[:self.held]
                self.held_H = grown
        return self.held_H[self.held:self.held + B]

    def defer(self, s, rows, C, H, names, r):
        r"""Later, add :math:`2\sum_g H_g \odot \sum_a C_{g,i,a}\,\xi_{\text{row}_g, a}` to
        ``sums[s][names[i]]``, and :math:`\sum_g r_g H_g \odot y_l(\text{row}_g)` twice to
        ``h2`` (``l = 1``) and four times to ``h4`` (``l = 3``): parents of one window are
        gathered over many blocks, so that each window's arrays are read once per product.

        Args:
            rows: ``(B,)``; ``C``: ``(B, n, V)`` weights of every token; ``H``: ``(B, P)``,
            the view :meth:`reserve` returned, or an array copied into it here;
            ``r``: ``(B,)`` the parents' reach.
        """
        B, P = H.shape
        slot = self.reserve(B, P)
        if H.ctypes.data != slot.ctypes.data:  # not written in place
            slot[:] = H
        self.pending.append((s, tuple(names), rows, C, r, np.arange(self.held, self.held + B)))
        self.held += B

    def _products(self):
        """The deferred products (:meth:`defer`), windows with as many parents at once."""
        by = {}
        for s, names, *part in self.pending:
            by.setdefault((s, names), []).append(part)
        self.pending, self.held = [], 0
        for (s, names), parts in by.items():
            rows, C, r, src = (np.concatenate(x) for x in zip(*parts))
            arrays = self.arrays
            total, ry = held_products(arrays[f"xi{self.streams[s][2]}"], arrays[f"y{s}_1"],
                                      arrays[f"y{s}_3"], self.held_H, rows, C, r, src,
                                      CHUNK_ELEMENTS)
            for i, name in enumerate(names):
                self.sums[s][name] += 2 * total[i]
            self.sums[s]["h2"] += 2 * ry[0]
            self.sums[s]["h4"] += 4 * ry[1]

    def flush(self, last=False):
        """Use every cached window's deferred and accumulated weights, then empty the cache
        (``last``: the run's last flush, which leaves the rows' arrays as they are, for
        :meth:`kept_tables`)."""
        if self.by_rows and not last and self.kept and self.n:  # rows about to be reused
            self._by_id(np.arange(self.n), 0, self.n)
        self._products()
        for s, stream in enumerate(self.streams):
            if f"y{s}_1" not in self.arrays:  # nothing cached yet
                continue
            self._contract(s)
            A, a, n = self.acc[("r", s)][:self.n], self.arrays, self.n  # (n, T)
            St = self.acc[("st", s)][:n]  # (n, T) the states' reach per window and depth
            tot, out, T = A.sum(axis=1), self.sums[s], A.shape[1]  # (n,)
            out["h"] += tot @ a[f"y{s}_1"][:n]
            # every weight of one moment in one product: each (n, P) array read once
            y2 = np.concatenate([tot[None], A.T, St.T]) @ a[f"y{s}_2"][:n]  # (1 + 2T, P)
            out["h2"] += y2[0]
            out["cross"] += y2[1:T + 1]  # (T, P)
            out["token_sum_by_depth"] += y2[T + 1:]  # (T, P)
            if f"y{s}_4" in a:  # not with moments=2
                y4 = np.concatenate([tot[None], A.T]) @ a[f"y{s}_4"][:n]  # (1 + T, P)
                out["h4"] += y4[0]
                out["cross4"] += y4[1:]
            A[:] = 0.0
            live = St.sum(axis=1) > 0  # reach >= 0: some state reachable
            if n and live.all():  # the largest |E[xi | s]| as the largest and -smallest
                y1 = a[f"y{s}_1"][:n]
                np.maximum(out["cond_max"], np.maximum(y1.max(axis=0), -y1.min(axis=0)),
                           out=out["cond_max"])
            elif live.any():
                np.maximum(out["cond_max"], np.abs(a[f"y{s}_1"][:n][live]).max(axis=0),
                           out=out["cond_max"])
            St[:] = 0.0
        self.row_of[:self.n_ids] = -1
        self.n = 0

    def _contract(self, s):
        """Contract stream ``s``'s per-(window, token) weights with powers of its scores
        (a factored cache: from the factors, :func:`fisher_ref.engine.factored.window_sums`)."""
        powers, acc = self.powers.get(s, ()), self.acc.get(s)
        if not len(powers):  # no weights accumulated
            return
        if self.factored:
            V = self.task.model.vocab_size
            # windows whose (window, token) rows hold about J_ELEMENTS / 4 elements
            # (row_width counts sixteen rows' worth): one batch for a small run
            step = max(1, 4 * J_ELEMENTS // (V * row_width(self.task.model.spec,
                                                             self.columns)))
            for lo in range(0, self.n, step):
                hi = min(lo + step, self.n)
                for name, v in zip(self.names[s],
                                   window_sums(self, s, acc[lo:hi], powers, lo, hi)):
                    self.sums[s][name] += v
            acc[:self.n] = 0.0
            return
        xi = self.arrays[f"xi{self.streams[s].center}"]
        V, P = xi.shape[1:]
        step = max(1, CHUNK_ELEMENTS // (V * P))
        for lo in range(0, self.n, step):
            hi = min(lo + step, self.n)
            x, A = xi[lo:hi], acc[lo:hi]  # (u, V, P), (u, n, V)
            xn = x
            for n in range(1, powers.max() + 1):
                if n > 1:
                    xn = x * x if n == 2 else np.multiply(xn, x, out=xn)
                i = np.flatnonzero(powers == n)
                if len(i):  # (m, u*V) @ (u*V, P): one matrix product for the m weights
                    Ai = A[:, i].transpose(1, 0, 2).reshape(len(i), -1)
                    for name, v in zip([self.names[s][j] for j in i],
                                       Ai @ xn.reshape(-1, P)):
                        self.sums[s][name] += v
        acc[:self.n] = 0.0
