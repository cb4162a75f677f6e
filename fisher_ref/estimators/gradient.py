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
from scipy.sparse import csr_matrix

from ..engine.plan import EnumerationTooLarge
from ..limits import readable, readable_log10
from ..tasks import require_task
from .audit import warn_fallback
from .batch import batch_arrays, batch_limit, group_arrays
from .evaluation import Coefficients, check_finite, check_symmetric, loss_coefficients
from .moments import Merged
from .groups import (DEFAULT_MAX_BYTES, DEFAULT_MAX_GROUPS, check_groups, groups,
                     response_table)

__all__ = ["LossGradient", "expected_loss_gradient", "fit_scale", "kl_gradient",
           "policy_gradient_of", "loss_coefficients", "clipped_share", "check_groups_per_batch",
           "PADS", "MAX_COVARIANCE_PARAMETERS", "walk_batches", "group_gradients"]

# Elements of one chunk's per-group gradients (n, P) (8 MiB).
_GATHER_ELEMENTS = 2 ** 20
# Groups whose loss is evaluated in one vmap call.
_VMAP_GROUPS = 2 ** 14
#: The most parameters ``covariance=True`` accepts: its ``(P, P)`` float64 matrix is then
#: 128 MiB (and it must also fit in ``max_bytes``).
MAX_COVARIANCE_PARAMETERS = 4096


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
    r"""The exact expected gradient of a loss over one batch draw (all ``(P,)``).

    Attributes:
        mean: :math:`E[\nabla_\theta L]`.
        policy_gradient: :math:`\nabla_\theta E_p[R]`, the sum :func:`fisher_ref.exact` takes.
        variance: :math:`\mathrm{Var}[\nabla_\theta L]` per parameter, over one batch of
            ``groups_per_batch`` groups (one group when ``K = 1``).
        kl_gradient: :math:`\nabla_\theta KL(p_{seq} \| ref_{seq})` or ``None`` (no reference).
        group_size, symmetric, n_groups: what was enumerated (``n_groups``: the groups of
            ``G`` responses, :math:`\sum_x M_x^G` or the multisets).
        groups_per_batch: ``K``, groups per batch.
        n_batches: the batches whose loss was evaluated: ``n_groups`` when ``K = 1``, else
            the multisets of ``K`` groups that can be drawn,
            :math:`\binom{N + K - 1}{K}` for ``N`` such groups.
        pad: ``"max_len"`` or ``"longest"``.
        evaluation: ``"vmap"`` (every batch of a chunk at once) or ``"loop"`` (one batch at
            a time, after ``vmap`` failed).
        evaluation_error: the first error ``vmap`` raised (why the loop), or ``None``.
        casts: ``{"aten.op to float32": count}``, the ops of the loss that cast below
            float64 (the loss ran as written; its gradient is rounded there).
        limit: the :class:`fisher_ref.estimators.batch.BatchLimit` the batches carried.
        covariance: :math:`\mathrm{Cov}[\nabla_\theta L]` ``(P, P)`` over one batch (its
            diagonal is ``variance``), or ``None`` unless asked with ``covariance=True``.
        low, high: the range of one batch's gradient over the batches that can be drawn,
            for :func:`fisher_ref.testing.check_applied_gradient`'s tail bound.
    """

    mean: np.ndarray
    policy_gradient: np.ndarray
    variance: np.ndarray
    kl_gradient: np.ndarray | None = None
    group_size: int = 1
    symmetric: bool = False
    n_groups: int = 0
    groups_per_batch: int = 1
    n_batches: int = 0
    pad: str = "max_len"
    evaluation: str = "vmap"
    evaluation_error: str | None = None
    casts: dict | None = None
    limit: object = None
    covariance: np.ndarray | None = None
    low: np.ndarray | None = None
    high: np.ndarray | None = None

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
        r"""Expected squared error of the average of ``batches`` i.i.d. batches as an estimate
        of :math:`\alpha g`: :math:`\|mean - \alpha g\|^2 + \mathrm{tr\,Var}/batches`."""
        if isinstance(batches, bool) or not isinstance(batches, (int, np.integer)) \
                or batches < 1:
            raise ValueError(f"batches must be an integer >= 1, got {batches!r}")
        bias = self.mean - self.scale * self.policy_gradient
        return float(bias @ bias + self.variance_trace / batches)


#: What ``pad`` may be: every batch padded to ``max_len``, or to its longest response.
PADS = ("max_len", "longest")


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


def group_gradients(table, a, C):
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


def _merged(P, max_bytes, covariance):
    """A :class:`Merged` accumulator; refuse ``covariance=True`` past
    :data:`MAX_COVARIANCE_PARAMETERS` or ``max_bytes`` (``ValueError`` naming
    ``covariance`` and ``P``); a non-boolean is a ``TypeError``."""
    if not isinstance(covariance, (bool, np.bool_)):
        raise TypeError(f"covariance must be True or False, got {covariance!r}")
    if not covariance:
        return Merged(P)
    need = 8 * P * P
    if P > MAX_COVARIANCE_PARAMETERS or need > max_bytes:
        raise ValueError(
            f"covariance=True refused: P = {P} parameters give a ({P}, {P}) matrix of "
            f"{readable(need)} bytes; at most P = {MAX_COVARIANCE_PARAMETERS} and "
            f"max_bytes={readable(max_bytes)}. Use covariance=False (the per-parameter "
            f"variance) or a smaller model")
    return Merged(P, covariance=True)


def check_groups_per_batch(groups_per_batch, n_groups, max_groups):
    r"""The number of batches of ``K`` groups out of ``n_groups``, as multisets,
    :math:`\binom{N + K - 1}{K}`; refuse a ``K`` that is not an integer >= 1
    (``ValueError``) or past ``max_groups`` batches (:class:`EnumerationTooLarge`), before
    anything is enumerated."""
    K = groups_per_batch
    if isinstance(K, (bool, np.bool_)) or not isinstance(K, (int, np.integer)) or K < 1:
        raise ValueError(f"groups_per_batch must be an integer >= 1, got {K!r}")
    K = int(K)
    if K == 1:
        return n_groups
    log10 = (math.lgamma(n_groups + K) - math.lgamma(K + 1) - math.lgamma(n_groups)) \
        / math.log(10)
    n = math.inf if log10 > math.log10(max_groups) + 1 else math.comb(n_groups + K - 1, K)
    if n > max_groups:
        shown = readable_log10(log10) if n == math.inf else readable(n)
        raise EnumerationTooLarge(
            f"expected_loss_gradient refused groups_per_batch={K}: {shown} batches (the "
            f"multisets of {K} groups out of {readable(n_groups)}), more than "
            f"max_groups={readable(max_groups)}. Use a smaller groups_per_batch, group_size "
            f"or task, symmetric=True, or raise max_groups")
    return n


def _all_groups(table, G, symmetric, chunk):
    """Every group of every prompt that can be drawn: prompt rows ``(N,)``, responses
    ``(N, G)`` and probabilities ``(N,)`` (summing to 1)."""
    pj, idx, w = [], [], []
    for j, pr in enumerate(table.prompts):
        q = np.exp(pr.sampler_logp)  # (M,)
        for g, mult in groups(len(pr), G, symmetric, chunk=chunk):
            p = pr.weight * mult * np.prod(q[g], axis=1)  # (n,)
            keep = p > 0
            pj.append(np.full(int(keep.sum()), j))
            idx.append(g[keep])
            w.append(p[keep])
    return np.concatenate(pj), np.concatenate(idx), np.concatenate(w)


def _batches(table, coeffs, acc, G, K, symmetric, step):
    r"""Sum over the multisets of ``K`` groups, weight
    :math:`K!/\prod_j n_j! \prod_k \pi(g_k)`; the loss must be symmetric in its groups
    (probed on the first chunk). Returns the number of batches."""
    pj, idx, prob = _all_groups(table, G, symmetric, chunk=max(step, 4096))
    first, count = True, 0
    for units, mult in groups(len(prob), K, symmetric=True, chunk=step):
        w = mult * np.prod(prob[units], axis=1)  # (n,)
        count += len(w)
        a = batch_arrays(table, units, pj, idx)
        C = coeffs(a, None)  # (n, K G, T, V)
        check_finite(a, C, None)
        if first:  # the groups rotated; with symmetric, the responses of every group
            check_symmetric(coeffs, a, C, None, [np.roll(np.arange(K * G), G)], "groups")
            if symmetric and G > 1:
                within = (np.arange(K)[:, None] * G + np.roll(np.arange(G), 1)[None, :])
                check_symmetric(coeffs, a, C, None, [within.ravel()], "responses")
        first = False
        acc.add(w, group_gradients(table, a, C))
    return count


def walk_batches(task, loss, group_size, symmetric, groups_per_batch, pad, max_groups,
                 max_bytes, vectorize, make_acc):
    """Check the arguments (as :func:`expected_loss_gradient` documents them), then feed
    every group (or batch of ``K`` groups) that can be drawn to the accumulator
    ``make_acc(P, n_batches)``, chunk by chunk, as ``acc.add(probabilities (n,),
    gradients (n, P))``. Returns ``(acc, {"table", "coeffs", "P", "limit", "n_groups",
    "n_batches"})``."""
    require_task(task)
    if not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"symmetric must be True or False, got {symmetric!r}")
    if not isinstance(pad, str) or pad not in PADS:
        raise ValueError(f"pad must be one of {', '.join(map(repr, PADS))}, got {pad!r}")
    for name, value in (("max_groups", max_groups), ("max_bytes", max_bytes)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                             np.floating)) or not value >= 1:
            raise ValueError(f"{name} must be a number >= 1 (inf: no limit), got {value!r}")
    if not callable(loss):
        raise TypeError(f"loss must be a callable loss(batch) -> torch scalar, got "
                        f"{type(loss).__name__}")
    n_groups = check_groups(task, group_size, symmetric, max_groups)
    n_batches = check_groups_per_batch(groups_per_batch, n_groups, max_groups)
    G, K = int(group_size), int(groups_per_batch)
    table = response_table(task, max_bytes)
    limit = batch_limit(table, G)
    P = table.xi.shape[2]
    acc = make_acc(P, n_batches)
    coeffs = Coefficients(loss, vectorize, K, limit, pad)
    T, V = task.max_len, task.model.vocab_size
    # bounded: the (n, P) gradients and the (n, B, T, V) distributions of one chunk
    step = max(1, min(_VMAP_GROUPS, _GATHER_ELEMENTS // P,
                      4 * _GATHER_ELEMENTS // (K * G * T * V)))
    if K > 1:
        n_batches = _batches(table, coeffs, acc, G, K, symmetric, step)
    for pr in table.prompts if K == 1 else ():
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
            check_finite(a, C, pr.prompt)
            if symmetric and G > 1 and first:
                check_symmetric(coeffs, a, C, pr.prompt)
            first = False
            acc.add(w, group_gradients(table, a, C))
    coeffs.check_connected()
    if coeffs.error is not None:
        warn_fallback(coeffs.error)
    return acc, {"table": table, "coeffs": coeffs, "P": P, "limit": limit,
                 "n_groups": n_groups, "n_batches": n_batches}


def expected_loss_gradient(task, loss, group_size=1, symmetric=False, *, groups_per_batch=1,
                           pad="max_len", max_groups=DEFAULT_MAX_GROUPS,
                           max_bytes=DEFAULT_MAX_BYTES, vectorize=True, policy_gradient=None,
                           covariance=False):
    r"""The exact expected gradient of ``loss`` over batches drawn from the task's sampler.

    A batch is ``K`` groups; each group's prompt is drawn i.i.d. from the prompt weights
    :math:`w_x` and its ``G`` responses i.i.d. from :math:`\mu(\cdot|x)`:

    .. math:: E[\nabla_\theta L] = \sum_{g_1..g_K} \prod_k \pi(g_k)
       \sum_{i,t,b} \frac{\partial L}{\partial\,\mathrm{logp\_all}_{i,t,b}}\,\xi_b(s_{i,t}),
       \qquad \pi(x, y_1..y_G) = w_x \prod_i \mu(y_i|x),

    summed over the multisets of ``K`` groups with their multiplicities
    :math:`K!/\prod_j n_j!` when ``K > 1`` (the groups are exchangeable; a loss not
    symmetric in its groups is refused).

    Args:
        task: a :class:`fisher_ref.tasks.Task` (``sampler``: the draw; ``reference``: the
            KL target, optional; ``old_policy``: :math:`\theta_{old}` of ``old_logp``).
        loss: ``loss(batch) -> torch scalar``, written to be minimised, reading a
            :class:`fisher_ref.estimators.LossBatch` of ``K G`` rows.
        group_size: ``G``, responses per group, i.i.d.
        symmetric: the loss is symmetric in the responses of a group: enumerate multisets
            (with their multiplicities) instead of ordered tuples.
        groups_per_batch: ``K``, groups per batch (1: one group, as before).
        pad: ``"max_len"`` (every batch ``T = max_len`` wide) or ``"longest"`` (each batch
            as wide as its longest response, as trainers pad).
        max_groups, max_bytes: refuse (:class:`fisher_ref.engine.plan.EnumerationTooLarge`)
            past this many groups (or batches), or when the per-state scores need more
            memory; refused before anything is enumerated.
        vectorize: evaluate the batches of a chunk at once with ``torch.func.vmap``
            (a loss that does not vectorise falls back to one batch at a time, with a
            :class:`fisher_ref.estimators.audit.VmapFallbackWarning`).
        policy_gradient: :math:`\nabla E_p[R]` if already known (else the same finite sum
            :func:`fisher_ref.exact` takes, :math:`E_p[(R - b) h]`, over the responses
            enumerated here; the tests hold the two at 1e-10).
        covariance: also return the full covariance of one batch's gradient,
            :math:`\sum_b \pi_b (\nabla L_b - E)(\nabla L_b - E)^T` ``(P, P)``; refused
            (``ValueError``) past ``MAX_COVARIANCE_PARAMETERS`` (4096) parameters or when its
            ``8 P^2`` bytes pass ``max_bytes``.

    Returns:
        :class:`LossGradient`.

    Raises:
        ValueError: a bad ``groups_per_batch``, ``pad``, ``symmetric``, a loss whose
            gradient is not finite, a loss not symmetric where declared; an exception of
            the loss is raised again with the batch it was raised on.

    Example:
        >>> from fisher_ref import load_config
        >>> from fisher_ref.estimators import expected_loss_gradient
        >>> lg = expected_loss_gradient(load_config("tabular"),
        ...                             lambda b: -(b.rewards * b.logp.sum(1)).mean())
        >>> round(lg.scale, 10), lg.relative_bias < 1e-10
        (-1.0, True)
        >>> lg2 = expected_loss_gradient(load_config("tabular"),
        ...                              lambda b: -(b.rewards * b.logp.sum(1)).mean(),
        ...                              groups_per_batch=2)
        >>> lg2.n_batches, round(lg2.scale, 10)
        (465, -1.0)
    """
    def make_acc(P, n):  # checked before anything is enumerated
        nonlocal policy_gradient
        if policy_gradient is not None:
            policy_gradient = _check_vector(policy_gradient, P, "policy_gradient")
        return _merged(P, max_bytes, covariance)
    acc, state = walk_batches(task, loss, group_size, symmetric, groups_per_batch, pad, max_groups,
                       max_bytes, vectorize, make_acc)
    table, coeffs = state["table"], state["coeffs"]
    if policy_gradient is None:
        policy_gradient = policy_gradient_of(table, _mean_reward(table))
    G, K, limit = int(group_size), int(groups_per_batch), state["limit"]
    n_groups, n_batches = state["n_groups"], state["n_batches"]
    return LossGradient(mean=acc.mean * acc.W, policy_gradient=policy_gradient,
                        variance=acc.M2 / acc.W if acc.W > 0 else acc.M2,
                        kl_gradient=kl_gradient(table), group_size=G, symmetric=bool(symmetric),
                        n_groups=n_groups, groups_per_batch=K, n_batches=n_batches, pad=pad,
                        evaluation=coeffs.evaluation, evaluation_error=coeffs.error,
                        casts=dict(coeffs.casts), limit=limit,
                        covariance=acc.covariance, low=acc.low.copy(), high=acc.high.copy())


def clipped_share(clipped, unclipped):
    r"""The fraction of the expected gradient lost to clipping,

    .. math:: s = 1 - \frac{\langle E[\nabla L_{clip}],\, E[\nabla L]\rangle}
       {\|E[\nabla L]\|^2},

    ``clipped`` and ``unclipped`` the :class:`LossGradient` of the same loss with and
    without its clip (e.g. ``presets.ppo_clip()`` and ``presets.ppo_clip(clip=False)``): the
    share of the unclipped expected gradient's length that the clipped one does not
    carry along it (0: nothing lost; 1: nothing left; negative: clipping lengthened it).
    """
    u, c = np.asarray(unclipped.mean), np.asarray(clipped.mean)
    uu = float(u @ u)
    if uu == 0:
        raise ValueError("the unclipped expected gradient vanishes: no share to measure")
    return 1.0 - float(c @ u) / uu
