r"""Per-response and per-state views used by the lessons.

- :func:`response_token_scores`: the token scores
  :math:`\xi_{t,i} = j_{i,y_t}(s_t) - \bar j_i(s_t)` of one response, so a
  single response's cross terms :math:`\xi_{u,i}\xi_{t,i}` can be looked at;
- :func:`pairwise_terms`: the pair contributions
  :math:`\tfrac12 p_a p_b (j_{i,a} - j_{i,b})^2` whose sum is the token Fisher;
- :func:`fisher_ratio`: the alignment diagnostic :math:`f_i(s) / f^{unif}_i(s)`
  for every kept state of an :class:`~fisher_ref.results.ExactResult`;
- :func:`entropy`: the entropy of each state's next-token distribution;
- :func:`concentration`, :func:`shuffled_token_fisher`, :func:`alignment_factor`,
  :func:`shuffled_sequence_fisher`: the ratio split into a part that only
  depends on how concentrated ``p`` is and a part that measures alignment;
- :func:`shuffle_control`: the model's statistics against copies with ``p``
  shuffled across the tokens at every state;
- :func:`state_sensitivities`: the sensitivities ``j`` at every kept state.

Concentration against alignment. Averaged over a uniformly random permutation
:math:`\pi` of the model's probabilities across tokens (same entropy, any
alignment destroyed), the token Fisher is

.. math:: E_\pi[f_i] = c(s)\, f^{unif}_i(s), \qquad
          c(s) = \frac{1 - \sum_a p_a^2}{1 - 1/V} \in [0, 1].

Write :math:`f = \sum_a p_a j_a^2 - (\sum_a p_a j_a)^2` (index ``i`` dropped).
Under :math:`\pi`, :math:`E[p_{\pi(a)}] = 1/V`,
:math:`E[p_{\pi(a)}^2] = S/V` and, for :math:`a \ne b`,
:math:`E[p_{\pi(a)} p_{\pi(b)}] = (1 - S)/(V(V-1))` with :math:`S = \sum_a p_a^2`;
collecting terms gives :math:`(1-S)\,\tfrac{V}{V-1}\,\mathrm{Var}_{unif}(j)`, and
:math:`f^{unif} = \mathrm{Var}_{unif}(j)`. So :math:`f/f^{unif} = c(s)\,a_i(s)`: the
concentration :math:`c(s) \le 1` lowers the ratio on average whatever the
sensitivities are, and the alignment factor :math:`a_i(s) = f_i / (c f^{unif}_i)`, whose
average over permutations is exactly 1, is what is left for alignment.
"""
from __future__ import annotations

import re
import textwrap

import numpy as np

from fisher_ref.models.base import model_windows
from fisher_ref.numerics import softmax
from fisher_ref.models.sensitivities import sensitivities
from fisher_ref.numerics import mean_sensitivity, token_fisher, uniform_token_fisher

__all__ = ["response_token_scores", "pairwise_terms", "fisher_ratio", "entropy",
           "concentration", "shuffled_token_fisher", "alignment_factor",
           "shuffled_sequence_fisher", "state_sensitivities", "shuffle_control", "compact_table",
           "RATIO_FLOOR"]

#: f_unif below this (relative to its largest value) counts as "no sensitivity":
#: the ratio is undefined there and returned as NaN.
RATIO_FLOOR = 1e-12


def response_token_scores(task, prompt, response):
    r"""Token scores of one response, :math:`\xi_{t,i} = \partial_i \log p(y_t|s_t)`.

    .. math:: \xi_{t,i} = j_{i,y_t}(s_t) - \sum_b p_b(s_t)\, j_{i,b}(s_t)

    Positions after the response ends hold 0 (no token is drawn there).

    Args:
        task: a :class:`fisher_ref.tasks.Task` (its model and ``theta`` are used).
        prompt: index into ``task.prompts``.
        response: the generated tokens (EOS included if it ended with EOS),
            ``-1`` padding allowed at the end.

    Returns:
        float64 ``(T, P)`` with ``T = task.max_len``.

    Example:
        >>> from fisher_ref import load_config
        >>> task = load_config("tabular")
        >>> response_token_scores(task, 0, [2, 0]).shape
        (3, 12)
    """
    model, theta = task.model, task.theta
    if not 0 <= int(prompt) < len(task.prompts):
        raise ValueError(f"prompt index {prompt} out of range 0..{len(task.prompts) - 1}")
    resp = [int(t) for t in response if int(t) >= 0]
    if len(resp) == 0 or len(resp) > task.max_len:
        raise ValueError(f"a response needs 1..{task.max_len} tokens, got {len(resp)}")
    V = model.vocab_size
    if any(not 0 <= t < V for t in resp):
        raise ValueError(f"response {resp} holds a token outside 0..{V - 1}")
    if model.eos and 0 in resp[:-1]:
        raise ValueError(f"response {resp} continues after EOS (token 0)")
    pr = list(task.prompts[int(prompt)])
    states = [pr + resp[:t] for t in range(len(resp))]
    W = model_windows(model, states)  # (n, k)
    p = softmax(np.asarray(model.logits(theta, W), dtype=float))  # (n, V)
    J = sensitivities(model, theta, W)  # (n, P, V)
    jbar = mean_sensitivity(p, J)  # (n, P)
    xi = np.zeros((task.max_len, model.num_params))  # (T, P)
    xi[:len(resp)] = J[np.arange(len(resp)), :, resp] - jbar
    return xi


def pairwise_terms(probs, sens):
    r"""Pair contributions :math:`\tfrac12 p_a p_b (j_{i,a} - j_{i,b})^2`.

    Their sum over ``a, b`` is the token Fisher :math:`f_i`.

    Args:
        probs: ``(V,)`` next-token probabilities of one state.
        sens: ``(P, V)`` sensitivities of that state.

    Returns:
        ``(P, V, V)``.

    Example:
        >>> float(pairwise_terms(np.array([0.5, 0.5]), np.array([[1.0, 0.0]])).sum())
        0.25
    """
    probs = np.asarray(probs, dtype=float)
    sens = np.asarray(sens, dtype=float)
    if probs.ndim != 1 or sens.ndim != 2 or sens.shape[1] != probs.shape[0]:
        raise ValueError(f"need probs (V,) and sens (P, V); got {probs.shape} and {sens.shape}")
    diff = sens[:, :, None] - sens[:, None, :]  # (P, V, V)
    return 0.5 * probs[None, :, None] * probs[None, None, :] * diff ** 2


def fisher_ratio(result, floor=RATIO_FLOOR):
    r"""The alignment diagnostic :math:`f_i(s) / f^{unif}_i(s)` at every kept state.

    Entries whose :math:`f^{unif}` is below ``floor`` times its largest value are
    NaN (the parameter does not move the logits there at all).

    Args:
        result: an :class:`~fisher_ref.results.ExactResult` with ``states`` kept.

    Returns:
        ``(N, P)`` float64.
    """
    states = _kept_states(result)
    return _ratio(states["token_fisher"], states["uniform"], floor)


def _kept_states(result):
    if result.states is None:
        raise ValueError("the result kept no per-state arrays; run "
                         "exact(..., options=EngineOptions(keep_states=True))")
    return result.states


def _ratio(num, den, floor):
    """``num / den`` where ``den`` exceeds ``floor`` times its largest value, else NaN."""
    ok = den > floor * max(float(den.max()), np.finfo(float).tiny)
    return np.where(ok, num / np.where(ok, den, 1.0), np.nan)


def entropy(probs):
    r""":math:`H = -\sum_a p_a \log p_a` (nats) of each row, ``(..., V) -> (...)``.

    Example:
        >>> round(float(entropy(np.array([0.5, 0.5]))), 6)
        0.693147
    """
    probs = np.asarray(probs, dtype=float)
    logp = np.log(np.where(probs > 0, probs, 1.0))
    return -(probs * logp).sum(axis=-1)


def concentration(probs):
    r""":math:`c = (1 - \sum_a p_a^2) / (1 - 1/V)` of each row, ``(..., V) -> (...)``.

    1 for the uniform distribution, 0 for a point mass. Times :math:`f^{unif}`
    it is the token Fisher averaged over all permutations of ``p`` across tokens
    (module docstring).

    Example:
        >>> concentration(np.array([[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0]])).tolist()
        [1.0, 0.0]
    """
    probs = np.asarray(probs, dtype=float)
    V = probs.shape[-1]
    if V < 2:
        raise ValueError(f"concentration needs a vocabulary of at least 2 tokens, got V = {V}")
    return (1.0 - (probs ** 2).sum(axis=-1)) / (1.0 - 1.0 / V)


def shuffled_token_fisher(probs, sens):
    r""":math:`E_\pi[f_i] = c(s)\, f^{unif}_i(s)`: the token Fisher averaged over every
    permutation :math:`\pi` of ``probs`` across the tokens, sensitivities kept.

    Args:
        probs: ``(..., V)`` next-token probabilities.
        sens: ``(..., P, V)`` sensitivities.

    Returns:
        ``(..., P)``.

    Example:
        >>> import itertools
        >>> from fisher_ref.numerics import token_fisher
        >>> p, j = np.array([0.7, 0.2, 0.1]), np.array([[1.0, -1.0, 0.5]])
        >>> brute = np.mean([token_fisher(p[list(q)], j) for q in itertools.permutations(range(3))], axis=0)
        >>> bool(np.allclose(shuffled_token_fisher(p, j), brute, rtol=1e-12))
        True
    """
    probs = np.asarray(probs, dtype=float)
    return concentration(probs)[..., None] * uniform_token_fisher(np.asarray(sens, dtype=float))


def alignment_factor(result, floor=RATIO_FLOOR):
    r""":math:`a_i(s) = f_i(s) / (c(s) f^{unif}_i(s))` at every kept state, ``(N, P)``.

    Its average over permutations of ``p`` is exactly 1: below 1 the model's mass
    sits on tokens parameter ``i`` moves more alike than a random assignment of
    the same probabilities would; above 1, on tokens it moves apart. NaN where
    :math:`c f^{unif}` is below ``floor`` times its largest value.
    """
    states = _kept_states(result)
    shuffled = concentration(states["probs"])[:, None] * states["uniform"]  # (N, P)
    return _ratio(states["token_fisher"], shuffled, floor)


def shuffled_sequence_fisher(result):
    r""":math:`F^{shuf}_i = \sum_s \pi(s)\, c(s)\, f^{unif}_i(s)`, ``(P,)``.

    The on-policy sequence Fisher :math:`F_i = \sum_s \pi(s) f_i(s)` (``pi`` the
    reach of state ``s``) with the probabilities at every state randomly permuted
    across tokens, averaged over the permutations (reach kept). :math:`F_i / F^{shuf}_i`
    is parameter ``i``'s alignment over the whole task.
    """
    states = _kept_states(result)
    shuffled = concentration(states["probs"])[:, None] * states["uniform"]  # (N, P)
    return states["reach"] @ shuffled


def state_sensitivities(task, states):
    """Sensitivities ``j`` at every state of ``result.states``: ``(N, P, V)``.

    Example:
        >>> from fisher_ref import load_config, exact
        >>> task = load_config("tabular")
        >>> state_sensitivities(task, exact(task, progress=False).states).shape
        (14, 12, 3)
    """
    toks = np.asarray(states["tokens"])  # (N, L), -1 padded
    W = task.model.windows(toks, (toks >= 0).sum(axis=1))  # (N, k)
    return sensitivities(task.model, task.theta, W)  # (N, P, V)


def shuffle_control(task, result, rng, shuffles=200, params=None, floor=RATIO_FLOOR):
    r"""The shuffled-:math:`p` control: the model against copies of itself whose next-token
    probabilities are permuted across the tokens, independently at every state.

    Two statistics, for the model and for each shuffle :math:`k`:

    - ``share``: the reach-weighted share of (state, parameter) pairs with
      :math:`f_i(s) < f^{unif}_i(s)` (pairs with :math:`f^{unif}` above ``floor`` times its
      largest value);
    - ``ratio``: :math:`F_i / F^{shuf}_i` for the selected parameters, with
      :math:`F_i = \sum_s \pi(s) f_i(s)` computed from the (shuffled) probabilities and
      :math:`F^{shuf}_i` from :func:`shuffled_sequence_fisher` (its exact average over shuffles).

    Args:
        task: the task ``result`` was computed for (its sensitivities are needed).
        result: an :class:`~fisher_ref.results.ExactResult` with ``states`` kept.
        rng: ``numpy.random.Generator`` drawing the permutations.
        shuffles: number of shuffled copies ``K``.
        params: indices of the parameters for ``ratio`` (default: all); those with
            :math:`F^{shuf}_i` below ``floor`` times its largest value are dropped.

    Returns:
        dict with ``share`` (float), ``shuffled_share`` ``(K,)``, ``ratio`` ``(n,)``,
        ``shuffled_ratio`` ``(K, n)`` and ``params`` ``(n,)`` (the indices kept).
    """
    states = _kept_states(result)
    J = state_sensitivities(task, states)  # (N, P, V)
    fu, reach, probs = states["uniform"], states["reach"], states["probs"]  # (N, P), (N,), (N, V)
    good = fu > floor * max(float(fu.max()), np.finfo(float).tiny)  # (N, P)
    weight = np.broadcast_to(reach[:, None], good.shape)[good]
    F_shuf = shuffled_sequence_fisher(result)  # (P,)
    idx = np.arange(F_shuf.size) if params is None else np.asarray(params)
    idx = idx[F_shuf[idx] > floor * max(float(F_shuf.max()), np.finfo(float).tiny)]

    def stats(f):  # (N, P) -> (share, (n,) ratio)
        share = float((weight * (f[good] < fu[good])).sum() / weight.sum())
        return share, (reach @ f)[idx] / F_shuf[idx]

    share, ratio = stats(states["token_fisher"])
    shuffled = [stats(token_fisher(rng.permuted(probs, axis=1), J)) for _ in range(shuffles)]
    return {"share": share, "ratio": ratio, "params": idx,
            "shuffled_share": np.array([s for s, _ in shuffled]),
            "shuffled_ratio": np.array([r for _, r in shuffled]).reshape(shuffles, idx.size)}


#: The verify table's words for symbols the lessons name otherwise (one meaning per symbol).
_LESSON_WORDS = {"pi(s)": "rho(s)", "rho A h": "(p/mu) A h", "f(j + c) = f(j), c per":
                 "f(j + delta) = f(j), delta per"}


def compact_table(rows, width=84):
    """Rows of :func:`fisher_ref.checks.identities.exact_checks` as a table ``width`` wide.

    One line per row (identity, stream, value, result), the check's wording wrapped under it;
    the notes are left out. The lessons print this instead of the full ``verify`` table, whose
    lines are wider than a notebook cell.

    Example:
        >>> from types import SimpleNamespace as Row
        >>> print(compact_table([Row(identity="2 cross terms vanish", stream="policy",
        ...                          check="max |C[u,t]| / max F", value=1e-17, kind="zero",
        ...                          passed=True)]))
        identity                  stream       value  result
        ----------------------------------------------------
        2 cross terms vanish      policy    1.00e-17  PASS
            max |C[u,t]| / max F
    """
    out = [f"{'identity':<25} {'stream':<8} {'value':>9}  result", "-" * 52]
    for row in rows:
        result = "info" if row.kind == "info" else ("PASS" if row.passed else "FAIL")
        out.append(f"{row.identity[:25]:<25} {row.stream:<8} {row.value:9.2e}  {result}")
        words = row.check
        for old, new in _LESSON_WORDS.items():
            words = words.replace(old, new)
        words = re.sub(r"([<>=]=?) (\S)", "\\1\u00a0\\2", words)  # never wrap after "> "
        out += textwrap.wrap(words, width, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(out)
