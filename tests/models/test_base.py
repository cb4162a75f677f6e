"""What the models share (fisher_ref.models.base, make_model): layout, unpacking, seeded
initialisation, extreme logits, windows, and bad specs/parameters. Each model's own logits
are tested in tests/models/test_mlp.py, test_tabular.py and test_function.py."""
import numpy as np
import pytest

from fisher_ref.models.mlp import MLPModel
from fisher_ref.models.base import ModelSpec, check_theta, windows_for
from fisher_ref.numerics import log_softmax, softmax
from fisher_ref.models import make_model

RTOL = 1e-10


def test_layout_is_contiguous_and_in_design_order():
    m = MLPModel(ModelSpec(vocab_size=5, context=2, embed_dim=3, hidden=8))
    lay = m.layout()
    assert [n for n, _, _ in lay] == ["E", "W1", "b1", "W2", "b2"]
    assert [s for _, s, _ in lay] == [(6, 3), (6, 8), (8,), (8, 5), (5,)]
    off = 0
    for _, shape, o in lay:
        assert o == off
        off += int(np.prod(shape))
    assert off == m.num_params == 119


def test_unpack_views_are_row_major_slices_of_theta():
    m = MLPModel(ModelSpec(vocab_size=3, context=1, embed_dim=2, hidden=2))
    th = np.arange(m.num_params, dtype=float)
    p = m.unpack(th)
    assert p["E"][1, 0] == 2.0 and p["W1"][0, 1] == 9.0 and p["b2"][-1] == m.num_params - 1
    assert all(np.shares_memory(v, th) for v in p.values())  # views, not copies
    stack = np.stack([th, th + 1.0])  # a leading axis: (B, P)
    assert m.unpack(stack)["W2"].shape == (2, 2, 3)
    assert np.shares_memory(m.unpack(stack)["W2"], stack)


def test_unpack_under_autograd_gives_the_gradient_of_each_block():
    """A traced theta takes autograd's reshape: the gradient of a sum over one block is 1 on
    its entries and 0 elsewhere."""
    from autograd import grad
    m = MLPModel(ModelSpec(vocab_size=3, context=1, embed_dim=2, hidden=2))
    g = grad(lambda t: m.unpack(t)["W1"].sum())(np.zeros(m.num_params))
    start = dict((n, o) for n, _, o in m.layout())["W1"]
    assert g.sum() == 4.0 and np.all(g[start:start + 4] == 1.0)


def test_init_params_are_seeded_and_scaled():
    a = MLPModel(ModelSpec(vocab_size=3, init_seed=4, init_scale=2.0)).init_params()
    b = 2.0 * np.random.default_rng(4).standard_normal(a.size)
    assert np.array_equal(a, b)


def test_log_softmax_is_finite_for_extreme_and_masked_logits():
    z = np.array([[1e3, -1e3, 0.0], [-np.inf, 2.0, 1e3], [700.0, 700.0, -np.inf]])
    lp = log_softmax(z)
    p = softmax(z)
    assert np.isfinite(lp[~np.isneginf(z)]).all()
    assert np.allclose(p.sum(axis=1), 1.0, rtol=0, atol=RTOL)
    assert p[1, 0] == 0.0 and np.isclose(p[2, 0], 0.5, rtol=RTOL)


def test_windows_for_pads_with_bos_oldest_first():
    W = windows_for([(), (1,), (1, 2, 3)], context=2, bos=9)
    assert W.tolist() == [[9, 9], [9, 1], [2, 3]]


@pytest.mark.parametrize("theta, exc, words", [
    (np.zeros(5), ValueError, "length 5"),
    (np.zeros((2, 6)), ValueError, "flat vector"),
    (np.array([0.0] * 11 + [np.nan]), ValueError, "non-finite"),
    (np.array([0.0] * 11 + [np.inf]), ValueError, "index 11"),
    (np.array(["a"] * 12), TypeError, "numeric"),
], ids=["wrong-length", "not-flat", "nan", "inf", "strings"])
def test_check_theta_rejects_bad_parameters(theta, exc, words):
    with pytest.raises(exc, match=words):
        check_theta(theta, 12)


@pytest.mark.parametrize("spec, words", [
    ({"vocab_size": 0}, "vocab_size must be a positive integer"),
    ({"vocab_size": 2.5}, "vocab_size must be a positive integer"),
    ({"vocab_size": 4, "hidden": 0}, "hidden must be a positive integer"),
    ({"vocab_size": 4, "context": True}, "context must be a positive integer"),
    ({"vocab_size": 1, "eos": True}, "at least 2 when eos"),
    ({"vocab_size": 4, "eos": "yes"}, "eos must be true or false"),
    ({"vocab_size": 4, "init_seed": -1}, "init_seed must be a non-negative integer"),
    ({"vocab_size": 4, "init_scale": float("nan")}, "init_scale must be a finite number"),
    ({"vocab_size": 4, "init_scale": "big"}, "init_scale must be a finite number"),
    ({"vocab_size": 4, "depth": 2}, "unknown model keys \\['depth'\\]"),
    ({"context": 2}, "vocab_size is required"),
    ({"arch": "transformer", "vocab_size": 4}, "unknown model arch 'transformer'"),
    ({"arch": "tabular", "vocab_size": 3, "hidden": 2}, "unknown model keys \\['hidden'\\]"),
    ({"arch": "tabular", "vocab_size": 0}, "vocab_size must be a positive integer"),
], ids=lambda v: str(v) if isinstance(v, str) else None)
def test_bad_model_specs_name_the_problem(spec, words):
    with pytest.raises(ValueError, match=words):
        make_model(spec)


def test_make_model_rejects_non_dict():
    with pytest.raises(TypeError, match="model spec must be a dict"):
        make_model([5])
