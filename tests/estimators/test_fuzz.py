"""Fuzzing the estimators surface: random tiny tasks, random presets with random
arguments, random group sizes and groups per batch.

A preset built from valid arguments gives the mean and variance of the independent brute
force (tests/estimators/brute.py) at 1e-10; an argument outside its documented range is
refused when the loss is built, by a ``ValueError`` or ``TypeError`` naming it, never
by a torch error at evaluation or a wrong number. Derandomized
(``derandomize=True, database=None, deadline=None``), so a failure reproduces.
"""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cases
from fisher_ref.estimators import expected_loss_gradient
from fisher_ref.estimators import presets as P

from .brute import brute_force_batches, tiny_task

SETTINGS = dict(derandomize=True, database=None, deadline=None, max_examples=12,
                suppress_health_check=[HealthCheck.too_slow])
SAMPLERS = [None, {"kind": "perturbed", "scale": 0.4, "seed": 3},
            {"kind": "temperature", "temperature": 0.7}]
REF = {"kind": "perturbed", "scale": 0.3, "seed": 5}

positive = st.floats(0.05, 5.0)
baseline = st.floats(-2.0, 2.0)


@st.composite
def valid_presets(draw):
    """``(name, loss, smallest group)`` built from valid arguments."""
    kind = draw(st.sampled_from(["reinforce", "tis", "mis", "gspo", "cispo", "kl",
                                 "kl_in_reward", "centered", "grpo"]))
    if kind == "reinforce":
        return kind, P.reinforce(draw(baseline)), 1
    if kind == "tis":
        f = draw(st.sampled_from([P.sequence_tis, P.token_tis]))
        return kind, f(cap=draw(positive), baseline=draw(baseline)), 1
    if kind == "mis":
        lo = draw(st.floats(0.0, 1.0))
        f = draw(st.sampled_from([P.sequence_mis, P.token_mis]))
        return kind, f(band=(lo, lo + draw(positive))), 1
    if kind == "gspo":
        return kind, P.gspo(draw(positive) / 10, draw(positive) / 10), 2
    if kind == "cispo":
        return kind, P.cispo(draw(positive) / 10), 2
    if kind == "kl":
        return kind, P.kl_loss(draw(st.sampled_from(["k1", "k2", "k3"])), draw(positive)), 1
    if kind == "kl_in_reward":
        return kind, P.kl_in_reward(draw(positive)), 1
    if kind == "centered":
        return kind, P.centered(draw(baseline)), 1
    return kind, P.grpo(draw(st.sampled_from(P.AGGREGATIONS))), 2


@given(preset=valid_presets(), sampler=st.sampled_from(range(len(SAMPLERS))),
       seed=st.integers(0, 5), eos=st.booleans(), extra=st.integers(0, 1),
       two_groups=st.booleans())
@settings(**SETTINGS)
def test_valid_presets_equal_the_brute_force(preset, sampler, seed, eos, extra, two_groups):
    name, loss, G = preset
    G += extra
    K = 2 if two_groups and G == 1 else 1  # two groups of one response: 49 batches a prompt
    task = tiny_task(SAMPLERS[sampler], REF, eos=eos, seed=seed, one_prompt=G * K > 2)
    lg = expected_loss_gradient(task, loss, G, groups_per_batch=K)
    mean, var, _ = brute_force_batches(task, loss, G, K)
    # on the scale of one group's gradient (k1 on policy has E = 0: rounding alone)
    scale = max(np.abs(mean).max(), np.sqrt(var.max()), 1e-300)
    assert np.abs(lg.mean - mean).max() <= cases.RTOL * scale, (name, seed)
    assert np.abs(lg.variance - var).max() <= cases.RTOL * max(np.abs(var).max(), 1e-300), name


BAD_REALS = st.one_of(st.floats(-5.0, 0.0), st.just(math.nan), st.just(math.inf),
                      st.sampled_from(["0.1", None, True, [1.0]]))


@st.composite
def invalid_presets(draw):
    """``(builder, the argument's name)`` with one argument out of its range."""
    bad = draw(BAD_REALS)
    which = draw(st.sampled_from(["cap", "band", "beta", "baseline", "eps_low",
                                  "eps_high"]))
    if which == "cap":
        return (lambda: draw(st.sampled_from([P.sequence_tis, P.token_tis]))(cap=bad)), "cap"
    if which == "band":
        band = draw(st.one_of(st.tuples(st.floats(0.1, 5), st.floats(0.1, 5)).filter(
            lambda b: b[0] >= b[1]), st.tuples(st.just(bad), st.just(1.0)),
            st.sampled_from([(1.0,), "ab", 3.0])))
        return (lambda: P.token_mis(band=band)), "band"
    if which == "beta":
        f = draw(st.sampled_from([P.kl_in_reward, P.rho_k3, lambda b: P.kl_loss("k2", b)]))
        return (lambda: f(bad)), "beta"
    if which == "baseline":  # any finite number is a baseline
        bad = draw(st.sampled_from([math.nan, -math.inf, math.inf, "mean", None, "0", True]))
        f = draw(st.sampled_from([P.reinforce, P.centered, P.sequence_is]))
        return (lambda: f(baseline=bad)), "baseline"
    if which == "eps_low":
        return (lambda: P.gspo(eps_low=bad)), "eps_low"
    return (lambda: draw(st.sampled_from([P.gspo, P.cispo]))(eps_high=bad)), "eps_high"


@given(case=invalid_presets())
@settings(derandomize=True, database=None, deadline=None, max_examples=60)
def test_invalid_preset_arguments_are_refused_by_name(case):
    build, name = case
    with pytest.raises((ValueError, TypeError), match=name):
        build()
