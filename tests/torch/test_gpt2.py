"""The GPT-2 in torch (fisher_ref.torch.gpt2): transformers' GPT2LMHeadModel over the flat
theta, its parameters in the GPT-2 layout's order and offsets, BOS and context as the
numpy model's, and a layout that does not match refused."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")
pytest.importorskip("transformers", reason="the hf extra (transformers) is needed")

from fisher_ref import load_config  # noqa: E402
from fisher_ref.torch.gpt2 import gpt2_adapter  # noqa: E402
from fisher_ref.torch.registry import torch_model  # noqa: E402

pytestmark = pytest.mark.torch


def test_the_adapter_holds_theta_in_the_gpt2_layout():
    task = load_config("gpt2_small")
    m = task.model
    ad = gpt2_adapter(m)
    assert ad.name == "gpt2" and ad.num_params == m.num_params
    assert (ad.vocab_size, ad.eos, ad.bos, ad.context) == (m.vocab_size, m.eos, m.bos, m.context)
    assert [(n, tuple(s), o) for n, s, o in ad.layout] == \
        [(n, tuple(s), o) for n, s, o in m.layout()]
    views = ad.unpack(ad.theta(task.theta))  # each block is the numpy model's own
    for name, block in m.unpack(task.theta).items():
        np.testing.assert_array_equal(views[name].numpy(), block)
    assert type(torch_model(m)) is type(ad) and torch_model(m).layout == ad.layout


def test_a_model_whose_layout_differs_is_refused(monkeypatch):
    m = load_config("gpt2_small").model
    real = m.layout()
    monkeypatch.setattr(m, "layout", lambda: real[::-1])
    with pytest.raises(RuntimeError, match="differ from the GPT-2 layout"):
        gpt2_adapter(m)
