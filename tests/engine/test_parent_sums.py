"""The regrouped sums of ``fisher_ref.engine.parent_sums`` against plain sums over responses.

Random parents (prefix-sorted generated tokens, score histories, running sums
``H``, weights, rewards and last scores) are drawn; every response
``(g, a)`` gets its own ``h = H_g + xi_{g,a}`` and score history here, and each
sum is taken response by response with loops. The grouped functions must give
the same numbers at 1e-10.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cases import RTOL, rel
from fisher_ref.engine.parent_sums import (history_cross, level_sums, one_token_sums, prefix_starts,
                                segment_sum, window_products)


@st.composite
def parent_blocks(draw):
    """``B`` parents at depth ``d`` with ``k`` complete responses each."""
    d, P, k = draw(st.integers(0, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    B = draw(st.integers(1, 9))
    seed = draw(st.integers(0, 2 ** 31))
    rng = np.random.default_rng(seed)
    gen = np.array(sorted(map(tuple, rng.integers(0, 3, size=(B, d)))), dtype=int).reshape(B, d)
    prompt = np.sort(rng.integers(0, 2, size=B))
    key = [(p,) + tuple(g) for p, g in zip(prompt, gen)]
    keep = np.array([True] + [key[i] != key[i - 1] for i in range(1, B)])  # distinct parents
    gen, prompt = gen[keep], prompt[keep]
    B = len(prompt)
    # parents sharing a prefix share the scores of that prefix
    hist = np.zeros((B, d, P))
    for t in range(d):
        for b in range(B):
            same = [c for c in range(b) if prompt[c] == prompt[b] and (gen[c, :t + 1] ==
                                                                        gen[b, :t + 1]).all()]
            hist[b, t] = hist[same[0], t] if same else rng.normal(size=P)
    return dict(prompt=prompt, gen=gen, hist=hist, H=rng.normal(size=(B, P)) * 2,
                G=rng.normal(size=(B, P)), xi=rng.normal(size=(B, k, P)),
                w=rng.random((B, k)), R=rng.normal(size=(B, k)),
                rho=rng.random((B, k)) * draw(st.sampled_from([0.0, 1.0])))


def brute(b):
    """Every sum response by response (loops over parents and tokens)."""
    B, k, P = b["xi"].shape
    d = b["hist"].shape[1]
    out = {key: 0.0 for key in ("mass", "R")}
    for key in ("h", "Rh", "h2", "Rh2", "R2h2", "h4", "g", "g2", "is_h", "is_Rh"):
        out[key] = np.zeros(P)
    out["cross"], out["cross4"] = np.zeros((d + 1, d + 1, P)), np.zeros((d + 1, d + 1, P))
    for g in range(B):
        for a in range(k):
            w, R, rw = b["w"][g, a], b["R"][g, a], b["rho"][g, a] * b["w"][g, a]
            h = b["H"][g] + b["xi"][g, a]
            hist = np.concatenate([b["hist"][g], b["xi"][g, a][None]])  # (d+1, P)
            out["mass"] += w
            out["R"] += w * R
            for key, v in (("h", w * h), ("Rh", w * R * h), ("h2", w * h * h),
                           ("Rh2", w * R * h * h), ("R2h2", w * R * R * h * h),
                           ("h4", w * h ** 4), ("g", w * b["G"][g]), ("g2", w * b["G"][g] ** 2),
                           ("is_h", rw * h), ("is_Rh", rw * R * h)):
                out[key] = out[key] + v
            out["cross"] += w * hist[:, None] * hist[None, :]
            out["cross4"] += w * hist[:, None] ** 2 * hist[None, :] ** 2
    return out


@settings(derandomize=True, database=None, deadline=None, max_examples=150)
@given(parent_blocks())
def test_level_sums_equal_sums_over_responses(b):
    w, xi, d = b["w"], b["xi"], b["hist"].shape[1]
    X = [np.einsum("bk,bkp->bp", w, xi ** n) for n in (1, 2, 3, 4)]
    C = np.stack([w * b["R"], w * b["R"] ** 2], axis=1)  # (B, 2, k)
    Z = np.einsum("bik,bkp->bip", C, xi)
    starts = prefix_starts(b["prompt"], b["gen"])
    rho_w = b["rho"] * w if b["rho"].any() else None

    def hist_at(t, at):
        return b["hist"][at, t]

    got = level_sums(b["H"], b["G"], hist_at, w, b["R"], rho_w, X[:3], starts, Z,
                     [X[0].sum(0), X[1].sum(0), X[3].sum(0)])
    # the pure reward terms are accumulated elsewhere in the engine: added here
    got["Rh"] = got["Rh"] + Z[:, 0].sum(0)
    got["Rh2"] = got["Rh2"] + np.einsum("bk,bkp->p", C[:, 0], xi ** 2)
    got["R2h2"] = got["R2h2"] + np.einsum("bk,bkp->p", C[:, 1], xi ** 2)
    if rho_w is None:
        got["is_h"], got["is_Rh"] = np.zeros_like(got["h"]), np.zeros_like(got["h"])
    else:
        got["is_h"] = got["is_h"] + np.einsum("bk,bkp->p", rho_w, xi)
        got["is_Rh"] = got["is_Rh"] + np.einsum("bk,bkp->p", rho_w * b["R"], xi)
    want = brute(b)
    assert set(got) == set(want)
    for key in want:
        assert rel(got[key], want[key], max(np.abs(want[key]).max(), 1.0)) <= RTOL, (key, d)


@settings(derandomize=True, database=None, deadline=None, max_examples=150)
@given(parent_blocks())
def test_one_token_sums_equal_sums_over_responses(b):
    """One complete response per parent (its first token's): h formed whole, every sum
    against the brute force response by response, with the reward and importance terms
    without H added as the window cache adds them."""
    b = dict(b, xi=b["xi"][:, :1], w=b["w"][:, :1], R=b["R"][:, :1], rho=b["rho"][:, :1])
    w, xi, R = b["w"], b["xi"], b["R"]
    starts = prefix_starts(b["prompt"], b["gen"])
    rho_w = b["rho"] * w if b["rho"].any() else None

    def hist_at(t, at):
        return b["hist"][at, t]

    got = one_token_sums(b["H"], b["G"], hist_at, w, R, rho_w, xi[:, 0], starts)
    got["Rh"] = got["Rh"] + np.einsum("bk,bkp->p", w * R, xi)
    got["Rh2"] = got["Rh2"] + np.einsum("bk,bkp->p", w * R, xi ** 2)
    got["R2h2"] = got["R2h2"] + np.einsum("bk,bkp->p", w * R * R, xi ** 2)
    if rho_w is None:
        got["is_h"], got["is_Rh"] = np.zeros_like(got["h"]), np.zeros_like(got["h"])
    else:
        got["is_h"] = got["is_h"] + np.einsum("bk,bkp->p", rho_w, xi)
        got["is_Rh"] = got["is_Rh"] + np.einsum("bk,bkp->p", rho_w * R, xi)
    want = brute(b)
    assert set(got) == set(want)
    for key in want:
        assert rel(got[key], want[key], max(np.abs(want[key]).max(), 1.0)) <= RTOL, key


@settings(derandomize=True, database=None, deadline=None, max_examples=150)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=8), st.integers(1, 3),
       st.integers(0, 2 ** 31))
def test_segment_sum_equals_a_loop(sizes, P, seed):
    x = np.random.default_rng(seed).normal(size=(sum(sizes), P))
    starts = np.cumsum([0] + sizes[:-1])
    want = np.array([x[s:s + n].sum(axis=0) for s, n in zip(starts, sizes)])
    assert rel(segment_sum(x, starts), want) <= RTOL
    assert rel(segment_sum(x[:, 0], starts), want[:, 0]) <= RTOL
    w = np.random.default_rng(seed + 1).normal(size=len(x))
    want_w = np.array([w[s:s + n] @ x[s:s + n] for s, n in zip(starts, sizes)])
    assert rel(segment_sum(x, starts, w), want_w) <= RTOL  # weighted rows


def test_segment_sum_takes_each_path():
    x = np.arange(12.0).reshape(6, 2)
    assert segment_sum(x, np.array([0, 2, 4])).tolist() == [[2, 4], [10, 12], [18, 20]]
    assert segment_sum(x, np.array([0, 1, 3, 5])).tolist() == [[0, 1], [6, 8], [14, 16], [10, 11]]
    assert segment_sum(x, np.array([0, 1, 4])).tolist() == [[0, 1], [12, 15], [18, 20]]
    assert segment_sum(x, np.array([0, 1, 3, 4])).tolist() == [[0, 1], [6, 8], [6, 7],
                                                               [18, 20]]  # unequal: sparse
    w = np.array([1.0, 2.0, 0.5, -1.0, 3.0, 0.0])
    for starts in ([0, 2, 4], [0, 1, 3, 5], [0, 1, 3, 4]):  # weighted: reshape, ends, sparse
        want = [w[a:b] @ x[a:b] for a, b in zip(starts, starts[1:] + [6])]
        assert segment_sum(x, np.array(starts), w).tolist() == np.array(want).tolist()


def test_prefix_starts_by_hand():
    prompt = np.array([0, 0, 0, 1])
    gen = np.array([[1, 1], [1, 2], [2, 1], [2, 1]])
    assert [s.tolist() for s in prefix_starts(prompt, gen)] == [[0, 2, 3], [0, 1, 2, 3]]


@settings(derandomize=True, database=None, deadline=None, max_examples=60)
@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2 ** 31))
def test_window_products_equal_a_loop(B, V, P, seed):
    """Per window matrix products (every token terminal) and the gathered form (EOS only)."""
    rng = np.random.default_rng(seed)
    xi = rng.normal(size=(3, V, P))
    rows = rng.integers(0, 3, size=B)
    for K in (np.arange(V), np.array([0])):
        C = rng.normal(size=(B, 2, len(K)))
        want = np.array([[sum(C[b, i, j] * xi[rows[b], a] for j, a in enumerate(K))
                          for i in range(2)] for b in range(B)])
        assert rel(window_products(C, xi, rows, K), want) <= RTOL


def test_history_cross_at_the_root_is_empty():
    c, c4 = history_cross(None, np.ones(2), np.ones((2, 3)), np.ones((2, 3)), [])
    assert c.shape == c4.shape == (1, 1, 3) and not c.any()


@pytest.mark.parametrize("chunk", [1, 2 ** 18])
def test_held_products_equal_a_loop(chunk):
    """The window cache's deferred products, batched per window of equal parent counts,
    against a loop over parents; with one window per batch and with many."""
    from fisher_ref.engine.parent_sums import held_products
    rng = np.random.default_rng(3)
    U, V, P, B, n = 5, 4, 7, 13, 2
    xi, y1, y3 = rng.normal(size=(U, V, P)), rng.normal(size=(U, P)), rng.normal(size=(U, P))
    held = rng.normal(size=(B + 3, P))
    rows = rng.integers(0, U, size=B)  # windows with 0 to several parents
    C, r, src = rng.normal(size=(B, n, V)), rng.random(B), rng.permutation(B + 3)[:B]
    total, ry = held_products(xi, y1, y3, held, rows, C, r, src, chunk)
    want_t = sum(held[src[b]] * (C[b] @ xi[rows[b]]) for b in range(B))  # (n, P)
    want_r = sum(r[b] * held[src[b]] * np.stack([y1[rows[b]], y3[rows[b]]]) for b in range(B))
    np.testing.assert_allclose(total, want_t, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ry, want_r, rtol=1e-12, atol=1e-12)
