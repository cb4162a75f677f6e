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

from fisher_ref.parallel.param_shards import param_columns
from fisher_ref.engine.parent_sums import coarse_cross, segment_sum
from fisher_ref.models.mlp import MLPModel
from fisher_ref.engine.mlp_scores import families, mlp_columns, mlp_param_shards

__all__ = ["Rows", "Slots", "Layout", "augment", "wsum", "gsum", "factors_last_level",
           "shard_columns", "row_width", "groups", "LastLevel", "last_level_fisher",
           "last_level_all", "window_sums"]


#: The bias block whose columns are a block's second factor (:class:`Rows`), the block
#: right after it in the flat layout (:func:`fisher_ref.engine.mlp_scores.mlp_blocks`).
_BIAS = {"W1": "b1", "W2": "b2"}


def augment(a):
    """A first factor ``a (..., m)`` with a last entry 1 ``(..., m + 1)``: its outer product
    with a second factor ``b`` holds the weight block's row then the bias's, ``b`` itself
    (:class:`Layout`); a product of such factors keeps the 1."""
    out = np.empty(a.shape[:-1] + (a.shape[-1] + 1,))
    out[..., :-1] = a
    out[..., -1] = 1.0
    return out


class Rows:
    r"""Per-parent rows ``(B, P)`` of the MLP, held by group (the parents of one
    grandparent along axis 1, padded to the largest group: ``(n, k, ...)``, see
    :func:`groups`) and by block: ``W1`` and ``W2`` with their biases as outer products
    ``(a (n, k, r), b (n, k, l))`` (a row is :math:`a \otimes b`): the second factor is also
    the row's bias block (``b1`` of ``W1``, ``b2`` of ``W2``: the scores and every product
    of them hold :math:`\hat g` on both, and :math:`D` on both), so the first factor holds
    a last entry 1 for the bias's row (:func:`augment`), and only the rows ``r`` of the
    ``(m + 1, l)`` block that hold the run's parameters (:meth:`Layout.pair`); the pair is
    ``None`` when neither the block nor its bias lies inside them. ``E``: the ``E`` block
    by slot (:class:`Slots` ``slots``), ``(G (n, k, kw, d), L (n, k, d))``: the group's
    slots and each row's own (its last token's), ``L`` ``None`` where it holds 0 (in the
    scores of a grandparent's window, :meth:`Slots.group`, and every product with them);
    ``None`` when the block lies outside the run's parameters. Elementwise products keep
    the form; :func:`wsum` and :func:`gsum` sum them over parents as small matrix
    products."""

    def __init__(self, W1, W2, E, slots=None):
        self.W1, self.W2, self.E, self.slots = W1, W2, E, slots

    def __mul__(self, o):
        return self._times(o, lambda x, y: _array(x) * _array(y))

    def lazy(self, o):
        """``self * o`` whose ``W1`` and ``W2`` factors are :class:`_Product` s, formed only
        where a sum writes them (:func:`_weighted`): for a row summed once."""
        return self._times(o, _Product)

    def _times(self, o, times):
        def pair(x, y):
            return None if x is None else (times(x[0], y[0]), times(x[1], y[1]))
        E = None
        if self.E is not None:  # the own slots' product is 0 where either holds 0
            (G, L), (Go, Lo) = self.E, o.E
            E = (G * Go, None if L is None or Lo is None else L * Lo)
        return Rows(pair(self.W1, o.W1), pair(self.W2, o.W2), E, self.slots)


class _Product:
    """The elementwise product of two factors of :class:`Rows` (``(n, k or 1, m)`` each,
    broadcast), formed only where it is written (:meth:`into`), so that a row summed once
    is not first written out whole and then copied."""

    __slots__ = ("x", "y", "shape")

    def __init__(self, x, y):
        self.x, self.y = x, y
        self.shape = tuple(max(i, j) for i, j in zip(x.shape, y.shape))

    def into(self, out=None):
        return np.multiply(self.x, self.y, out=out)


def _array(f):
    """A factor as an array (a :class:`_Product` formed)."""
    return f.into() if isinstance(f, _Product) else f


class Slots:
    r"""The ``E`` block of a group's rows by slot: the rows of ``E`` they can be nonzero on,
    slots of ``d`` columns, instead of the whole block's ``(V + 1) d`` columns, held as
    ``(G, L)`` (:class:`Rows`): slots ``0..k-1`` (``G``) are the group's, the tokens of a
    window every row of the group reads (the grandparent's, or in :func:`window_sums` the
    window's own); with ``last``, slot ``k`` (``L``) is each row's own (a parent's last
    token). A token that fills several slots holds its value in the first of them only, 0
    in the others in every row (:meth:`group`, :meth:`own`), so that an elementwise product
    of rows by slot is the product of their whole blocks; :meth:`sum` places a group's sum
    in the block.

    Args:
        lay: the run's :class:`Layout`; ``spec``: the MLP's.
        win, dup: ``(n, k)`` each group's window (tokens ``0..V``) and where a token is
            earlier in it too (:data:`fisher_ref.engine.mlp_scores.FACTORS`).
        last: ``(n, m)`` each row's last token (the window of its own scores is the
            group's shifted by one: ``win[1:]`` then ``last``), or ``None``.
        valid: ``(n, m)`` the rows that hold a parent (:func:`groups`).
    """

    def __init__(self, lay, spec, win, dup, last=None, valid=None):
        n, k = win.shape
        V1, d = spec.vocab_size + 1, spec.embed_dim
        self.cut, self.k, self.d, self.n, self.V1 = lay.cut["E"][0], k, d, n, V1
        self.spare = n * V1  # the row of the placed block that takes the slots holding 0
        at = np.arange(n)[:, None] * V1
        self.at_group = np.where(dup, self.spare, at + win).ravel()  # (n k,)
        self.at_last, self.merge = None, []
        if last is not None:
            taken = (last[:, :, None] == win[:, None, :]).any(axis=2) | ~valid  # (n, m)
            self.at_last = np.where(taken, self.spare, at + last).ravel()  # (n m,)
            placed = self.at_last[self.at_last != self.spare]
            if len(placed) and np.bincount(placed).max() > 1:
                raise RuntimeError("two parents of one grandparent end in the same token")
            # the slots of a row's own window (1..k) whose token is the group's slot 0's
            own = np.concatenate([np.broadcast_to(win[:, None, 1:], last.shape + (k - 1,)),
                                  last[:, :, None]], axis=2)  # (n, m, k): slots 1..k
            self.merge = [(j + 1, m) for j, m in enumerate(np.moveaxis(
                own == win[:, None, :1], 2, 0)) if m.any()]

    def group(self, x):
        """``x (n, m, k d)``: rows by position of the group's window, by slot; their own
        slot holds 0."""
        return x.reshape(x.shape[:2] + (self.k, self.d)), None

    def own(self, x):
        """``x (n, m, k d)``: rows by position of each row's own window (slots ``1..k``),
        by slot (a token of slot 0 moved there)."""
        k, d = self.k, self.d
        x = x.reshape(x.shape[:2] + (k, d))
        G = np.zeros(x.shape)
        G[:, :, 1:] = x[:, :, :k - 1]
        L = x[:, :, k - 1].copy()
        for j, m in self.merge:
            at = L if j == k else G[:, :, j]
            G[m, 0] += at[m]
            at[m] = 0.0
        return G, L

    def sum(self, terms, grouped=True):
        r""":math:`\sum_{(w, x)} \sum_{b \in g} w_b x_b` ``(n, r)`` of weights ``w (n, m)``
        and rows by slot ``x = (G (n, m, k, d), L (n, m, d) or None)`` (``terms``:
        ``(w, x)``, :class:`Rows`): the ``E`` block's columns inside the run's, for each
        group; with ``grouped=False`` their sum over the groups
        ``(r,)``. The terms are summed by slot and placed in the block once (the slots of a
        row hold distinct rows of the block, or the spare one): per group by index, over the
        groups by a product with the slots' one-hot placement (:meth:`_placement`)."""
        d, k, n = self.d, self.k, self.n
        g = sum(np.matmul(w[:, None, :], G.reshape(n, w.shape[1], k * d))
                for w, (G, _) in terms).reshape(n * k, d)  # (n k, d): each group's slots
        lasts = [(w, L) for w, (_, L) in terms if L is not None]
        last = None if self.at_last is None or not lasts else \
            sum(w[:, :, None] * L for w, L in lasts).reshape(-1, d)  # (n m, d)
        if not grouped:
            out = self._placement("group") @ g
            if last is not None:
                out += self._placement("last") @ last
            return out[:-1].ravel()[self.cut]
        out = np.zeros((self.spare + 1, d))
        out[self.at_group] = g
        if last is not None:
            out[self.at_last] = last
        return out[:-1].reshape(n, -1)[:, self.cut]

    def _placement(self, name):
        """``(V + 2, slots)``, kept: 1 at each of slots ``at_<name>``'s row of the block (a
        token ``0..V``; ``V + 1`` for the spare row, which the slots holding 0 take)."""
        key = "_place_" + name
        if key not in self.__dict__:
            at, V1 = getattr(self, "at_" + name), self.V1
            S = np.zeros((V1 + 1, len(at)))
            S[np.where(at == self.spare, V1, at % V1), np.arange(len(at))] = 1.0
            self.__dict__[key] = S
        return self.__dict__[key]


class Layout:
    r"""Where the parts of :class:`Rows` lie among a run's parameters ``columns`` (a slice of
    ``0..P`` or a :class:`fisher_ref.engine.mlp_scores.UnitColumns`, all by default; in
    the layout they are read in, :func:`fisher_ref.engine.mlp_scores.mlp_columns`, where
    ``W1``'s rows hold the run's hidden units ``hidden`` only, as its factors
    :math:`\hat g` do): ``cut[name] = (within the block, within the run's)``, the
    columns of each block inside them (absent when none); for ``W1`` and ``W2`` with their
    biases, ``fcut``, the same over the block and its bias as one ``(m + 1, l)`` block (the
    bias its last row), and ``rows[name]``, the rows of it that hold them (so that a slice
    costs its share of the block); ``families``, those of the factors the run forms
    (:func:`fisher_ref.engine.mlp_scores.families`)."""

    def __init__(self, spec, columns=None):
        blocks, lo, hi, hidden = mlp_columns(spec, columns)
        self.hidden = slice(*hidden)
        inner_width = {"W1": hidden[1] - hidden[0], "W2": spec.vocab_size}  # l of (m, l)
        self.width, self.cut, self.fcut, self.rows = hi - lo, {}, {}, {}
        self.families = families(spec, columns)  # of the factors the run forms
        at = {}
        for name, start, stop in blocks:
            at[name] = (start, stop)
            a, b = max(start, lo), min(stop, hi)
            if a < b:
                self.cut[name] = (slice(a - start, b - start), slice(a - lo, b - lo))
        for name, bias in _BIAS.items():  # the block and its bias: rows m0..m1 of (m + 1, l)
            start, stop = at[name][0], at[bias][1]
            a, b = max(start, lo), min(stop, hi)
            if a >= b:
                continue
            l = inner_width[name]
            m0, m1 = (a - start) // l, (b - start - 1) // l + 1
            self.rows[name] = slice(m0, m1)
            self.fcut[name] = (slice(a - start - m0 * l, b - start - m0 * l),
                               slice(a - lo, b - lo))

    def has(self, name):
        return name in self.cut

    def pair(self, name, a, b):
        """The outer-product part of block ``name`` (``W1`` or ``W2``) with its bias:
        ``(a, b)``, the first factor ``a (..., m + 1)`` (:func:`augment`) cut to the rows
        that hold the run's columns; ``None`` when neither the block nor its bias holds
        any."""
        rows = self.rows.get(name)
        return None if rows is None else (a[..., rows], b)

    def part(self, out, name, shape):
        """Where the sum ``shape (*lead, r, l)`` of block ``name`` with its bias goes: a
        view of ``out (*lead, width)`` when the run holds every entry of its rows (written
        there), else a scratch array (placed by :meth:`place`)."""
        inner, outer = self.fcut[name]
        if inner.start == 0 and inner.stop == shape[-2] * shape[-1]:
            return out[..., outer].reshape(shape)  # a view: splits the last axis
        return np.empty(shape)

    def place(self, out, name, x):
        """Write the run's columns of the sum ``x`` (``(*lead, r, l)``, rows as :meth:`pair`
        cut them) of block ``name`` with its bias into ``out (*lead, width)``, unless
        :meth:`part` wrote them there."""
        inner, outer = self.fcut[name]
        if not np.may_share_memory(x, out):
            out[..., outer] = x.reshape(out.shape[:-1] + (-1,))[..., inner]


def _sums(lay, terms, grouped):
    r""":math:`\sum_j \sum_b w_{j,b}\,x_{j,b}` of terms ``[(w (n, k), Rows x), ...]`` over
    every parent (``(P,)``) or per group ``g`` (``grouped``: ``(n, P)``), written in place.
    A factor of one row per group (``k = 1``: the same for every parent of ``g``, as the
    grandparent's window's are) comes out of the sum,
    :math:`a_g \otimes \sum_{b \in g} w_b\,b_b`. Per block (each with its bias,
    :func:`augment`): over every parent, each term's small ``(r, l)`` matrix product added
    up; per group, every term's factors side by side in one buffer, one batched matrix
    product. The weights multiply the narrower factor (:func:`_weighted`)."""
    lead = (len(terms[0][0]),) if grouped else ()
    out = np.empty(lead + (lay.width,))
    for name in ("W1", "W2"):
        if getattr(terms[0][1], name) is None:
            continue
        per_group, per_parent = [], []
        for w, x in terms:
            a, b = getattr(x, name)
            if a.shape[1] == 1:  # (n, r), (n, l): the group's factor, the weighted sum
                per_group.append((_array(a)[:, 0], np.matmul(w[:, None, :], _array(b))[:, 0]))
            else:
                per_parent.append((w, a, b))
        m, l = (per_group[0][0].shape[1], per_group[0][1].shape[1]) if per_group else \
            (per_parent[0][1].shape[2], per_parent[0][2].shape[2])
        dst = lay.part(out, name, lead + (m, l))
        if not grouped:  # a small (r, l) product per term, added up
            prods = [ag.T @ bw for ag, bw in per_group] + \
                [wa.reshape(-1, m).T @ wb.reshape(-1, l)
                 for wa, wb in (_weighted(w, a, b) for w, a, b in per_parent)]
            dst[...] = prods[0] if len(prods) == 1 else sum(prods)
        elif not per_parent and len(per_group) == 1:  # an outer product per group
            np.einsum("nm,nl->nml", *per_group[0], out=dst)
        else:
            _group_product(per_group, per_parent, m, l, dst)
        lay.place(out, name, dst)
    if terms[0][1].E is not None:
        by_slots = {}  # the terms of each Slots (one, as a rule), placed in its block once
        for w, x in terms:
            by_slots.setdefault(id(x.slots), (x.slots, []))[1].append((w, x.E))
        out[..., lay.cut["E"][1]] = sum(slots.sum(pairs, grouped)  # (n, r) or (r,)
                                        for slots, pairs in by_slots.values())
    return out


def _weighted(w, a, b, out=None):
    """A term's factors ``(a (n, k, m), b (n, k, l))`` (arrays or :class:`_Product` s) with
    its weights ``w (n, k)`` multiplied into the narrower of the two (the fewer elements to
    write); with ``out``, ``(A, B)`` of their shapes, both are written there."""
    A, B = (None, None) if out is None else out
    if a.shape[2] <= b.shape[2]:
        return _times_weights(a, w, A), _written(b, B)
    return _written(a, A), _times_weights(b, w, B)


def _times_weights(f, w, out):
    """``f (n, k, m)`` times the weights ``w (n, k)``, into ``out`` (new when ``None``)."""
    if isinstance(f, _Product):
        out = f.into(out)
        out *= w[:, :, None]
        return out
    return np.multiply(f, w[:, :, None], out=out)


def _written(f, out):
    """``f`` into ``out`` (``f`` itself, formed, when ``None``)."""
    if isinstance(f, _Product):
        return f.into(out)
    if out is None:
        return f
    out[...] = f
    return out


def _group_product(per_group, per_parent, m, l, dst):
    r"""``dst (n, m, l)`` :math:`= \sum a_g \otimes \beta_g + \sum_{b \in g} w_b\,a_b
    \otimes b_b` of the per-group terms ``[(a_g (n, m), beta_g (n, l))]`` and the per-parent
    ones ``[(w (n, k), a (n, k, m), b (n, k, l))]``: every term's factors side by side in
    one buffer (:func:`_weighted`), one batched product."""
    if len(per_parent) == 1 and not per_group:
        a, b = _weighted(*per_parent[0])
        np.matmul(a.transpose(0, 2, 1), b, out=dst)
        return
    n = dst.shape[0]
    K = len(per_group) + sum(a.shape[1] for _, a, _ in per_parent)
    A, B = np.empty((n, K, m)), np.empty((n, K, l))
    for j, (ag, bg) in enumerate(per_group):
        A[:, j], B[:, j] = ag, bg
    at = len(per_group)
    for w, a, b in per_parent:
        k = a.shape[1]
        _weighted(w, a, b, out=(A[:, at:at + k], B[:, at:at + k]))
        at += k
    np.matmul(A.transpose(0, 2, 1), B, out=dst)


def wsum(lay, w, x):
    r""":math:`\sum_b w_b\,x_b` ``(P,)`` of weights ``w (n, k)`` and :class:`Rows` ``x``
    (:func:`_sums`)."""
    return _sums(lay, [(w, x)], False)


def gsum(lay, w, x):
    r""":math:`\sum_{b \in g} w_b\,x_b` for each group ``g``, ``(n, P)`` (:func:`_sums`)."""
    return _sums(lay, [(w, x)], True)


def factors_last_level(task):
    """Whether the last level of a run of ``task`` is summed here (the MLP's; over a slice of
    its parameters too, ``param_shard``: only the blocks inside it)."""
    return isinstance(task.model, MLPModel)


def shard_columns(task, n):
    """The parameters of each of ``n`` parameter shards of ``task``
    (``exact(task, param_shard=(i, n))``): for the MLP, cut between its factor families
    and between hidden units, balanced by their work
    (:func:`fisher_ref.engine.mlp_scores.mlp_param_shards`); for other models, whose
    windows' sensitivities are formed whole in every shard, consecutive slices as equal as
    whole parameters allow (:func:`fisher_ref.parallel.param_shards.param_columns`)."""
    cols = mlp_param_shards(task.model.spec, n) if factors_last_level(task) else None
    return param_columns(task.model.num_params, n) if cols is None else cols


def row_width(spec, columns=None):
    """Elements of one parent's row of :class:`Rows` over the run's parameters ``columns``
    (all by default: a parameter shard holds only its blocks), sixteen times
    over (about the rows alive at once), for the element budget of a sub-block
    (``Budgets.sub_block_elements``, a block's even sub-blocks holding at most half as
    many again): at the default 2**20 a sub-block's rows stay in the processor's cache
    (every parameter: rows of 564 parents of medium, 210 of v16); where freed
    memory is kept, at 2**22, a whole block of either is one sub-block (fewer numpy calls,
    which cost more than the cache misses there)."""
    lay = Layout(spec, columns)
    kd, H, V = spec.context * spec.embed_dim, spec.hidden, spec.vocab_size
    width = (kd + spec.embed_dim) * lay.has("E") + kd * lay.has("W1") \
        + (lay.hidden.stop - lay.hidden.start) * ("G" in lay.families) \
        + H * lay.has("W2") + V * ("D" in lay.families)
    return 16 * max(width, 1)


def groups(runs, B):
    """The ``B`` parents in groups (runs starting at ``runs``), padded for batched products:
    ``(idx (n, k), valid (n, k))`` (past a group's end, ``idx`` repeats its first row)."""
    size = np.diff(np.r_[runs, B])  # (n,)
    k = int(size.max())
    valid = np.arange(k)[None, :] < size[:, None]  # (n, k)
    idx = np.where(valid, runs[:, None] + np.arange(k)[None, :], runs[:, None])
    return idx, valid


class LastLevel:
    r"""One stream's last-level parents ``sl`` of a block, in factored form and in groups
    (one per grandparent), and the sums of one term over them.

    Rows by ``(l, Y)`` (:meth:`rows`): :math:`\xi_b^l \odot Y_b`, with :math:`\xi_b` the
    score of a parent's last token and ``Y`` the name of a row of its own: ``"y1"``..``"y3"``
    the moments :math:`y_l` of its window (:meth:`y`), or one given to :meth:`name`. The
    grandparent's window is the same for every parent of a group, so the factors of
    :math:`\xi_b` from that window (``e`` on ``W1``, ``hid`` on ``W2``) are held once per
    group and come out of the group's sums (:func:`_sums`). Weights by name
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
        coefficient, every other term goes into one fused sum (:func:`_sums`: one matrix
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
            kept.append((1.0, _sums(self.lay, [(coef * self._w[c], self.rows(l, Y))
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
