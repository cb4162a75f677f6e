"""The MLP's closed-form window scores and moments against the dense route: the
sensitivities of :func:`mlp_sensitivities` (held to autograd and finite differences in
test_sensitivities.py), centered and summed token by token here."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fisher_ref.models.base import ModelSpec
from fisher_ref.models.mlp import MLPModel
from fisher_ref.engine.mlp_columns import UnitColumns, families, mlp_blocks
from fisher_ref.engine.mlp_scores import (factor_names, factor_shapes, mlp_score_rows,
                                          mlp_window_arrays)
from fisher_ref.models.sensitivities import mlp_sensitivities
from fisher_ref.numerics import softmax, topk_weights


def _dense(model, theta, windows, c, cols):
    J = mlp_sensitivities(model, theta, windows, tokens_first=True)[:, :, cols]  # (U, V, P)
    return J, J - np.einsum("ua,uap->up", c, J)[:, None]


def _close(a, b):
    scale = max(np.abs(b).max(), 1e-300)
    assert np.abs(a - b).max() <= 1e-13 * scale, np.abs(a - b).max() / scale


@settings(max_examples=40, deadline=None)
@given(V=st.integers(2, 7), k=st.integers(1, 3), d=st.integers(1, 3), H=st.integers(1, 5),
       U=st.integers(1, 6), seed=st.integers(0, 2 ** 31 - 1), topk=st.integers(1, 7),
       cut=st.floats(0, 1), width=st.floats(0, 1))
def test_closed_form_matches_the_dense_scores_and_moments(V, k, d, H, U, seed, topk, cut,
                                                          width):
    rng = np.random.default_rng(seed)
    model = MLPModel(ModelSpec(vocab_size=V, context=k, embed_dim=d, hidden=H))
    theta = 1.5 * rng.standard_normal(model.num_params)
    windows = rng.integers(0, V + 1, size=(U, k))  # V: the padding token
    windows[0] = windows[0, 0]  # a window repeating one token
    P = model.num_params
    lo = int(cut * (P - 1))
    cols = slice(lo, lo + 1 + int(width * (P - 1 - lo)))
    p = softmax(rng.standard_normal((U, V)))
    q = softmax(2 * rng.standard_normal((U, V)))
    centers = [p, topk_weights(q, topk)]
    moments = [(q, 0, 4), (p, 1, 2)]
    for columns in (None, cols):
        xi, ys, unif = mlp_window_arrays(model, theta, windows, centers, moments,
                                         uniform=True, columns=columns)
        c_sl = slice(None) if columns is None else columns
        for c, x in zip(centers, xi):
            _close(x, _dense(model, theta, windows, c, c_sl)[1])
        for (w, i, n), y in zip(moments, ys):
            ref = _dense(model, theta, windows, centers[i], c_sl)[1]
            assert len(y) == n
            for l in range(n):
                _close(y[l], np.einsum("ua,uap->up", w, ref ** (l + 1)))
        J = _dense(model, theta, windows, p, c_sl)[0]
        _close(unif, ((J - J.mean(axis=1, keepdims=True)) ** 2).mean(axis=1))


def test_writes_into_the_arrays_given_and_refuses_bad_ones():
    model = MLPModel(ModelSpec(vocab_size=4, context=2, embed_dim=2, hidden=3))
    theta = np.random.default_rng(1).standard_normal(model.num_params)
    windows = np.array([[4, 1], [2, 2], [0, 3]])
    p = softmax(np.random.default_rng(2).standard_normal((3, 4)))
    out, ys, un = [np.full((3, 4, model.num_params), np.nan)], \
        [np.full((3, model.num_params), np.nan) for _ in range(3)], \
        np.full((3, model.num_params), np.nan)
    xi, got, unif = mlp_window_arrays(model, theta, windows, [p], [(p, 0, ys)], uniform=un,
                                      out=out)
    assert xi[0] is out[0] and got[0] is ys and unif is un
    assert np.isfinite(out[0]).all() and all(np.isfinite(y).all() for y in ys)
    assert np.isfinite(un).all()  # every entry written, the zero ones too
    with pytest.raises(ValueError, match="out must hold"):
        mlp_window_arrays(model, theta, windows, [p], [], out=[np.empty((3, 4, 5))])
    with pytest.raises(ValueError, match="consecutive"):
        mlp_window_arrays(model, theta, windows, [p], [], columns=slice(0, 10, 2))


def test_a_slice_of_the_parameters_forms_only_its_families_factors():
    """A slice inside W2's family (a parameter shard that holds no hidden unit) forms and reads no
    factor of E's or W1's (gc, Ec, mG, mE): the factors it does form still give the dense
    scores (mlp_score_rows), and a factor asked for outside the slice is refused by name."""
    spec = ModelSpec(vocab_size=5, context=2, embed_dim=3, hidden=4)
    model = MLPModel(spec)
    at = {name: (start, stop) for name, start, stop in mlp_blocks(spec)}
    W2_family = slice(at["W2"][0], at["b2"][1])
    assert families(spec) == {"E", "G", "D"}
    assert families(spec, slice(at["W1"][0], at["b1"][1])) == {"G"}
    assert families(spec, W2_family) == {"D"}
    assert families(spec, slice(at["b1"][1] - 1, at["b1"][1] + 1)) == {"G", "D"}
    assert families(spec, slice(0, 1)) == {"E"}
    names = factor_names(spec, 2, 1, 3, W2_family)
    assert names == ["e", "hid", "win", "dup", "c0", "c1", "mD0_1", "mD0_2", "mD0_3"]
    assert set(factor_names(spec, 2, 1, 3)) >= {"gc0", "Ec1", "mG0_3", "mE0_1", "mD0_2"}

    rng = np.random.default_rng(3)
    theta = rng.standard_normal(model.num_params)
    windows = np.array([[5, 1], [2, 2], [0, 3]])
    p, q = softmax(rng.standard_normal((3, 5))), softmax(rng.standard_normal((3, 5)))
    shapes = factor_shapes(spec)
    fac = {n: np.full((3,) + shapes[n.rstrip("0123456789_")], np.nan) for n in names}
    mlp_window_arrays(model, theta, windows, [p, q], [(q, 0, [None] * 3)], out=False,
                      columns=W2_family, factors=fac)
    assert all(np.isfinite(x).all() for x in fac.values())
    tokens = np.array([4, 0, 2])
    rows = {n: fac[n] for n in ("e", "hid", "win", "dup")} | {"c": fac["c1"]}
    got = mlp_score_rows(spec, rows, tokens, W2_family)
    dense = _dense(model, theta, windows, q, W2_family)[1][np.arange(3), tokens]
    _close(got, dense)
    with pytest.raises(ValueError, match="gc0"):
        mlp_window_arrays(model, theta, windows, [p], [(q, 0, [None] * 3)], out=False,
                          columns=W2_family,
                          factors={"gc0": np.empty((3, 5, 4)), **{n: fac[n] for n in names}})


def _unit_index(model, h0, h1, lo, hi):
    """The flat parameters of :class:`UnitColumns` built from the model's own unpacking
    (not from mlp_blocks): E, W1's columns h0..h1 row by row, b1's h0..h1, W2, b2, in that
    order, then positions lo..hi of that list."""
    at = model.unpack(np.arange(model.num_params, dtype=float))
    order = np.concatenate([at["E"].ravel(), at["W1"][:, h0:h1].ravel(), at["b1"][h0:h1],
                            at["W2"].ravel(), at["b2"].ravel()]).astype(int)
    return order[lo:hi]


@settings(max_examples=40, deadline=None)
@given(V=st.integers(2, 6), k=st.integers(1, 3), d=st.integers(1, 3), H=st.integers(1, 6),
       U=st.integers(1, 5), seed=st.integers(0, 2 ** 31 - 1), a=st.floats(0, 1),
       b=st.floats(0, 1), cut=st.floats(0, 1), width=st.floats(0, 1))
def test_unit_columns_give_the_dense_arrays_at_their_parameters(V, k, d, H, U, seed, a, b,
                                                                cut, width):
    """A run over the hidden units h0..h1 of W1's family (UnitColumns: parameters lo..hi
    of the layout that holds only those units) gives the dense scores, moments, uniform
    spread and score rows at its parameters, which are those the model's own unpacking
    puts there."""
    rng = np.random.default_rng(seed)
    spec = ModelSpec(vocab_size=V, context=k, embed_dim=d, hidden=H)
    model = MLPModel(spec)
    h0 = min(int(a * H), H - 1)
    h1 = h0 + 1 + int(b * (H - h0 - 1))
    P = mlp_blocks(spec, h1 - h0)[-1][2]
    lo = int(cut * (P - 1))
    hi = lo + 1 + int(width * (P - 1 - lo))
    uc = UnitColumns(spec, lo, hi, h0, h1)
    index = _unit_index(model, h0, h1, lo, hi)
    assert np.array_equal(uc.index, index) and uc.width == len(index)
    theta = 1.5 * rng.standard_normal(model.num_params)
    windows = rng.integers(0, V + 1, size=(U, k))
    p, q = softmax(rng.standard_normal((U, V))), softmax(2 * rng.standard_normal((U, V)))
    xi, ys, unif = mlp_window_arrays(model, theta, windows, [p, q], [(q, 0, 3)],
                                     uniform=True, columns=uc)
    for c, x in zip((p, q), xi):
        _close(x, _dense(model, theta, windows, c, index)[1])
    ref = _dense(model, theta, windows, p, index)[1]
    for l in range(3):
        _close(ys[0][l], np.einsum("ua,uap->up", q, ref ** (l + 1)))
    J = _dense(model, theta, windows, p, index)[0]
    _close(unif, ((J - J.mean(axis=1, keepdims=True)) ** 2).mean(axis=1))
    names = factor_names(spec, 1, 1, 2, uc)
    shapes = factor_shapes(spec, uc)
    fac = {n: np.full((U,) + shapes[n.rstrip("0123456789_")], np.nan) for n in names}
    mlp_window_arrays(model, theta, windows, [p], [(q, 0, [None] * 2)], out=False,
                      columns=uc, factors=fac)
    tokens = rng.integers(0, V, size=U)
    rows = {n: fac[n] for n in ("e", "hid", "win", "dup")} | {"c": fac["c0"]}
    rows |= {n: fac[f"{n}0"][np.arange(U), tokens] for n in ("gc", "Ec") if f"{n}0" in fac}
    _close(mlp_score_rows(spec, rows, tokens, uc), ref[np.arange(U), tokens])
    if "gc0" in fac:  # the factor of its own units only
        assert fac["gc0"].shape == (U, V, h1 - h0)
