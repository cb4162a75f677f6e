r"""Streaming enumeration of every state and response of a task.

States are visited depth-first in blocks of at most ``chunk`` rows, so memory
stays bounded by the size of one block's children, not by ``V^T``. A state at
depth ``t`` (``t`` generated tokens) is expanded while ``t < max_len`` and its
last generated token is not EOS; its children are every token ``a`` of the
vocabulary, with reach probability :math:`\pi(s)\,p(a|s)`.

:func:`estimate_cost` counts states and responses in closed form and estimates
time and memory before anything runs; :func:`check_cost` refuses a task past
the limits with :class:`EnumerationTooLarge`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Cost", "EnumerationTooLarge", "estimate_cost", "check_cost", "count_states",
           "state_windows", "DEFAULT_MAX_SECONDS", "DEFAULT_MAX_BYTES"]

DEFAULT_MAX_SECONDS = 900.0
DEFAULT_MAX_BYTES = 8 * 2 ** 30
# Throughput assumed by the estimate (floating-point operations per second of
# vectorised numpy on one core, and seconds of Python work per response: the
# reward call). Calibrated on the 2-core x86_64 development machine against
# measured exact() times (python -m fisher_ref.scaling); the estimate errs high.
_FLOPS = 1.0e9
_SECONDS_PER_RESPONSE = 1.0e-5
# Per-window arrays kept between blocks (fisher_ref.exact.WINDOW_CACHE_BYTES).
_WINDOW_CACHE_BYTES = 256 * 2 ** 20


class EnumerationTooLarge(ValueError):
    """Raised when exact enumeration would exceed the time or memory limit."""


@dataclass(frozen=True)
class Cost:
    """Size of an enumeration and its estimated time and peak memory."""

    n_states: int
    n_responses: int
    num_params: int
    vocab_size: int
    max_len: int
    n_streams: int
    chunk: int
    seconds: float
    bytes: int

    def describe(self):
        return (f"{self.n_states:,} states, {self.n_responses:,} responses, "
                f"P={self.num_params:,} parameters, V={self.vocab_size}, T={self.max_len}: "
                f"about {self.seconds:,.1f} s and {self.bytes / 2**30:,.2f} GiB")


def count_states(vocab_size, max_len, eos, n_prompts=1):
    """``(n_states, n_responses)`` of the full enumeration, in closed form."""
    branch = vocab_size - 1 if eos else vocab_size
    per_depth = [branch ** t for t in range(max_len)]  # expandable states per depth
    n_states = sum(per_depth)
    if eos:
        n_resp = sum(per_depth[:-1]) + per_depth[-1] * vocab_size
    else:
        n_resp = vocab_size ** max_len
    return n_states * n_prompts, n_resp * n_prompts


def default_chunk(num_params, vocab_size, max_len, n_streams, budget_bytes=256 * 2 ** 20):
    """Rows per block so that one block's children fit in ``budget_bytes``."""
    per_row = 8 * vocab_size * num_params * (n_streams * (max_len + 2) + 4)
    return int(max(1, min(4096, budget_bytes // max(per_row, 1))))


def estimate_cost(task, n_streams=None, chunk=None, keep_states=False, keep_sequences=False):
    """Estimate the size, time and peak memory of :func:`fisher_ref.exact.exact` on ``task``."""
    m = task.model
    V, P, T = m.vocab_size, m.num_params, task.max_len
    S = n_streams if n_streams is not None else (1 if task.sampler is None else 3)
    chunk = chunk or default_chunk(P, V, T, S)
    N, M = count_states(V, T, m.eos, len(task.prompts))
    # per state: sensitivities and centering; per response: h, h^2, h^4, A h (about
    # 24 passes over P) and the score history of open children (T + 1 slots)
    flops = N * P * V * (12 + 6 * S) + M * P * S * (24 + T)
    seconds = flops / _FLOPS + M * _SECONDS_PER_RESPONSE
    windows = min(N, (V + 1) ** m.context)
    cache = min(_WINDOW_CACHE_BYTES, 8 * windows * P * V * S * 2)
    # one block's work arrays, plus the children (score histories) of up to T - 1
    # partly expanded blocks waiting on the depth-first stack
    rows = min(chunk, N)  # a block never holds more states than the tree has
    block = 8 * rows * V * P * (S * (T + 2) + 4) + cache
    block += max(T - 1, 0) * 8 * rows * V * P * S * (T + 2)
    kept = (8 * N * (3 * P + 2 * V + 8) if keep_states else 0) + \
        (8 * M * (T + 6) if keep_sequences else 0)
    return Cost(N, M, P, V, T, S, chunk, float(seconds), int(block + kept + 8 * S * T * T * P * 2))


def check_cost(cost, max_seconds=DEFAULT_MAX_SECONDS, max_bytes=DEFAULT_MAX_BYTES):
    """Raise :class:`EnumerationTooLarge` naming the numbers if ``cost`` is past a limit."""
    problems = []
    if cost.seconds > max_seconds:
        problems.append(f"estimated time {cost.seconds:,.0f} s exceeds the limit {max_seconds:,.0f} s")
    if cost.bytes > max_bytes:
        problems.append(f"estimated memory {cost.bytes / 2**30:,.2f} GiB exceeds the limit "
                        f"{max_bytes / 2**30:,.2f} GiB")
    if problems:
        raise EnumerationTooLarge(
            "exact enumeration refused: " + "; ".join(problems) + f" ({cost.describe()}). "
            "Use Monte Carlo instead (fisher_ref.monte_carlo.estimate), shorten max_len, "
            "shrink the vocabulary, or raise max_seconds/max_bytes if you mean it.")


def state_windows(tokens, lengths, context, bos):
    """Windows of the last ``context`` tokens of each state, BOS-padded: ``(B, k)``.

    Args:
        tokens: ``(B, L)`` int, ``-1`` padded.
        lengths: ``(B,)`` number of real tokens in each row.
    """
    if tokens.shape[1] == 0:  # only empty states (empty prompts, nothing generated)
        return np.full((tokens.shape[0], context), bos, dtype=np.int64)
    idx = lengths[:, None] - context + np.arange(context)[None, :]  # (B, k)
    rows = np.arange(tokens.shape[0])[:, None]
    win = tokens[rows, np.clip(idx, 0, None)]
    return np.where(idx >= 0, win, bos).astype(np.int64)  # (B, k)
