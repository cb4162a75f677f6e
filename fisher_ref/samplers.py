r"""Samplers :math:`\mu` for off-policy sampling.

A sampler gives the full next-token distribution :math:`\mu(\cdot|s)` at every
state, as logits (no derivative is taken through it)::

    sampler.logits(model, theta, windows) -> (B, V)

Shipped kinds: a temperature, a perturbed copy of the parameters, and logits
rounded to a number of decimals (an inference engine of low precision).
"""
from __future__ import annotations

import math

import numpy as np

from fisher_ref.limits import (MAX_ABS_THETA, MAX_DECIMALS, MAX_TEMPERATURE, MIN_TEMPERATURE,
                               check_seed, is_real, readable)

__all__ = ["Sampler", "TemperatureSampler", "PerturbedSampler", "RoundedSampler",
           "LogitsSampler", "make_sampler"]


def _number(value, name, positive, low=0.0, high=math.inf, why=""):
    """``value`` as a float if it is a finite number (> 0 with ``positive``, else >= 0)
    within ``low .. high`` (``why`` says what the range keeps finite)."""
    try:
        ok = is_real(value) and math.isfinite(value) and value >= 0 and not (
            positive and value == 0)
    except OverflowError:  # an int too large for a float
        ok = False
    if not ok:
        kind = "positive" if positive else "non-negative"
        shown = readable(value) if isinstance(value, int) and not isinstance(value, bool) \
            else repr(value)
        raise ValueError(f"{name} must be a {kind} finite number, got {shown}")
    if not low <= float(value) <= high:
        raise ValueError(f"{name} is {readable(float(value))}, outside {low:g} .. {high:g}"
                         + (f" ({why})" if why else ""))
    return float(value)


class Sampler:
    """Base class for a fixed next-token distribution ``mu`` given as logits."""

    kind = "sampler"

    def logits(self, model, theta, windows):  # pragma: no cover - abstract
        raise NotImplementedError

    def params(self, model, theta):
        """The parameters the sampler runs with (``theta`` unless it changes them)."""
        return np.asarray(theta, dtype=float)

    def to_json(self):
        return {"kind": self.kind}

    def __repr__(self):
        return f"{type(self).__name__}({self.to_json()})"


class TemperatureSampler(Sampler):
    r""":math:`\mu = \mathrm{softmax}(z / \tau)`."""

    kind = "temperature"

    def __init__(self, temperature):
        self.temperature = _number(temperature, "sampler temperature", positive=True,
                                   low=MIN_TEMPERATURE, high=MAX_TEMPERATURE,
                                   why="logits divided by it must stay finite")

    def logits(self, model, theta, windows):
        return np.asarray(model.logits(theta, windows)) / self.temperature

    def to_json(self):
        return {"kind": self.kind, "temperature": self.temperature}


class PerturbedSampler(Sampler):
    r"""A stale copy: :math:`\theta_\mu = \theta + \sigma\,\varepsilon`,
    :math:`\varepsilon \sim N(0, I)` from ``default_rng(seed)``."""

    kind = "perturbed"

    def __init__(self, scale, seed=0):
        self.scale = _number(scale, "sampler scale", positive=False, high=MAX_ABS_THETA,
                             why="the limit on parameters: larger ones overflow the logits")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"sampler seed must be a non-negative integer, got {seed!r}")
        self.seed = check_seed(seed, "sampler seed")

    def params(self, model, theta):
        rng = np.random.default_rng(self.seed)
        return np.asarray(theta, dtype=float) + self.scale * rng.standard_normal(len(theta))

    def logits(self, model, theta, windows):
        return np.asarray(model.logits(self.params(model, theta), windows))

    def to_json(self):
        return {"kind": self.kind, "scale": self.scale, "seed": self.seed}


class RoundedSampler(Sampler):
    """The policy's logits rounded to ``decimals`` decimals (a coarse inference engine)."""

    kind = "rounded"

    def __init__(self, decimals):
        if isinstance(decimals, bool) or not isinstance(decimals, (int, np.integer)):
            raise ValueError(f"sampler decimals must be an integer, got {decimals!r}")
        if abs(decimals) > MAX_DECIMALS:
            raise ValueError(f"sampler decimals is {readable(decimals)}, outside "
                             f"-{MAX_DECIMALS} .. {MAX_DECIMALS} (logits times 10^decimals "
                             "must stay finite)")
        self.decimals = int(decimals)

    def logits(self, model, theta, windows):
        return np.round(np.asarray(model.logits(theta, windows)), self.decimals)

    def to_json(self):
        return {"kind": self.kind, "decimals": self.decimals}


class LogitsSampler(Sampler):
    """A user sampler: ``fn(windows) -> (B, V)`` logits (``-inf`` allowed)."""

    kind = "custom"

    def __init__(self, fn):
        if not callable(fn):
            raise TypeError("LogitsSampler needs a callable fn(windows) -> logits")
        self.fn = fn

    def logits(self, model, theta, windows):
        return np.asarray(self.fn(windows), dtype=float)


def make_sampler(spec):
    """Build a sampler from a task-file dict (``kind`` plus its arguments), or pass one through."""
    if spec is None or isinstance(spec, Sampler):
        return spec
    if not isinstance(spec, dict) or "kind" not in spec:
        raise ValueError(f"sampler must be a dict with a 'kind', got {spec!r}")
    spec = dict(spec)
    kind = spec.pop("kind")
    kinds = {"temperature": TemperatureSampler, "perturbed": PerturbedSampler,
             "rounded": RoundedSampler}
    if kind not in kinds:
        raise ValueError(f"unknown sampler kind {kind!r}; known: {sorted(kinds)}")
    try:
        return kinds[kind](**spec)
    except TypeError as exc:
        raise ValueError(f"bad arguments for sampler {kind!r}: {exc}") from None
