r"""Evaluating a loss on the batches of a chunk: ``C = dL/dlogp_all`` by torch autograd.

:class:`Coefficients` evaluates every batch of a chunk at once under
``torch.func.vmap`` of ``grad``, falling back to one batch at a time (plain autograd)
when the loss does not vectorise; under the cast audit (:mod:`.audit`); with
``pad="longest"`` each batch at its longest response. It also refuses what would make
the expected gradient silently wrong: a NaN or infinite ``C`` (:func:`check_finite`), a
loss not symmetric where its enumeration assumes it (:func:`check_symmetric`), a loss
with no autograd path to the log-probabilities, and a loss that writes in place into a
tensor its gradient needs.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from .audit import CastAudit, describe_batch, reraise_with_batch
from .batch import make_batch

__all__ = ["Coefficients", "check_finite", "check_output", "check_symmetric",
           "loss_coefficients"]


def check_output(out):
    """``out`` as a 0-d tensor; ``TypeError``/``ValueError`` unless a torch scalar."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"loss(batch) must return a torch scalar tensor, got "
                        f"{type(out).__name__}")
    if out.numel() != 1:
        raise ValueError(f"loss(batch) must return a scalar, got a tensor of shape "
                         f"{tuple(out.shape)}")
    return out.reshape(())


# The arrays of a chunk the loss reads, in the order _one takes them.
_KEYS = ("logp_all", "sampler_logp_all", "ref_logp_all", "old_logp_all", "tokens", "mask",
         "rewards", "prompts", "groups")


def _tensors(a, k=None):
    take = (lambda v: v) if k is None else (lambda v: v[k])
    return {key: None if a.get(key) is None else torch.tensor(np.ascontiguousarray(take(a[key])))
            for key in _KEYS}


def _loss_batch(t, prompt, ctx):
    """The :class:`LossBatch` of one batch's tensors ``t`` (``ctx``: ``(K, limit)``)."""
    return make_batch(t["logp_all"], t["sampler_logp_all"], t["ref_logp_all"], t["tokens"],
                      t["mask"], t["rewards"], prompt, old_logp_all=t["old_logp_all"],
                      prompts=t["prompts"], groups=t["groups"], groups_per_batch=ctx[0],
                      limit=ctx[1])


def _batch_of(loss, t, prompt, ctx):
    return check_output(loss(_loss_batch(t, prompt, ctx)))


def _where(a, k, prompt):
    return describe_batch(a["tokens"][k], a["mask"][k], a["prompts"][k], a["rewards"][k])


# Batches of a chunk the loop evaluates under the cast audit (it costs 4x per batch; a
# loss's casts do not depend on the batch's values in practice).
_AUDITED = 4


# The tensors of a batch a loss might write into in place.
_FIELDS = ("logp", "old_logp", "sampler_logp", "ref_logp", "mask", "rewards", "lengths",
           "tokens", "logp_all", "sampler_logp_all", "ref_logp_all", "old_logp_all")


def _in_place(exc, lb, versions):
    """Raise ``ValueError`` naming the fields of ``lb`` the loss wrote into in place when
    ``exc`` is torch's refusal of such a write; return otherwise."""
    msg = str(exc)
    if not ("inplace" in msg or "in-place" in msg or "leaf Variable" in msg):
        return
    changed = [k for k, v in versions.items() if getattr(lb, k)._version != v]
    if "leaf Variable" in msg:  # the one leaf that requires grad: refused before the
        changed = ["logp_all"]  # write, so no version counter moved
    named = ", ".join(f"batch.{k}" for k in changed) or "a field of the batch"
    raise ValueError(f"the loss changed {named} in place, which the gradient dL/dlogp "
                     f"needs unchanged: compute on a copy (e.g. mask = batch.mask.clone()) "
                     f"instead ({exc})") from exc


def _plain(loss, t, prompt, ctx, where):
    """``C (B, T, V)`` of one batch by plain autograd, ``None`` when the loss has no
    autograd path to ``logp_all`` (a ``.detach()``, ``.item()``, a constant); an
    exception of the loss raised again with ``where()``, the batch it was raised on."""
    lpa = t["logp_all"] = t["logp_all"].clone().requires_grad_(True)
    lb = _loss_batch(t, prompt, ctx)
    versions = {k: getattr(lb, k)._version for k in _FIELDS if getattr(lb, k) is not None}
    try:
        L = check_output(loss(lb))
        if not L.requires_grad:
            return None
        (c,) = torch.autograd.grad(L, lpa, allow_unused=True)
    except Exception as exc:
        _in_place(exc, lb, versions)
        reraise_with_batch(exc, where())
    return None if c is None else c.numpy()


def _loop(loss, a, prompt, ctx=(1, None), casts=None):
    """``C (n, B, T, V)`` one batch at a time (plain autograd); the first ``_AUDITED``
    batches under the cast audit when ``casts`` is a dict."""
    out = np.zeros(a["logp_all"].shape)
    whole = _tensors(a)  # one conversion per chunk; each batch takes views of it
    for k in range(out.shape[0]):
        t = {key: None if v is None else v[k] for key, v in whole.items()}
        audit = CastAudit(casts) if casts is not None and k < _AUDITED \
            else contextlib.nullcontext()
        with audit:
            c = _plain(loss, t, prompt, ctx, lambda: _where(a, k, prompt))
        if c is not None:
            out[k] = c
    return out


def _vmapped(loss, a, prompt, ctx=(1, None)):
    """``C (n, B, T, V)`` of every batch at once (``torch.func.vmap`` of ``grad``)."""
    t = _tensors(a)

    def one(*vals):
        return _batch_of(loss, dict(zip(_KEYS, vals)), prompt, ctx)
    dims = tuple(None if t[key] is None else 0 for key in _KEYS)
    f = torch.func.vmap(torch.func.grad(one), in_dims=dims)
    return f(*(t[key] for key in _KEYS)).numpy()


def _cut(a, T):
    """The arrays of ``a`` padded to ``T`` positions instead of ``max_len``."""
    out = {}
    for key, v in a.items():
        if v is None or key in ("rewards", "prompts", "groups"):
            out[key] = v
        elif v.ndim == 4:
            out[key] = v[:, :, :T]  # (n, B, T, V)
        else:
            out[key] = v[:, :, :T]  # (n, B, T)
    return out


class Coefficients:
    """Evaluates ``C`` chunk by chunk, vectorised until the loss refuses ``vmap``, with
    one torch thread (the tensors are small; more threads only contend), under the cast
    audit (every vmap call; the first batches of each chunk in the loop);
    ``pad="longest"`` evaluates each batch at its longest response. Records whether any
    coefficient was nonzero, and keeps the first batch of the first chunks to probe, if
    none was, whether the loss reaches the log-probabilities at all
    (:meth:`check_connected`)."""

    def __init__(self, loss, vectorize, groups_per_batch=1, limit=None, pad="max_len"):
        self.loss, self.vectorize = loss, vectorize
        self.ctx, self.pad = (int(groups_per_batch), limit), pad
        self.error, self.casts = None, {}
        self.nonzero, self.probes = False, []

    def __call__(self, a, prompt):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            C = self._padded(a, prompt)
        finally:
            torch.set_num_threads(threads)
        if not self.nonzero:
            self.nonzero = bool(np.any(np.where(a["mask"][..., None], C, 0.0) != 0))
            if len(self.probes) < _PROBES:
                self.probes.append(({k: None if v is None else v[:1] for k, v in a.items()},
                                    prompt))
        return C

    def _padded(self, a, prompt):
        if self.pad == "max_len":
            return self._evaluate(a, prompt)
        longest = a["mask"].sum(-1).max(-1)  # (n,)
        C = np.zeros(a["logp_all"].shape)  # (n, B, T, V)
        for T in np.unique(longest):
            sel = np.flatnonzero(longest == T)
            sub = _cut({k: None if v is None else v[sel] for k, v in a.items()}, T)
            C[sel, :, :T] = self._evaluate(sub, prompt)
        return C

    @property
    def evaluation(self):
        return "vmap" if self.vectorize else "loop"

    def _evaluate(self, a, prompt):
        if self.vectorize:
            try:
                with CastAudit(self.casts):
                    return _vmapped(self.loss, a, prompt, self.ctx)
            except Exception as exc:  # the loss does not vectorise (.item(), mask indexing)
                self.vectorize = False
                self.error = f"{type(exc).__name__}: {str(exc)[:300]}"
        return _loop(self.loss, a, prompt, self.ctx, self.casts)

    def check_connected(self):
        """Refuse a loss whose gradient vanished because it never reaches ``logp``: no
        coefficient was nonzero and no probed batch has an autograd path to it."""
        if self.nonzero:
            return
        for a, prompt in self.probes:
            t = {key: None if v is None else v[0] for key, v in _tensors(a).items()}
            if _plain(self.loss, t, prompt, self.ctx, lambda: _where(a, 0, prompt)) \
                    is not None:
                return
        raise ValueError("loss(batch) does not depend on the log-probabilities: on the "
                         "batches probed it returns a tensor with no autograd path to "
                         "batch.logp or batch.logp_all (a .detach(), .item(), torch.no_grad "
                         "or a constant), so its gradient is 0 by construction, not in "
                         "expectation; compute the loss from batch.logp")


# Batches (the first of the first chunks) probed for an autograd path.
_PROBES = 8


def loss_coefficients(loss, arrays, prompt, vectorize=True):
    """``C = dL/dlogp_all (n, G, T, V)`` of the groups in ``arrays``
    (:func:`fisher_ref.estimators.batch.group_arrays`)."""
    return Coefficients(loss, vectorize)(arrays, prompt)


def check_finite(a, C, prompt):
    """Refuse a loss whose ``dL/dlogp_all`` is NaN or infinite at a real token of a batch
    that can be drawn (the expectation would be NaN, silently)."""
    bad = ~np.isfinite(np.where(a["mask"][..., None], C, 0.0)).all(axis=(1, 2, 3))  # (n,)
    if bad.any():
        k = int(np.argmax(bad))
        resp = [[int(v) for v in row if v >= 0] for row in a["tokens"][k]]
        ps = sorted({int(p) for p in a["prompts"][k]})
        where = f"prompt {ps[0]}" if len(ps) == 1 else f"prompts {ps}"
        raise ValueError(f"loss(batch) has a NaN or infinite gradient dL/dlogp on "
                         f"{int(bad.sum())} groups of {where}, first the responses "
                         f"{resp} (rewards {a['rewards'][k].tolist()}): the expected gradient "
                         f"would be NaN; guard the loss (a std or a length of 0, a log of 0)")


# Groups of a chunk re-evaluated with their responses permuted when symmetric=True.
_SYMMETRY_PROBE = 256


def check_symmetric(coeffs, a, C, prompt, perms=None, what="responses"):
    """``symmetric=True`` weighs each multiset once for all its orders; refuse a loss
    whose coefficients do not permute with its rows (the sum would be silently wrong).
    Probes the first batches of a chunk under ``perms`` of the rows (by default a cyclic
    shift and a swap of the responses)."""
    n, G = min(C.shape[0], _SYMMETRY_PROBE), C.shape[1]
    if perms is None:
        perms = [np.roll(np.arange(G), 1)] + ([np.r_[1, 0, 2:G]] if G > 2 else [])
    for perm in perms:
        sub = {key: None if v is None else v[:n] if key == "groups" else v[:n][:, perm]
               for key, v in a.items()}  # the group labels are positions: not permuted
        back = coeffs(sub, prompt)[:, np.argsort(perm)]  # (n, G, T, V), original order
        ref = np.where(a["mask"][:n, ..., None], C[:n], 0.0)
        diff = np.abs(np.where(a["mask"][:n, ..., None], back, 0.0) - ref).max()
        scale = np.abs(ref).max()
        if not diff <= 1e-9 * scale + 1e-300:
            where = f"prompt {prompt}" if prompt is not None else "a batch"
            if what == "responses":
                raise ValueError(f"symmetric=True, but the loss is not symmetric in its "
                                 f"responses: reordering a group of {where} changes "
                                 f"dL/dlogp by {diff:.3g} (largest {scale:.3g}); use "
                                 f"symmetric=False (ordered tuples)")
            raise ValueError(f"groups_per_batch > 1 enumerates each multiset of groups once, "
                             f"but the loss is not symmetric in its groups: reordering the "
                             f"groups of a batch changes dL/dlogp by {diff:.3g} (largest "
                             f"{scale:.3g}); a trainer's loss treats the groups of a "
                             f"mini-batch alike")
