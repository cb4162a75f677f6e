r"""The last level of an MLP fisher run, summed from the factors of the scores.

In ``exact(task, quantities="fisher")`` the parents ``b`` of the last level (every child a
complete response) add, per stream,

.. math::

   \sum_b W_b H_b = \sum_g W_g H_g + \sum_b W_b \xi_b,\qquad
   \sum_b W_b H_b^2 + 2 H_b \odot X_{1,b} = \sum_g \bigl(W_g H_g^2 + 2 H_g \odot M_g\bigr)
   + \sum_b W_b \xi_b^2 + 2 \sum_b r_b\,\xi_b \odot y_1(b),

with :math:`H_b = H_g + \xi_b` (``g`` the grandparent, :math:`\xi_b` the score of the
parent's last token, a row of the grandparent's window), :math:`W_g = \sum_{b \in g} W_b`
and :math:`M_g = \sum_{b \in g} W_b \xi_b + r_b\,y_1(b)`
(:func:`fisher_ref.engine.complete._last_level_fisher` forms them from ``(parents, P)``
arrays).

For the window MLP every block of a score row is an outer product of two short factors
(:mod:`fisher_ref.models.mlp_scores`): :math:`\xi_b = e \otimes \hat g` on ``W1`` and
:math:`\mathrm{hid} \otimes D` on ``W2``, and so is :math:`y_1(b)`. A sum over parents of
products of such rows is then a small matrix product per block,
:math:`\sum_b c_b\,(\alpha_b \otimes \beta_b) \odot (\alpha'_b \otimes \beta'_b) =
(\alpha \odot \alpha')^\top \mathrm{diag}(c)\,(\beta \odot \beta')`, and :math:`M_g` is one
outer product and one small batched product per grandparent. No ``(parents, P)`` array is
formed: the same finite sums, regrouped (no identity of docs/theory.md §2.9 is used). The
short blocks (``b1``, ``b2``) and the ``E`` block are summed row by row.
``tests/engine/test_factored.py`` holds it to the dense route at 1e-12.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.engine.parent_sums import segment_sum
from fisher_ref.models.mlp_scores import mlp_blocks, scatter_E

__all__ = ["last_level_fisher"]


def _groups(runs, B):
    """Padded groups of the parents of each grandparent: ``idx (n, k)`` rows and ``valid``."""
    size = np.diff(np.r_[runs, B])  # (n,)
    k = int(size.max())
    valid = np.arange(k)[None, :] < size[:, None]  # (n, k)
    idx = np.where(valid, runs[:, None] + np.arange(k)[None, :], runs[:, None])
    return idx, valid


def last_level_fisher(cache, block, arrs, s, sl, gen, W, r):
    r"""The sums of :func:`fisher_ref.engine.complete._last_level_fisher` (``mass``, ``h``,
    ``h2``) of stream ``s`` over the last level's parents ``sl``, from the factors of a
    factored :class:`fisher_ref.engine.window_cache.WindowCache` (module docstring).

    Args:
        W: ``(b,)`` total weight of each parent's complete responses; ``r``: ``(b,)`` the
            parents' reach; ``gen``: the block's generated tokens ``(B, d)``.
    """
    spec, a = cache.task.model.spec, cache.arrays
    i = cache.centers.index(cache.streams[s].center)
    d, src = block.depth, block.src[sl]
    u, tok, own = block.path_rows[sl, d - 1], gen[sl, d - 1], arrs.rows[sl]
    runs = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])  # parents of one grandparent
    Hg = np.take(block.parents[0][s], src[runs], axis=0, mode="clip")  # (n, P)
    idx, valid = _groups(runs, len(src))
    rv = np.where(valid, r[idx], 0.0)  # (n, k): the groups' reach, 0 past their end
    gc = a[f"gc{i}"][u, tok]  # (b, H): ghat of each parent's last token
    D = np.eye(spec.vocab_size)[tok] - a[f"c{i}"][u]  # (b, V)
    y1 = a[f"y{s}_1"]
    P = y1.shape[1]
    one, two, cross, M = np.empty(P), np.empty(P), np.empty(P), np.empty((len(runs), P))
    for name, lo, hi in mlp_blocks(spec):
        if name in ("W1", "W2"):  # xi = al (x) be, y_1 = al2 (x) be2
            al, be = (a["e"][u], gc) if name == "W1" else (a["hid"][u], D)
            al2, be2 = (a["e"][own], a[f"mG{s}"][own]) if name == "W1" \
                else (a["hid"][own], a[f"mD{s}"][own])
            Wbe = W[:, None] * be
            one[lo:hi] = (al.T @ Wbe).ravel()
            two[lo:hi] = ((al * al).T @ (Wbe * be)).ravel()
            cross[lo:hi] = ((al * al2).T @ (r[:, None] * be * be2)).ravel()
            # M_g: sum W xi (the grandparent's window: al is the same in a group) and
            # sum r y_1, one small product per grandparent
            Mg = al[runs][:, :, None] * segment_sum(Wbe, runs)[:, None, :]  # (n, m, l)
            Mg += np.matmul((al2[idx] * rv[:, :, None]).transpose(0, 2, 1), be2[idx])
            M[:, lo:hi] = Mg.reshape(len(runs), -1)
            continue
        if name == "E":
            x = scatter_E(spec, a[f"Ec{i}"][u, tok], a["win"][u], a["dup"][u])  # (b, nE)
            y = y1[own, lo:hi]
        else:  # b1, b2: the rows themselves
            x, y = (gc, a[f"mG{s}"][own]) if name == "b1" else (D, a[f"mD{s}"][own])
        one[lo:hi], two[lo:hi], cross[lo:hi] = W @ x, W @ (x * x), r @ (x * y)
        M[:, lo:hi] = segment_sum(x, runs, W) + segment_sum(y, runs, r)
    Wg = segment_sum(W, runs)
    h2 = Wg @ (Hg * Hg) + 2 * np.einsum("gp,gp->p", Hg, M) + two + 2 * cross
    return {"mass": W.sum(), "h": Wg @ Hg + one, "h2": h2}
