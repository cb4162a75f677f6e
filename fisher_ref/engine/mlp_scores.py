r"""The scores and token moments of the window MLP's windows in closed form, block by block.

For one window the MLP of docs/theory.md §4.1 has the logit sensitivities
(:func:`fisher_ref.models.sensitivities.mlp_sensitivities`), with
:math:`g_{h,a} = (1 - \mathrm{hid}_h^2)\,W2_{h,a}`,

- ``W1``: :math:`j_{a,(m,h)} = e_m\,g_{h,a}`, ``b1``: :math:`j_{a,h} = g_{h,a}`;
- ``W2``: :math:`j_{a,(h,c)} = \mathrm{hid}_h\,[c = a]`, ``b2``: :math:`j_{a,c} = [c = a]`;
- ``E``: :math:`j_{a,(v,r)} = \sum_{pos:\,w_{pos} = v} \sum_h W1_{pos\,d + r,h}\,g_{h,a}`,
  zero off the rows of the window's tokens.

Centered at a distribution :math:`c` over the tokens, the score
:math:`\xi_a = j_a - \sum_b c_b\,j_b` keeps the factors:
:math:`\xi_{a,(m,h)} = e_m\,\hat g_{h,a}` with :math:`\hat g_{h,a} = g_{h,a} - \sum_b c_b
g_{h,b}`, and :math:`\xi_{a,(h,c')} = \mathrm{hid}_h\,D_{a,c'}` with
:math:`D_{a,c'} = [c' = a] - c_{c'}`. So the token moments
:math:`y_n = \sum_a w_a\,\xi_a^{\,n}` under a distribution :math:`w` are outer products of
small arrays: :math:`e_m^{\,n} \sum_a w_a \hat g_{h,a}^{\,n}` and
:math:`\mathrm{hid}_h^{\,n} \sum_a w_a D_{a,c'}^{\,n}` (the distributive law on the same
finite sum over tokens, each token's term kept: no :math:`1 - w_{c'}` is formed). Only the
small ``E`` block is summed entry by entry.

:func:`mlp_window_arrays` writes every center's scores ``(U, V, P)`` in one pass and forms
the moments from the factors, instead of passes over ``(U, V, P)`` arrays for each
power. ``tests/engine/test_mlp_scores.py`` holds it to the dense route
(:func:`fisher_ref.models.sensitivities.mlp_sensitivities`, centered and summed token by
token).
"""
from __future__ import annotations

import numpy as np

from fisher_ref.engine.mlp_columns import families, mlp_columns

__all__ = ["mlp_window_arrays", "mlp_score_rows", "scatter_E", "FACTORS", "factor_shapes",
           "factor_names"]


class _Factors:
    r"""The per-window factors of the MLP's sensitivities, tokens first: ``e (U, kd)``,
    ``hid (U, H)``, ``gT (U, V, H)`` (:math:`g_{h,a}` at ``[u, a, h]``), ``gG`` its
    hidden units ``hidden = (h0, h1)`` (``W1``'s family's; ``gT`` itself when all), and the ``E``
    block by window position, ``jE (U, V, k, d)``: row ``windows[u, pos]`` of :math:`E`
    gets ``jE[u, :, pos]``, the positions of a token already earlier in the window added to
    its first (``dup[u, pos]``, their own rows zero), so every other row of the block is
    zero. Only the factors of the families ``fam`` (:func:`families`) are formed:
    ``gT`` with ``"E"``, ``gG`` with ``"G"``, ``jE`` with ``"E"`` (else ``None``)."""

    def __init__(self, model, theta, windows, fam=frozenset("EGD"), hidden=None):
        spec = model.spec
        V, k, d = spec.vocab_size, spec.context, spec.embed_dim
        p = model.unpack(theta)
        self.e, self.hid = model.hidden(theta, windows)  # (U, kd), (U, H)
        U = windows.shape[0]
        self.fam, self.gT, self.gG, jE = fam, None, None, None
        h0, h1 = (0, spec.hidden) if hidden is None else hidden
        if "E" in fam:
            self.gT = p["W2"].T[None] * (1.0 - self.hid ** 2)[:, None, :]  # (U, V, H)
        if "G" in fam:
            self.gG = self.gT[:, :, h0:h1] if self.gT is not None else \
                p["W2"][h0:h1].T[None] * (1.0 - self.hid[:, h0:h1] ** 2)[:, None, :]
        if "E" in fam:  # (U, V, k, d): sum_h g_{h,a} W1_{pos d + r, h}
            jE = np.matmul(self.gT, p["W1"].T).reshape(U, V, k, d)
        self.windows, self.V, self.d = windows, V, d
        same = windows[:, :, None] == windows[:, None, :]  # (U, k, k)
        self.dup = (same & np.tri(k, k, -1, dtype=bool).T[None]).any(axis=1)  # (U, k)
        if jE is not None and self.dup.any():
            first = np.argmax(same, axis=1)  # (U, k): the token's first position
            for pos in range(1, k):
                u = np.flatnonzero(self.dup[:, pos])
                jE[u, :, first[u, pos]] += jE[u, :, pos]
                jE[u, :, pos] = 0.0
        self.jE = jE
        self.eye = np.eye(V)
        self.spec = spec

    def centered(self, c):
        r"""``(gc, Ec, D)`` at center ``c (U, V)``: :math:`\hat g` ``(U, V, H)``, the
        centered ``E`` block by position ``(U, V, k, d)`` and :math:`D = [c' = a] - c_{c'}`
        ``(U, V, V)`` (``[u, a, c']``); ``None`` for each outside the families formed
        (:math:`\hat g` of the hidden units of ``gG`` only)."""
        fam = self.fam
        gc = self.gG - np.matmul(c[:, None, :], self.gG) if "G" in fam else None  # (U, V, H)
        Ec = self.jE - np.einsum("ua,uakd->ukd", c, self.jE)[:, None] if "E" in fam else None
        D = self.eye[None] - c[:, None, :] if "D" in fam else None
        return gc, Ec, D

    def scatter_E(self, x, out):
        """The ``E`` block ``out (U, ..., (V+1) d)`` of the by-position rows
        ``x (U, ..., k, d)`` (:func:`scatter_E` of each row, with its window's)."""
        U, k = self.windows.shape
        lead = x.shape[1:-2]
        n = int(np.prod(lead, dtype=np.int64))
        rep = lambda w: np.repeat(w, n, axis=0)  # (U n, k): each row's window
        out[...] = scatter_E(self.spec, x.reshape(U * n, -1), rep(self.windows),
                             rep(self.dup)).reshape(out.shape)


def _fill(blocks, lo, hi, out, writers):
    """Each block's columns inside ``lo..hi`` of ``out (..., hi - lo)``: a whole block in
    place (``writers[name](view)`` writes every entry of its ``(..., stop - start)``
    view), a part formed whole and its columns copied."""
    for name, start, stop in blocks:
        a, b = max(start, lo), min(stop, hi)
        if a >= b:
            continue
        if a == start and b == stop:
            writers[name](out[..., start - lo:stop - lo])
        else:
            tmp = np.empty(out.shape[:-1] + (stop - start,))
            writers[name](tmp)
            out[..., a - lo:b - lo] = tmp[..., a - start:b - start]


def _outer(x, y, view):
    """``view (U, m * n) <- x (U, m) (outer) y (U, n)``, row by row."""
    np.multiply(x[:, :, None], y[:, None, :], out=view.reshape(x.shape + y.shape[1:]))


def _copy(x):
    def write(view):
        view[...] = x
    return write


def mlp_window_arrays(model, theta, windows, centers, moments, uniform=None, out=None,
                      columns=None, factors=None):
    r"""Scores and token moments of the MLP's windows ``(U, k)``, from the factors of its
    sensitivities (module docstring).

    Args:
        model: an :class:`fisher_ref.models.mlp.MLPModel`; ``theta`` its parameters.
        centers: ``[c, ...]``, each ``(U, V)``: the distributions the scores are centered
            at, :math:`\xi^{(c)}_a = j_a - \sum_b c_b\,j_b`.
        moments: ``[(w, i, y), ...]``: the moments
            :math:`y_l = \sum_a w_a (\xi^{(c_i)}_a)^l`, ``l = 1..n``, of the ``(U, V)``
            distribution ``w`` about center ``centers[i]``, written into ``y``, ``n``
            arrays ``(U, P)`` (or an int ``n``: allocated; ``None`` for a moment whose
            factors alone are wanted).
        uniform: a ``(U, P)`` array (or ``True``: allocated) to write
            :math:`\frac1V \sum_a (j_a - \frac1V\sum_b j_b)^2` into; ``None``: not formed.
        out: ``[(U, V, P), ...]``, one array per center to write its scores into (allocated
            when ``None``; ``False``: the scores are not formed).
        columns: a slice of ``0..P`` or a :class:`~fisher_ref.engine.mlp_columns.UnitColumns`:
            only those parameters
            (``P`` becomes their number).
        factors: ``{name: array}`` to write the factors the scores are formed from into
            (:data:`FACTORS`; center ``i``'s with the suffix ``i``), for
            :func:`mlp_score_rows`; with ``mG{j}_{l}``, ``mD{j}_{l}``, ``mE{j}_{l}`` also
            those of moment ``l`` of request ``j``: :math:`y_l = e^l \otimes` ``mG`` on
            ``W1`` (``mG`` on ``b1``), :math:`\mathrm{hid}^l \otimes` ``mD`` on ``W2``
            (``mD`` on ``b2``) and ``mE`` ``(k d,)`` on ``E`` by window position (as ``Ec``).
            Only the factors of the families inside ``columns`` are formed
            (:func:`factor_names`; a ``ValueError`` names any other asked for), and so read
            by a run over them: a parameter shard (:func:`mlp_param_shards`) forms no
            ``gc``, ``Ec`` or moment factor of another shard's families, and ``gc`` and
            ``mG`` of its own hidden units only (``gT`` is formed for ``E``, ``e``, ``hid``
            and ``c`` in every run).

    Returns:
        ``(xi, ys, unif)``: the scores of each center (``None`` with ``out=False``), the
        moments of each request, and the uniform spread (``None`` when not asked).
    """
    blocks, lo, hi, hidden = mlp_columns(model.spec, columns)
    U, V, width = windows.shape[0], model.spec.vocab_size, hi - lo
    fam = families(model.spec, columns)  # the factors of the other blocks: not formed
    f = _Factors(model, theta, windows, fam, hidden)
    e, hid = f.e, f.hid
    cent = [f.centered(c) for c in centers]
    if factors is not None:
        outside = sorted(n for n in factors if not _formed(n, fam))
        if outside:
            raise ValueError(f"factors {outside} are not formed for the parameters "
                             f"{lo}..{hi} (their blocks lie outside them)")
        _write_factors(f, centers, cent, factors)
    xi = [np.empty((U, V, width)) for _ in centers] if out is None else out
    for (gc, Ec, D), o in zip(cent, xi or ()):
        if o.shape != (U, V, width):
            raise ValueError(f"out must hold ({U}, {V}, {width}) arrays, got {o.shape}")

        def w_W1(v, gc=gc):  # xi_{a,(m,h)} = e_m ghat_{h,a}
            np.multiply(gc[:, :, None, :], e[:, None, :, None],
                        out=v.reshape(U, V, e.shape[1], -1))

        def w_W2(v, D=D):  # xi_{a,(h,c)} = hid_h ([c = a] - c_c)
            np.multiply(hid[:, None, :, None], D[:, :, None, :],
                        out=v.reshape(U, V, hid.shape[1], V))

        _fill(blocks, lo, hi, o, {"E": lambda v, Ec=Ec: f.scatter_E(Ec, v), "W1": w_W1,
                                  "b1": _copy(gc), "W2": w_W2, "b2": _copy(D)})
    ys = []
    for j, (w, i, y) in enumerate(moments):
        gc, Ec, D = cent[i]
        y = [np.empty((U, width)) for _ in range(y)] if isinstance(y, int) else y
        base = {n: x for n, x in (("G", gc), ("E", Ec), ("D", D)) if x is not None}
        pw, el, hl = dict(base), e, hid  # power l + 1 of each formed family's factor
        G = Dw = Ew = None
        for l, yl in enumerate(y):
            if l:  # the next power of each factor
                pw = {n: x * base[n] for n, x in pw.items()}
                el, hl = el * e, hl * hid
            if "G" in fam:
                G = np.matmul(w[:, None, :], pw["G"])[:, 0]  # (U, H): sum_a w_a ghat^l
            if "D" in fam:  # (U, V): sum_a w_a D^l, token by token
                Dw = np.matmul(w[:, None, :], pw["D"])[:, 0]
            if "E" in fam:
                Ew = np.einsum("ua,uakd->ukd", w, pw["E"])  # (U, k, d)
            for name, x in (("mG", G), ("mD", Dw), ("mE", Ew)):
                if factors is not None and f"{name}{j}_{l + 1}" in factors:
                    factors[f"{name}{j}_{l + 1}"][...] = x.reshape(U, -1)
            if yl is None:  # only its factors asked for
                continue
            _fill(blocks, lo, hi, yl, {
                "E": lambda v, Ew=Ew: f.scatter_E(Ew, v),
                "W1": lambda v, el=el, G=G: _outer(el, G, v), "b1": _copy(G),
                "W2": lambda v, hl=hl, Dw=Dw: _outer(hl, Dw, v), "b2": _copy(Dw)})
        ys.append(y)
    unif = None
    if uniform is not None:  # about the uniform mean: the same for every center
        unif = np.empty((U, width)) if uniform is True else uniform
        Gu = Du = None
        if "G" in fam:
            dev_g = f.gG - f.gG.mean(axis=1, keepdims=True)  # (U, V, H)
            Gu = (dev_g * dev_g).mean(axis=1)  # (U, H)
        if "D" in fam:
            D0 = f.eye - 1.0 / V  # (V, V): [c' = a] - 1/V
            Du = np.broadcast_to((D0 * D0).mean(axis=0), (U, V))

        def w_E(v):
            dev_E = f.jE - f.jE.mean(axis=1, keepdims=True)  # (U, V, k, d)
            f.scatter_E((dev_E * dev_E).mean(axis=1), v)
        _fill(blocks, lo, hi, unif, {
            "E": w_E, "W1": lambda v: _outer(e * e, Gu, v), "b1": _copy(Gu),
            "W2": lambda v: _outer(hid * hid, Du, v), "b2": _copy(Du)})
    return xi or None, ys, unif


#: The factors :func:`mlp_window_arrays` writes for :func:`mlp_score_rows`, per window:
#: ``e (kd,)``, ``hid (H,)``, the window ``win (k,)`` and ``dup (k,)`` (1 where the token is
#: earlier in the window too), as floats; per center ``i``: ``gc{i} (V, H)``
#: (:math:`\hat g` by token), ``c{i} (V,)`` (the center) and ``Ec{i} (V, k d)`` (the
#: centered ``E`` block by position).
FACTORS = ("e", "hid", "win", "dup", "gc", "c", "Ec")


def factor_shapes(spec, columns=None):
    """``{name: shape}`` of one window's factors (:data:`FACTORS`, per center the names
    without their suffix) in a run over the parameters ``columns`` (those of ``W1``'s
    family hold its hidden units only, :func:`mlp_columns`)."""
    V, k, d = spec.vocab_size, spec.context, spec.embed_dim
    h0, h1 = mlp_columns(spec, columns)[3]
    return {"e": (k * d,), "hid": (spec.hidden,), "win": (k,), "dup": (k,),
            "gc": (V, h1 - h0), "c": (V,), "Ec": (V, k * d), "mG": (h1 - h0,), "mD": (V,),
            "mE": (k * d,)}


#: The family of each factor that belongs to one (:func:`families`); the others
#: (``e``, ``hid``, ``win``, ``dup``, ``c``) every run keeps.
_OWN = {"gc": "G", "Ec": "E", "mG": "G", "mD": "D", "mE": "E"}


def _formed(name, fam):
    """Whether the factor ``name`` (with or without its center, stream and power suffix)
    is formed by a run over the families ``fam``."""
    return _OWN.get(name.rstrip("0123456789_"), "") in fam | {""}


def factor_names(spec, n_centers, n_streams, moments, columns=None):
    """The names of the factors a run over the parameters ``columns`` keeps per window
    (:data:`FACTORS` and the moments' ``mG``, ``mD``, ``mE`` of ``l = 1..moments``), for
    ``n_centers`` centers and ``n_streams`` streams: those of the families inside the
    columns only (:func:`families`)."""
    fam = families(spec, columns)
    return list(FACTORS[:4]) + \
        [f"{n}{i}" for n in FACTORS[4:] if _formed(n, fam) for i in range(n_centers)] + \
        [f"{n}{s}_{l}" for n in ("mG", "mD", "mE") if _formed(n, fam)
         for s in range(n_streams) for l in range(1, moments + 1)]


def _write_factors(f, centers, cent, out):
    U = f.e.shape[0]
    out["e"][...], out["hid"][...] = f.e, f.hid
    out["win"][...], out["dup"][...] = f.windows, f.dup
    for i, (c, (gc, Ec, _)) in enumerate(zip(centers, cent)):
        out[f"c{i}"][...] = c
        for name, x in ((f"gc{i}", gc), (f"Ec{i}", Ec)):
            if name in out:
                out[name][...] = x.reshape(U, x.shape[1], -1)


def scatter_E(spec, Ec, win, dup):
    """The ``E`` block ``(n, (V+1) d)`` of ``n`` score rows from their by-position rows
    ``Ec (n, k d)``, windows ``win (n, k)`` and ``dup (n, k)`` (:data:`FACTORS`)."""
    d = spec.embed_dim
    out = np.zeros((len(Ec), (spec.vocab_size + 1) * d))
    i, pos = np.nonzero(dup == 0)  # the (row, position) entries that own a row of E
    cols = win.astype(np.int64)[i, pos][:, None] * d + np.arange(d)[None, :]  # (m, d)
    out[i[:, None], cols] = Ec[i[:, None], pos[:, None] * d + np.arange(d)[None, :]]
    return out


def mlp_score_rows(spec, fac, tokens, columns=None):
    r"""The scores :math:`\xi_{a_i}` of ``n`` (window, token) pairs ``(n, P)``, formed from the
    windows' factors (:func:`mlp_window_arrays` with ``factors``) instead of read from a
    ``(U, V, P)`` array: the same numbers, to rounding.

    Args:
        spec: the MLP's :class:`fisher_ref.models.base.ModelSpec`.
        fac: the factors of each pair's window (:data:`FACTORS`, one center's, without
            its suffix), ``gc`` and ``Ec`` at the pair's token: ``e (n, kd)``,
            ``hid (n, H)``, ``win (n, k)``, ``dup (n, k)``, ``gc (n, H)``, ``c (n, V)``,
            ``Ec (n, k d)``; ``gc`` and ``Ec`` only where their family lies inside
            ``columns`` (:func:`factor_names`).
        tokens: ``(n,)`` the pairs' tokens.
        columns: a slice of ``0..P`` or a :class:`~fisher_ref.engine.mlp_columns.UnitColumns`:
            only those parameters.
    """
    blocks, lo, hi, _ = mlp_columns(spec, columns)
    n, V = len(tokens), spec.vocab_size
    D = np.eye(V)[tokens] - fac["c"]  # (n, V): [c' = a] - c_{c'}
    out = np.empty((n, hi - lo))

    def w_E(v):
        v[...] = scatter_E(spec, fac["Ec"], fac["win"], fac["dup"])
    _fill(blocks, lo, hi, out, {"E": w_E, "W1": lambda v: _outer(fac["e"], fac["gc"], v),
                                "b1": lambda v: _copy(fac["gc"])(v),
                                "W2": lambda v: _outer(fac["hid"], D, v), "b2": _copy(D)})
    return out
