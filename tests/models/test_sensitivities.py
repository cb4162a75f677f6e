"""Logit sensitivities three ways: MLP closed form, autograd, central differences."""
import numpy as np
import pytest

from fisher_ref.models.mlp import MLPModel
from fisher_ref.models.base import ModelSpec
from fisher_ref.models.tabular import TabularModel
from fisher_ref.models.sensitivities import (finite_difference_sensitivities, mlp_sensitivities,
                                      sensitivities, sensitivities_autograd)

RTOL = 1e-10
FD_STEP = 1e-6
# central differences in float64: truncation O(step^2 |z'''|) + rounding O(eps |z| / step)
FD_RTOL = 1e-7

SPECS = {
    "default": ModelSpec(vocab_size=5, context=2, embed_dim=3, hidden=8),
    "no_eos_ctx3": ModelSpec(vocab_size=3, context=3, embed_dim=2, hidden=4, eos=False,
                             init_seed=3, init_scale=1.5),
    "one_unit": ModelSpec(vocab_size=2, context=1, embed_dim=1, hidden=1, init_seed=7),
}


def _windows(V, k, n=6, seed=0):
    rng = np.random.default_rng(seed)
    W = rng.integers(0, V + 1, size=(n, k))
    W[0, :] = V  # all-BOS window
    W[1, :] = 1  # a token repeated across the window
    return W


@pytest.mark.parametrize("name", list(SPECS))
def test_mlp_closed_form_matches_autograd(name):
    m = MLPModel(SPECS[name])
    th = m.init_params()
    W = _windows(m.vocab_size, m.context)
    a, b = mlp_sensitivities(m, th, W), sensitivities_autograd(m, th, W)
    assert a.shape == (len(W), m.num_params, m.vocab_size)
    assert np.max(np.abs(a - b)) <= RTOL * np.max(np.abs(b))


@pytest.mark.parametrize("name", list(SPECS) + ["tabular"])
def test_tokens_first_layout_is_the_transpose(name):
    """``tokens_first`` gives the same numbers with each token's row contiguous (the
    MLP's closed form written transposed; any other model transposed)."""
    m = TabularModel(3, context=2, init_seed=1) if name == "tabular" else MLPModel(SPECS[name])
    th = m.init_params()
    W = _windows(m.vocab_size, m.context)
    a, b = sensitivities(m, th, W), sensitivities(m, th, W, tokens_first=True)
    assert b.shape == (len(W), m.vocab_size, m.num_params) and b.flags.c_contiguous
    assert np.max(np.abs(b - a.transpose(0, 2, 1))) <= RTOL * np.max(np.abs(a))


@pytest.mark.parametrize("name", list(SPECS))
def test_autograd_matches_central_differences(name):
    m = MLPModel(SPECS[name])
    th = m.init_params()
    W = _windows(m.vocab_size, m.context)
    a = sensitivities_autograd(m, th, W)
    fd = finite_difference_sensitivities(m, th, W, step=FD_STEP)
    assert np.max(np.abs(a - fd)) <= FD_RTOL * np.max(np.abs(a))


def test_dispatch_uses_closed_form_for_mlp_and_autograd_otherwise():
    m = TabularModel(3, context=1)
    th = m.init_params()
    W = np.array([[3], [1]])
    J = sensitivities(m, th, W)  # (2, 12, 3): one-hot rows
    for b, row in enumerate([3, 1]):
        expect = np.zeros((12, 3))
        expect[row * 3:(row + 1) * 3] = np.eye(3)
        assert np.array_equal(J[b], expect)


def test_output_layer_blocks_in_closed_form():
    """dz_a/db2_c = delta_ca and dz_a/dW2_{h,c} = hid_h delta_ca."""
    m = MLPModel(SPECS["default"])
    th = m.init_params()
    W = _windows(5, 2)
    J = mlp_sensitivities(m, th, W)
    _, hid = m.hidden(th, W)
    lay = {n: (s, o) for n, s, o in m.layout()}
    (H, V), o = lay["W2"]
    jW2 = J[:, o:o + H * V].reshape(len(W), H, V, V)
    assert np.array_equal(jW2, hid[:, :, None, None] * np.eye(V)[None, None])
    _, o = lay["b2"]
    assert np.array_equal(J[:, o:o + V], np.broadcast_to(np.eye(V), (len(W), V, V)))


def test_custom_architecture_autograd_matches_central_differences():
    from cases import masked_mlp, sine_model  # tests/ is on the path (conftest appends it)
    for model, th in (sine_model(), masked_mlp(vocab_size=4, context=2, embed_dim=2, hidden=3)):
        W = _windows(model.vocab_size, model.context)
        a = sensitivities(model, th, W)
        assert np.isfinite(a).all()  # -inf masks are constants: finite derivatives
        # masked (-inf) logits have no finite differences; they carry probability 0
        live = np.broadcast_to(~np.isneginf(np.asarray(model.logits(th, W)))[:, None, :],
                               a.shape)
        with np.errstate(invalid="ignore"):
            fd = finite_difference_sensitivities(model, th, W, FD_STEP)
        assert np.max(np.abs(a - fd)[live]) <= FD_RTOL * np.max(np.abs(a[live]))


@pytest.mark.parametrize("cut", [(0, 5), (3, 40), (18, 66), (60, 80), (100, 119), (0, 119),
                                 (118, 119)])
def test_mlp_columns_are_the_slice_of_every_parameter(cut):
    """sensitivities(..., columns=slice) is the slice of the full (B, V, P) array, for
    slices inside one block (E), exactly one block (W1), across blocks and at either end."""
    spec = SPECS["default"]
    m = MLPModel(spec)
    th = m.init_params()
    assert m.num_params == 119  # blocks E 0-18, W1 18-66, b1 66-74, W2 74-114, b2 114-119
    W = _windows(spec.vocab_size, spec.context)
    full = sensitivities(m, th, W, tokens_first=True)
    cols = slice(*cut)
    part = sensitivities(m, th, W, tokens_first=True, columns=cols)
    assert np.array_equal(part, full[:, :, cols])
    out = np.full((len(W), m.vocab_size, cols.stop - cols.start), np.nan)
    assert sensitivities(m, th, W, tokens_first=True, out=out, columns=cols) is out
    assert np.array_equal(out, full[:, :, cols])
    with pytest.raises(ValueError, match="tokens_first"):
        sensitivities(m, th, W, columns=cols)
    tab = TabularModel(3, context=1)  # autograd's route: the slice taken after
    tth, Wt = tab.init_params(), np.array([[3], [1]])
    tfull = sensitivities(tab, tth, Wt, tokens_first=True)
    assert np.array_equal(sensitivities(tab, tth, Wt, tokens_first=True, columns=slice(1, 4)),
                          tfull[:, :, 1:4])
