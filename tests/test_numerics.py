"""Token Fisher of one state: centered vs pairwise form, closed forms, shifts."""
import numpy as np
import pytest

from fisher_ref import exact, load_config
from fisher_ref.models.mlp import MLPModel
from fisher_ref.models.base import ModelSpec, windows_for
from fisher_ref.models.tabular import TabularModel
from fisher_ref.models.sensitivities import sensitivities
from fisher_ref.numerics import (mean_sensitivity, token_fisher, token_fisher_pairwise,
                                     token_scores, token_second_moment, uniform_token_fisher)

RTOL = 1e-10


def _random_state(rng, B=4, P=6, V=5, zeros=False):
    p = rng.dirichlet(np.ones(V), size=B)  # (B, V)
    if zeros:
        p[:, 0] = 0.0
        p /= p.sum(axis=1, keepdims=True)
    return p, rng.normal(size=(B, P, V)) * 3


@pytest.mark.parametrize("zeros", [False, True], ids=["full-support", "zero-prob-token"])
def test_pairwise_form_matches_centered_form(zeros):
    p, j = _random_state(np.random.default_rng(1), zeros=zeros)
    a, b = token_fisher(p, j), token_fisher_pairwise(p, j)
    assert np.max(np.abs(a - b)) <= RTOL * np.max(np.abs(a))


def test_uniform_logit_shift_leaves_token_fisher_unchanged():
    rng = np.random.default_rng(2)
    p, j = _random_state(rng)
    shift = rng.normal(size=j.shape[:-1])[..., None] * 100  # (B, P, 1)
    for fn in (token_fisher, token_fisher_pairwise):
        a, b = fn(p, j), fn(p, j + shift)
        assert np.max(np.abs(a - b)) <= RTOL * np.max(np.abs(a))


def test_token_fisher_is_second_moment_of_scores():
    p, j = _random_state(np.random.default_rng(3))
    xi = token_scores(j, mean_sensitivity(p, j))  # (B, P, V)
    assert np.allclose(np.einsum("bv,bpv->bp", p, xi), 0, atol=RTOL * np.abs(j).max())
    assert np.allclose(token_second_moment(p, j, mean_sensitivity(p, j)),
                       np.einsum("bv,bpv->bp", p, xi ** 2), rtol=RTOL, atol=0)


def test_uniform_reference_uses_one_over_V():
    p, j = _random_state(np.random.default_rng(4))
    V = j.shape[-1]
    assert np.allclose(uniform_token_fisher(j), token_fisher(np.full((4, V), 1 / V), j),
                       rtol=RTOL, atol=0)


def test_tabular_token_fisher_is_p_one_minus_p():
    """Tabular model: f = p(1-p) on the visited row's parameters, 0 elsewhere."""
    m = TabularModel(4, context=1, init_seed=2)
    th = m.init_params()
    W = np.array([[4], [2], [0]])
    J = sensitivities(m, th, W)  # (3, P, V)
    p = np.exp(th.reshape(5, 4)[[4, 2, 0]])
    p /= p.sum(axis=1, keepdims=True)  # (3, V)
    f = token_fisher(p, J)  # (3, P)
    for b, row in enumerate([4, 2, 0]):
        expect = np.zeros(m.num_params)
        expect[row * 4:(row + 1) * 4] = p[b] * (1 - p[b])
        assert np.allclose(f[b], expect, rtol=RTOL, atol=0)


def test_tabular_config_two_routes():
    """Through exact(): the kept per-state token Fisher equals p(1-p) by hand."""
    task = load_config("tabular")
    r = exact(task, progress=False)
    V = task.model.vocab_size
    s = r.states
    for n in range(len(s["depth"])):
        toks = [int(t) for t in s["tokens"][n] if t >= 0]
        row = int(windows_for([toks], 1, V)[0, 0])
        expect = np.zeros(task.model.num_params)
        expect[row * V:(row + 1) * V] = s["probs"][n] * (1 - s["probs"][n])
        assert np.allclose(s["token_fisher"][n], expect, rtol=RTOL, atol=1e-300)


def test_mlp_output_weights_token_fisher_is_hid_squared_p_one_minus_p():
    """W2[h, c] moves logit c by hid_h: f = hid_h^2 p_c (1 - p_c)."""
    m = MLPModel(ModelSpec(vocab_size=5, context=2, embed_dim=3, hidden=8))
    th = m.init_params()
    W = np.array([[5, 5], [1, 2], [3, 0]])
    J = sensitivities(m, th, W)
    z = m.logits(th, W)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)  # (B, V)
    _, hid = m.hidden(th, W)  # (B, H)
    f = token_fisher(p, J)
    (_, (H, V), o), = [x for x in m.layout() if x[0] == "W2"]
    expect = (hid[:, :, None] ** 2 * (p * (1 - p))[:, None, :]).reshape(len(W), H * V)
    assert np.allclose(f[:, o:o + H * V], expect, rtol=RTOL, atol=0)
    (_, _, ob), = [x for x in m.layout() if x[0] == "b2"]
    assert np.allclose(f[:, ob:ob + V], p * (1 - p), rtol=RTOL, atol=0)
