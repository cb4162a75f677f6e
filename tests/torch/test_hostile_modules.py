"""Hostile torch modules: each ends in a ValueError (or LowPrecisionError) that names the
problem and what to do, never a raw torch error and never a silently wrong number."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")
pytest.importorskip("transformers", reason="the hf extra (transformers) is needed")

from fisher_ref.torch import causal_lm_task, exact_causal_lm, from_module  # noqa: E402
from tests.torch.hf_families import V, tiny  # noqa: E402

pytestmark = pytest.mark.torch


def reward(prompt, response):
    return float(list(response).count(2))


class Base(torch.nn.Module):
    """Embedding -> mean over positions -> head: (b, n) -> (b, V)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(V + 1, 3)
        self.head = torch.nn.Linear(3, V)

    def features(self, ids):
        return self.emb(ids).mean(1)  # (b, 3)

    def forward(self, ids):
        return self.head(self.features(ids))


def run(module, **kw):
    kw = {"vocab_size": V, "eos": True, "bos": V, **kw}
    return exact_causal_lm(module, [[1], [2, 3]], 2, reward, **kw)


class LengthSecond(Base):
    def forward(self, ids):  # (b, V, n): the length axis last
        return self.head(self.emb(ids)).transpose(1, 2)


class BatchDependent(Base):
    def forward(self, ids):  # rows centred on the batch mean
        x = self.features(ids)
        return self.head(x - x.mean(0, keepdim=True))


class Counter(Base):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, ids):  # a stateful forward: each call shifts the logits
        self.calls += 1
        return self.head(self.features(ids)) * (1 + 0.01 * self.calls)


class Noisy(Base):
    def forward(self, ids):  # a random op in eval mode
        return self.head(self.features(ids)) + 1e-3 * torch.randn(ids.shape[0], V,
                                                                   dtype=torch.float64)


class Huge(Base):
    def forward(self, ids):  # finite logits whose squared scores overflow
        return 1e200 * self.head(self.features(ids))


class IntLogits(Base):
    def forward(self, ids):
        return (self.head(self.features(ids)) * 10).long()


class Branchy(Base):
    def forward(self, ids):  # data-dependent control flow: no vmap
        x = self.features(ids)
        return self.head(x) if float(x.sum()) > 0 else -self.head(x)


class NoParams(torch.nn.Module):
    def forward(self, ids):
        return torch.nn.functional.one_hot(ids[:, -1], V + 1).double()


class WithIntParam(Base):
    def __init__(self):
        super().__init__()
        self.steps = torch.nn.Parameter(torch.tensor([3]), requires_grad=False)


@pytest.mark.parametrize("module, kw, match", [
    (LengthSecond(), {}, r"is it \(b, V, n\)\? transpose it"),
    (BatchDependent(), {}, "depend on the other sequences of the batch"),
    (Counter(), {"vectorize": False}, "forward is not deterministic"),
    (Noisy(), {"vectorize": False}, "forward is not deterministic"),
    (Huge(), {}, r"streams\.policy\.\w+ is not finite"),
    (IntLogits(), {}, "torch.int64 logits"),
    (Branchy(), {}, "vectorize=False"),
    (Noisy(), {}, "forward is not deterministic"),
], ids=["length_axis", "batch_dependent", "stateful", "random_looped", "overflow",
        "integer_logits", "control_flow_vmap", "random"])
def test_hostile_module_is_refused_by_name(module, kw, match):
    with pytest.raises(ValueError, match=match):
        run(module.double(), **kw)


def test_tuple_dict_and_last_position_outputs_are_read_as_logits():
    """(logits, extra) tuples (return_dict=False), {"logits": ...} dicts and (b, 1, V)
    last-position outputs give the same result as the plain (b, V) module."""
    class Tuple(Base):
        def forward(self, ids):
            return (super().forward(ids), None)

    class Dict(Base):
        def forward(self, ids):
            return {"logits": super().forward(ids)}

    class Last(Base):
        def forward(self, ids):
            return super().forward(ids)[:, None, :]

    want = run(Base().double())["streams"]["policy"]["sequence_fisher"]
    for cls in (Tuple, Dict, Last):
        got = run(cls().double())["streams"]["policy"]["sequence_fisher"]
        np.testing.assert_array_equal(got, want, err_msg=cls.__name__)


def test_a_gru_without_vectorize_false_names_it():
    class GRULM(Base):
        def __init__(self):
            super().__init__()
            self.gru = torch.nn.GRU(3, 3, batch_first=True)

        def forward(self, ids):
            return self.head(self.gru(self.emb(ids))[0][:, -1])

    with pytest.raises(ValueError, match="vectorize=False"):
        run(GRULM().double())
    out = run(GRULM().double(), vectorize=False)
    assert all(r["passed"] for r in out["checks"])


def test_a_module_without_parameters_is_refused_on_both_engines():
    with pytest.raises(ValueError, match="no floating parameters"):
        run(NoParams())  # torch engine
    with pytest.raises(ValueError, match="no floating parameters"):
        causal_lm_task(NoParams(), [[1]], 2, reward, vocab_size=V, eos=True, bos=V)  # numpy


def test_integer_parameters_are_not_part_of_theta():
    out = run(WithIntParam().double())
    assert "steps" not in out["params"]
    assert out["streams"]["policy"]["sequence_fisher"].shape == (3 * (V + 1) + 3 * V + V,)


def test_meta_device_module_is_refused():
    with torch.device("meta"):
        module = Base()
    with pytest.raises(ValueError, match="meta device"):
        run(module)
    with pytest.raises(ValueError, match="device='meta' holds no values"):
        run(Base().double(), device="meta")


def test_cuda_without_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device='cuda' but torch.cuda.is_available\(\) is "
                                         "False"):
        run(Base().double(), device="cuda")


def test_bos_outside_the_embedding_is_named():
    with pytest.raises(ValueError, match=r"bos=9 is not an id of the module's input "
                                         r"embedding \(rows 0\.\.4\)"):
        run(Base().double(), bos=9)


def test_input_longer_than_the_position_table_is_named():
    model = tiny("opt", "sdpa")  # max_position_embeddings = 8
    with pytest.raises(ValueError, match="max_position_embeddings=8"):
        exact_causal_lm(model, [[1] * 6], 4, reward, vocab_size=V, eos=True, bos=V)


def test_an_index_error_inside_the_module_gets_context():
    class Shifted(Base):
        def forward(self, ids):  # reads an embedding row past the table
            return self.head(self.emb(ids + 10).mean(1))

    with pytest.raises(ValueError, match="raised IndexError .* an id past its embedding"):
        run(Shifted().double())


def test_caller_sees_no_change_and_a_good_module_passes_every_check():
    module = Base().double()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    out = run(module)
    assert all(r["passed"] for r in out["checks"])
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert np.all(np.isfinite(out["streams"]["policy"]["sequence_fisher"]))


def test_from_module_refuses_a_bad_n_embeddings():
    with pytest.raises(ValueError, match="n_embeddings must be a non-negative integer"):
        from_module(Base(), V, eos=True, bos=V, positions=3, n_embeddings=-2)
    with pytest.raises(ValueError, match="fewer than vocab_size"):
        from_module(Base(), V, eos=True, bos=V, positions=3, n_embeddings=2)
