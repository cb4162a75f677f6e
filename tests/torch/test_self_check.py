"""The self-checks every torch-engine result carries (fisher_ref.torch.self_check): the
cheap exact identities attached and passing in float64, a failed row warned (or raised
when strict) by name, and the row that catches a stock Llama run without the audit."""
import warnings

import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")
pytest.importorskip("transformers", reason="the hf extra (transformers) is needed")

from fisher_ref.torch import self_check  # noqa: E402
from fisher_ref.torch.self_check import SelfCheckError, SelfCheckWarning  # noqa: E402
from tests.torch.hf_families import tiny  # noqa: E402
from tests.torch.test_precision import modules, run  # noqa: E402

pytestmark = pytest.mark.torch


def test_self_checks_are_attached_and_pass_on_float64():
    out = run(modules(cast=True)[1])
    names = [r["identity"] for r in out["checks"]]
    assert names == ["F = sum pi f", "gradient = autodiff", "E[h] = 0"]
    assert all(r["passed"] and r["value"] <= 1e-12 for r in out["checks"]), out["checks"]


def test_a_failed_self_check_warns_naming_the_row_or_raises_when_strict(monkeypatch):
    """With every tolerance below zero each row fails: the warning names the worst one."""
    monkeypatch.setitem(self_check.SELF_CHECK_TOL, "float64", -1.0)
    module = modules(cast=False)[0]
    with pytest.warns(SelfCheckWarning, match=r"exact identity .* is off by .* float64"):
        out = run(module)
    assert not any(r["passed"] for r in out["checks"])
    with pytest.raises(SelfCheckError, match="exact identity"):
        run(module, strict=True)


def test_without_the_audit_the_self_check_catches_a_stock_llama(monkeypatch):
    """The self-check is what would have caught the float32 casts: with the audit
    switched off, the stock Llama's gradient-vs-autodiff row fails."""
    import contextlib

    import fisher_ref.torch.module as module_mod
    monkeypatch.setattr(module_mod, "run_dtype", lambda *a, **k: contextlib.nullcontext())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run(tiny("llama", "eager"))
    assert not all(r["passed"] for r in out["checks"])
    assert any(issubclass(w.category, SelfCheckWarning) for w in caught)
