"""What from_module reads off a module (fisher_ref.torch.module_parameters): theta's
tensors in named_parameters() order, a tied one once, integers never, and selections that
name what is wrong."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")
pytest.importorskip("transformers", reason="the hf extra (transformers) is needed")
pytest.importorskip("peft", reason="the hf extra (peft) is needed")

from fisher_ref.torch.module_parameters import (flat_parameters, input_embeddings,  # noqa: E402
                                                position_table, select_parameters)
from tests.torch.test_params import frozen_llama, run  # noqa: E402

pytestmark = pytest.mark.torch


def test_selection_errors_name_params():
    model = frozen_llama()
    with pytest.raises(ValueError, match="'q_proj'.*did you mean"):
        select_parameters(model, ["q_proj"])
    with pytest.raises(ValueError, match="params must be 'all', 'trainable'"):
        select_parameters(model, "frozen")
    with pytest.raises(ValueError, match="no parameters selected by the params predicate"):
        select_parameters(model, lambda n, p: False)
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no parameters selected by params='trainable'"):
        run(model, params="trainable")


class Tied(torch.nn.Module):
    """An embedding tied to the head, a frozen bias and an integer parameter."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(4, 2)
        self.mid = torch.nn.Linear(2, 2)
        self.head = torch.nn.Linear(2, 4, bias=False)
        self.head.weight = self.emb.weight
        self.steps = torch.nn.Parameter(torch.tensor([3]), requires_grad=False)
        self.mid.bias.requires_grad_(False)


def test_theta_is_each_floating_parameter_once_in_module_order():
    torch.manual_seed(0)
    m = Tied().double()
    names, shapes, theta = flat_parameters(m)
    assert names == ["emb.weight", "mid.weight", "mid.bias"]  # tied once, no integer
    assert shapes == [(4, 2), (2, 2), (2,)]
    np.testing.assert_array_equal(theta, np.concatenate(
        [m.emb.weight.detach().numpy().ravel(), m.mid.weight.detach().numpy().ravel(),
         m.mid.bias.detach().numpy()]))
    assert [n for n, _ in select_parameters(m, "trainable")] == ["emb.weight", "mid.weight"]
    assert [n for n, _ in select_parameters(m, ["mid.bias", "emb.weight"])] == \
        ["emb.weight", "mid.bias"]  # the module's order, not the list's
    with pytest.raises(ValueError, match="'steps', an integer parameter"):
        select_parameters(m, ["steps"])
    assert input_embeddings(m) == 4 and position_table(m) is None


def test_a_transformers_model_gives_its_embedding_rows_and_position_table():
    model = frozen_llama()
    assert input_embeddings(model) == model.get_input_embeddings().weight.shape[0]
    assert position_table(model) == model.config.max_position_embeddings > 0


def test_a_tied_alias_selects_the_shared_weight():
    """issue 46 item 20: with tied embeddings, ``params=["lm_head.weight"]`` was refused as
    "not in the module's named_parameters()", which lists the shared tensor only as
    ``model.embed_tokens.weight``. The alias now selects the shared weight, under its first
    name, and gives the same result as that name."""
    import transformers

    from fisher_ref.torch import exact_causal_lm
    V = 4
    config = transformers.LlamaConfig(
        vocab_size=V + 1, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8,
        tie_word_embeddings=True)
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(config).double().eval()
    assert llama.lm_head.weight is llama.model.embed_tokens.weight
    for names in (["lm_head.weight"], ["lm_head.weight", "model.embed_tokens.weight"]):
        (picked,) = select_parameters(llama, names)
        assert picked[0] == "model.embed_tokens.weight" and picked[1] is llama.lm_head.weight
    reward = lambda prompt, response: float(response.count(2))  # noqa: E731
    kw = dict(vocab_size=V, eos=True, bos=V)
    a = exact_causal_lm(llama, [[1]], 2, reward, params=["model.embed_tokens.weight"], **kw)
    b = exact_causal_lm(llama, [[1]], 2, reward, params=["lm_head.weight"], **kw)
    assert b["params"] == ["model.embed_tokens.weight"]
    for q in ("gradient", "sequence_fisher"):
        np.testing.assert_array_equal(b["streams"]["policy"][q], a["streams"]["policy"][q])
