"""The autograd GPT-2 against Hugging Face ``transformers`` (the optional extra ``hf``).

Needs torch and transformers; CI installs them, so these tests must run there.
"""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="the hf extra (torch) is needed")
transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is needed")

from fisher_ref.models.gpt2 import GPT2Model, GPT2Spec  # noqa: E402
from fisher_ref.models.hf import (hf_config, hf_logits, spec_from_hf_config,  # noqa: E402
                           theta_from_hf, to_hf)

from cases import RTOL, rel  # noqa: E402
from fisher_ref.models.base import model_windows

LOGITS_RTOL = 1e-12  # autograd vs transformers logits, float64


def all_states(prompts, V, T, eos):
    """Every state where a token is drawn: prompt + g, ``len(g) < T``, no EOS (id 0) in ``g``."""
    alphabet = range(1, V) if eos else range(V)
    return [tuple(p) + g for p in prompts for t in range(T)
            for g in itertools.product(alphabet, repeat=t)]


PROMPTS = [(), (1,), (3, 2)]  # longest input: BOS + 2 + (T - 1) = 5 <= n_positions


@pytest.mark.parametrize("n_layer", [1, 2])
@pytest.mark.parametrize("eos", [True, False], ids=["eos", "no_eos"])
def test_logits_equal_transformers_on_every_state(n_layer, eos):
    V, T = 4, 3
    m = GPT2Model(GPT2Spec(vocab_size=V, eos=eos, n_positions=6, embed_dim=8, n_layer=n_layer,
                           n_head=2, init_seed=11 + n_layer, init_scale=0.8))
    theta = m.init_params()
    states = all_states(PROMPTS, V, T, eos)
    assert len(states) == (39 if eos else 63)
    hf = to_hf(m, theta)
    ours = m.logits(theta, model_windows(m, states))  # (N, V), one padded batch
    theirs = hf_logits(hf, states)  # (N, V), unpadded batches of equal length
    err = rel(ours, theirs)
    assert err <= LOGITS_RTOL, f"relative error {err:.2e}"


def test_theta_round_trip_is_exact():
    m = GPT2Model(GPT2Spec(vocab_size=5, n_positions=7, embed_dim=6, n_layer=2, n_head=3))
    theta = m.init_params()
    hf = to_hf(m, theta)
    assert next(hf.parameters()).dtype == torch.float64 and not hf.training
    assert hf.config._attn_implementation == "eager"
    assert hf.lm_head.weight is hf.transformer.wte.weight
    np.testing.assert_array_equal(theta_from_hf(hf, m.spec), theta)


def test_named_parameters_order_is_the_layout():
    spec = GPT2Spec(vocab_size=3, n_positions=4, embed_dim=4, n_layer=2, n_head=2)
    hf = transformers.GPT2LMHeadModel(hf_config(spec))
    got = [(n, tuple(p.shape)) for n, p in hf.named_parameters()]
    assert got == [(n, shape) for n, shape, _ in spec.layout()]


def test_weights_initialised_by_transformers():
    """Weights that transformers drew (its own init, then perturbed) give the same logits."""
    spec = GPT2Spec(vocab_size=4, eos=False, n_positions=5, embed_dim=4, n_layer=2, n_head=2)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(hf_config(spec)).to(torch.float64).eval()
    with torch.no_grad():
        for p in hf.parameters():  # LayerNorms start at (1, 0): move them off it
            p.add_(0.3 * torch.randn_like(p))
    m = GPT2Model(spec_from_hf_config(hf.config, eos=False))
    theta = theta_from_hf(hf, m.spec)
    states = all_states([()], 4, 4, eos=False)
    assert rel(m.logits(theta, model_windows(m, states)), hf_logits(hf, states)) <= LOGITS_RTOL


def test_sensitivities_equal_torch_autograd():
    """``j`` of a few states against torch's backward pass through transformers."""
    m = GPT2Model(GPT2Spec(vocab_size=4, n_positions=6, embed_dim=4, n_layer=2, n_head=2,
                           init_seed=2))
    theta = m.init_params()
    hf = to_hf(m, theta)
    states = [(), (2,), (3, 1, 1)]
    J = m.sensitivities(theta, model_windows(m, states))  # (B, P, V)
    for b, s in enumerate(states):
        z = hf(input_ids=torch.tensor([(4,) + s])).logits[0, -1, :4]  # (V,)
        for a in range(4):
            hf.zero_grad()
            z[a].backward(retain_graph=True)
            g = torch.cat([p.grad.reshape(-1) for p in hf.parameters()]).numpy()  # (P,)
            assert rel(J[b, :, a], g) < RTOL


def test_windows_and_states_give_the_same_hf_logits():
    m = GPT2Model(GPT2Spec(vocab_size=3, n_positions=5, embed_dim=4, n_head=1))
    hf = to_hf(m, m.init_params())
    states = [(2, 1), (), (1, 0, 2, 2)]
    np.testing.assert_array_equal(hf_logits(hf, model_windows(m, states)), hf_logits(hf, states))


def test_config_mismatch_names_the_field():
    spec = GPT2Spec(vocab_size=3, n_positions=4, embed_dim=4, n_layer=1, n_head=2)
    hf = to_hf(GPT2Model(spec), GPT2Model(spec).init_params())
    with pytest.raises(ValueError, match="model.n_layer"):
        theta_from_hf(hf, GPT2Spec(vocab_size=3, n_positions=4, embed_dim=4, n_layer=2, n_head=2))
    with pytest.raises(ValueError, match="theta has length"):
        to_hf(GPT2Model(spec), np.zeros(3))
    config = hf_config(spec)
    config.activation_function = "gelu"
    with pytest.raises(ValueError, match="config.activation_function"):
        spec_from_hf_config(config, eos=True)


@settings(max_examples=25, derandomize=True, database=None, deadline=None)
@given(data=st.data(), V=st.integers(1, 5), eos=st.booleans(), n_layer=st.integers(1, 3),
       H=st.sampled_from([1, 2, 4]), hd=st.integers(1, 3), N=st.integers(1, 7),
       seed=st.integers(0, 2 ** 16), scale=st.floats(0.05, 2.0))
def test_random_specs_equal_transformers(data, V, eos, n_layer, H, hd, N, seed, scale):
    spec = GPT2Spec(vocab_size=V, eos=eos and V >= 2, n_positions=N, embed_dim=H * hd,
                    n_layer=n_layer, n_head=H, init_seed=seed, init_scale=scale)
    m = GPT2Model(spec)
    theta = m.init_params()
    states = data.draw(st.lists(st.lists(st.integers(0, V - 1), max_size=N - 1),
                                min_size=1, max_size=6))
    err = rel(m.logits(theta, model_windows(m, states)), hf_logits(to_hf(m, theta), states))
    assert err <= LOGITS_RTOL, f"relative error {err:.2e}"
