r"""The exact expected gradient of a trainer's loss, its variance and its bias.

A loss ``L = loss(batch)`` (:class:`fisher_ref.estimators.batch.LossBatch`) reads the
parameters only through the policy's log-probabilities, so by the chain rule

.. math:: \nabla_\theta L = \sum_{i,t,b} C_{i,t,b}\, \xi_b(s_{i,t}),
   \qquad C = \partial L / \partial\, \mathrm{logp\_all},
   \qquad \xi_b(s) = \partial \log p(b|s) / \partial\theta

(``logp`` is the gather of ``logp_all`` inside the same graph, so ``C`` holds both).
:func:`expected_loss_gradient` takes ``C`` by torch autograd, group by group (all
groups of a chunk at once under ``torch.func.vmap``, one at a time when the loss does
not vectorise), and sums exactly over every prompt and every group of ``G`` responses
drawn i.i.d. from the sampler :math:`\mu` (the policy when there is none):

.. math:: E[\nabla L] = \sum_x w_x \sum_{y_1..y_G} \prod_i \mu(y_i|x)\, \nabla L(y_1..y_G).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.sparse import csr_matrix

from ..tasks import require_task
from .batch import group_arrays, make_batch
from .groups import (DEFAULT_MAX_BYTES, DEFAULT_MAX_GROUPS, check_groups, groups,
                     response_table)

__all__ = ["LossGradient", "expected_loss_gradient", "fit_scale", "kl_gradient",
           "policy_gradient_of", "loss_coefficients"]

# Elements of one chunk's per-group gradients (n, P) (8 MiB).
_GATHER_ELEMENTS = 2 ** 20
# Groups whose loss is evaluated in one vmap call.
_VMAP_GROUPS = 2 ** 14


def fit_scale(mean, target):
    r"""``(alpha, relative)``: the least-squares :math:`\alpha` with ``mean ≈ alpha target``
    and :math:`\|mean - \alpha\,target\| / \|\alpha\,target\|` (0 when both vanish, ``inf``
    when only the fit does)."""
    tt = float(target @ target)
    alpha = float(mean @ target) / tt if tt > 0 else 0.0
    fit = np.linalg.norm(alpha * target)
    resid = np.linalg.norm(mean - alpha * target)
    rel = resid / fit if fit > 0 else (0.0 if resid == 0 else math.inf)
    return alpha, float(rel)


@dataclass
class LossGradient:
    r"""The exact expected gradient of a loss over one group draw (all ``(P,)``).

    Attributes:
        mean: :math:`E[\nabla_\theta L]`.
        policy_gradient: :math:`\nabla_\theta E_p[R]`, the sum :func:`fisher_ref.exact` takes.
        variance: :math:`\mathrm{Var}[\nabla_\theta L]` per parameter, over one group.
        kl_gradient: :math:`\nabla_\theta KL(p_{seq} \| ref_{seq})` or ``None`` (no reference).
        group_size, symmetric, n_groups: what was enumerated.
    """

    mean: np.ndarray
    policy_gradient: np.ndarray
    variance: np.ndarray
    kl_gradient: np.ndarray | None = None
    group_size: int = 1
    symmetric: bool = False
    n_groups: int = 0

    @property
    def scale(self):
        """Least-squares :math:`\\alpha` with ``mean ≈ α policy_gradient`` (-1: unbiased)."""
        return fit_scale(self.mean, self.policy_gradient)[0]

    @property
    def relative_bias(self):
        """:math:`\\|mean - α g\\| / \\|α g\\|`, ``g`` the policy gradient."""
        return fit_scale(self.mean, self.policy_gradient)[1]

    @property
    def cosine(self):
        """Cosine of ``mean`` and the policy gradient (0 when either vanishes)."""
        d = np.linalg.norm(self.mean) * np.linalg.norm(self.policy_gradient)
        return float(self.mean @ self.policy_gradient / d) if d > 0 else 0.0

    @property
    def variance_trace(self):
        """:math:`\\sum_i \\mathrm{Var}[\\partial_i L]`."""
        return float(self.variance.sum())

    def mse(self, batches=1):
        r"""Expected squared error of the average of ``batches`` i.i.d. groups as an estimate
        of :math:`\alpha g`: :math:`\|mean - \alpha g\|^2 + \mathrm{tr\,Var}/batches`."""
        if isinstance(batches, bool) or not isinstance(batches, (int, np.integer)) \
                or batches < 1:
            raise ValueError(f"batches must be an integer >= 1, got {batches!r}")
        bias = self.mean - self.scale * self.policy_gradient
        return float(bias @ bias + self.variance_trace / batches)


def _check_vector(value, P, name):
    """``value`` as a finite float64 ``(P,)`` array; else ``ValueError`` naming ``name``."""
    try:
        v = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be an array of {P} numbers, got {value!r:.60}") from e
    if v.shape != (P,):
        raise ValueError(f"{name} must have shape ({P},), one entry per parameter, got "
                         f"shape {v.shape}")
    if not np.isfinite(v).all():
        raise ValueError(f"{name} has {int((~np.isfinite(v)).sum())} NaN or infinite "
                         f"entries of {P}")
    return v


def _check_output(out):
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"loss(batch) must return a torch scalar tensor, got "
                        f"{type(out).__name__}")
    if out.numel() != 1:
        raise ValueError(f"loss(batch) must return a scalar, got a tensor of shape "
                         f"{tuple(out.shape)}")
    return out.reshape(())


def _tensors(a, k=None):
    take = (lambda v: v) if k is None else (lambda v: v[k])
    t = {key: None if v is None else torch.tensor(take(v))
         for key, v in a.items() if key != "rows"}
    return t


# The tensors of a batch a loss might write into in place.
_FIELDS = ("logp", "old_logp", "sampler_logp", "ref_logp", "mask", "rewards", "lengths",
           "tokens", "logp_all", "sampler_logp_all", "ref_logp_all")


def _changed_fields(batch, versions):
    """The fields of ``batch`` whose tensors were written in place since ``versions``."""
    return [k for k, v in versions.items() if getattr(batch, k)._version != v]


def _plain(loss, t, prompt):
    """``C (G, T, V)`` of one group by plain autograd, ``None`` when the loss has no
    autograd path to ``logp_all`` (a ``.detach()``, ``.item()``, a constant)."""
    lpa = t["logp_all"].requires_grad_(True)
    batch = make_batch(lpa, t["sampler_logp_all"], t["ref_logp_all"], t["tokens"], t["mask"],
                       t["rewards"], prompt)
    versions = {k: getattr(batch, k)._version for k in _FIELDS
                if getattr(batch, k) is not None}
    try:
        L = _check_output(loss(batch))
        if not L.requires_grad:
            return None
        (c,) = torch.autograd.grad(L, lpa, allow_unused=True)
    except RuntimeError as e:
        changed = _changed_fields(batch, versions)
        if "leaf Variable" in str(e):  # the one leaf that requires grad: refused before
            changed = ["logp_all"]     # the write, so no version counter moved
        if changed or "inplace" in str(e) or "in-place" in str(e):
            named = ", ".join(f"batch.{k}" for k in changed) or "a field of the batch"
            raise ValueError(f"the loss changed {named} in place, which the gradient "
                             f"dL/dlogp needs unchanged: compute on a copy (e.g. "
                             f"mask = batch.mask.clone()) instead ({e})") from e
        raise
    return None if c is None else c.numpy()


def _loop(loss, a, prompt):
    """``C (n, G, T, V)`` one group at a time (plain autograd)."""
    out = np.zeros(a["logp_all"].shape)
    for k in range(out.shape[0]):
        c = _plain(loss, _tensors(a, k), prompt)
        if c is not None:
            out[k] = c
    return out


def _vmapped(loss, a, prompt):
    """``C (n, G, T, V)`` of every group at once (``torch.func.vmap`` of ``grad``)."""
    t = _tensors(a)

    def one(lpa, spa, rpa, tok, mask, R):
        return _check_output(loss(make_batch(lpa, spa, rpa, tok, mask, R, prompt)))
    dims = (0, 0, None if t["ref_logp_all"] is None else 0, 0, 0, 0)
    f = torch.func.vmap(torch.func.grad(one), in_dims=dims)
    return f(t["logp_all"], t["sampler_logp_all"], t["ref_logp_all"], t["tokens"], t["mask"],
             t["rewards"]).numpy()


class _Coefficients:
    """Evaluates ``C`` chunk by chunk, vectorised until the loss refuses ``vmap``, with
    one torch thread (the tensors are small; more threads only contend). Records
    whether any coefficient was nonzero, and keeps the first group of each prompt to
    probe, if none was, whether the loss reaches the log-probabilities at all."""

    def __init__(self, loss, vectorize):
        self.loss, self.vectorize = loss, vectorize
        self.nonzero, self.probes = False, []

    def __call__(self, a, prompt):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            C = self._evaluate(a, prompt)
        finally:
            torch.set_num_threads(threads)
        if not self.nonzero:
            self.nonzero = bool(np.any(np.where(a["mask"][..., None], C, 0.0) != 0))
            if len(self.probes) < _PROBES:
                self.probes.append(({k: None if v is None else v[:1] for k, v in a.items()},
                                    prompt))
        return C

    def _evaluate(self, a, prompt):
        if self.vectorize:
            try:
                return _vmapped(self.loss, a, prompt)
            except Exception:  # the loss does not vectorise (.item(), data-dependent branches)
                self.vectorize = False
        return _loop(self.loss, a, prompt)

    def check_connected(self):
        """Refuse a loss whose gradient vanished because it never reaches ``logp``: no
        coefficient was nonzero and no probed group has an autograd path to it."""
        if self.nonzero:
            return
        for a, prompt in self.probes:
            if _plain(self.loss, _tensors(a, 0), prompt) is not None:
                return
        raise ValueError("loss(batch) does not depend on the log-probabilities: on the "
                         "groups probed it returns a tensor with no autograd path to "
                         "batch.logp or batch.logp_all (a .detach(), .item(), torch.no_grad "
                         "or a constant), so its gradient is 0 by construction, not in "
                         "expectation; compute the loss from batch.logp")


# Groups (the first of a prompt's first chunks) probed for an autograd path.
_PROBES = 8


def loss_coefficients(loss, arrays, prompt, vectorize=True):
    """``C = dL/dlogp_all (n, G, T, V)`` of the groups in ``arrays``
    (:func:`fisher_ref.estimators.batch.group_arrays`)."""
    return _Coefficients(loss, vectorize)(arrays, prompt)


def _check_finite(a, C, prompt):
    """Refuse a loss whose ``dL/dlogp_all`` is NaN or infinite at a real token of a group
    that can be drawn (the expectation would be NaN, silently)."""
    bad = ~np.isfinite(np.where(a["mask"][..., None], C, 0.0)).all(axis=(1, 2, 3))  # (n,)
    if bad.any():
        k = int(np.argmax(bad))
        resp = [[int(v) for v in row if v >= 0] for row in a["tokens"][k]]
        raise ValueError(f"loss(batch) has a NaN or infinite gradient dL/dlogp on "
                         f"{int(bad.sum())} groups of prompt {prompt}, first the responses "
                         f"{resp} (rewards {a['rewards'][k].tolist()}): the expected gradient "
                         f"would be NaN; guard the loss (a std or a length of 0, a log of 0)")


# Groups of a chunk re-evaluated with their responses permuted when symmetric=True.
_SYMMETRY_PROBE = 256


def _check_symmetric(coeffs, a, C, prompt):
    """``symmetric=True`` weighs each multiset once for all its orders; refuse a loss
    whose coefficients do not permute with its responses (the sum would be silently
    wrong). Probes the first groups of a chunk under a cyclic shift and a swap."""
    n, G = min(C.shape[0], _SYMMETRY_PROBE), C.shape[1]
    perms = [np.roll(np.arange(G), 1)] + ([np.r_[1, 0, 2:G]] if G > 2 else [])
    for perm in perms:
        sub = {key: None if v is None else v[:n][:, perm] for key, v in a.items()}
        back = coeffs(sub, prompt)[:, np.argsort(perm)]  # (n, G, T, V), original order
        ref = np.where(a["mask"][:n, ..., None], C[:n], 0.0)
        diff = np.abs(np.where(a["mask"][:n, ..., None], back, 0.0) - ref).max()
        scale = np.abs(ref).max()
        if not diff <= 1e-9 * scale + 1e-300:
            raise ValueError(f"symmetric=True, but the loss is not symmetric in its "
                             f"responses: reordering a group of prompt {prompt} changes "
                             f"dL/dlogp by {diff:.3g} (largest {scale:.3g}); use "
                             f"symmetric=False (ordered tuples)")


def _group_gradients(table, a, C):
    r"""Per-group gradients :math:`\sum_{i,t,b} C_{i,t,b}\xi_b(s_{i,t})`: ``(n, P)``.

    One sparse product: row ``k`` holds group ``k``'s nonzero coefficients at columns
    ``u V + b`` of the scores ``xi (U V, P)``, so a loss that reads only ``logp`` (``C``
    zero off the generated tokens) costs ``G T`` scores per group, not ``G T V``. Padded
    slots are constants (not functions of :math:`\theta`) and add nothing."""
    U, V, P = table.xi.shape
    n = C.shape[0]
    data = np.where(a["mask"][..., None], C, 0.0).reshape(n, -1)  # (n, G T V)
    cols = (a["rows"][..., None] * V + np.arange(V)).reshape(n, -1)
    nz = data != 0
    indptr = np.r_[0, np.cumsum(nz.sum(axis=1))]
    S = csr_matrix((data[nz], cols[nz], indptr), shape=(n, U * V))
    return np.asarray(S @ table.xi.reshape(U * V, P))


class _Merged:
    """Weighted mean and sum of squared deviations, merged chunk by chunk (Chan et al.)."""

    def __init__(self, P):
        self.W, self.mean, self.M2 = 0.0, np.zeros(P), np.zeros(P)

    def add(self, w, g):
        Wc = w.sum()
        if Wc == 0:
            return
        mc = np.einsum("n,np->p", w, g) / Wc  # einsum: no BLAS threads to contend
        g -= mc  # in place: g is this chunk's own array
        np.square(g, out=g)
        M2c = np.einsum("n,np->p", w, g)
        d, W = mc - self.mean, self.W + Wc
        self.mean = self.mean + d * (Wc / W)
        self.M2 = self.M2 + M2c + d * d * (self.W * Wc / W)
        self.W = W


def _score_sum(table, coef):
    r""":math:`\sum_x w_x \sum_y p(y)\,c_x(y)\,h(y)`, :math:`h = \sum_t \xi_t`, with
    ``coef(pr) -> (M,)`` the per-response factors :math:`c_x`: per-window coefficients
    (a ``bincount``), then one product with the scores."""
    U, V, P = table.xi.shape
    D = np.zeros(U * V)
    for pr in table.prompts:
        c = pr.weight * np.exp(pr.logp) * coef(pr)  # (M,)
        live = pr.mask
        cols = (pr.rows * V + np.where(live, pr.tokens, 0))[live]  # (L,)
        D += np.bincount(cols, np.broadcast_to(c[:, None], live.shape)[live], minlength=U * V)
    return D @ table.xi.reshape(U * V, P)


def policy_gradient_of(table, baseline=0.0):
    r""":math:`\nabla E_p[R] = \sum_x w_x \sum_y p(y)\,(R(y) - b)\,h(y)` over the
    enumerated responses (the sum of the engine's ``policy`` stream; ``b`` any constant,
    as :math:`E_p[h] = 0`)."""
    return _score_sum(table, lambda pr: pr.rewards - baseline)


def _mean_reward(table):
    """:math:`E_p[R]` over the enumerated responses (a baseline that keeps the sum small)."""
    return sum(pr.weight * np.exp(pr.logp) @ pr.rewards for pr in table.prompts)


def kl_gradient(table):
    r""":math:`\nabla KL(p_{seq}\|ref_{seq}) = \sum_x w_x \sum_y p(y)\,(\sum_u \delta_u)\,h(y)`,
    :math:`\delta_u = \log p(y_u|s_u) - \log ref(y_u|s_u)`, :math:`h = \sum_t \xi_t`
    (exact because :math:`E_p[h] = 0`); ``None`` without a reference."""
    if table.ref_logp is None:
        return None

    def delta(pr):
        tok = np.where(pr.mask, pr.tokens, 0)
        return np.where(pr.mask, table.logp[pr.rows, tok] - table.ref_logp[pr.rows, tok],
                        0.0).sum(axis=1)  # (M,)
    return _score_sum(table, delta)


def expected_loss_gradient(task, loss, group_size=1, symmetric=False, *,
                           max_groups=DEFAULT_MAX_GROUPS, max_bytes=DEFAULT_MAX_BYTES,
                           vectorize=True, policy_gradient=None):
    r"""The exact expected gradient of ``loss`` over groups drawn from the task's sampler.

    .. math:: E[\nabla_\theta L] = \sum_x w_x \sum_{y_1..y_G} \prod_i \mu(y_i|x)
       \sum_{i,t,b} \frac{\partial L}{\partial\,\mathrm{logp\_all}_{i,t,b}}\,\xi_b(s_{i,t})

    Args:
        task: a :class:`fisher_ref.tasks.Task` (``sampler``: the draw; ``reference``: the
            KL target, optional).
        loss: ``loss(batch) -> torch scalar``, written to be minimised, reading a
            :class:`fisher_ref.estimators.LossBatch` of ``group_size`` responses to one
            prompt.
        group_size: ``G``, responses per group, i.i.d.
        symmetric: the loss is symmetric in its responses: enumerate multisets (with
            their multiplicities) instead of ordered tuples.
        max_groups, max_bytes: refuse (:class:`fisher_ref.engine.plan.EnumerationTooLarge`)
            past this many groups, or when the per-state scores need more memory.
        vectorize: evaluate the groups of a chunk at once with ``torch.func.vmap``
            (a loss that does not vectorise falls back to one group at a time).
        policy_gradient: :math:`\nabla E_p[R]` if already known (else the same finite sum
            :func:`fisher_ref.exact` takes, :math:`E_p[(R - b) h]`, over the responses
            enumerated here; the tests hold the two at 1e-10).

    Returns:
        :class:`LossGradient`.

    Example:
        >>> from fisher_ref import load_config
        >>> from fisher_ref.estimators import expected_loss_gradient
        >>> lg = expected_loss_gradient(load_config("tabular"),
        ...                             lambda b: -(b.rewards * b.logp.sum(1)).mean())
        >>> round(lg.scale, 10), lg.relative_bias < 1e-10
        (-1.0, True)
    """
    require_task(task)
    if not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"symmetric must be True or False, got {symmetric!r}")
    for name, value in (("max_groups", max_groups), ("max_bytes", max_bytes)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                             np.floating)) or not value >= 1:
            raise ValueError(f"{name} must be a number >= 1 (inf: no limit), got {value!r}")
    if not callable(loss):
        raise TypeError(f"loss must be a callable loss(batch) -> torch scalar, got "
                        f"{type(loss).__name__}")
    n_groups = check_groups(task, group_size, symmetric, max_groups)
    G = int(group_size)
    table = response_table(task, max_bytes)
    P = table.xi.shape[2]
    if policy_gradient is not None:
        policy_gradient = _check_vector(policy_gradient, P, "policy_gradient")
    coeffs, acc = _Coefficients(loss, vectorize), _Merged(P)
    T, V = task.max_len, task.model.vocab_size
    # bounded: the (n, P) gradients and the (n, G, T, V) distributions of one chunk
    step = max(1, min(_VMAP_GROUPS, _GATHER_ELEMENTS // P, 4 * _GATHER_ELEMENTS // (G * T * V)))
    for pr in table.prompts:
        q, first = np.exp(pr.sampler_logp), True  # (M,)
        for idx, mult in groups(len(pr), G, symmetric, chunk=step):
            w = pr.weight * mult * np.prod(q[idx], axis=1)  # (n,)
            keep = w > 0  # a group mu never draws adds nothing (and may be NaN)
            if not keep.all():
                idx, w = idx[keep], w[keep]
            if len(w) == 0:
                continue
            a = group_arrays(table, pr, idx)
            C = coeffs(a, pr.prompt)  # (n, G, T, V)
            _check_finite(a, C, pr.prompt)
            if symmetric and G > 1 and first:
                _check_symmetric(coeffs, a, C, pr.prompt)
            first = False
            acc.add(w, _group_gradients(table, a, C))
    coeffs.check_connected()
    if policy_gradient is None:
        policy_gradient = policy_gradient_of(table, _mean_reward(table))
    return LossGradient(mean=acc.mean * acc.W, policy_gradient=policy_gradient,
                        variance=acc.M2 / acc.W if acc.W > 0 else acc.M2,
                        kl_gradient=kl_gradient(table), group_size=G, symmetric=bool(symmetric),
                        n_groups=n_groups)
