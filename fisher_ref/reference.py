r"""The readable judge: how the exact numbers are made.

Every quantity of docs/theory.md §2–3, for one task, by listing every state and every
response of the prefix tree and summing. The file reads in the order of the text:

1. the prefix tree, level by level (§1, §7.1): at each open state the model's next-token
   probabilities :math:`p` (and the sampler's :math:`\mu`), the sensitivities
   :math:`j_{i,a} = \partial z_a / \partial\theta_i` (§2.1), and for each *stream* the score
   of every candidate token and the state's token moment (§2.3, §3, §7.3);
2. each complete response with its whole score history :math:`(\xi_1, \dots, \xi_T)`;
3. per stream, every response-level expectation as
   :math:`\sum_y w(y) \times` (the response's own value: :math:`h`, :math:`h^2`,
   :math:`\xi_u\xi_t`, :math:`A h`) and every token-level one as
   :math:`\sum_s \pi(s) \times` (the state's value) (§2.2–2.7, §3);
4. the policy gradient a second way: autograd's derivative of the exact expected reward
   (identity (6) of §2.9).

A stream is a pair (the distribution responses are drawn from, the centering of the score):

=============  ===========  ================================================
stream         drawn from   score of token ``a`` at state ``s``
=============  ===========  ================================================
``policy``     :math:`p`    :math:`j_{\cdot,a} - \bar j` (on-policy, §2)
``raw``        :math:`\mu`  :math:`j_{\cdot,a} - \bar j` (the policy score, §3)
``centered``   :math:`\mu`  :math:`j_{\cdot,a} - \bar j^\mu`
``top{k}``     :math:`\mu`  :math:`j_{\cdot,a} - c^{(k)}` (top-``k`` of :math:`\mu`)
=============  ===========  ================================================

Nothing here uses an identity of §2.9, so the identities checked against these sums are
tested, not assumed. The fast engine (:func:`fisher_ref.exact`) regroups the same finite sums
and is held to this file at 1e-10 relative, and so is every shipped golden file
(``tests/test_reference.py``). ``exact(task, reference=True)`` runs it.

It shares with the fast engine only what is not the arithmetic of the sums: the models,
rewards and samplers, the formulas of :mod:`fisher_ref.numerics`, the checked next-token
distributions (:mod:`fisher_ref.next_token`), the size limits (:mod:`fisher_ref.limits`) and
the result classes (:mod:`fisher_ref.results`).

Example:
    >>> from fisher_ref import load_config
    >>> r = exact_reference(load_config("default"), progress=False)
    >>> bool(np.allclose(r.sequence_fisher, r.token_fisher_sum, rtol=1e-10, atol=0))
    True
"""
from __future__ import annotations

from types import SimpleNamespace

import autograd.numpy as anp
import numpy as np
from autograd import grad

from fisher_ref._progress import Progress
from fisher_ref.limits import (DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, Cost, check_cost,
                               count_states, resolve_keep)
from fisher_ref.next_token import check_support, checked_sensitivities, model_probs
from fisher_ref.numerics import (log_softmax, mean_sensitivity, token_fisher, topk_center,
                                 uniform_token_fisher)
from fisher_ref.results import (ExactResult, FisherStreamResult, StreamResult,
                                check_quantities, check_topk, stream_specs)
from fisher_ref.rewards import evaluate_reward
from fisher_ref.tasks import require_task

__all__ = ["exact_reference", "reference_cost"]

#: Floating-point operations per second the refusal assumes (vectorised numpy on one core),
#: and the seconds of Python work per response (its reward, one call each) and per run.
FLOPS, SECONDS_PER_RESPONSE, SECONDS_FIXED = 5.0e8, 1.0e-5, 0.01


def exact_reference(task, *, topk=(), quantities="all", keep_states="auto",
                    keep_sequences="auto", max_seconds=DEFAULT_MAX_SECONDS,
                    max_bytes=DEFAULT_MAX_BYTES, progress=True):
    r"""Every quantity of docs/theory.md §2–3 for ``task``: the judge of :func:`fisher_ref.exact`.

    Args:
        task: a :class:`fisher_ref.tasks.Task`.
        topk: with a sampler, also the stream ``top{k}`` for each ``k`` here.
        quantities: ``"all"``, or ``"fisher"``: per stream only the Fisher quantities
            (:class:`fisher_ref.results.FisherStreamResult`); no reward is evaluated.
        keep_states, keep_sequences: keep the per-state / per-response arrays
            (``"auto"``: when they fit in about 1 GiB; never the per-response ones with
            ``quantities="fisher"``).
        max_seconds, max_bytes: refuse (:class:`fisher_ref.limits.EnumerationTooLarge`) a
            task whose estimate (:func:`reference_cost`) is past these.
        progress: show a progress bar on stderr once the run exceeds 2 s.

    Returns:
        :class:`fisher_ref.results.ExactResult`, as :func:`fisher_ref.exact` gives it.
    """
    P, T = require_task(task).model.num_params, task.max_len
    streams = stream_specs(task, _checked_topk(task, topk, quantities, keep_sequences))
    cost = reference_cost(task, len(streams))
    keep_states, keep_sequences = resolve_keep(keep_states, keep_sequences, cost.n_states,
                                               cost.n_responses, P, T)
    check_cost(cost, max_seconds, max_bytes)
    bar = Progress(cost.n_states, "exact enumeration (reference)", enabled=progress)
    states, responses = enumerate_tree(task, streams, bar)
    bar.close()
    fisher = quantities == "fisher"
    R = None if fisher else rewards(task, responses)  # (M,)
    results = {st.name: stream_result(task, st, states, responses, R) for st in streams}
    gradient = None if fisher else autodiff_gradient(task, responses, R)
    return ExactResult.build(task, cost, results, gradient,
                             kept_states(task, states) if keep_states else None,
                             kept_sequences(task, responses, R)
                             if keep_sequences and not fisher else None, quantities)


def _checked_topk(task, topk, quantities, keep_sequences):
    """``topk`` as a tuple, after the checks of the arguments that depend on each other."""
    topk = check_topk(topk)
    if check_quantities(quantities) == "fisher" and keep_sequences is True:
        raise ValueError("keep_sequences=True needs quantities='all': the per-response "
                         "arrays hold rewards and advantages, which quantities='fisher' "
                         "does not compute")
    if topk and task.sampler is None:
        raise ValueError("topk centering needs a sampler mu; this task is on-policy "
                         "(add a 'sampler' to the task)")
    return topk


def reference_cost(task, n_streams):
    r"""The size of ``task``'s enumeration and this judge's time and peak memory, estimated
    in closed form (an upper bound): a :class:`fisher_ref.limits.Cost`.

    The judge holds, per state, its token moments (two ``(P,)`` per stream, and the kept
    arrays); per response, its score history ``(T, P)`` and path sum ``(P,)`` per stream
    (twice while they are split off a level and while they are sorted); and for the states
    of one level the sensitivities and scores of every candidate token ``(V, P)`` and the
    score histories of their ``V`` children (twice while they are split); and 1 MiB of small
    records.
    """
    m = task.model
    V, P, T, S = m.vocab_size, m.num_params, task.max_len, n_streams
    N, M = count_states(V, T, m.eos, len(task.prompts))
    L = max(len(x) for x in task.prompts) + T
    per_state = P * (V * (S + 1) + 2 * S + 6) + 2 * V + L
    per_child = S * (T + 1) * P + L + 6
    flops = N * P * V * (4 * S + 6) + M * S * P * (2 * T * T + 10 * T) + M * T * P * V * 6
    seconds = SECONDS_FIXED + flops / FLOPS + M * SECONDS_PER_RESPONSE
    return Cost(N, M, P, V, T, S, chunk=N, seconds=float(seconds),
                bytes=2 ** 20 + 8 * (N * per_state + 2 * (N * V + M) * per_child))


# --- 1, 2: the prefix tree, level by level -------------------------------------------------

def enumerate_tree(task, streams, bar):
    r"""Every open state and every complete response (docs/theory.md §1, §7.1).

    Level ``t`` holds the ``B`` open states of depth ``t``. Each is followed by every token
    ``a``; the child ends a response on EOS (token 0, when the model has it) or at depth
    ``T``, and is an open state of level ``t + 1`` otherwise. A child's reach is
    :math:`\pi(s)\,p(a|s)` under each distribution, and per stream its score history is
    its parent's with the score of ``a`` in slot ``t``.

    Returns:
        ``(states, responses)``: dicts of arrays, one row per state ``(N, ...)`` and per
        response ``(M, ...)``, sorted by prompt, depth and tokens and by prompt and tokens;
        per-stream arrays in dicts keyed by stream name.
    """
    V, T, P = task.model.vocab_size, task.max_len, task.model.num_params
    n, plen = len(task.prompts), [len(x) for x in task.prompts]
    tokens = np.full((n, max(plen) + T), -1, dtype=np.int64)  # (n, L): prompt, then tokens
    for i, x in enumerate(task.prompts):
        tokens[i, :plen[i]] = x
    w = task.prompt_weights.astype(float)  # (n,)
    level = {"prompt": np.arange(n), "tokens": tokens, "length": np.array(plen), "rp": w,
             "rq": w, "xi": {st.name: np.zeros((n, T, P)) for st in streams},  # (n, T, P)
             "g": {st.name: np.zeros((n, P)) for st in streams}}  # (n, P) path sums of m
    states, responses = [], []
    for depth in range(T):
        state, scores = open_states(task, streams, level, depth)
        states.append(state)
        bar.update(len(level["prompt"]))
        children, ends = expand(task, streams, level, state, scores, depth)
        responses.append(rows(children, ends))
        level = rows(children, ~ends)
    states, responses = concat(states), concat(responses)
    resp = response_tokens(task, responses)  # (M, T)
    states = rows(states, np.lexsort([states["tokens"][:, c] for c in range(
        states["tokens"].shape[1] - 1, -1, -1)] + [states["depth"], states["prompt"]]))
    return states, rows(responses, np.lexsort([resp[:, c] for c in range(T - 1, -1, -1)]
                                              + [responses["prompt"]]))


def open_states(task, streams, level, depth):
    r"""What the open states of one level ``B`` give (docs/theory.md §2.1, §2.3, §3, §7.3).

    Returns:
        ``(state, scores)``: the states' record (their tokens, prompt, depth, reach
        ``(B,)``, probabilities ``(B, V)``, and per stream the token moment
        :math:`m_i(s) = \sum_a q_a \xi_{i,a}^2` and the conditional mean
        :math:`E_q[\xi_i | s] = \sum_a q_a \xi_{i,a}` ``(B, P)``, ``q`` the stream's drawing
        distribution), and per stream the score :math:`\xi_{i,a}` of every candidate
        token ``(B, P, V)``.
    """
    W = task.model.windows(level["tokens"], level["length"])  # (B, k)
    p, q = model_probs(task, task.theta, W)  # (B, V) each: the policy, the sampler (or p)
    if task.sampler is not None:  # importance weights p/mu need mu > 0 wherever p > 0
        check_support(SimpleNamespace(**level), p, q)
    J = checked_sensitivities(task, W)  # (B, P, V): j_{i,a} = dz_a / dtheta_i
    centers = {"p": mean_sensitivity(p, J), "q": mean_sensitivity(q, J)}  # (B, P) j-bar
    drawn = {"p": p, "q": q}
    scores, m, cond = {}, {}, {}
    for st in streams:
        c = centers[st.center] if st.center in centers else topk_center(q, J, st.center)
        xi = J - c[:, :, None]  # (B, P, V): the score of every candidate token
        scores[st.name] = xi
        m[st.name] = np.einsum("bv,bpv->bp", drawn[st.drawn_from], xi ** 2)  # (B, P)
        cond[st.name] = np.einsum("bv,bpv->bp", drawn[st.drawn_from], xi)  # (B, P)
    state = {"tokens": level["tokens"][:, :-1], "prompt": level["prompt"],
             "depth": np.full(len(p), depth), "rp": level["rp"], "rq": level["rq"], "p": p,
             "q": q, "token_fisher": token_fisher(p, J),  # (B, P) f(s), §2.3
             "uniform": uniform_token_fisher(J), "m": m, "cond": cond}  # §2.6; (B, P) each
    return state, scores


def expand(task, streams, level, state, scores, depth):
    """Every child (state ``b`` followed by token ``a``, row ``b V + a``) of a level, and
    which of them end a response ``(B V,)``."""
    V, B = task.model.vocab_size, len(level["prompt"])
    par, tok = np.repeat(np.arange(B), V), np.tile(np.arange(V), B)  # (B V,) each
    tokens = level["tokens"][par]  # (B V, L)
    tokens[np.arange(B * V), level["length"][par]] = tok
    children = {"prompt": level["prompt"][par], "tokens": tokens,
                "length": level["length"][par] + 1,
                "rp": level["rp"][par] * state["p"][par, tok],  # pi(s) p(a|s)
                "rq": level["rq"][par] * state["q"][par, tok], "xi": {}, "g": {}}
    for st in streams:
        hist = level["xi"][st.name][par]  # (B V, T, P)
        hist[:, depth, :] = scores[st.name][par, :, tok]  # xi_{depth+1} = the score of a
        children["xi"][st.name] = hist
        children["g"][st.name] = level["g"][st.name][par] + state["m"][st.name][par]
    ends = (depth + 1 == task.max_len) | (task.model.eos & (tok == 0))  # (B V,)
    return children, ends


def rows(record, idx):
    """Rows ``idx`` of every array of a record (and of its per-stream dicts)."""
    return {k: rows(v, idx) if isinstance(v, dict) else v[idx] for k, v in record.items()}


def concat(records):
    """Records of the same keys, their arrays concatenated along the rows."""
    return {k: concat([r[k] for r in records]) if isinstance(v, dict) else
            np.concatenate([r[k] for r in records]) for k, v in records[0].items()}


def response_tokens(task, responses):
    """The generated tokens of each response ``(M, T)``, ``-1`` after its end."""
    T = task.max_len
    plen = np.array([len(x) for x in task.prompts])[responses["prompt"]]  # (M,)
    col = plen[:, None] + np.arange(T)  # (M, T)
    resp = np.take_along_axis(responses["tokens"], col, axis=1)
    return np.where(col < responses["length"][:, None], resp, -1)


def rewards(task, responses):
    """:math:`R(x, y)` of every response ``(M,)`` (docs/theory.md §5)."""
    resp = response_tokens(task, responses)
    return np.array([evaluate_reward(task.reward, task.prompts[x], y[y >= 0].tolist())
                     for x, y in zip(responses["prompt"], resp)], dtype=float)


# --- 3: the sums of one stream --------------------------------------------------------------

def stream_result(task, stream, states, responses, R):
    r"""One stream's quantities (docs/theory.md §2.2–2.7, §3): with ``w(y)`` the probability
    of each response under the stream's drawing distribution and :math:`\pi(s)` the reach of
    each state, sums over responses of ``w`` times the response's value and over states of
    :math:`\pi` times the state's value. ``R``: ``(M,)`` rewards, ``None`` for only the
    Fisher quantities."""
    T, name = task.max_len, stream.name
    w = responses["r" + stream.drawn_from]  # (M,) w(y)
    pi = states["r" + stream.drawn_from]  # (N,) reach
    xi = responses["xi"][name]  # (M, T, P): the score history, 0 after the response ends
    h = xi.sum(axis=1)  # (M, P): the sequence score, §2.2
    m, depth = states["m"][name], states["depth"]  # (N, P) the token moment, (N,)
    live = pi > 0
    fisher = dict(
        score_mean=w @ h, sequence_fisher=w @ h ** 2,  # E[h], E[h^2]
        token_fisher_sum=pi @ m,  # sum_s pi(s) m(s), §2.4
        token_fisher_by_depth=np.stack([pi[depth == t] @ m[depth == t] for t in range(T)]),
        cond_score_max=np.abs(states["cond"][name][live]).max(axis=0, initial=0.0),
        mass=float(w.sum()))
    if R is None:
        return FisherStreamResult(**fisher)
    mass, F = fisher["mass"], fisher["sequence_fisher"]
    ER = float(R[0]) + float(w @ (R - R[0])) / mass  # E[R]; exactly R[0] if all R are
    b = ER if task.baseline == "mean" else float(task.baseline)  # §5
    A = R - b  # (M,) the advantage
    unit = float(np.abs(R).max(initial=0.0)) or 1.0  # rewards in units of their size
    std = unit * float(np.sqrt(w @ ((R - ER) / unit) ** 2 / mass))  # std(A) = std(R)
    G = w @ (A[:, None] * h)  # (P,) E[A h]
    cov = w @ ((R - ER)[:, None] * h)  # (P,) E[R h] - E[R] E[h]
    bound = std * np.sqrt(F)  # std(A) sqrt(E[h^2])
    corr = np.where(bound > 0, np.abs(cov) / np.where(bound > 0, bound, 1.0), 0.0)
    rho = np.divide(responses["rp"], w, out=np.zeros_like(w), where=w > 0)  # P(y) / w(y)
    cross = np.einsum("m,mup,mtp->utp", w, xi, xi)  # (T, T, P) E[xi_u xi_t], §2.5
    g = responses["g"][name]  # (M, P): sum_t m(s_t) along each response
    variances = {"h": F - fisher["score_mean"] ** 2, "h2": w @ h ** 4 - F ** 2,
                 "token_sum": w @ g ** 2 - (w @ g) ** 2,
                 "Ah": w @ (A[:, None] ** 2 * h ** 2) - G ** 2,
                 "cross": np.einsum("m,mup,mtp->utp", w, xi ** 2, xi ** 2) - cross ** 2,
                 "reward": std ** 2}
    return StreamResult(
        **fisher, token_fisher_sum_paths=w @ g, cross_terms=cross, expected_reward=ER,
        reward_std=std, baseline=float(b), gradient=G, covariance=cov,
        gradient_shift=fisher["score_mean"].copy(), bound=bound, correlation=corr,
        importance_gradient=(w * rho * A) @ h,  # E_w[rho A h], §3
        variances=variances)


# --- 4: the policy gradient by autodiff ------------------------------------------------------

def autodiff_gradient(task, responses, R):
    r"""Identity (6) of docs/theory.md §2.9 by its other side: the derivative of the exact
    expected reward :math:`\sum_{x,y} w_x \prod_t p(y_t | s_t)\, R(x, y)`, by autograd through
    the model's logits at the state before every generated token. It reads none of the
    sensitivities or scores the sums above use."""
    T, model = task.max_len, task.model
    plen = np.array([len(x) for x in task.prompts])[responses["prompt"]]  # (M,)
    n = responses["length"] - plen  # (M,) generated tokens
    m, t = np.nonzero(np.arange(T) < n[:, None])  # (K,) each: every generated token
    W = model.windows(responses["tokens"][m], plen[m] + t)  # (K, k) the state before it
    y = responses["tokens"][m, plen[m] + t]  # (K,) the token
    slot = np.full((len(n), T), len(m))  # (M, T) its row in the K tokens; K: log 1 = 0
    slot[m, t] = np.arange(len(m))
    weight = task.prompt_weights[responses["prompt"]] * R  # (M,) w_x R(x, y)

    def expected_reward(theta):
        logp = log_softmax(model.logits(theta, W))[np.arange(len(m)), y]  # (K,)
        logP = anp.sum(anp.concatenate([logp, anp.zeros(1)])[slot], axis=1)  # (M,)
        return anp.sum(weight * anp.exp(logP))

    return grad(expected_reward)(task.theta)  # (P,)


# --- what is kept: the per-state and per-response arrays -------------------------------------

def kept_states(task, states):
    """The per-state arrays of :attr:`fisher_ref.results.ExactResult.states`."""
    out = {"tokens": states["tokens"], "prompt": states["prompt"], "depth": states["depth"],
           "reach": states["rp"], "probs": states["p"], "token_fisher": states["token_fisher"],
           "uniform": states["uniform"], "score_mean": states["cond"]["policy"]}  # E_p[xi|s]
    if task.sampler is not None:
        out.update({"sampler_reach": states["rq"], "sampler_probs": states["q"],
                    "sampler_token_fisher": states["m"]["centered"],  # f^mu(s)
                    "raw_score_mean": states["cond"]["raw"]})  # E_mu[xi|s], xi the policy's
    return out


def kept_sequences(task, responses, R):
    """The per-response arrays of :attr:`fisher_ref.results.ExactResult.sequences` (the
    advantages are added by :meth:`fisher_ref.results.ExactResult.build`)."""
    return {"tokens": response_tokens(task, responses), "prompt": responses["prompt"],
            "prob": responses["rp"], "sampler_prob": responses["rq"], "reward": R}
