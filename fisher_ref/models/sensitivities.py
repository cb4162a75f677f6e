r"""Logit sensitivities :math:`j_{i,a}(s) = \partial z_a(s) / \partial\theta_i`.

Two routes: :func:`sensitivities_autograd` (any model, by autograd) and
:func:`mlp_sensitivities` (the MLP of docs/theory.md §4.1 in closed form, using that
per-example derivatives of a linear layer are outer products). The tests hold
them against each other and against central finite differences.
"""
from __future__ import annotations

import numpy as np
from autograd import jacobian

from fisher_ref.models.mlp import MLPModel

__all__ = ["sensitivities", "sensitivities_autograd", "mlp_sensitivities",
           "finite_difference_sensitivities"]


def sensitivities_autograd(model, theta, windows):
    """``j`` by autograd: the Jacobian of each state's logits, ``(B, P, V)``."""
    jac = jacobian(lambda th: model.logits(th, windows))(theta)  # (B, V, P)
    return np.ascontiguousarray(np.transpose(jac, (0, 2, 1)))  # (B, P, V)


def mlp_sensitivities(model, theta, windows, tokens_first=False, out=None, columns=None):
    r"""Closed-form ``j`` for :class:`MLPModel`, ``(B, P, V)`` (``(B, V, P)`` with
    ``tokens_first``: the same numbers, each token's row contiguous, written into ``out``
    when given; with ``columns``, a slice of ``0..P``, only those parameters).

    With :math:`g_{h,a} = (1-\mathrm{hid}_h^2) W2_{h,a}`:
    :math:`\partial z_a/\partial b2_c = \delta_{ca}`,
    :math:`\partial z_a/\partial W2_{h,c} = \mathrm{hid}_h\delta_{ca}`,
    :math:`\partial z_a/\partial b1_h = g_{h,a}`,
    :math:`\partial z_a/\partial W1_{m,h} = e_m g_{h,a}`,
    :math:`\partial z_a/\partial E_{v,r} = \sum_{p: c_p=v}\sum_h W1_{pd+r,h} g_{h,a}`.
    """
    spec = model.spec
    V, k, d, H = spec.vocab_size, spec.context, spec.embed_dim, spec.hidden
    p = model.unpack(theta)
    e, hid = model.hidden(theta, windows)  # (B, k*d), (B, H)
    B = windows.shape[0]
    g = (1.0 - hid ** 2)[:, :, None] * p["W2"][None]  # (B, H, V)
    q = np.einsum("pdh,bha->bpda", p["W1"].reshape(k, d, H), g)  # (B, k, d, V)
    if columns is not None and columns.step not in (None, 1):
        raise ValueError(f"columns must be a slice of consecutive parameters, got {columns!r}")
    width = len(range(model.num_params)[columns or slice(None)])
    if out is not None and (not tokens_first or out.shape != (B, V, width)
                            or not out.flags.c_contiguous):
        raise ValueError(f"out must be a C-contiguous ({B}, {V}, {width}) array "
                         "with tokens_first=True")
    if columns is not None and not tokens_first:
        raise ValueError("columns= takes the (B, V, P) layout: pass tokens_first=True")
    if tokens_first:
        return _mlp_tokens_first(windows, q, e, hid, g, V, d, H, out, columns)
    onehot = (windows[:, :, None] == np.arange(V + 1)[None, None]).astype(float)  # (B, k, V+1)
    jE = np.einsum("bpv,bpda->bvda", onehot, q).reshape(B, (V + 1) * d, V)
    jW1 = (e[:, :, None, None] * g[:, None]).reshape(B, k * d * H, V)
    eye = np.eye(V)
    jW2 = (hid[:, :, None, None] * eye[None, None]).reshape(B, H * V, V)
    jb2 = np.broadcast_to(eye, (B, V, V))
    return np.concatenate([jE, jW1, g, jW2, jb2], axis=1)  # (B, P, V)


def _mlp_tokens_first(windows, q, e, hid, g, V, d, H, out=None, columns=None):
    """The blocks of :func:`mlp_sensitivities` written straight into one ``(B, V, P)``
    array (token rows), without stacking copies; ``W2``'s block is zero off its diagonal,
    ``E``'s off the rows of the window's tokens (added position by position, so that a
    token twice in a window gets both terms). With ``columns`` (a slice of ``0..P``), only
    those parameters' columns ``(B, V, len)``: a block outside them is not formed."""
    B, kd = e.shape
    o1 = (V + 1) * d
    o2 = o1 + kd * H
    o3 = o2 + H
    o4 = o3 + H * V
    P = o4 + V
    lo, hi, _ = (slice(None) if columns is None else columns).indices(P)
    out = np.empty((B, V, hi - lo)) if out is None else out  # every entry written
    rows, ar, gt = np.arange(B), np.arange(V), g.transpose(0, 2, 1)  # gt: (B, V, H)

    def block_E(o):  # dz_a / dE_{v,r}: q[b, pos, r, a] to E's row windows[b, pos]
        jE = o.reshape(B, V, V + 1, d)
        jE[:] = 0.0
        for pos in range(windows.shape[1]):
            jE[rows, :, windows[:, pos], :] += q[:, pos].transpose(0, 2, 1)  # (B, V, d)

    def block_W1(o):
        np.multiply(e[:, None, :, None], gt[:, :, None, :], out=o.reshape(B, V, kd, H))

    def block_b1(o):
        o[:] = gt

    def block_W2(o):  # dz_a / dW2_{h,c} = hid_h [c = a]
        w2 = o.reshape(B, V, H, V)
        w2[:] = 0.0
        w2[:, ar, :, ar] = hid[None]  # (V, B, H) <- (1, B, H)

    def block_b2(o):
        o[:] = np.eye(V)

    for start, stop, write in ((0, o1, block_E), (o1, o2, block_W1), (o2, o3, block_b1),
                               (o3, o4, block_W2), (o4, P, block_b2)):
        a, b = max(start, lo), min(stop, hi)
        if a >= b:
            continue
        if a == start and b == stop:  # the whole block: in place
            write(out[:, :, start - lo:stop - lo])
        else:  # part of it: formed whole, the part copied
            tmp = np.empty((B, V, stop - start))
            write(tmp)
            out[:, :, a - lo:b - lo] = tmp[:, :, a - start:b - start]
    return out


def sensitivities(model, theta, windows, tokens_first=False, out=None, columns=None):
    """``j`` for a batch of windows, ``(B, P, V)`` (``(B, V, P)`` with ``tokens_first``,
    written into ``out`` when given; with ``columns``, a slice of ``0..P``, only those
    parameters, ``tokens_first`` only): closed form for the MLP, the model's own
    ``sensitivities`` method where it has one (the GPT-2's per-state stack), else
    autograd's Jacobian."""
    if (out is not None or columns is not None) and not tokens_first:
        raise ValueError("out= and columns= take the (B, V, P) layout: pass tokens_first=True")
    if isinstance(model, MLPModel):
        return mlp_sensitivities(model, theta, windows, tokens_first, out, columns)
    if callable(getattr(model, "sensitivities", None)):
        J = model.sensitivities(theta, windows)
    else:
        J = sensitivities_autograd(model, theta, windows)
    if not tokens_first:
        return J
    if columns is not None:
        J = J[:, columns]
    if out is None:
        return np.ascontiguousarray(J.transpose(0, 2, 1))
    out[...] = J.transpose(0, 2, 1)
    return out


def finite_difference_sensitivities(model, theta, windows, step=1e-6):
    """Central differences ``(z(theta + h e_i) - z(theta - h e_i)) / 2h``, ``(B, P, V)``."""
    theta = np.asarray(theta, dtype=float)
    B = windows.shape[0]
    out = np.empty((B, theta.size, model.vocab_size))
    for i in range(theta.size):
        tp, tm = theta.copy(), theta.copy()
        tp[i] += step
        tm[i] -= step
        out[:, i, :] = (np.asarray(model.logits(tp, windows))
                        - np.asarray(model.logits(tm, windows))) / (2 * step)
    return out
