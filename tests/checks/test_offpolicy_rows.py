"""The off-policy rows of verify (fisher_ref.checks.offpolicy_rows): the constant past
which the uncentered gradient breaks the centered bound, against a brute-force scan and
when already broken at 0, and the raw-bias row, informational where mu equals p."""
import json

import numpy as np
import pytest

from fisher_ref import exact, load_config, task_from_json
from fisher_ref.checks.identities import exact_checks
from fisher_ref.checks.offpolicy_rows import (bound_broken_at_zero, constant_breaking_bound,
                                              sampler_gap)
from fisher_ref.samplers import TemperatureSampler
from tests.checks.test_identities import PEAKED


def _scan_breaking_constant(raw, centered, c_max, n=200001):
    """Brute force: the smallest |c| on a grid of both signs at which some parameter's
    |E_mu[(A+c)h]| exceeds the bound, by evaluating every grid point."""
    c = np.linspace(0.0, c_max, n)  # (n,)
    for sign in (1.0, -1.0):
        g = raw.gradient[None, :] + sign * c[:, None] * raw.score_mean[None, :]  # (n, P)
        over = (np.abs(g) > centered.bound[None, :]).any(axis=1)  # (n,)
        yield c[np.argmax(over)] if over.any() else np.inf


@pytest.mark.parametrize("temperature", [0.9, 0.98, 1.02])
def test_constant_breaking_bound_matches_a_brute_force_scan(temperature):
    """On a sampler close to the policy (bound intact at c = 0) the closed form agrees
    with a grid scan over c of both signs to the grid step."""
    task = load_config("default").with_(sampler=TemperatureSampler(temperature))
    r = exact(task, progress=False)
    raw, cen = r.streams["raw"], r.streams["centered"]
    assert bound_broken_at_zero(raw, cen) == 0
    c = constant_breaking_bound(raw, cen)
    assert 0 < c < np.inf
    c_max = 4 * c
    step = c_max / 200000
    scanned = min(_scan_breaking_constant(raw, cen, c_max))
    assert abs(scanned - c) <= 2 * step, (scanned, c)


def test_constant_breaking_bound_is_zero_when_already_broken():
    """offpolicy_stale: parameters over the bound at c = 0 give c = 0 and a count that a
    direct comparison reproduces; the verify table says so."""
    r = exact(load_config("offpolicy_stale"), progress=False)
    raw, cen = r.streams["raw"], r.streams["centered"]
    n0 = sum(abs(g) > b for g, b in zip(raw.gradient.tolist(), cen.bound.tolist()))
    assert n0 > 0 and bound_broken_at_zero(raw, cen) == n0
    assert constant_breaking_bound(raw, cen) == 0.0
    rows = [row for row in exact_checks(r) if "already at c = 0" in row.check]
    assert len(rows) == 1 and rows[0].value == n0


@PEAKED
def test_raw_bias_row_is_info_only_where_mu_equals_p():
    r = exact(load_config("offpolicy_stale"), progress=False)
    row = next(x for x in exact_checks(r) if "must be > 0" in x.check)
    assert row.kind == "nonzero" and row.passed and sampler_gap(r) > 1e-3
    d = json.loads(json.dumps(load_config("offpolicy_stale").spec))
    d["model"]["init_scale"] = 1e3  # mu and p one-hot on the same tokens
    r = exact(task_from_json(d), progress=False)
    row = next(x for x in exact_checks(r) if "must be > 0" in x.check)
    assert row.kind == "info" and sampler_gap(r) <= 1e-8 and "no bias to show" in row.note
