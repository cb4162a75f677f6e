"""Samplers mu: logits of each kind, parameters, bad specs, and the support error."""
import numpy as np
import pytest

from fisher_ref import LogitsSampler, exact, load_config
from fisher_ref.models.base import windows_for
from fisher_ref.samplers import (PerturbedSampler, RoundedSampler, TemperatureSampler,
                                 make_sampler)


def _mw():
    t = load_config("default")
    return t, windows_for([(1, 2), (3,), ()], 2, 5)


def test_temperature_divides_logits():
    t, W = _mw()
    z = t.model.logits(t.theta, W)
    assert np.array_equal(TemperatureSampler(2.0).logits(t.model, t.theta, W), z / 2.0)


def test_perturbed_is_a_seeded_stale_copy():
    t, W = _mw()
    s = PerturbedSampler(0.3, seed=7)
    th = t.theta + 0.3 * np.random.default_rng(7).standard_normal(len(t.theta))
    assert np.array_equal(s.params(t.model, t.theta), th)
    assert np.array_equal(s.logits(t.model, t.theta, W), t.model.logits(th, W))
    assert np.array_equal(PerturbedSampler(0.0).params(t.model, t.theta), t.theta)


def test_rounded_rounds_logits():
    t, W = _mw()
    assert np.array_equal(RoundedSampler(1).logits(t.model, t.theta, W),
                          np.round(t.model.logits(t.theta, W), 1))


def test_make_sampler_round_trip():
    for spec in ({"kind": "temperature", "temperature": 1.5},
                 {"kind": "perturbed", "scale": 0.3, "seed": 7},
                 {"kind": "rounded", "decimals": 2}):
        assert make_sampler(spec).to_json() == spec
    assert make_sampler(None) is None


@pytest.mark.parametrize("spec, words", [
    ({"kind": "beam"}, "unknown sampler kind 'beam'"),
    ({"kind": "temperature", "temperature": -1}, "positive finite number"),
    ({"kind": "temperature", "temperature": float("inf")}, "positive finite number"),
    ({"kind": "perturbed", "scale": -0.1}, "non-negative finite"),
    ({"kind": "rounded", "decimals": 1.5}, "decimals must be an integer"),
    ({"kind": "rounded"}, "bad arguments for sampler 'rounded'"),
    ({"temperature": 2}, "must be a dict with a 'kind'"),
])
def test_bad_sampler_specs(spec, words):
    with pytest.raises(ValueError, match=words):
        make_sampler(spec)


def test_logits_sampler_needs_a_callable():
    with pytest.raises(TypeError, match="callable"):
        LogitsSampler(3)


def test_sampler_missing_support_is_refused():
    """mu gives probability 0 to token 2, which the policy can emit."""
    task = load_config("default")

    def fn(w):
        z = np.zeros((w.shape[0], 5))
        z[:, 2] = -np.inf
        return z

    with pytest.raises(ValueError, match="sampler gives probability 0 to token 2 at state "
                                         "\\[1, 2\\].*importance weights p/mu are undefined"):
        exact(task.with_(sampler=LogitsSampler(fn)), progress=False)


@pytest.mark.parametrize("fn, words", [
    (lambda w: np.full((w.shape[0], 5), np.nan), "NaN, \\+inf or all -inf"),
    (lambda w: np.full((w.shape[0], 5), -np.inf), "NaN, \\+inf or all -inf"),
    (lambda w: np.zeros((w.shape[0], 4)), "sampler returned logits of shape"),
], ids=["nan", "all-neg-inf", "wrong-shape"])
def test_bad_sampler_logits_are_refused(fn, words):
    task = load_config("default").with_(sampler=LogitsSampler(fn))
    with pytest.raises(ValueError, match=words):
        exact(task, progress=False)
