"""fisher_ref.golden.check (public as fisher_ref.testing): passes a right implementation,
fails a wrong one with a per-key message and judges vanishing quantities on their
documented scales; tests/test_testing.py holds the public face, its examples and its
lightness."""
import numpy as np
import pytest

from fisher_ref.golden.check import (RTOL, Comparison, compare_to_golden, file_scales,
                                     golden_cases, golden_names, golden_path)
from fisher_ref.golden.format import load_golden


def from_scores(g):
    """A right implementation of a few keys, from the file's per-response scores."""
    h, w, A = g["seq_score"], g["seq_prob"], g["seq_advantage"]
    return {"sequence_fisher": w @ h ** 2, "score_mean": w @ h, "gradient": w @ (A[:, None] * h),
            "cross_terms": g["cross_terms"].copy()}


@pytest.mark.parametrize("golden", golden_cases())
def test_a_right_implementation_passes(golden):
    result = compare_to_golden(from_scores(golden), golden)
    assert result, str(result)


@pytest.mark.parametrize("golden", golden_cases(offpolicy=False, max_params=200))
@pytest.mark.parametrize("wrong", ["scale", "sign", "shift_one", "transpose"])
def test_a_wrong_implementation_fails_with_a_message(golden, wrong):
    mine = from_scores(golden)
    F = mine["sequence_fisher"]
    mine["sequence_fisher"] = {"scale": 1.001 * F, "sign": F * np.where(np.arange(F.size) == F.argmax(),
                               -1.0, 1.0), "shift_one": np.roll(F, 1),
                               "transpose": F[::-1]}[wrong]
    result = compare_to_golden(mine, golden)
    assert not result.passed and result.failed == ["sequence_fisher"]
    (msg,) = result.messages()
    assert msg.startswith("sequence_fisher: relative error") and "fisher scale" in msg
    assert "worst entry" in msg and "golden" in msg
    assert "NO" in str(result) and "FAIL (1 of 4 keys)" in str(result)


def test_table_lists_every_key_with_error_and_scale():
    g = load_golden(golden_path("default"))
    text = str(compare_to_golden(from_scores(g), g))
    lines = text.splitlines()
    assert lines[0] == "golden 'default': PASS (4 keys)"
    assert lines[1].split() == ["key", "kind", "max", "abs", "err", "scale", "rel", "err", "ok"]
    assert [ln.split()[0] for ln in lines[2:]] == ["sequence_fisher", "score_mean", "gradient",
                                                   "cross_terms"]
    assert repr(compare_to_golden(from_scores(g), g)) == text


def test_score_mean_is_judged_on_the_score_scale_not_its_own():
    # E[h] is 0 exactly: rounding-level values must pass against sqrt(max F), and a
    # value that is small but far above rounding must fail.
    g = load_golden(golden_path("default"))
    S, _ = file_scales(g.arrays)
    noise = 1e-17 * np.random.default_rng(0).standard_normal(g["score_mean"].size)
    r = compare_to_golden({"score_mean": noise}, g)
    assert r.passed and r["score_mean"].scale == pytest.approx(S, rel=1e-12)
    assert not compare_to_golden({"score_mean": np.full(g["score_mean"].size, 1e-8 * S)}, g)


def test_all_zero_arrays():
    # A constant reward makes the gradient 0 exactly; a golden array that is 0 everywhere
    # passes yours when it is 0 or at rounding level on its scale (no 0/0), and fails
    # on a visible entry. A plain value has no floor: only an exact 0 passes.
    g = load_golden(golden_path("default"))
    g.arrays = dict(g.arrays, gradient=np.zeros(g["gradient"].size),
                    state_reach=np.zeros(g["state_reach"].size))
    P, N = g["gradient"].size, g["state_reach"].size
    for ok in (np.zeros(P), np.full(P, 1e-18)):
        r = compare_to_golden({"gradient": ok}, g)
        assert r.passed and np.isfinite(r["gradient"].rel), str(r)
    assert not compare_to_golden({"gradient": np.full(P, 1e-6)}, g)
    assert compare_to_golden({"state_reach": np.zeros(N)}, g)
    r = compare_to_golden({"state_reach": np.full(N, 1e-300)}, g)
    assert not r and r["state_reach"].rel == 1.0


def test_correlation_is_weighted_by_the_bound():
    # Where the bound is at rounding level, rho = |Cov|/B is noise/noise: any value is
    # right there. Elsewhere an error in rho fails.
    g = load_golden(golden_path("gpt2_small"))
    B, rho = g["bound"], g["correlation"].copy()
    tiny = np.flatnonzero(B < 1e-12 * B.max())
    assert tiny.size > 0  # GPT-2's attention key bias never moves a logit
    rho[tiny] = 0.5
    assert compare_to_golden({"correlation": rho}, g)
    rho[np.argmax(B)] += 1e-6
    assert not compare_to_golden({"correlation": rho}, g)


def test_integer_keys_must_be_equal():
    g = load_golden(golden_path("tabular"))
    toks = g["seq_tokens"].copy()
    assert compare_to_golden({"seq_tokens": toks}, g)
    toks[3, 1] += 1
    r = compare_to_golden({"seq_tokens": toks}, g)
    assert not r and "integer arrays differ at 1 entries, first at [3, 1]" in r.messages()[0]


def test_missing_shape_nan_and_unknown_keys():
    g = load_golden(golden_path("default"))
    mine = from_scores(g)
    r = compare_to_golden(mine, g, keys=["sequence_fisher", "bound"])
    assert r.failed == ["bound"] and "missing from your arrays" in r.messages()[0]
    r = compare_to_golden({"gradient": mine["gradient"][:-1]}, g)
    assert "shape (118,), golden has (119,)" in r.messages()[0]
    bad = mine["gradient"].copy()
    bad[5] = np.nan
    r = compare_to_golden({"gradient": bad}, g)
    assert not r and "non-finite" in r.messages()[0] and "[5]" in r.messages()[0]
    with pytest.raises(KeyError, match="not a golden-file key"):
        compare_to_golden({"sequence_fischer": mine["sequence_fisher"]}, g)
    with pytest.raises(KeyError, match="has no key 'offpolicy_gradient'"):
        compare_to_golden({"offpolicy_gradient": mine["gradient"]}, g)


def test_golden_by_name_path_or_object():
    g = load_golden(golden_path("tabular"))
    mine = from_scores(g)
    for ref in ("tabular", golden_path("tabular"), str(golden_path("tabular")), g):
        assert compare_to_golden(mine, ref).passed
    with pytest.raises(ValueError, match="no shipped golden file 'nope'"):
        compare_to_golden(mine, "nope")


def test_golden_cases_have_readable_ids_and_filters():
    ids = [p.id for p in golden_cases()]
    assert ids == golden_names() and len(ids) >= 14
    assert all(p.values[0].meta["offpolicy"] for p in golden_cases(offpolicy=True))
    assert {p.values[0].meta["model"]["arch"] for p in golden_cases(arch="gpt2")} == {"gpt2"}
    assert all(p.values[0].sizes["P"] <= 100 for p in golden_cases(max_params=100))


def test_rtol_is_the_exact_float64_tolerance():
    assert RTOL == 1e-10
    g = load_golden(golden_path("default"))
    F = g["sequence_fisher"]
    assert compare_to_golden({"sequence_fisher": F * (1 + 1e-11)}, g)
    assert not compare_to_golden({"sequence_fisher": F * (1 + 1e-9)}, g)
    assert compare_to_golden({"sequence_fisher": F * (1 + 1e-9)}, g, rtol=1e-8)


def test_comparison_result_api():
    g = load_golden(golden_path("tabular"))
    r = compare_to_golden({"score_mean": g["score_mean"]}, g)
    assert isinstance(r, Comparison) and r.passed and [x.key for x in r.results] == ["score_mean"]
    with pytest.raises(KeyError):
        r["sequence_fisher"]
    with pytest.raises(ValueError, match="an empty comparison is not a pass"):
        compare_to_golden({}, "tabular")


@pytest.mark.parametrize("value", [None, "2", b"2", object()], ids=["none", "str", "bytes", "object"])
def test_object_arrays_are_refused_naming_the_key(value):
    """issue 46 item 3: an object array (None or a string where state_depth is expected)
    raised numpy's untyped "unsupported operand type(s) for -"; now the documented
    TypeError names the key and the entry, for integer and float keys alike."""
    g = load_golden(golden_path("default"))
    for key in ("state_depth", "sequence_fisher"):
        mine = np.array(g[key], dtype=object)
        mine[1] = value
        with pytest.raises(TypeError, match=rf"^{key}: your array holds Python objects .* at \[1\]"):
            compare_to_golden({key: mine}, g)
    # numbers in an object array are numbers: compared as usual
    assert compare_to_golden({"state_depth": np.array(g["state_depth"], dtype=object)}, g)


@pytest.mark.parametrize("name", ["../golden_data/default", "../../../etc/passwd", "..",
                                  "sub/default", "sub\\default", "/abs/default", ".hidden",
                                  "", "default\0", 5, None])
def test_golden_path_refuses_names_that_are_paths(name):
    """issue 46 item 6: golden_path("../../...") returned a path outside the package's
    golden data; a name with a separator or ``..`` is refused by name."""
    with pytest.raises(ValueError, match="golden name must be a plain name"):
        golden_path(name)


def test_golden_path_stays_inside_the_golden_data(tmp_path, monkeypatch):
    """issue 46 item 6: a link in the golden data that points outside is refused too."""
    import fisher_ref.golden.check as check
    assert golden_path("default").parent == check.GOLDEN_DIR
    outside = tmp_path / "outside.npz"
    outside.write_bytes(golden_path("default").read_bytes())
    data = tmp_path / "data"
    data.mkdir()
    (data / "evil.npz").symlink_to(outside)
    monkeypatch.setattr(check, "GOLDEN_DIR", data)
    with pytest.raises(ValueError, match="resolves outside the shipped golden data"):
        check.golden_path("evil")
