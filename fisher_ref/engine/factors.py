r"""Score rows of the window MLP held as factors, and their weighted sums over parents.

For the window MLP every block of a score row is an outer product of two short factors
(:mod:`fisher_ref.engine.mlp_scores`): :math:`\xi = e \otimes \hat g` on ``W1`` and
:math:`\mathrm{hid} \otimes D` on ``W2``, and so are the moments :math:`y_l` of a window and
the reward-weighted products :math:`Z`. :class:`Rows` holds such rows block by block,
:class:`Layout` says where each block's columns go among the run's parameters and
:class:`Slots` holds the ``E`` block by slot. Elementwise products of such rows keep the
form, and a sum over parents of them is a small matrix product,
:math:`\sum_b c_b\,(\alpha_b \otimes \beta_b) = \alpha^\top \mathrm{diag}(c)\,\beta`, per
group of parents a batched one (:func:`wsum`, :func:`gsum`, :func:`factored_sums`). A bias
block (``b1``, ``b2``) is its weight block's second factor, and follows that block in the
flat layout: so the first factor is held with a last entry 1 (:func:`augment`), and the
outer product covers the weight block and its bias as one ``(m + 1, l)`` block.

:mod:`fisher_ref.engine.factored` sums the last level of a run with them;
``tests/engine/test_factors.py`` holds the sums to the dense rows.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.engine.mlp_columns import families, mlp_columns

__all__ = ["Rows", "Slots", "Layout", "augment", "factored_sums", "wsum", "gsum",
           "row_width", "groups"]


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
    window every row of the group reads (the grandparent's, or in
    :func:`fisher_ref.engine.factored.window_sums` the window's own); with ``last``, slot
    ``k`` (``L``) is each row's own (a parent's last
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


def factored_sums(lay, terms, grouped):
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
    (:func:`factored_sums`)."""
    return factored_sums(lay, [(w, x)], False)


def gsum(lay, w, x):
    r""":math:`\sum_{b \in g} w_b\,x_b` for each group ``g``, ``(n, P)``
    (:func:`factored_sums`)."""
    return factored_sums(lay, [(w, x)], True)


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
