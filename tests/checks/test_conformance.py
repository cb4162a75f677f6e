"""The conformance check passes correct token-Fisher implementations (numpy, torch in
float64/float32/bfloat16) and fails deliberately wrong ones in the right cases."""
import doctest

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the torch extra is needed (CI installs it)")

import fisher_ref.checks.conformance as conformance
from fisher_ref.checks.conformance import FLOOR, check_token_fisher, conformance_cases

ALL_CASES = [c["name"] for c in conformance_cases()]
TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def numpy_token_fisher(z, j):
    p = np.exp(z - z.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)  # (..., V)
    c = j - (j * p[..., None, :]).sum(-1, keepdims=True)  # (..., P, V)
    return (p[..., None, :] * c ** 2).sum(-1)  # (..., P)


def torch_token_fisher(logits, sensitivities):
    """The seeds' snippet, with probs broadcast over the parameter axis."""
    probs = logits.softmax(dim=-1).unsqueeze(-2)  # (..., 1, V)
    centered = sensitivities - (sensitivities * probs).sum(dim=-1, keepdim=True)
    return (probs * centered.square()).sum(dim=-1)  # (..., P)


def torch_uncentered(logits, sens):
    probs = logits.softmax(dim=-1).unsqueeze(-2)
    return (probs * sens.square()).sum(dim=-1)


def torch_uniform_centering(logits, sens):
    probs = logits.softmax(dim=-1).unsqueeze(-2)
    centered = sens - sens.mean(dim=-1, keepdim=True)
    return (probs * centered.square()).sum(dim=-1)


def torch_softmax_without_max(logits, sens):
    e = logits.exp()
    probs = (e / e.sum(dim=-1, keepdim=True)).unsqueeze(-2)
    centered = sens - (sens * probs).sum(dim=-1, keepdim=True)
    return (probs * centered.square()).sum(dim=-1)


def torch_pairwise_missing_half(logits, sens, chunk=256):
    """sum_{a,b} p_a p_b (j_a - j_b)^2 without the 1/2, over chunks of a (memory O(P V chunk))."""
    p = logits.softmax(dim=-1)
    out = 0.0
    for lo in range(0, p.shape[-1], chunk):
        diff2 = (sens[..., lo:lo + chunk, None] - sens[..., None, :]).square()  # (..., P, c, V)
        out = out + torch.einsum("...a,...b,...pab->...p", p[..., lo:lo + chunk], p, diff2)
    return out


def run_torch(fn, dtype):
    tdt = TORCH_DTYPES[dtype]
    return check_token_fisher(fn, convert=lambda x: torch.as_tensor(x).to(tdt),
                              to_numpy=lambda t: t.double().numpy(), dtype=dtype)


def test_correct_numpy_implementation_passes():
    report = check_token_fisher(numpy_token_fisher)
    print(report)
    assert report.passed, str(report)
    assert [r.name for r in report.results] == ALL_CASES


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_correct_torch_implementation_passes(dtype):
    report = run_torch(torch_token_fisher, dtype)
    print(report)
    assert report.passed, str(report)
    worst = max(r.max_rel for r in report.results)
    assert worst <= FLOOR[dtype]  # every case inside the floor, not only its own tolerance


def test_float32_numpy_implementation_passes_at_float32_tolerance_only():
    def f32(z, j):
        return numpy_token_fisher(z.astype(np.float32), j.astype(np.float32))
    assert check_token_fisher(f32, dtype="float32").passed
    assert not check_token_fisher(f32, dtype="float64").passed  # float32 is not float64-exact


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("fn,must_fail,may_pass", [
    (torch_uncentered, ALL_CASES, []),
    (torch_uniform_centering, ["random", "batch", "large_vocab", "uniform_shift"], []),
    (torch_softmax_without_max, ["peaked"], [c for c in ALL_CASES if c != "peaked"]),
    (torch_pairwise_missing_half, ALL_CASES, []),
], ids=["uncentered", "uniform_centering", "no_max_subtraction", "pairwise_missing_half"])
def test_wrong_implementations_fail_in_the_right_cases(fn, must_fail, may_pass, dtype):
    with np.errstate(all="ignore"):
        report = run_torch(fn, dtype)
    print(report)
    assert not report.passed
    assert set(must_fail) <= set(report.failed), str(report)
    if may_pass:  # a bug confined to one case fails that case only
        assert set(report.failed) == set(ALL_CASES) - set(may_pass), str(report)


def test_no_max_subtraction_is_reported_as_nan():
    report = run_torch(torch_softmax_without_max, "float64")
    assert "non-finite" in report["peaked"].problem


def test_report_is_readable():
    text = str(run_torch(torch_uncentered, "float32"))
    assert text.startswith("token Fisher conformance (float32): FAIL")
    for name in ALL_CASES:
        assert name in text


def test_exceptions_and_wrong_shapes_are_failures_not_crashes():
    def raises(z, j):
        raise RuntimeError("boom")
    report = check_token_fisher(raises)
    assert not report.passed and "RuntimeError: boom" in report["random"].problem
    report = check_token_fisher(lambda z, j: numpy_token_fisher(z, j)[..., :-1])
    assert all("returned shape" in r.problem for r in report.results)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="dtype must be one of"):
        check_token_fisher(numpy_token_fisher, dtype="float16")
    with pytest.raises(ValueError, match="needs a convert function"):
        check_token_fisher(numpy_token_fisher, dtype="bfloat16")


def test_fixed_rtol_and_subset_of_cases():
    cases = [c for c in conformance_cases() if c["name"] == "large_vocab"]
    assert cases[0]["logits"].shape == (5000,)
    report = check_token_fisher(numpy_token_fisher, rtol=1e-12, cases=cases)
    assert report.passed and report.results[0].tol == 1e-12


def test_uniform_shift_case_really_shifts():
    case = {c["name"]: c for c in conformance_cases()}["uniform_shift"]
    diff = case["sens"] - case["base_sens"]  # (B, P, V): constant along V, not zero
    np.testing.assert_allclose(diff, np.broadcast_to(diff[..., :1], diff.shape), rtol=1e-14)
    assert np.min(np.abs(diff)) > 0


def test_doctests():
    assert doctest.testmod(conformance).failed == 0


# ---------------------------------------------------------------- parametrize_with_cases


@conformance.parametrize_with_cases(numpy_token_fisher)
def test_parametrize_with_cases_passes_a_correct_implementation(check):
    """One item per case (``...[peaked]``), each passing for a correct implementation."""
    assert check().passed


def numpy_uncentered(z, j):
    p = np.exp(z - z.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)  # (..., V)
    return (p[..., None, :] * j ** 2).sum(-1)  # (..., P): the centering forgotten


def test_each_case_check_fails_alone_for_a_wrong_implementation():
    """The per-case checks of a wrong implementation fail one by one, each raising an
    AssertionError that names its case; the whole report agrees on which."""
    checks = conformance.case_checks(numpy_uncentered)
    assert [c.name for c in checks] == ALL_CASES and [repr(c) for c in checks] == ALL_CASES
    failed = []
    for check in checks:
        try:
            check()
        except AssertionError as exc:
            assert check.name in str(exc) and "FAIL" in str(exc)
            failed.append(check.name)
    assert failed and failed == check_token_fisher(numpy_uncentered).failed


def test_single_vs_batch_is_checked_with_the_batch_it_is_compared_with():
    """An implementation whose single-state call disagrees with its batched one fails
    ``single_vs_batch`` on its own item too."""
    def off_when_single(z, j):
        return numpy_token_fisher(z, j) * (1.001 if z.ndim == 1 else 1.0)
    check = {c.name: c for c in conformance.case_checks(off_when_single)}["single_vs_batch"]
    assert [c["name"] for c in check.cases] == ["single_vs_batch", "uniform_shift"]
    with pytest.raises(AssertionError, match="single_vs_batch"):
        check()


def test_a_users_pytest_reports_each_case_as_an_item(tmp_path):
    """In a user's test file, pytest lists one item per case, ids the case names: a correct
    function passes every item, a wrong one fails the cases it gets wrong."""
    import os
    import subprocess
    import sys
    test = tmp_path / "test_mine.py"
    test.write_text(
        "import numpy as np\n"
        "from fisher_ref.checks.conformance import parametrize_with_cases\n"
        "def good(z, j):\n"
        "    p = np.exp(z - z.max(-1, keepdims=True)); p = p / p.sum(-1, keepdims=True)\n"
        "    c = j - (j * p[..., None, :]).sum(-1, keepdims=True)\n"
        "    return (p[..., None, :] * c ** 2).sum(-1)\n"
        "def bad(z, j):\n"
        "    return 2 * good(z, j)\n"
        "@parametrize_with_cases(good)\n"
        "def test_good(check):\n"
        "    check()\n"
        "@parametrize_with_cases(bad)\n"
        "def test_bad(check):\n"
        "    check()\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                          "-p", "no:xdist", str(test)], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=120).stdout
    for name in ALL_CASES:
        assert f"test_good[{name}] PASSED" in out, out
        assert f"test_bad[{name}] FAILED" in out, out
    assert f"{len(ALL_CASES)} failed, {len(ALL_CASES)} passed" in out, out
