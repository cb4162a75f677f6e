"""The autograd GPT-2 (no torch needed): layout, windows, a naive second
implementation, causality, derivatives, bad specs.

The reference :func:`naive_outputs` reads ``theta`` in its own order and loops
over positions and heads in plain numpy; it shares no code with
``fisher_ref.models.gpt2``. ``tests/test_hf.py`` holds the model against ``transformers``.
"""
import doctest
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fisher_ref.models.gpt2 as gpt2_module
from fisher_ref.models.gpt2 import GPT2Model, GPT2Spec
from fisher_ref.models.sensitivities import sensitivities_autograd

from cases import RTOL, rel
from fisher_ref.models.base import model_windows

FD_STEP = 1e-6  # central finite-difference step
FD_RTOL = 1e-6  # FD truncation ~ step^2, round-off ~ eps * |z| / step, on the scale of max|j|

SMALL = dict(vocab_size=5, eos=True, n_positions=8, embed_dim=8, n_layer=1, n_head=2)


# ------------------------------------------------------------ independent reference

def naive_outputs(spec, theta, seq):
    """Logits ``(n, V)`` at every position of ``[BOS] + seq``, by loops in plain numpy."""
    V, N, d, H = spec.vocab_size, spec.n_positions, spec.embed_dim, spec.n_head
    pos = [0]

    def take(*shape):
        n = int(np.prod(shape))
        out = theta[pos[0]:pos[0] + n].reshape(shape)
        pos[0] += n
        return out

    def norm(u, w, b):
        return w * (u - u.mean()) / np.sqrt(((u - u.mean()) ** 2).mean() + 1e-5) + b

    def gelu(u):
        return 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))

    wte, wpe = take(V + 1, d), take(N, d)
    x = [V] + list(seq)
    h = [wte[t] + wpe[i] for i, t in enumerate(x)]
    hd = d // H
    for _ in range(spec.n_layer):
        w1, b1, wa, ba, wp, bp = take(d), take(d), take(d, 3 * d), take(3 * d), take(d, d), take(d)
        w2, b2, wf, bf = take(d), take(d), take(d, 4 * d), take(4 * d)
        wm, bm = take(4 * d, d), take(d)
        qkv = [norm(u, w1, b1) @ wa + ba for u in h]
        att = []
        for t in range(len(h)):
            heads = []
            for j in range(H):
                sl = slice(j * hd, (j + 1) * hd)
                q = qkv[t][sl]
                s = np.array([q @ qkv[u][d:][sl] / np.sqrt(hd) for u in range(t + 1)])
                a = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
                heads.append(sum(a[u] * qkv[u][2 * d:][sl] for u in range(t + 1)))
            att.append(np.concatenate(heads))
        h = [u + a @ wp + bp for u, a in zip(h, att)]
        h = [u + gelu(norm(u, w2, b2) @ wf + bf) @ wm + bm for u in h]
    wf_, bf_ = take(d), take(d)
    assert pos[0] == theta.size
    return np.array([(norm(u, wf_, bf_) @ wte.T)[:V] for u in h])


# ------------------------------------------------------------------------ tests

def test_docstring_examples():
    res = doctest.testmod(gpt2_module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0 and res.failed == 0


@pytest.mark.parametrize("n_layer", [1, 2, 3])
def test_layout_order_and_size(n_layer):
    spec = GPT2Spec(vocab_size=4, n_positions=5, embed_dim=6, n_layer=n_layer, n_head=3)
    V, N, d = 4, 5, 6
    # per block: 2 LayerNorms (4d), c_attn (3d^2 + 3d), c_proj (d^2 + d),
    # c_fc (4d^2 + 4d), mlp.c_proj (4d^2 + d)
    assert spec.num_params == (V + 1) * d + N * d + n_layer * (12 * d * d + 13 * d) + 2 * d
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(n_layer):
        names += [f"transformer.h.{i}.{n}" for n in (
            "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
            "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
            "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias")]
    names += ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    layout = spec.layout()
    assert [n for n, _, _ in layout] == names
    ends = [off + int(np.prod(shape)) for _, shape, off in layout]
    assert [off for _, _, off in layout] == [0] + ends[:-1]
    shapes = {n: shape for n, shape, _ in layout}
    assert shapes["transformer.h.0.attn.c_attn.weight"] == (d, 3 * d)  # Conv1D: (in, out)
    assert shapes["transformer.h.0.mlp.c_proj.weight"] == (4 * d, d)


def test_windows_are_bos_then_state():
    m = GPT2Model(GPT2Spec(vocab_size=3, n_positions=4, embed_dim=2, n_head=1))
    w = m.windows(np.array([[2, 1, 0], [1, -1, -1], [-1, -1, -1]]), np.array([3, 1, 0]))
    assert w.dtype == np.int64
    assert w.tolist() == [[3, 2, 1, 0], [3, 1, -1, -1], [3, -1, -1, -1]]
    empty = m.windows(np.zeros((2, 0), dtype=int), np.array([0, 0]))  # only empty states
    assert empty.tolist() == [[3, -1, -1, -1]] * 2
    with pytest.raises(ValueError, match="n_positions"):
        m.windows(np.array([[1, 1, 1, 1]]), np.array([4]))


@pytest.mark.parametrize("n_layer", [1, 2])
def test_logits_equal_naive_loops_at_every_position(n_layer):
    spec = GPT2Spec(**{**SMALL, "n_layer": n_layer, "init_seed": 4})
    m = GPT2Model(spec)
    theta = m.init_params()
    seq = (3, 0, 4, 4, 1, 2, 2)  # fills all 8 positions
    ref = naive_outputs(spec, theta, seq)  # (8, V)
    got = m.logits(theta, model_windows(m, [seq[:t] for t in range(len(seq) + 1)]))  # (8, V)
    assert rel(got, ref) < RTOL


def test_causal_and_padding_invariance():
    """A state's logits do not depend on what follows it, on the batch, or on the padding."""
    m = GPT2Model(GPT2Spec(**SMALL))
    theta = m.init_params()
    states = [(), (2,), (2, 4, 1), (1, 1, 1, 1, 3, 2, 0)]
    together = m.logits(theta, model_windows(m, states))  # (4, V)
    for b, s in enumerate(states):
        alone = m.logits(theta, model_windows(m, [s]))[0]  # (V,)
        assert rel(alone, together[b]) < RTOL
        w = model_windows(m, [s])
        n = len(s) + 1
        assert np.all(w[0, n:] == -1)
    longer = m.logits(theta, model_windows(m, [(2, 4, 1, 3, 3)]))
    prefix = m.logits(theta, model_windows(m, [(2, 4, 1)]))
    assert not np.allclose(longer, prefix)  # the history is read
    assert rel(prefix[0], together[2]) < RTOL


def test_sensitivities_two_routes_agree():
    m = GPT2Model(GPT2Spec(**{**SMALL, "n_layer": 2}))
    theta = m.init_params()
    W = model_windows(m, [(), (1,), (4, 2), (3, 3, 0, 1)])
    per_example = m.sensitivities(theta, W)  # (B, P, V)
    assert per_example.shape == (4, m.num_params, 5)
    assert rel(per_example, sensitivities_autograd(m, theta, W)) < RTOL


@pytest.mark.parametrize("n_layer", [1, 2])
def test_sensitivities_match_finite_differences(n_layer):
    m = GPT2Model(GPT2Spec(**{**SMALL, "n_layer": n_layer, "init_seed": 7, "init_scale": 0.7}))
    theta = m.init_params()
    W = model_windows(m, [(), (2,), (4, 1, 3)])
    J = m.sensitivities(theta, W)  # (B, P, V)
    rng = np.random.default_rng(0)
    idx = [off + int(rng.integers(np.prod(shape))) for _, shape, off in m.layout()]
    idx += [off for _, _, off in m.layout()]
    for i in idx:
        tp, tm = theta.copy(), theta.copy()
        tp[i] += FD_STEP
        tm[i] -= FD_STEP
        fd = (m.logits(tp, W) - m.logits(tm, W)) / (2 * FD_STEP)  # (B, V)
        err = np.max(np.abs(fd - J[:, i, :])) / np.max(np.abs(J))
        assert err < FD_RTOL, f"parameter {i}: relative error {err:.2e}"


def test_gelu_clip_changes_no_value():
    u = np.linspace(-200.0, 200.0, 400_001)  # (n,)
    plain = 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3)))
    np.testing.assert_array_equal(gpt2_module.gelu_new(u), plain)


@pytest.mark.parametrize("scale", [1e-8, 1e3])
def test_extreme_init_scale_is_finite(scale):
    m = GPT2Model(GPT2Spec(**{**SMALL, "init_scale": scale}))
    theta = m.init_params()
    W = model_windows(m, [(), (1, 2), (4, 4, 4, 0)])
    assert np.all(np.isfinite(m.logits(theta, W)))
    assert np.all(np.isfinite(m.sensitivities(theta, W)))


@pytest.mark.parametrize("field, value", [
    ("vocab_size", 0), ("vocab_size", 2.5), ("n_positions", 0), ("embed_dim", -1),
    ("n_layer", 0), ("n_head", 0), ("n_head", 3), ("n_layer", True), ("eos", "yes"),
    ("init_seed", -1), ("init_scale", float("nan")), ("init_scale", "1")])
def test_bad_spec_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"model.{field}"):
        GPT2Spec(**{**SMALL, field: value})


def test_vocab_of_one_needs_eos_off():
    with pytest.raises(ValueError, match="model.vocab_size"):
        GPT2Spec(**{**SMALL, "vocab_size": 1})
    assert GPT2Model(GPT2Spec(**{**SMALL, "vocab_size": 1, "eos": False})).vocab_size == 1


def test_describe_round_trips():
    m = GPT2Model(GPT2Spec(**SMALL))
    d = m.describe()
    assert d["arch"] == "gpt2" and d["bos"] == 5
    keys = {k: v for k, v in d.items() if k not in ("arch", "bos")}
    assert GPT2Spec(**keys) == m.spec


@settings(max_examples=20, derandomize=True, database=None, deadline=None)
@given(data=st.data(), V=st.integers(1, 4), eos=st.booleans(), n_layer=st.integers(1, 2),
       H=st.sampled_from([1, 2, 3]), hd=st.integers(1, 3), N=st.integers(1, 5),
       seed=st.integers(0, 2 ** 16), scale=st.floats(0.1, 2.0))
def test_random_specs_equal_naive_loops(data, V, eos, n_layer, H, hd, N, seed, scale):
    eos = eos and V >= 2
    spec = GPT2Spec(vocab_size=V, eos=eos, n_positions=N, embed_dim=H * hd, n_layer=n_layer,
                    n_head=H, init_seed=seed, init_scale=scale)
    m = GPT2Model(spec)
    theta = m.init_params()
    seq = data.draw(st.lists(st.integers(0, V - 1), max_size=N - 1))
    ref = naive_outputs(spec, theta, seq)  # (len(seq)+1, V)
    got = m.logits(theta, model_windows(m, [seq[:t] for t in range(len(seq) + 1)]))
    assert rel(got, ref) < RTOL


def test_all_states_of_a_small_task_are_distinct_and_finite():
    """All 21 states of V=5 (EOS on), T=3 in one batch: finite, and no two alike."""
    m = GPT2Model(GPT2Spec(**SMALL))
    states = [s for t in range(3) for s in itertools.product(range(1, 5), repeat=t)]
    z = m.logits(m.init_params(), model_windows(m, states))  # (21, V)
    assert z.shape == (21, 5) and np.all(np.isfinite(z))
    assert len({tuple(np.round(r, 12)) for r in z}) == 21
