r"""The Monte Carlo engine: ancestral sampling and estimators with standard errors.

:func:`sample` draws responses token by token from the policy ``p`` (or from a
task's sampler ``mu``) with a passed-in ``numpy.random.Generator``;
:func:`estimate` turns ``n`` draws into an :class:`MCResult` whose streams
mirror :func:`fisher_ref.exact.exact`:

- drawn from ``p``: ``"policy"`` (score centered at :math:`\bar j_p`);
- drawn from ``mu``: ``"raw"`` (centered at :math:`\bar j_p`, the raw score)
  and ``"centered"`` (centered at :math:`\bar j_\mu`). The ``"policy"`` stream
  is not an average of draws from ``mu`` and is left out; its gradient comes
  back as the raw stream's ``importance_gradient``
  :math:`\overline{\rho A h}`, :math:`\rho = P_p(y)/P_\mu(y)`.

Per stream and per sample: :math:`h = \sum_t \xi_t`, :math:`h^2`, the
Rao–Blackwellised :math:`g = \sum_t m(s_t)` with
:math:`m(s) = \sum_a w_a (j_a - c)^2` (``w`` the drawing distribution, ``c``
the centering; the token Fisher ``f`` on the policy stream), :math:`\xi_u\xi_t`,
:math:`A h` and ``R``. ``A = R - b`` for a constant baseline; for ``"mean"``,
:math:`A_k = R_k - \frac{1}{n-1}\sum_{l\ne k} R_l` (leave-one-out), so that
:math:`E[A_k h_k] = E[Rh] - E[R]E[h]` exactly — the exact engine's gradient with
the exact mean as baseline — with no :math:`O(1/n)` bias.

Sensitivities depend on a state only through its window, so they are computed
once per distinct window visited, in blocks of ``chunk`` windows.
"""
from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from fisher_ref.monte_carlo.ztests import (EXACT_VARIANCE, bernstein_z, bonferroni_z,
                                           linearised_values, spread, z_score, cross_spread)
from fisher_ref.monte_carlo.estimators import (Estimate, MCResult, advantage_estimates,
                                               cross_estimate, exact_variance_reduction,
                                               mean_estimate, running_estimates,
                                               variance_reduction)
from fisher_ref.engine.plan import DEFAULT_MAX_BYTES
from fisher_ref.monte_carlo.memory import check_mc_size, mc_bytes
from fisher_ref.monte_carlo.values import checked_logits, prompt_table, sample_values
from fisher_ref.numerics import log_softmax
from fisher_ref._progress import Progress
from fisher_ref.tasks import require_task
from fisher_ref.results import require_all_quantities

__all__ = ["sample", "estimate", "sample_values", "MCResult", "Estimate", "bonferroni_z",
           "variance_reduction", "exact_variance_reduction", "running_estimates",
           "check_monte_carlo", "CheckRow", "EXACT_VARIANCE", "mc_bytes", "check_mc_size"]

def _check_args(task, n, rng, use_sampler, max_bytes=DEFAULT_MAX_BYTES, values=True):
    require_task(task)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n (the number of samples) must be an integer >= 1, got {n!r}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator (e.g. np.random.default_rng(0)), "
                        f"got {type(rng).__name__}; global random state is never used")
    if use_sampler and task.sampler is None:
        raise ValueError(f"use_sampler=True but task {task.name!r} has no sampler")
    check_mc_size(task, n, use_sampler, max_bytes, values)


def _draw(probs, rng):
    """One token per row by inverse CDF: first ``a`` with ``cdf[a] >= u * cdf[-1]``, u in (0, 1]."""
    cdf = np.cumsum(probs, axis=1)  # (B, V)
    u = (1.0 - rng.random(probs.shape[0])) * cdf[:, -1]  # (B,)
    return np.minimum((cdf < u[:, None]).sum(axis=1), probs.shape[1] - 1)


def sample(task, n, rng, use_sampler=False, max_bytes=DEFAULT_MAX_BYTES):
    r"""Draw ``n`` responses by ancestral sampling.

    Prompt :math:`x \sim w`, then :math:`y_t \sim p(\cdot|s_t)` (or
    :math:`\mu(\cdot|s_t)` with ``use_sampler``) for ``t = 1..T``, vectorised over
    the ``n`` samples; a sample stops after EOS (``task.model.eos``) or at ``max_len``.

    Args:
        task: a :class:`fisher_ref.tasks.Task`.
        n: number of samples (``>= 1``).
        rng: a ``numpy.random.Generator`` (the only source of randomness).
        use_sampler: draw from the task's sampler ``mu`` instead of ``p``.
        max_bytes: refuse, before drawing, when the draws would need more memory.

    Returns:
        dict: ``tokens`` ``(n, T)`` int, ``-1`` padded (the EOS included), ``prompt`` ``(n,)``.

    Example:
        >>> from fisher_ref import load_config
        >>> d = sample(load_config("default"), 4, np.random.default_rng(0))
        >>> d["tokens"].shape, d["prompt"].shape
        ((4, 3), (4,))
    """
    _check_args(task, n, rng, use_sampler, max_bytes, values=False)
    w = np.cumsum(task.prompt_weights)
    u = 1.0 - rng.random(n)  # (n,) in (0, 1]
    prompt = np.minimum(np.searchsorted(w, u * w[-1], side="left"), len(w) - 1)  # (n,)
    full, plen = prompt_table(task, n)
    full = full[prompt]  # (n, Lp + T)
    length = plen[prompt].copy()  # (n,)
    tokens = np.full((n, task.max_len), -1, dtype=np.int64)  # (n, T)
    live = np.ones(n, dtype=bool)
    m = task.model
    for t in range(task.max_len):
        rows = np.flatnonzero(live)
        if rows.size == 0:
            break
        W = m.windows(full[rows], length[rows])  # (B, k)
        probs = np.exp(log_softmax(checked_logits(task, W, use_sampler)))  # (B, V)
        y = _draw(probs, rng)  # (B,)
        tokens[rows, t] = y
        full[rows, length[rows]] = y
        length[rows] += 1
        if m.eos:
            live[rows[y == 0]] = False
    return {"tokens": tokens, "prompt": prompt}


def _advantages(R, baseline):
    if baseline != "mean":
        return R - float(baseline)
    n = R.shape[0]
    if n < 2:
        raise ValueError("baseline 'mean' uses the leave-one-out mean of the other samples' "
                         "rewards, which needs n >= 2")
    return R - (R.sum() - R) / (n - 1)  # (n,)


def estimate(task, n, rng, use_sampler=None, keep_samples=False, chunk=None,
             max_bytes=DEFAULT_MAX_BYTES):
    r"""Monte Carlo estimates, with standard errors, of the exact engine's quantities.

    Args:
        task: a :class:`fisher_ref.tasks.Task`.
        n: number of sampled responses (``>= 1``; ``>= 2`` for baseline ``"mean"``).
        rng: a ``numpy.random.Generator``.
        use_sampler: draw from ``mu`` (streams ``"raw"``, ``"centered"``) or from ``p``
            (stream ``"policy"``); ``None``: from ``mu`` when the task has a sampler.
        keep_samples: keep the per-sample arrays in ``MCResult.samples``.
        chunk: distinct windows per sensitivity block (default: about 64 MiB of ``j``).
        max_bytes: refuse, before drawing, when :func:`mc_bytes` exceeds this (8 GiB).

    Returns:
        :class:`MCResult`.

    Raises:
        TypeError: ``task`` is not a Task, ``rng`` not a Generator.
        ValueError: a bad ``n``, or ``n`` draws that would not fit in ``max_bytes``
            (the message says which ``n`` fits).

    Example:
        >>> from fisher_ref import load_config
        >>> mc = estimate(load_config("default"), 2000, np.random.default_rng(0))
        >>> mc.sequence_fisher.mean.shape, mc.n
        ((119,), 2000)
    """
    if use_sampler is None:
        use_sampler = require_task(task).sampler is not None
    _check_args(task, n, rng, use_sampler, max_bytes)
    t0 = time.perf_counter()
    bar = Progress(2 + 3 * (2 if use_sampler else 1), "Monte Carlo estimate")  # after 2 s
    draws = sample(task, n, rng, use_sampler)
    bar.update()
    values = sample_values(task, draws, use_sampler, chunk)
    bar.update()
    R = values.pop("reward")  # (n,)
    rho = values.pop("rho")  # (n,) or None
    A = _advantages(R, task.baseline)  # (n,)
    streams, samples = {}, {}
    for s, per in values.items():
        h, h2 = per["h"], per["h2"]  # (n, P)
        Ah = A[:, None] * h  # (n, P)
        est = {"score_mean": mean_estimate(h), "sequence_fisher": mean_estimate(h2),
               "token_fisher_sum": mean_estimate(per["token_sum"]),
               "gradient": mean_estimate(Ah), "expected_reward": mean_estimate(R)}
        bar.update()
        est["cross_terms"] = cross_estimate(per["xi"])
        bar.update()
        est.update(advantage_estimates(R, h, h2))
        bar.update()
        per.update(Ah=Ah, reward=R, advantage=A)
        if s == "raw":
            est["importance_gradient"] = mean_estimate(rho[:, None] * Ah)
            per.update(rho=rho, rhoAh=rho[:, None] * Ah)
        streams[s] = est
        samples[s] = per
    bar.close()
    return MCResult(task=task, n=int(n), from_sampler=bool(use_sampler), streams=streams,
                    draws=draws, samples=samples if keep_samples else None,
                    seconds=time.perf_counter() - t0)


class CheckRow(NamedTuple):
    """One row of :func:`check_monte_carlo`: the entry nearest its threshold."""

    quantity: str
    stream: str
    max_abs_z: float
    threshold: float
    passed: bool


def _exact_spread(task, exact_result, from_mu):
    """{(stream, quantity): (variance, max |x - E x|)} from every response, or {}."""
    seq = exact_result.sequences
    if seq is None:
        return {}
    vals = sample_values(task, {"tokens": seq["tokens"], "prompt": seq["prompt"]}, from_mu)
    w = seq["sampler_prob"] if from_mu else seq["prob"]
    out = {key: spread(x, w)[1:] for key, x in linearised_values(vals, w, task.baseline).items()}
    for s in ("policy", "raw", "centered"):
        if s in vals:
            out[(s, "cross_terms")] = cross_spread(vals[s]["xi"], w)[1:]
    return out


def check_monte_carlo(task, exact_result, n, seed, alpha=1e-6):
    r"""z-test every Monte Carlo estimator of ``task`` against ``exact_result``.

    Draws ``n`` responses from ``p`` (and, with a sampler, ``n`` more from ``mu``,
    from independent child seeds of ``seed``). Each entry's z uses the exact
    variance of its (linearised) per-sample value, computed from every response
    when ``exact_result.sequences`` was kept (else :meth:`MCResult.z_scores`). Its
    threshold is ``bonferroni_z(alpha, m)`` over all ``m`` entries, raised to
    :func:`fisher_ref.monte_carlo.ztests.bernstein_z` where that is larger (very skewed values
    that are rarely non-zero), so the whole check fails falsely with probability at
    most about ``alpha`` whatever the tails.

    Returns:
        list of :class:`CheckRow` ``(quantity, stream, max_abs_z, threshold, passed)``,
        one per (stream, quantity), for its entry with the largest ``|z| / threshold``.

    Example:
        >>> from fisher_ref import load_config, exact
        >>> t = load_config("tabular")
        >>> rows = check_monte_carlo(t, exact(t, progress=False), 2000, seed=0)
        >>> all(r.passed for r in rows)
        True
    """
    require_all_quantities(exact_result, "check_monte_carlo")
    seeds = np.random.SeedSequence(seed).spawn(2)
    draws = [False] + ([True] if task.sampler is not None else [])
    zs, spread = {}, {}
    for k, from_mu in enumerate(draws):
        mc = estimate(task, n, np.random.default_rng(seeds[k]), use_sampler=from_mu)
        zs.update(mc.z_scores(exact_result))
        sp = _exact_spread(task, exact_result, from_mu)
        spread.update(sp)
        for key in sp:
            zs[key] = z_score(mc.streams[key[0]][key[1]].mean,
                              getattr(exact_result.streams[key[0]], key[1]), sp[key][0], n)
    m = sum(np.size(z) for z in zs.values())
    zb = bonferroni_z(alpha, m)
    rows = []
    for (s, q), z in zs.items():
        thr = np.full(np.shape(z), zb)
        if (s, q) in spread:
            thr = np.maximum(thr, bernstein_z(n, *spread[(s, q)], alpha / m))
        i = np.unravel_index(np.argmax(np.abs(z) / thr), np.shape(z)) if np.ndim(z) else ()
        worst, t = float(np.abs(z[i])), float(thr[i])
        rows.append(CheckRow(q, s, worst, t, bool(np.all(np.abs(z) <= thr))))
    return rows
