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
from fisher_ref.limits import check_limit, readable
from fisher_ref.numerics import log_softmax
from fisher_ref._progress import Progress
from fisher_ref.tasks import require_task
from fisher_ref.results import require_all_quantities
from fisher_ref.rewards import evaluate_reward
from fisher_ref.models.sensitivities import sensitivities
from fisher_ref.numerics import mean_sensitivity, token_second_moment

__all__ = ["sample", "estimate", "sample_values", "MCResult", "Estimate", "bonferroni_z",
           "variance_reduction", "exact_variance_reduction", "running_estimates",
           "check_monte_carlo", "CheckRow", "EXACT_VARIANCE", "mc_bytes", "check_mc_size"]

_CHUNK_BYTES = 64 * 2 ** 20


def mc_bytes(task, n, use_sampler, values=True):
    r"""Peak memory estimate, in bytes, of drawing ``n`` responses (and, with ``values``,
    of :func:`estimate` on them), in closed form before anything is allocated.

    With ``S`` streams (1 from ``p``, 2 from ``mu``), ``T = max_len``, ``P`` parameters,
    ``V`` tokens, ``L`` the longest state and ``k`` the window width:

    - drawing: :math:`8n\,(2L + k + T + 8 + 3V + L\lfloor P/V \rfloor + L^2)` — states
      and windows, one step's ``(n, V)`` logits, probabilities and cumulative sums,
      and the model's activations (a hidden layer is at most ``P / V`` wide; one
      ``L x L`` attention);
    - the values (after the draws' temporaries are freed):
      :math:`8n\,[2STP + (4S + 8)P + T(L + 4k + 8) + 2L] + 32PV` — per stream the score
      tables, the gathered scores ``(n, T, P)`` and path sums; the ``(n, P)`` values and
      the estimators' temporaries; every visited window; one window's sensitivities.

    The estimate is the larger of the two (the first alone without ``values``). On
    the shipped configs it is 1.5-1.9 times the peak that ``tracemalloc`` traces
    (2-core x86_64 development machine).
    """
    m = task.model
    n, T, P, V, k = int(n), task.max_len, m.num_params, m.vocab_size, m.context
    L = max(len(p) for p in task.prompts) + T
    draws = 8 * n * (2 * L + k + T + 8 + 3 * V + L * (P // V) + L * L)
    if not values:
        return draws
    S = 2 if use_sampler else 1
    est = 8 * n * (2 * S * T * P + (4 * S + 8) * P + T * (L + 4 * k + 8) + 2 * L) + 32 * P * V
    return max(draws, est)


def check_mc_size(task, n, use_sampler, max_bytes=DEFAULT_MAX_BYTES, values=True):
    """Refuse ``n`` draws whose :func:`mc_bytes` exceed ``max_bytes`` (``ValueError``
    naming ``n``, the estimate and the largest ``n`` that fits)."""
    max_bytes = check_limit(max_bytes, "max_bytes")
    need = mc_bytes(task, n, use_sampler, values)  # an int of any size
    if need <= max_bytes:
        return
    per = mc_bytes(task, 1, use_sampler, values)
    fit = int(max_bytes // per) if per <= max_bytes else 0  # per may pass float range
    S = 2 if use_sampler else 1
    raise ValueError(
        f"Monte Carlo refused: n={readable(n)} samples need about {readable(need // 2 ** 30)} "
        f"GiB (n x T x P x 8 bytes x {2 * S} and more; T={readable(task.max_len)}, "
        f"P={readable(task.model.num_params)}), more than the limit "
        f"max_bytes={readable(max_bytes / 2 ** 30)} GiB; "
        + (f"use n <= {readable(fit)} or raise max_bytes" if fit >= 1 else
           "no n fits: shorten max_len or shrink the model, or raise max_bytes"))


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


def _logits(task, W, use_sampler):
    if use_sampler:
        z = task.sampler.logits(task.model, task.theta, W)
    else:
        z = task.model.logits(task.theta, W)
    z = np.asarray(z, dtype=float)  # (B, V)
    if np.isnan(z).any() or np.isposinf(z).any() or np.isneginf(z).all(axis=-1).any():
        who = "sampler" if use_sampler else "model"
        raise ValueError(f"the {who} returned NaN, +inf or all -inf logits")
    return z


def _template(task, n_rows):
    plen = np.array([len(p) for p in task.prompts], dtype=np.int64)
    full = np.full((len(task.prompts), plen.max() + task.max_len), -1, dtype=np.int64)
    for i, pr in enumerate(task.prompts):
        full[i, :len(pr)] = pr
    return full, plen


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
    full, plen = _template(task, n)
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
        probs = np.exp(log_softmax(_logits(task, W, use_sampler)))  # (B, V)
        y = _draw(probs, rng)  # (B,)
        tokens[rows, t] = y
        full[rows, length[rows]] = y
        length[rows] += 1
        if m.eos:
            live[rows[y == 0]] = False
    return {"tokens": tokens, "prompt": prompt}


def _rewards(task, draws):
    keys = np.concatenate([draws["prompt"][:, None], draws["tokens"]], axis=1)  # (n, 1+T)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    vals = np.array([evaluate_reward(task.reward, task.prompts[k[0]],
                                     [int(t) for t in k[1:] if t >= 0]) for k in uniq])
    return vals[inv.reshape(-1)]  # (n,)


def _occurrences(task, draws):
    """Every visited (sample, position): windows, next token, sample row, position."""
    toks, prompt = draws["tokens"], draws["prompt"]
    n, T = toks.shape
    full, plen = _template(task, n)
    full = full[prompt]  # (n, Lp + T)
    pl = plen[prompt]  # (n,)
    valid = toks >= 0  # (n, T)
    rows, ts = np.nonzero(valid)  # (K,), (K,)
    full[rows, pl[rows] + ts] = toks[rows, ts]
    W = task.model.windows(full[rows], pl[rows] + ts)  # (K, k)
    return W, toks[rows, ts], rows, ts


def _per_state(task, from_mu, W, y, rows, ts, n, chunk):
    """Scores xi (n, T, P) and path sums g (n, P) per stream, and log rho (n,).

    Work is done once per distinct (window, next token) pair: ``xi`` and ``m`` are
    tables over pairs and windows, gathered back to the samples at the end.
    """
    m = task.model
    P, V, T, k = m.num_params, m.vocab_size, task.max_len, W.shape[1]
    names = [("raw", "p"), ("centered", "q")] if from_mu else [("policy", "p")]
    w = "q" if from_mu else "p"
    pairs, pinv = np.unique(np.concatenate([W, y[:, None]], axis=1), axis=0,
                            return_inverse=True)  # sorted by window, then token
    pinv = pinv.reshape(-1)  # (K,)
    uw, winv = np.unique(pairs[:, :k], axis=0, return_inverse=True)
    winv = winv.reshape(-1)  # (Q,) nondecreasing
    Q, U = len(pairs), len(uw)
    chunk = chunk or max(1, _CHUNK_BYTES // (8 * P * V * 4))
    xi_tab = {s: np.zeros((Q + 1, P)) for s, _ in names}  # last row: positions after the end
    m_tab = {s: np.zeros((U + 1, P)) for s, _ in names}
    lr_tab = np.zeros(Q + 1)  # log p(y|s) - log mu(y|s) per pair
    for a in range(0, U, chunk):
        Wu = uw[a:a + chunk]  # (C, k)
        q0, q1 = np.searchsorted(winv, [a, a + len(Wu)])
        lu, yq = winv[q0:q1] - a, pairs[q0:q1, k]  # (Q_c,)
        lp = log_softmax(_logits(task, Wu, False))  # (C, V)
        dist = {"p": np.exp(lp)}
        J = np.asarray(sensitivities(m, task.theta, Wu), dtype=float)  # (C, P, V)
        if not np.isfinite(J).all():
            raise ValueError("non-finite logit sensitivities (check the model's derivatives)")
        center = {"p": mean_sensitivity(dist["p"], J)}  # (C, P)
        if from_mu:
            lq = log_softmax(_logits(task, Wu, True))  # (C, V)
            dist["q"] = np.exp(lq)
            bad = (dist["p"] > 0) & (dist["q"] == 0)
            if bad.any():
                b, tok = map(int, np.argwhere(bad)[0])
                raise ValueError(
                    f"the sampler gives probability 0 to token {tok} at window {Wu[b].tolist()}, "
                    "which the policy can emit; importance weights p/mu are undefined")
            center["q"] = mean_sensitivity(dist["q"], J)
            lr_tab[q0:q1] = lp[lu, yq] - lq[lu, yq]
        jy = np.ascontiguousarray(J.transpose(0, 2, 1))[lu, yq]  # (Q_c, P)
        for s, cname in names:
            xi_tab[s][q0:q1] = jy - center[cname][lu]
            m_tab[s][a:a + len(Wu)] = token_second_moment(dist[w], J, center[cname])  # (C, P)
    pk = np.full((n, T), Q)  # pair of each (sample, position); Q = past the end
    pk[rows, ts] = pinv
    wk = np.full((n, T), U)
    wk[rows, ts] = winv[pinv]
    xi = {s: xi_tab[s][pk] for s, _ in names}  # (n, T, P)
    g = {s: m_tab[s][wk].sum(axis=1) for s, _ in names}  # (n, P)
    return xi, g, lr_tab[pk].sum(axis=1)


def sample_values(task, draws, from_sampler, chunk=None):
    r"""Per-sample values of given responses (no randomness): the core of :func:`estimate`.

    Args:
        task: the task the responses belong to.
        draws: dict ``tokens`` ``(n, T)`` (``-1`` padded) and ``prompt`` ``(n,)``, as
            :func:`sample` returns (or every response of ``exact(...).sequences``).
        from_sampler: the responses come from ``mu`` (streams ``raw``, ``centered``)
            rather than ``p`` (stream ``policy``).
        chunk: distinct windows per sensitivity block.

    Returns:
        dict: ``reward`` ``(n,)``; ``rho`` ``(n,)`` :math:`P_p(y)/P_\mu(y)` (``None``
        from ``p``); per stream a dict ``xi`` ``(n, T, P)`` (0 past the end), ``h``,
        ``h2``, ``token_sum`` :math:`\sum_t m(s_t)` ``(n, P)``.
    """
    n = draws["tokens"].shape[0]
    W, y, rows, ts = _occurrences(task, draws)
    xi, g, log_rho = _per_state(task, from_sampler, W, y, rows, ts, n, chunk)
    out = {"reward": _rewards(task, draws), "rho": np.exp(log_rho) if from_sampler else None}
    for s in xi:
        h = xi[s].sum(axis=1)  # (n, P)
        out[s] = {"xi": xi[s], "h": h, "h2": h * h, "token_sum": g[s]}
    return out


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
