"""The run's dtype all the way through a module (fisher_ref.torch.precision); the
self-checks every result carries are tested in tests/torch/test_self_check.py."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")
pytest.importorskip("transformers", reason="the hf extra (transformers) is needed")

from fisher_ref.torch.exact import exact_causal_lm
from fisher_ref.torch import self_check  # noqa: E402
from fisher_ref.torch.precision import LowPrecisionError, run_dtype  # noqa: E402
from tests.torch.hf_families import V, tiny  # noqa: E402

pytestmark = pytest.mark.torch

RTOL = 1e-12


def reward(prompt, response):
    return float(list(response).count(2)) + 0.25 * len(response)


class CastingLM(torch.nn.Module):
    """Embedding, a hidden layer computed through a float32 cast in ``blocks.0.norm``
    (``cast=True``, as RMSNorm does) or not, a float32 constant, and a head."""

    def __init__(self, cast, logits32=False):
        super().__init__()
        self.cast, self.logits32 = cast, logits32
        self.emb = torch.nn.Embedding(V + 1, 3)
        self.blocks = torch.nn.ModuleList([torch.nn.ModuleDict({"norm": Norm(cast)})])
        self.head = torch.nn.Linear(3, V)

    def forward(self, ids):  # (b, n) -> (b, V)
        x = self.emb(ids).mean(1)  # (b, 3)
        x = self.blocks[0]["norm"](x)
        z = self.head(x)
        return z.float() if self.logits32 else z


class Norm(torch.nn.Module):
    def __init__(self, cast):
        super().__init__()
        self.cast = cast
        self.scale = torch.nn.Parameter(torch.tensor([1.1, 0.9, 1.3]))

    def forward(self, x):
        dtype = x.dtype
        if self.cast:
            x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.scale * x.to(dtype)


def modules(**kw):
    torch.manual_seed(4)
    plain = CastingLM(cast=False).double()
    other = CastingLM(**kw).double()
    other.load_state_dict(plain.state_dict())
    return plain, other


def run(module, **kw):
    return exact_causal_lm(module, [[1], [2, 3]], 3, reward, vocab_size=V, eos=True, bos=V,
                           baseline="mean", **kw)


def rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_an_unknown_float32_cast_is_run_in_float64():
    """A cast fisher_ref knows nothing about gives the float64 results of the same module
    without it, and is listed with its module path."""
    plain, casting = modules(cast=True)
    want, got = run(plain), run(casting)
    for q in ("sequence_fisher", "gradient", "cross_terms"):
        assert rel(got["streams"]["policy"][q], want["streams"]["policy"][q]) <= RTOL, q
    assert "blocks.0.norm: aten._to_copy to float32" in got["upcasts"]
    assert not want["upcasts"]


def test_strict_refuses_the_cast_naming_module_and_op():
    _, casting = modules(cast=True)
    with pytest.raises(LowPrecisionError, match=r"blocks\.0\.norm: aten\._to_copy to float32"):
        run(casting, strict=True)


def test_float32_logits_in_a_float64_run_are_upcast_or_refused():
    plain, narrow = modules(cast=False, logits32=True)
    want, got = run(plain), run(narrow)
    assert rel(got["streams"]["policy"]["sequence_fisher"],
               want["streams"]["policy"]["sequence_fisher"]) <= RTOL
    assert any("aten._to_copy to float32" in k for k in got["upcasts"])
    with pytest.raises(LowPrecisionError, match="to float32"):
        run(narrow, strict=True)


def test_stock_llama_strict_names_its_first_cast_and_default_lists_them():
    model = tiny("llama", "eager")
    with pytest.raises(LowPrecisionError, match=r"model\.rotary_emb: aten\._to_copy to float32"):
        run(model, strict=True)
    out = run(model)
    assert "model.layers.0.input_layernorm: aten._to_copy to float32" in out["upcasts"]
    assert "model.layers.0.self_attn: aten._to_copy to float32" in out["upcasts"]  # softmax


def test_run_dtype_restores_torch_state():
    lin = torch.nn.Linear(2, 2).double()
    before = torch.get_default_dtype()
    with pytest.raises(LowPrecisionError):
        with run_dtype(lin, torch.float64, strict=True):
            lin(torch.ones(1, 2, dtype=torch.float64)).float()
    assert torch.get_default_dtype() == before
    assert not lin._forward_pre_hooks and not lin._forward_hooks


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_low_precision_run_says_its_dtype_and_is_judged_by_it(dtype):
    """A float32 head in a bfloat16 run (the cast module computes its norm in float32) is
    fine: only precision below the run's is refused."""
    out = run(modules(cast=True)[1], dtype=dtype)
    assert out["dtype"] == dtype
    assert all(r["tolerance"] == self_check.SELF_CHECK_TOL[dtype] for r in out["checks"])
    assert all(r["passed"] for r in out["checks"]), out["checks"]


def test_a_float32_constant_is_read_in_float64_and_listed():
    """A float32 tensor kept as a plain attribute (not a buffer, so .to() misses it)."""
    class Scaled(CastingLM):
        def __init__(self):
            super().__init__(cast=False)
            self.factor = torch.tensor([0.5, 2.0, 1.0, 1.5])  # float32

        def forward(self, ids):
            return super().forward(ids) * self.factor

    torch.manual_seed(4)
    out = run(Scaled().double())
    assert any("reads a float32 tensor (4,)" in k for k in out["upcasts"]), out["upcasts"]
    assert all(r["passed"] for r in out["checks"])


def test_an_op_that_stays_below_the_run_dtype_is_refused_naming_it():
    """Reinterpreting float64 bits as float32 cannot be made exact: always refused."""
    class Bits(CastingLM):
        def forward(self, ids):
            z = super().forward(ids)  # (b, V) float64
            return z + z.view(torch.float32)[:, ::2].to(z.dtype) * 0

    torch.manual_seed(4)
    with pytest.raises(LowPrecisionError, match=r"aten\.view\.dtype returns float32"):
        run(Bits(cast=False).double())


def test_complex64_rotary_angles_run_in_complex128():
    """Rotary embeddings by torch.polar on float32 angles (older Llama code): the angles and
    their complex exponentials come out in float64 / complex128."""
    class Rotary(CastingLM):
        def forward(self, ids):
            x = self.emb(ids)  # (b, n, 3)
            pos = torch.arange(ids.shape[1], dtype=torch.float32)[:, None] * 0.7  # (n, 1)
            rot = torch.polar(torch.ones_like(pos), pos)  # (n, 1) complex64
            y = (x.to(torch.complex64) * rot).real.to(x.dtype)  # (b, n, 3)
            return self.head(y.mean(1))

    class Rotary64(CastingLM):
        def forward(self, ids):
            x = self.emb(ids)
            pos = torch.arange(ids.shape[1], dtype=torch.float64)[:, None] * 0.7
            rot = torch.polar(torch.ones_like(pos), pos)
            return self.head((x.to(torch.complex128) * rot).real.mean(1))

    torch.manual_seed(4)
    a = Rotary(cast=False).double()
    b = Rotary64(cast=False).double()
    b.load_state_dict(a.state_dict())
    got, want = run(a), run(b)
    assert rel(got["streams"]["policy"]["sequence_fisher"],
               want["streams"]["policy"]["sequence_fisher"]) <= RTOL
    assert any("to complex64" in k for k in got["upcasts"]), got["upcasts"]
