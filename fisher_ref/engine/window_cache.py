r"""Per-window arrays of the fast exact engine, computed once per distinct window.

A state enters every per-state quantity only through its window (the ``k``
tokens the model reads, docs/theory.md §7.5): its probabilities ``p``, ``mu``,
its sensitivities :math:`j`, the centers, the scores
:math:`\xi_{i,a} = j_{i,a} - c_i` of every candidate token, the token moments.
:class:`WindowCache` computes them once per distinct window and serves them to
every state that ends in it:

- every distinct window gets an id for the whole run (:meth:`WindowCache.ids`);
  the window of an id stays known (:meth:`WindowCache.windows_of`), so the
  autodiff gradient reuses the ids the walk already has;
- the per-window arrays live in a cache of bounded size (:meth:`WindowCache.rows`),
  emptied when a block's new windows would not fit;
- sums of the form :math:`\sum_{(g, a)} c_{g,a}\,\xi_{u_g, a}^{\,j}` over the
  complete responses of many blocks are collected as weights per (window, token)
  (:meth:`WindowCache.accumulate`) and contracted with the window's scores once,
  when the window leaves the cache: the distributive law on the same finite sum.

Per-window arrays (``U`` windows; streams ``s`` as in :mod:`fisher_ref.engine.run`):

- ``p``, ``q`` ``(U, V)``: the policy's and the sampler's next-token probabilities;
- ``xi{c}`` ``(U, V, P)``: the score of every token under center ``c`` (the MLP's run
  that reads scores only by rows keeps instead their factors, ``FACTORS`` of
  :mod:`fisher_ref.engine.mlp_scores`, and forms the rows it reads, :meth:`WindowCache.scores`);
- ``y{s}_{n}`` ``(U, P)``, ``n = 1..4`` (``1..2`` with ``moments=2``, all that
  ``exact(..., quantities="fisher")`` reads; no ``y{s}_3`` in a factored run, which reads
  it by its factors): :math:`\sum_a q_a \xi_a^n` under the
  distribution ``q`` stream ``s`` draws from: ``y{s}_1`` is :math:`E[\xi \mid s]`,
  ``y{s}_2`` the token moment :math:`m = \sum_a q_a (j_a - c)^2`;
- ``uniform`` ``(U, P)`` when states are kept: :math:`\frac1V\sum_a (j_a - \bar j^{\,unif})^2`.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.engine.plan import DEFAULT_BUDGETS
from fisher_ref.engine.columns import column_count
from fisher_ref.engine.run import model_probs
from fisher_ref.models.mlp import MLPModel
from fisher_ref.engine.mlp_scores import (factor_names, factor_shapes, mlp_score_rows,
                                          mlp_window_arrays)
from fisher_ref.models.sensitivities import sensitivities
from fisher_ref.engine.window_sums import CHUNK_ELEMENTS, J_ELEMENTS, WindowSums
from fisher_ref.numerics import topk_weights

__all__ = ["WindowCache"]



class WindowCache(WindowSums):
    r"""Per-window arrays of a run, computed once per distinct window (module docstring).

    Args:
        task: the :class:`fisher_ref.tasks.Task`.
        streams: ``(name, drawn from, centered at)`` of each stream.
        keep_states: also compute what the kept per-state records need.
        budget: bytes of per-window arrays to keep between blocks (speed only).
        names: ``{stream: [(name, n), ...]}``: the sum each of the stream's weights given
            to :meth:`accumulate` adds to and the power of :math:`\xi` it takes.
        expected: how many distinct windows the run will likely see (first allocation).
        moments: the largest ``n`` of the sums ``y{s}_{n}`` computed (2 or 4).
        defer_bytes: parents' score sums held by :meth:`defer` before they are used.
        kept: ``{key: array name}``: per-window arrays also kept for the whole run
            (:meth:`kept_tables`).
        columns: the parameters (a slice of ``0..P``, or for the MLP a
            :class:`fisher_ref.engine.mlp_columns.UnitColumns`) whose arrays are formed;
            default all.
        factored_last: the run sums its last level from the factors of the MLP's scores
            (:mod:`fisher_ref.engine.factored`; :attr:`factored_last`).
    """

    def __init__(self, task, streams, keep_states, budget, names, expected=64,
                 defer_bytes=DEFAULT_BUDGETS.defer_bytes, kept=None, moments=4,
                 dense_keys=DEFAULT_BUDGETS.dense_keys, columns=None, factored_last=False):
        self.task, self.streams, self.keep, self.moments = task, streams, keep_states, moments
        # the kept arrays: read from the cache's own rows while row i holds the window of
        # id i (a cache never emptied before the run's last flush), else copied by id
        self.kept, self.by_id, self.by_rows = dict(kept or {}), {}, True
        V, P = task.model.vocab_size, task.model.num_params
        self.columns = None if columns is None or (isinstance(columns, slice) and
                                                   range(P)[columns] == range(P)) else columns
        P = column_count(columns, P) if self.columns is not None else P
        self.centers = list(dict.fromkeys(stream.center for stream in streams))
        self.shapes = {"p": (V,), "q": (V,)}
        # the MLP keeps the factors of its scores and of its first three moments (for
        # engine/factored.py). A run that reads its scores only by rows (a fisher run, or a
        # run whose last level is summed from the factors: not one whose first level is its
        # last, max_len 1, whose deferred products read whole windows) keeps no (V, P)
        # scores, and forms the rows it reads from the factors (_FactoredScores)
        self.has_factors = isinstance(task.model, MLPModel)
        self.factored_last = self.has_factors and factored_last
        self.factored = self.has_factors and (moments == 2 and not names or
                                              self.factored_last and task.max_len > 1)
        self.width, self.factor_names = P, []
        if self.has_factors:
            fs = factor_shapes(task.model.spec, self.columns)  # of the families in the columns
            self.factor_names = factor_names(task.model.spec, len(self.centers), len(streams),
                                             min(moments, 3), self.columns)
            self.shapes.update({n: fs[n.rstrip("0123456789_")] for n in self.factor_names})
        if not self.factored:
            self.shapes.update({f"xi{c}": (V, P) for c in self.centers})
        for s in range(len(streams)):  # (a factored run reads y_3 only by its factors)
            self.shapes.update({f"y{s}_{n}": (P,) for n in range(1, moments + 1)
                                if not (self.factored and n == 3)})
        if keep_states:
            self.shapes["uniform"] = (P,)
        self.names = {s: [name for name, _ in v] for s, v in names.items()}
        self.powers = {s: np.array([n for _, n in v], dtype=int) for s, v in names.items()}
        T = task.max_len
        per = 8 * sum(int(np.prod(sh)) for sh in self.shapes.values())
        per += 8 * (V * sum(len(p) for p in self.powers.values()) + 2 * T * len(streams))
        self.capacity = max(1, budget // per)
        # window entries lie in -1..V (-1 pads a model's whole-history window)
        k = task.model.context
        self.exact_keys = (V + 2) ** k < 2 ** 62
        self.base = ((V + 2) ** np.arange(k)).astype(np.int64) if self.exact_keys else None
        # few possible keys: an id table indexed by key (else a dict of keys)
        self.id_of_key = np.full((V + 2) ** k, -1, dtype=np.int64) \
            if (V + 2) ** k <= dense_keys else None
        self.key_id, self.table, self.n_ids = {}, np.zeros((64, k), dtype=np.int64), 0
        self.row_of = np.full(64, -1, dtype=np.int64)  # (n_ids,) cache row of each id
        self.sums = {s: {k: np.zeros(P) for k in self.names.get(s, []) + ["h", "h2", "h4"]}
                     for s in range(len(streams))}
        for s in self.sums:
            self.sums[s].update(cross=np.zeros((T, P)), cross4=np.zeros((T, P)),
                                token_sum_by_depth=np.zeros((T, P)), cond_max=np.zeros(P))
        self.pending, self.held, self.defer_bytes = [], 0, defer_bytes
        self.held_H = np.empty((0, P))  # running sums of deferred parents (defer)
        self.arrays, self.acc, self.size, self.n, self.scratch = {}, {}, 0, 0, {}
        self.first = max(1, min(self.capacity, expected))  # rows allocated at first

    # ------------------------------------------------------------ ids

    def ids(self, W):
        """Run-wide id of each window of ``W (B, k)``: ``(B,)`` int64."""
        if not self.exact_keys:
            keys = [tuple(r) for r in W.tolist()]
            out = np.empty(len(keys), dtype=np.int64)
            for i, key in enumerate(keys):
                j = self.key_id.get(key)
                if j is None:
                    j = self.key_id[key] = self._new_id(W[i])
                out[i] = j
            return out
        if self.id_of_key is not None:
            keys = (W + 1) @ self.base  # (B,)
            fresh = np.flatnonzero(self.id_of_key[keys] < 0)
            if len(fresh):  # new ids in order of first appearance
                uk, first = np.unique(keys[fresh], return_index=True)
                order = np.argsort(first, kind="stable")
                lo = self.n_ids
                self._new_ids(W[fresh[first[order]]])
                self.id_of_key[uk[order]] = np.arange(lo, self.n_ids)
            return self.id_of_key[keys]
        # each distinct key looked up once, in order of first appearance (new ids follow it)
        uk, first, inv = np.unique((W + 1) @ self.base, return_index=True, return_inverse=True)
        ids = np.empty(len(uk), dtype=np.int64)
        for u in np.argsort(first, kind="stable"):
            key = int(uk[u])
            j = self.key_id.get(key)
            if j is None:
                j = self.key_id[key] = self._new_id(W[first[u]])
            ids[u] = j
        return ids[inv.reshape(-1)]

    def _new_id(self, window):
        self._new_ids(window[None])
        return self.n_ids - 1

    def _new_ids(self, windows):
        """Give the next ids to ``windows (m, k)``, growing the tables (doubling)."""
        n = self.n_ids + len(windows)
        while n > len(self.table):
            self.table = np.concatenate([self.table, np.zeros_like(self.table)])
            self.row_of = np.concatenate([self.row_of, np.full(len(self.row_of), -1)])
        self.table[self.n_ids:n] = windows
        self.n_ids = n

    def windows_of(self, ids):
        """The windows ``(len(ids), k)`` of run-wide ids."""
        return self.table[ids]

    # ------------------------------------------------------------ cached arrays

    def rows(self, ids):
        """Cache row ``(B,)`` of each id, computing the windows not cached yet.

        Rows stay valid until the next call (which may empty the cache).
        """
        new = np.unique(ids[self.row_of[ids] < 0])  # (U_new,)
        if len(new):
            if self.n + len(new) > self.capacity:
                self.flush()
                new = np.unique(ids)
            self._grow(self.n + len(new))
            lo, hi = self.n, self.n + len(new)
            self._compute(self.table[new], lo)
            self.row_of[new] = np.arange(lo, hi)
            self.n = hi
            if self.by_rows and not (new[0] == lo and new[-1] == hi - 1):  # out of id order
                self._by_id(np.arange(lo), 0, lo)
            if not self.by_rows:
                self._by_id(new, lo, hi)
        return self.row_of[ids]

    def kept_tables(self):
        """``{key: (ids, ...)}``: the kept per-window arrays (``kept``), row ``i`` the window
        of run-wide id ``i``; after the run's last :meth:`flush`."""
        if self.by_rows:
            if not self.arrays:  # no window computed (a shard without states)
                return {}
            if self.kept and len(self.arrays[next(iter(self.kept.values()))]) < self.n_ids:
                raise RuntimeError("a window id was given that no block computed (a bug)")
            return {key: self.arrays[name][:self.n_ids] for key, name in self.kept.items()}
        return {k: v[:self.n_ids] for k, v in self.by_id.items()}

    def _by_id(self, new, lo, hi):
        """Copy the kept arrays of windows ``new`` (cache rows ``lo..hi``) into the tables
        by run-wide id (:attr:`by_id`), which outlive the cache; from now on every window's
        is copied."""
        self.by_rows = False
        for key, name in self.kept.items():
            table = self.by_id.get(key)
            if table is None or len(table) < self.n_ids:
                grown = np.empty((max(self.n_ids, 2 * (0 if table is None else len(table))),)
                                 + self.shapes[name])
                if table is not None:
                    grown[:len(table)] = table
                table = self.by_id[key] = grown
            table[new] = self.arrays[name][lo:hi]

    def _grow(self, n):
        """Room for ``n`` rows (doubling; past the capacity only when one block needs it)."""
        if n <= self.size:
            return
        size = max(n, min(self.capacity, max(self.first, 2 * self.size)))
        for name, shape in self.shapes.items():
            old, self.arrays[name] = self.arrays.get(name), np.empty((size,) + shape)
            if old is not None:
                self.arrays[name][:self.n] = old[:self.n]
        for s, p in self.powers.items():
            old, self.acc[s] = self.acc.get(s), np.zeros((size, len(p), self.shapes["p"][0]))
            if old is not None:
                self.acc[s][:self.n] = old[:self.n]
        for key in [(kind, s) for kind in ("r", "st") for s in range(len(self.streams))]:
            old, self.acc[key] = self.acc.get(key), np.zeros((size, self.task.max_len))
            if old is not None:
                self.acc[key][:self.n] = old[:self.n]
        self.size = size

    def _compute(self, Wu, lo):
        """Arrays of the distinct windows ``Wu (U, k)`` into rows ``lo..lo+U``."""
        task, a = self.task, self.arrays
        U, V, P = len(Wu), task.model.vocab_size, self.width
        pu, qu = model_probs(task, task.theta, Wu)  # (U, V) each
        a["p"][lo:lo + U], a["q"][lo:lo + U] = pu, qu
        if isinstance(task.model, MLPModel):  # from the factors of its sensitivities
            return self._compute_mlp(Wu, lo, pu, qu)
        # a model without closed-form columns forms every parameter's j, then keeps these
        wide = P if self.columns is None else task.model.num_params
        n_J, n = max(1, J_ELEMENTS // (V * wide)), max(1, CHUNK_ELEMENTS // (V * P))
        xi0 = a["xi" + str(self.centers[0])]  # j is written here, then centered in place
        for i in range(0, U, n_J):  # sensitivities of a batch of windows ...
            end = min(i + n_J, U)
            sensitivities(task.model, task.theta, Wu[i:end], tokens_first=True,
                          out=xi0[lo + i:lo + end], columns=self.columns)
            with np.errstate(invalid="ignore", over="ignore"):  # checked just below
                for j in range(i, end, n):  # ... and the passes over a few at a time
                    h = min(j + n, end)
                    self._compute_chunk(pu[j:h], qu[j:h], xi0[lo + j:lo + h],
                                        slice(lo + j, lo + h))
            # checked through the token moments y_2 = sum_a q_a (j_a - c)^2: a non-finite
            # j_{a,i} makes parameter i's center, scores and so its y_2 non-finite
            if not np.isfinite(a["y0_2"][lo + i:lo + end]).all():
                raise ValueError("non-finite logit sensitivities or token moments (check the "
                                 "model's derivatives and its scale)")

    def _compute_mlp(self, Wu, lo, pu, qu):
        """:meth:`_compute` for the MLP: every center's scores written in one pass and the
        moments formed from the factors of its sensitivities
        (:func:`fisher_ref.engine.mlp_scores.mlp_window_arrays`), a batch of windows at a
        time."""
        task, a = self.task, self.arrays
        step = max(1, J_ELEMENTS // (task.model.vocab_size * self.width))
        for i in range(0, len(Wu), step):
            end = min(i + step, len(Wu))
            r = slice(lo + i, lo + end)
            dist = {"p": pu[i:end], "q": qu[i:end]}
            centers = [dist[c] if c in dist else topk_weights(dist["q"], c)
                       for c in self.centers]
            requests = [(dist[st.drawn_from], self.centers.index(st.center),
                         [a[f"y{s}_{n}"][r] if f"y{s}_{n}" in a else None
                          for n in range(1, self.moments + 1)])
                        for s, st in enumerate(self.streams)]
            factors = {n: a[n][r] for n in self.factor_names}
            with np.errstate(invalid="ignore", over="ignore"):  # checked just below
                mlp_window_arrays(task.model, task.theta, Wu[i:end], centers, requests,
                                  uniform=a["uniform"][r] if self.keep else None,
                                  out=False if self.factored else
                                  [a[f"xi{c}"][r] for c in self.centers],
                                  columns=self.columns, factors=factors)
            if not np.isfinite(a["y0_2"][r]).all():  # as in _compute
                raise ValueError("non-finite logit sensitivities or token moments (check the "
                                 "model's derivatives and its scale)")

    def _compute_chunk(self, p, q, J, r):
        r"""Centers, scores and moments of a few windows into rows ``r``; ``J (u, V, P)``,
        the token rows of :math:`j`, are the first center's rows, centered in place.

        Sums over tokens are matrix products with the probabilities:
        :math:`\bar j = p^\top j`, :math:`y_n = q^\top \xi^{\circ n}`; the token moment of a
        stream is its :math:`y_2 = \sum_a q_a (j_a - c)^2`."""
        a, dist = self.arrays, {"p": p[:, None, :], "q": q[:, None, :]}  # (u, 1, V)
        x2 = self.work(0, J.shape)  # (u, V, P): the squares of xi
        means = [(c, (q if c == "q" else p if c == "p" else topk_weights(q, c))[:, None, :] @ J)
                 for c in self.centers]  # (u, 1, P) each: the centers
        for c, mean in means[1:]:
            np.subtract(J, mean, out=a[f"xi{c}"][r])  # (u, V, P): j_a - c
        J -= means[0][1]
        for s, stream in enumerate(self.streams):
            wname, c = stream.drawn_from, stream.center
            d, xi = dist[wname], a[f"xi{c}"][r]  # (u, 1, V), (u, V, P)
            if s == 0:  # the uniform mean in the same products (whether kept or not, so
                # that keeping the states changes no rounding)
                d = np.concatenate([d, np.full(d.shape, 1.0 / d.shape[2])], axis=1)
            np.multiply(xi, xi, out=x2)
            y1, y2 = d @ xi, d @ x2  # (u, 1 or 2, P)
            a[f"y{s}_1"][r], a[f"y{s}_2"][r] = y1[:, 0], y2[:, 0]
            if self.keep and s == 0:  # the spread about the uniform mean, two-pass: from
                # the deviations themselves (mean(xi^2) - mean(xi)^2 would lose digits as V
                # grows under a confident policy, where mean(xi)^2 is up to V times it)
                dev = np.subtract(xi, y1[:, 1:], out=self.work(1, J.shape))  # (u, V, P)
                a["uniform"][r] = np.einsum("uiv,uvp,uvp->uip", d[:, 1:], dev, dev)[:, 0]
            if f"y{s}_4" in a:  # without writing the third and fourth powers
                d = d[:, :1]
                a[f"y{s}_3"][r] = np.einsum("uiv,uvp,uvp->uip", d, x2, xi)[:, 0]
                a[f"y{s}_4"][r] = np.einsum("uiv,uvp,uvp->uip", d, x2, x2)[:, 0]

    def scores(self, c):
        """The scores ``(rows, V, P)`` of center ``c`` of the cached windows: the array, or
        in a factored run (:attr:`factored`) a view that forms the rows it is indexed at
        (``xi[rows, tokens]``) from the windows' factors."""
        return _FactoredScores(self, c) if self.factored else self.arrays[f"xi{c}"]

    def work(self, i, shape):
        """Work array ``i`` of ``shape``, reused from call to call (no fresh pages); ``i``
        0 and 1 are this class's own."""
        n = int(np.prod(shape))
        if self.scratch.get(i, np.empty(0)).size < n:
            self.scratch[i] = np.empty(n)
        return self.scratch[i][:n].reshape(shape)


class _FactoredScores:
    """The scores of one center of a factored :class:`WindowCache`
    (:attr:`WindowCache.factored`): indexed at ``(rows, tokens)`` (integer arrays that
    broadcast), the score rows ``(..., P)`` formed from the windows' factors
    (:func:`fisher_ref.engine.mlp_scores.mlp_score_rows`); ``shape`` as the array's."""

    def __init__(self, cache, c):
        self.cache, self.i = cache, cache.centers.index(c)
        self.shape = (cache.size, cache.task.model.vocab_size, cache.width)

    def __getitem__(self, key):
        rows, tokens = np.broadcast_arrays(*key)
        r, t = rows.ravel(), tokens.ravel()
        a, i = self.cache.arrays, self.i
        fac = {"e": a["e"][r], "hid": a["hid"][r], "win": a["win"][r], "dup": a["dup"][r],
               "c": a[f"c{i}"][r]}
        fac.update({n: a[f"{n}{i}"][r, t] for n in ("gc", "Ec") if f"{n}{i}" in a})
        out = mlp_score_rows(self.cache.task.model.spec, fac, t, self.cache.columns)
        return out.reshape(rows.shape + out.shape[-1:])
