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


def test_a_failed_self_check_raises_naming_the_row_or_warns_when_asked(monkeypatch):
    """With every tolerance below zero each row fails: the error (or, with
    ``self_check="warn"``, the warning) names the worst one; ``"off"`` is silent."""
    monkeypatch.setitem(self_check.SELF_CHECK_TOL, "float64", -1.0)
    module = modules(cast=False)[0]
    with pytest.raises(SelfCheckError, match=r"exact identity .* is off by .* float64"):
        run(module)
    with pytest.warns(SelfCheckWarning, match=r"exact identity .* is off by .* float64"):
        out = run(module, self_check="warn")
    assert not any(r["passed"] for r in out["checks"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = run(module, self_check="off")
    assert not any(r["passed"] for r in out["checks"])
    with pytest.raises(SelfCheckError, match="exact identity"):
        run(module, strict=True, self_check="warn")


def test_without_the_audit_the_self_check_catches_a_stock_llama(monkeypatch):
    """The self-check is what would have caught the float32 casts: with the audit
    switched off, the stock Llama's gradient-vs-autodiff row fails."""
    import contextlib

    import fisher_ref.torch.module as module_mod
    monkeypatch.setattr(module_mod, "run_dtype", lambda *a, **k: contextlib.nullcontext())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run(tiny("llama", "eager"), self_check="warn")
    assert not all(r["passed"] for r in out["checks"])
    assert any(issubclass(w.category, SelfCheckWarning) for w in caught)


class LateBatchDependent(torch.nn.Module):
    """Rows centred on the batch mean in batches of more than 3 rows only: the first
    batch's check of rows alone against rows in the batch (3 rows) does not see it."""

    def __init__(self, V=3):
        super().__init__()
        self.emb = torch.nn.Embedding(V + 1, 4)
        self.head = torch.nn.Linear(4, V)

    def forward(self, ids):  # (b, n) -> (b, V)
        z = self.head(self.emb(ids[:, -1]))
        return z - z.mean(0) if z.shape[0] > 3 else z


def test_a_batch_dependent_module_is_refused_by_default():
    """issue 46 item 2: a module whose output for a window depends on the rest of its batch
    gave a gradient 0.28 relative away from autodiff of its own E[R] with only a warning.
    Refused by default, naming the module and what differed; the opt-outs return it."""
    from fisher_ref.torch import exact_causal_lm
    torch.manual_seed(0)
    module = LateBatchDependent().double()
    kw = dict(vocab_size=3, eos=False, bos=3)
    args = (module, [[1], [2]], 3, lambda p, r: r.count(2))
    with pytest.raises(SelfCheckError, match=r"module LateBatchDependent .* gradient = autodiff "
                       r"is off by .*exact gradient .* and torch autograd .* differ") as err:
        exact_causal_lm(*args, **kw)
    assert "self_check='warn'" in str(err.value)
    with pytest.warns(SelfCheckWarning, match="LateBatchDependent"):
        out = exact_causal_lm(*args, self_check="warn", **kw)
    assert not all(r["passed"] for r in out["checks"])
    with pytest.raises(ValueError, match="self_check must be one of 'raise', 'warn', 'off'"):
        exact_causal_lm(*args, self_check=False, **kw)
