r"""Every response of a task and every group of ``G`` responses to one prompt.

:func:`response_table` enumerates the complete responses of each prompt once, with
everything a loss can read and everything its gradient needs per distinct state:

- per distinct window ``u``: the log-probabilities of the policy, the sampler and the
  reference policy, ``(U, V)`` each, and the scores of every candidate token,
  :math:`\xi_{u,b} = \partial \log p(b|s_u)/\partial\theta = j_b - \sum_a p_a j_a`,
  ``(U, V, P)``;
- per prompt: the responses' tokens, lengths, state rows, rewards and sequence
  log-probabilities.

:func:`groups` yields the groups of one prompt in chunks, as ordered tuples
(:math:`M_x^G` of them) or, for a loss symmetric in its responses, as multisets
(:math:`\binom{M_x + G - 1}{G}`) with their multiplicities :math:`G!/\prod_j n_j!`.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..engine.plan import EnumerationTooLarge, count_states
from ..engine.run import check_logits, checked_sensitivities
from ..limits import readable, readable_log10
from ..numerics import log_softmax

__all__ = ["PromptResponses", "ResponseTable", "all_responses", "response_table",
           "count_groups", "check_groups", "groups", "DEFAULT_MAX_GROUPS"]

#: Groups enumerated before :func:`check_groups` refuses (each costs one loss evaluation).
DEFAULT_MAX_GROUPS = 2_000_000
#: Bytes of the per-window scores ``xi (U, V, P)`` held at once.
DEFAULT_MAX_BYTES = 2 * 2 ** 30


def all_responses(vocab_size, max_len, eos):
    """Every response (the same set under every prompt): tokens ``(M, T)`` ``-1`` padded
    and lengths ``(M,)``, EOS (id 0) ending a response when ``eos``.

    Example:
        >>> tok, n = all_responses(2, 2, eos=True)
        >>> tok.tolist(), n.tolist()
        ([[0, -1], [1, 0], [1, 1]], [1, 2, 2])
    """
    V, T = int(vocab_size), int(max_len)
    done, open_ = [], np.zeros((1, 0), dtype=np.int64)
    for d in range(T):
        n = open_.shape[0]
        child = np.concatenate([np.repeat(open_, V, axis=0),
                                np.tile(np.arange(V), n)[:, None]], axis=1)  # (n V, d+1)
        term = np.full(n * V, d + 1 == T) | ((child[:, -1] == 0) & bool(eos))
        done.append(np.pad(child[term], ((0, 0), (0, T - d - 1)), constant_values=-1))
        open_ = child[~term]
    tokens = np.concatenate(done)  # (M, T)
    order = np.lexsort(tokens.T[::-1])  # lexicographic, -1 (ended) first
    tokens = tokens[order]
    return tokens, (tokens >= 0).sum(axis=1)


@dataclass
class PromptResponses:
    """The responses of one prompt (``M`` of them, ``T = max_len``).

    Attributes:
        prompt: the prompt's index; ``weight``: its weight :math:`w_x`.
        tokens: ``(M, T)`` int, ``-1`` padded; ``lengths``: ``(M,)`` (EOS counted).
        mask: ``(M, T)`` bool, the generated tokens.
        rows: ``(M, T)`` the window row of each token's state (0 past the end).
        rewards: ``(M,)``; ``logp``, ``sampler_logp``: ``(M,)`` sequence
            log-probabilities :math:`\\log p(y|x)`, :math:`\\log \\mu(y|x)`.
    """

    prompt: int
    weight: float
    tokens: np.ndarray
    lengths: np.ndarray
    mask: np.ndarray
    rows: np.ndarray
    rewards: np.ndarray
    logp: np.ndarray
    sampler_logp: np.ndarray

    def __len__(self):
        return self.tokens.shape[0]


@dataclass
class ResponseTable:
    r"""Every response of a task and the per-window arrays of their states.

    Attributes:
        logp, sampler_logp: ``(U, V)`` log-probabilities of the policy and the sampler
            (the policy's when there is none) at each distinct window.
        ref_logp: ``(U, V)`` of the reference policy, or ``None``.
        xi: ``(U, V, P)`` scores :math:`\partial \log p(b|s_u) / \partial\theta`.
        prompts: one :class:`PromptResponses` per prompt of nonzero weight.
        old_logp: ``(U, V)`` of the task's ``old_policy`` (:math:`\theta_{old}`), or
            ``None`` (the first step, :math:`\theta_{old} = \theta`).
    """

    logp: np.ndarray
    sampler_logp: np.ndarray
    ref_logp: np.ndarray | None
    xi: np.ndarray
    prompts: list
    old_logp: np.ndarray | None = None

    def gather_scores(self, rows, mask):
        """Scores of every token of responses: ``(..., T, V, P)``, zero past the end."""
        return np.where(mask[..., None, None], self.xi[rows], 0.0)


def _log_probs(z, W, V, who):
    z = np.asarray(z, dtype=float)
    check_logits(z, W, V, who)
    if np.isnan(z).any() or np.isposinf(z).any() or np.isneginf(z).all(axis=-1).any():
        raise ValueError(f"the {who} returned NaN, +inf or all -inf logits")
    return log_softmax(z)  # (U, V)


def _unique_rows(W):
    """``np.unique(W, axis=0, return_inverse=True)`` for small non-negative ints, by one
    integer code per row when the codes fit in int64 (much faster than sorting rows)."""
    base = int(W.max(initial=0)) + 1 if W.size else 1
    if W.min(initial=0) < 0 or W.shape[1] * np.log2(base) > 62:
        return np.unique(W, axis=0, return_inverse=True)
    code = W @ (base ** np.arange(W.shape[1] - 1, -1, -1, dtype=np.int64))  # (N,)
    u, first, inv = np.unique(code, return_index=True, return_inverse=True)
    return W[first], inv


def check_response_count(task, max_bytes=DEFAULT_MAX_BYTES):
    """``(n_states, n_responses)`` per prompt; refuse when the scores would not fit."""
    V, T, P = task.model.vocab_size, task.max_len, task.model.num_params
    n_states, n_resp = count_states(V, T, task.model.eos, len(task.prompts))
    need = 8 * n_states * V * P + 8 * n_resp * T * 4
    if need > max_bytes:
        raise EnumerationTooLarge(
            f"the expected loss gradient needs the scores of every state: {readable(n_states)} "
            f"states x V={V} x P={readable(P)} parameters, about {need / 2 ** 30:.2f} GiB, "
            f"more than max_bytes={max_bytes / 2 ** 30:.2f} GiB")
    return n_states, n_resp


def response_table(task, max_bytes=DEFAULT_MAX_BYTES):
    r"""Enumerate every response of ``task`` (:class:`ResponseTable`).

    Raises:
        EnumerationTooLarge: the per-state scores would exceed ``max_bytes``.
    """
    check_response_count(task, max_bytes)
    m, V, T = task.model, task.model.vocab_size, task.max_len
    resp, n = all_responses(V, T, m.eos)  # (M, T), (M,)
    M, t = resp.shape[0], np.arange(T)
    live = t[None, :] < n[:, None]  # (M, T)
    keep = [i for i, w in enumerate(task.prompt_weights) if w > 0]
    wins, full_rows = [], []
    for x in keep:
        pr = np.array(task.prompts[x], dtype=np.int64)
        full = np.concatenate([np.broadcast_to(pr, (M, len(pr))), np.maximum(resp, -1)], axis=1)
        full = np.where(np.concatenate([np.ones((M, len(pr)), bool), live], axis=1), full, -1)
        state_len = len(pr) + np.minimum(t[None, :], n[:, None] - 1)  # (M, T)
        W = m.windows(np.repeat(full, T, axis=0), state_len.ravel())  # (M T, k)
        wins.append(np.asarray(W, dtype=np.int64))
        full_rows.append(full)
    Wu, inv = _unique_rows(np.concatenate(wins))  # (U, k), (n M T,)
    inv = inv.reshape(len(keep), M, T)
    logp = _log_probs(m.logits(task.theta, Wu), Wu, V, "model")  # (U, V)
    samp = logp if task.sampler is None else _log_probs(
        task.sampler.logits(m, task.theta, Wu), Wu, V, "sampler")
    ref = getattr(task, "reference", None)
    ref_logp = None if ref is None else _log_probs(ref.logits(m, task.theta, Wu), Wu, V,
                                                   "reference policy")
    old = getattr(task, "old_policy", None)
    old_logp = None if old is None else samp if isinstance(old, str) else _log_probs(
        old.logits(m, task.theta, Wu), Wu, V, "old policy (the task key 'old_policy')")
    J = checked_sensitivities(task, Wu, tokens_first=True)  # (U, V, P)
    xi = J - np.einsum("uv,uvp->up", np.exp(logp), J)[:, None, :]  # (U, V, P)
    tok0 = np.where(live, resp, 0)  # (M, T)
    prompts = []
    for j, x in enumerate(keep):
        rows = np.where(live, inv[j], 0)  # (M, T)
        R = np.asarray(task.reward.batch(resp, n, task.prompts, np.full(M, x)), dtype=float)
        lp = np.where(live, logp[rows, tok0], 0.0).sum(axis=1)  # (M,)
        lq = np.where(live, samp[rows, tok0], 0.0).sum(axis=1)  # (M,)
        prompts.append(PromptResponses(x, float(task.prompt_weights[x]), resp, n, live, rows,
                                       R, lp, lq))
    return ResponseTable(logp, samp, ref_logp, xi, prompts, old_logp)


def count_groups(n_responses, group_size, symmetric=False):
    r"""Groups of one prompt: :math:`M^G` ordered tuples, or :math:`\binom{M+G-1}{G}`
    multisets when ``symmetric``."""
    return math.comb(n_responses + group_size - 1, group_size) if symmetric \
        else n_responses ** group_size


def check_groups(task, group_size, symmetric=False, max_groups=DEFAULT_MAX_GROUPS):
    r"""The number of groups, :math:`\sum_x M_x^G` (or of multisets); refuse past
    ``max_groups`` with :class:`EnumerationTooLarge` saying how many."""
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) \
            or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    _, n_resp = count_states(task.model.vocab_size, task.max_len, task.model.eos)
    n_prompts = int(np.count_nonzero(task.prompt_weights))
    G = int(group_size)
    # the exact count of a huge G is an integer of G log10(M) digits: too slow to form
    log10 = math.log10(n_prompts) + ((math.lgamma(n_resp + G) - math.lgamma(G + 1)
                                      - math.lgamma(n_resp)) / math.log(10) if symmetric
                                     else G * math.log10(n_resp))
    huge = log10 > math.log10(max_groups) + 1
    n = math.inf if huge else n_prompts * count_groups(n_resp, G, symmetric)
    if n > max_groups:
        kind = "multisets" if symmetric else "ordered tuples (sum_x M_x^G)"
        shown = readable_log10(log10) if huge else readable(n)
        raise EnumerationTooLarge(
            f"expected_loss_gradient refused: {shown} groups of {group_size} responses "
            f"as {kind}, {n_prompts} prompts x M={readable(n_resp)} responses each, more than "
            f"max_groups={readable(max_groups)}. Use a smaller group_size or task, "
            f"symmetric=True for a loss symmetric in its responses, or raise max_groups")
    return n


def _multiplicity(idx):
    """:math:`G!/\\prod_j n_j!` of each multiset row of ``idx (n, G)`` (sorted rows)."""
    G = idx.shape[1]
    out = np.full(idx.shape[0], float(math.factorial(G)))
    run = np.ones(idx.shape[0])
    for i in range(1, G):
        same = idx[:, i] == idx[:, i - 1]
        run = np.where(same, run + 1, 1.0)
        out /= np.where(same, run, 1.0)
    return out


def groups(n_responses, group_size, symmetric=False, chunk=4096):
    """Chunks ``(idx (n, G), multiplicity (n,))`` of every group of one prompt: ordered
    tuples (multiplicity 1) or sorted multisets (multiplicity ``G!/prod n_j!``)."""
    M, G = int(n_responses), int(group_size)
    it = itertools.combinations_with_replacement(range(M), G) if symmetric \
        else itertools.product(range(M), repeat=G)
    if not symmetric and M ** G <= 4 * chunk * 64:
        idx = np.indices((M,) * G).reshape(G, -1).T  # (M^G, G), lexicographic
        for lo in range(0, idx.shape[0], chunk):
            yield idx[lo:lo + chunk], np.ones(min(chunk, idx.shape[0] - lo))
        return
    while True:
        rows = list(itertools.islice(it, chunk))
        if not rows:
            return
        idx = np.array(rows, dtype=np.int64).reshape(len(rows), G)
        yield idx, (_multiplicity(idx) if symmetric else np.ones(len(rows)))
