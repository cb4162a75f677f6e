"""Rewards ``R(prompt, response)`` of a whole response.

``response`` is the tuple of generated tokens, the EOS included when the
response ended with it. Built-in rewards are named and serialisable; any Python
callable of ``(prompt, response)`` returning a finite float may be used too.

:meth:`Reward.batch` evaluates a reward on a whole block of responses at once:
the built-ins vectorise over the ``(M, T)`` token array, any other reward falls
back to one call per response (:func:`evaluate_reward`). Both give the same
numbers (tests/test_rewards.py holds them equal on random responses).
"""
from __future__ import annotations

import math

import numpy as np

from fisher_ref.limits import MAX_ABS_VALUE

__all__ = ["Reward", "CountReward", "MatchReward", "LengthReward", "FunctionReward",
           "make_reward", "evaluate_reward"]


class Reward:
    """Base class: ``__call__(prompt, response) -> float`` and ``to_json()``."""

    name = "reward"

    def __call__(self, prompt, response):  # pragma: no cover - abstract
        raise NotImplementedError

    def batch(self, tokens, lengths, prompts, prompt_ids):
        """Rewards of ``M`` responses at once: ``(M,)`` float.

        Args:
            tokens: ``(M, T)`` int, response ``m`` in ``tokens[m, :lengths[m]]`` (its
                final EOS included), ``-1`` after it.
            lengths: ``(M,)`` number of generated tokens of each response (``>= 1``).
            prompts: the task's prompts (token tuples).
            prompt_ids: ``(M,)`` index into ``prompts`` of each response's prompt.

        This default calls the reward once per response (:func:`evaluate_reward`);
        the built-in rewards override it with a vectorised form.
        """
        rows = tokens.tolist()
        return np.array([evaluate_reward(self, prompts[i], row[:n])
                         for i, row, n in zip(prompt_ids.tolist(), rows, lengths.tolist())],
                        dtype=float)  # (M,)

    def to_json(self):
        return {"name": self.name}

    def check_vocabulary(self, vocab_size, eos):
        """Raise ``ValueError`` if the reward names a token a response can never hold."""

    def check_length(self, max_len, eos):
        """Raise ``ValueError`` if the reward asks for a response length no response has."""

    def _check_ids(self, ids, vocab_size):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"reward {self.to_json()} names token id {bad[0]}, out of range "
                             f"0..{vocab_size - 1} (V={vocab_size}): it can never be generated")

    def __repr__(self):
        return f"{type(self).__name__}({self.to_json()})"


def _strip_eos(response, eos):
    return tuple(response[:-1]) if eos and response and response[-1] == 0 else tuple(response)


def _stripped_lengths(tokens, lengths, eos):
    """``(M,)`` lengths with a final EOS removed (:func:`_strip_eos` of each row)."""
    if not eos:
        return lengths
    last = tokens[np.arange(len(lengths)), np.maximum(lengths - 1, 0)]  # (M,)
    return lengths - ((lengths > 0) & (last == 0))


class CountReward(Reward):
    """Number of times ``token`` appears among the generated tokens.

    Example:
        >>> CountReward(2)((1,), (2, 3, 2, 0))
        2.0
    """

    name = "count"

    def __init__(self, token):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"reward 'count' needs a non-negative integer token, got {token!r}")
        self.token = token

    def __call__(self, prompt, response):
        return float(sum(1 for t in response if t == self.token))

    def batch(self, tokens, lengths, prompts, prompt_ids):
        live = np.arange(tokens.shape[1])[None, :] < lengths[:, None]  # (M, T)
        # a product with ones, not a sum over the short last axis (several times faster)
        return ((tokens == self.token) & live).astype(float) @ np.ones(tokens.shape[1])  # (M,)

    def check_vocabulary(self, vocab_size, eos):
        self._check_ids([self.token], vocab_size)

    def to_json(self):
        return {"name": self.name, "token": self.token}


class MatchReward(Reward):
    """1 if the response (its final EOS removed) equals ``target`` exactly, else 0."""

    name = "match"

    def __init__(self, target, eos=True):
        if not isinstance(target, (list, tuple)) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in target):
            raise ValueError(f"reward 'match' needs a list of integer tokens, got {target!r}")
        self.target = tuple(target)
        self.eos = eos

    def __call__(self, prompt, response):
        return float(_strip_eos(response, self.eos) == self.target)

    def batch(self, tokens, lengths, prompts, prompt_ids):
        n, k = _stripped_lengths(tokens, lengths, self.eos), len(self.target)  # (M,), int
        if k > tokens.shape[1]:
            return np.zeros(len(lengths))
        same = (tokens[:, :k] == np.array(self.target, dtype=tokens.dtype)).all(axis=1)  # (M,)
        return ((n == k) & same).astype(float)

    def check_vocabulary(self, vocab_size, eos):
        self._check_ids(self.target, vocab_size)
        if eos and 0 in self.target:
            raise ValueError(f"reward {self.to_json()}: the target holds the EOS id 0, but a "
                             "response ends at EOS and the match ignores that final EOS, so "
                             "this target can never match")

    def check_length(self, max_len, eos):
        """Refuse a target no response of at most ``max_len`` tokens can equal.

        Without EOS every response has exactly ``max_len`` tokens, so the target must
        too. With EOS a response ends at EOS (``len - 1`` tokens once it is removed,
        so at most ``max_len - 1``) or runs to ``max_len`` tokens without one, so any
        target of at most ``max_len`` tokens can match (the empty one: EOS first).
        """
        n = len(self.target)
        if eos and n > max_len:
            raise ValueError(f"reward {self.to_json()}: the target has {n} tokens but a "
                             f"response has at most max_len={max_len}, so it can never match")
        if not eos and n != max_len:
            raise ValueError(f"reward {self.to_json()}: the target has {n} tokens but without "
                             f"EOS every response has exactly max_len={max_len}, so it can "
                             "never match")

    def to_json(self):
        return {"name": self.name, "target": list(self.target)}


class LengthReward(Reward):
    """Number of generated tokens, the final EOS not counted."""

    name = "length"

    def __init__(self, eos=True):
        self.eos = eos

    def __call__(self, prompt, response):
        return float(len(_strip_eos(response, self.eos)))

    def batch(self, tokens, lengths, prompts, prompt_ids):
        return _stripped_lengths(tokens, lengths, self.eos).astype(float)  # (M,)


class FunctionReward(Reward):
    """Wrap a user callable ``fn(prompt, response) -> float``."""

    name = "custom"

    def __init__(self, fn):
        if not callable(fn):
            raise TypeError(f"a custom reward must be callable, got {type(fn).__name__}")
        self.fn = fn

    def __call__(self, prompt, response):
        return self.fn(prompt, response)

    def to_json(self):
        return {"name": self.name, "function": getattr(self.fn, "__name__", repr(self.fn))}


def make_reward(spec, eos=True):
    """Build a reward from a task-file dict, a Reward, or a callable."""
    if isinstance(spec, Reward):
        return spec
    if callable(spec):
        return FunctionReward(spec)
    if not isinstance(spec, dict) or "name" not in spec:
        raise ValueError(f"reward must be a dict with a 'name', got {spec!r}")
    spec = dict(spec)
    name = spec.pop("name")
    try:
        if name == "count":
            return CountReward(**spec)
        if name == "match":
            return MatchReward(eos=eos, **spec)
        if name == "length":
            return LengthReward(eos=eos, **spec)
    except TypeError as exc:
        raise ValueError(f"bad arguments for reward {name!r}: {exc}") from None
    raise ValueError(f"unknown reward {name!r}; known: 'count', 'match', 'length'")


def evaluate_reward(reward, prompt, response):
    """``float(reward(prompt, response))``, raising ``ValueError`` unless it is a finite
    number at most ``MAX_ABS_VALUE`` (1e100) in size."""
    value = reward(tuple(prompt), tuple(response))
    try:
        if isinstance(value, (str, bytes)):  # float("1.5") would pass silently
            raise TypeError
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(
            f"reward returned {value!r} (not a number) for prompt {list(prompt)} "
            f"and response {list(response)}") from None
    if not math.isfinite(value):
        raise ValueError(
            f"reward returned a non-finite value {value} for prompt {list(prompt)} "
            f"and response {list(response)}")
    if abs(value) > MAX_ABS_VALUE:
        raise ValueError(
            f"reward returned {value:.3g} for prompt {list(prompt)} and response "
            f"{list(response)}: rewards must be at most {MAX_ABS_VALUE:.0e} in size "
            "(A^2 h^2 would overflow float64)")
    return value
