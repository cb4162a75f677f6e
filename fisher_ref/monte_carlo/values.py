r"""Per-response values of given responses, without randomness (:func:`sample_values`,
the core of :func:`fisher_ref.monte_carlo.sampling.estimate`): per stream the scores
:math:`\xi_t`, :math:`h`, :math:`h^2` and the Rao–Blackwellised :math:`\sum_t m(s_t)`,
the rewards and the importance weights, with the checked logits and the prompt table
that drawing shares.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.models.sensitivities import sensitivities
from fisher_ref.numerics import log_softmax, mean_sensitivity, token_second_moment
from fisher_ref.rewards import evaluate_reward

__all__ = ["sample_values", "checked_logits", "prompt_table"]

_CHUNK_BYTES = 64 * 2 ** 20


def checked_logits(task, W, use_sampler):
    """Logits ``(B, V)`` of the model (or with ``use_sampler``, the sampler) at windows
    ``W (B, k)``, refused when NaN, +inf or all -inf."""
    if use_sampler:
        z = task.sampler.logits(task.model, task.theta, W)
    else:
        z = task.model.logits(task.theta, W)
    z = np.asarray(z, dtype=float)  # (B, V)
    if np.isnan(z).any() or np.isposinf(z).any() or np.isneginf(z).all(axis=-1).any():
        who = "sampler" if use_sampler else "model"
        raise ValueError(f"the {who} returned NaN, +inf or all -inf logits")
    return z


def prompt_table(task, n_rows):
    """``(full, plen)``: each prompt's tokens in a row of ``full (len(prompts), L)``, ``-1``
    padded to the longest prompt plus ``max_len``, and the prompt lengths ``(len(prompts),)``."""
    plen = np.array([len(p) for p in task.prompts], dtype=np.int64)
    full = np.full((len(task.prompts), plen.max() + task.max_len), -1, dtype=np.int64)
    for i, pr in enumerate(task.prompts):
        full[i, :len(pr)] = pr
    return full, plen


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
    full, plen = prompt_table(task, n)
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
        lp = log_softmax(checked_logits(task, Wu, False))  # (C, V)
        dist = {"p": np.exp(lp)}
        J = np.asarray(sensitivities(m, task.theta, Wu), dtype=float)  # (C, P, V)
        if not np.isfinite(J).all():
            raise ValueError("non-finite logit sensitivities (check the model's derivatives)")
        center = {"p": mean_sensitivity(dist["p"], J)}  # (C, P)
        if from_mu:
            lq = log_softmax(checked_logits(task, Wu, True))  # (C, V)
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
    r"""Per-sample values of given responses (no randomness): the core of
    :func:`~fisher_ref.monte_carlo.sampling.estimate`.

    Args:
        task: the task the responses belong to.
        draws: dict ``tokens`` ``(n, T)`` (``-1`` padded) and ``prompt`` ``(n,)``, as
            :func:`~fisher_ref.monte_carlo.sampling.sample` returns (or every response of
            ``exact(...).sequences``).
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
