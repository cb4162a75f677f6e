"""Which parameters of the window MLP a run holds, and in what order: its blocks in the
flat layout (:func:`mlp_blocks`), a set cut between hidden units (:class:`UnitColumns`),
the layout a run's columns are read in (:func:`mlp_columns`), the factor families it
forms (:func:`families`), and the parameter shards of a run balanced by their work
(:func:`mlp_param_shards`, with the fitted :data:`fisher_ref.engine.plan.WORK` and
:data:`~fisher_ref.engine.plan.LAST_SHARE`). The score rows over these columns are
:mod:`fisher_ref.engine.mlp_scores`'s.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from fisher_ref.engine.plan import LAST_SHARE, WORK

__all__ = ["mlp_blocks", "UnitColumns", "mlp_columns", "mlp_param_shards", "order_columns",
           "families"]


@lru_cache(maxsize=64)
def mlp_blocks(spec, units=None):
    """``((name, start, stop), ...)``: the MLP's parameter blocks in the flat layout of
    docs/theory.md §4.1 (``E``, ``W1``, ``b1``, ``W2``, ``b2``); kept per spec (a frozen
    dataclass). With ``units``, a number of hidden units: the layout in which ``W1`` and
    ``b1`` hold only that many (:class:`UnitColumns`)."""
    V, k, d, H = spec.vocab_size, spec.context, spec.embed_dim, spec.hidden
    h = H if units is None else units
    sizes = [("E", (V + 1) * d), ("W1", k * d * h), ("b1", h), ("W2", H * V), ("b2", V)]
    out, at = [], 0
    for name, n in sizes:
        out.append((name, at, at + n))
        at += n
    return tuple(out)


@dataclass(frozen=True)
class UnitColumns:
    r"""A set of the MLP's parameters that holds ``W1`` and ``b1`` only at the hidden units
    ``h0..h1``: the consecutive parameters ``lo..hi`` of the layout in which those two
    blocks hold only those units (:func:`mlp_blocks` with ``units=h1 - h0``: column
    ``h`` of ``W1``'s rows and entry ``h`` of ``b1``). Its parameters in the flat layout
    (:attr:`index`) are not consecutive, and are held in that layout's order. A run over
    it forms the factor :math:`\hat g` of those units only, so that shards cut between
    hidden units share no work of ``W1``'s family
    (:func:`mlp_param_shards`)."""

    spec: object = field(repr=False)
    lo: int
    hi: int
    h0: int
    h1: int

    def __post_init__(self):
        H, n = self.spec.hidden, self.h1 - self.h0
        if not 0 <= self.h0 <= self.h1 <= H:
            raise ValueError(f"hidden units {self.h0}..{self.h1} are not inside 0..{H}")
        P = mlp_blocks(self.spec, n)[-1][2]
        if not 0 <= self.lo < self.hi <= P:
            raise ValueError(f"parameters {self.lo}..{self.hi} are not a nonempty range of "
                             f"the {P} of the layout with {n} hidden units")

    @property
    def width(self):
        return self.hi - self.lo

    @cached_property
    def index(self):
        """The parameters held, in the flat layout, ``(width,)`` in increasing order."""
        narrow = mlp_blocks(self.spec, self.h1 - self.h0)
        flat = dict((name, start) for name, start, _ in mlp_blocks(self.spec))
        H, n = self.spec.hidden, self.h1 - self.h0
        parts = []
        for name, start, stop in narrow:
            a, b = max(start, self.lo), min(stop, self.hi)
            if a >= b:
                continue
            at = np.arange(a, b) - start  # within the narrowed block
            if name == "W1":  # row m, unit h0 + j of the narrowed block
                at = at // n * H + self.h0 + at % n
            elif name == "b1":
                at = at + self.h0
            parts.append(flat[name] + at)
        return np.concatenate(parts)


def mlp_columns(spec, columns=None):
    """``(blocks, lo, hi, hidden)`` of a run over the MLP's parameters ``columns`` (all,
    a slice of ``0..P`` or a :class:`UnitColumns`): the layout its columns are read in
    (:func:`mlp_blocks`), their range there, and the hidden units of ``W1``'s family
    ``(h0, h1)`` the run forms factors of."""
    if isinstance(columns, UnitColumns):
        return (mlp_blocks(spec, columns.h1 - columns.h0), columns.lo, columns.hi,
                (columns.h0, columns.h1))
    blocks = mlp_blocks(spec)
    lo, hi, step = (columns or slice(None)).indices(blocks[-1][2])
    if step != 1:
        raise ValueError(f"columns must be a slice of consecutive parameters, got {columns!r}")
    return blocks, lo, hi, (0, spec.hidden)




def mlp_param_shards(spec, n):
    r"""The parameters of each of ``n`` parameter shards of an MLP run, balanced by their
    work: the parameters in the order ``E``, then ``W1``'s family hidden unit by hidden
    unit (a unit's column of ``W1`` with its entry of ``b1``: the columns of one unit of
    :math:`\hat g`, :class:`UnitColumns`), then ``W2``'s family, cut where the work
    (:data:`fisher_ref.engine.plan.WORK`) reaches each shard's share: equal shares, the last
    :data:`~fisher_ref.engine.plan.LAST_SHARE` of the others'. A cut inside ``E`` or inside ``W2``'s
    family moves to that family's bound with ``W1``'s when it is within a quarter of a
    shard's work of it
    (a shard that holds part of a family forms that family's factors whole: ``E``'s and
    ``D`` cost the same whether a shard holds one parameter of the family or all);
    a cut inside ``W1``'s family falls between two hidden units, and each shard forms
    :math:`\hat g` of its own units only. Each shard is a slice of ``0..P`` where it holds
    every hidden unit of ``W1``'s family or none, else a :class:`UnitColumns`.

    ``None`` when some shard would hold nothing (more shards than the units of work)."""
    blocks = {name: (start, stop) for name, start, stop in mlp_blocks(spec)}
    H, kd1 = spec.hidden, spec.context * spec.embed_dim + 1
    nE, nD = blocks["E"][1], blocks["b2"][1] - blocks["W2"][0]
    per = [WORK["E"], kd1 * WORK["G"], WORK["D"]]  # per parameter, per unit, per parameter
    work = [nE * per[0], H * per[1], nD * per[2]]  # per family, in order
    total, edges = sum(work), np.cumsum([0] + work)  # the families' bounds in work
    shares = np.cumsum([0.0] + [1.0] * (n - 1) + [LAST_SHARE])
    at = [0]
    for i in range(1, n):
        t = total * shares[i] / shares[-1]
        f = min(int(np.searchsorted(edges, t, side="right")) - 1, 2)
        if f != 1:  # inside E or W2's family: to its bound, within a quarter of a shard
            bound = edges[1] if f == 0 else edges[2]
            if abs(t - bound) <= total / (4 * n):
                t = bound
        f = min(int(np.searchsorted(edges, t, side="right")) - 1, 2)
        offset = [0, nE, nE + H][f]
        at.append(offset + (int(round((t - edges[f]) / per[f])) if per[f] else 0))
    at.append(nE + H + nD)
    if any(a >= b for a, b in zip(at, at[1:])):
        return None
    return [order_columns(spec, blocks, a, b) for a, b in zip(at, at[1:])]


def order_columns(spec, blocks, a, b):
    """The parameters of positions ``a..b`` of :func:`mlp_param_shards`'s order (``E``'s
    parameters, ``W1``'s family's hidden units, ``W2``'s family's parameters)."""
    H, kd1 = spec.hidden, spec.context * spec.embed_dim + 1
    nE, b1 = blocks["E"][1], blocks["b1"][1]
    u0, u1 = min(max(a - nE, 0), H), min(max(b - nE, 0), H)  # the hidden units held
    if u0 == u1 or (u0, u1) == (0, H):  # every unit or none: consecutive parameters
        flat = lambda x: x if x <= nE else b1 + (x - nE - H)  # (never inside the units)
        return slice(flat(a), flat(b))
    lo = a if a < nE else nE  # in the layout with units u0..u1 only
    hi = nE + kd1 * (u1 - u0) + max(b - nE - H, 0)
    return UnitColumns(spec, lo, hi, u0, u1)


#: The factor family of each block: ``"E"``; ``"G"`` (:math:`\hat g`: ``W1`` and ``b1``);
#: ``"D"`` (``W2`` and ``b2``).
_FAMILY = {"E": "E", "W1": "G", "b1": "G", "W2": "D", "b2": "D"}


def families(spec, columns=None):
    """The factor families (``"E"``, ``"G"``, ``"D"``: :data:`_FAMILY`) with a block
    inside the parameters ``columns`` (a slice of ``0..P`` or a :class:`UnitColumns`; all
    by default): the factors a run over them forms and reads (:func:`mlp_window_arrays`,
    :func:`mlp_score_rows`)."""
    blocks, lo, hi, _ = mlp_columns(spec, columns)
    return frozenset(_FAMILY[name] for name, start, stop in blocks
                     if max(start, lo) < min(stop, hi))
