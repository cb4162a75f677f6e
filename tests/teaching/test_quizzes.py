"""Quizzes: every correct answer is proved by a computation with fisher_ref,
every quiz is used in exactly one notebook, and check() grades correctly."""
import doctest
import itertools
import re
import sys
from pathlib import Path

import numpy as np
import nbformat
import pytest

import fisher_ref.teaching.quizzes as quizzes
from fisher_ref import exact, list_configs, load_config
from fisher_ref import token_fisher, token_fisher_pairwise, uniform_token_fisher
from fisher_ref.teaching.views import pairwise_terms, response_token_scores, state_sensitivities
from fisher_ref.models.base import state_windows
from fisher_ref.models.base import windows_for
from fisher_ref.teaching.training import bf16_changed, policy_gradient
from fisher_ref.monte_carlo.estimators import mean_estimate
from fisher_ref.numerics import softmax
from fisher_ref.teaching.quizzes import LETTERS, QUIZZES, check
from fisher_ref.checks.tolerances import rel_err
from tests.teaching.test_lesson08 import PROOFS_08

LESSONS = Path(__file__).resolve().parents[2] / "lessons"
RTOL = 1e-10        # exact float64 identities
ZERO_ATOL = 1e-12   # "zero" relative to the scale of the quantity
SEED_QUIZZES = {"seq-to-token", "likely-alike"}
OFFPOLICY = ["offpolicy_temperature", "offpolicy_stale"]

_CACHE = {}


def result(name, topk=()):
    key = (name, topk)
    if key not in _CACHE:
        _CACHE[key] = exact(load_config(name), topk=topk, progress=False)
    return _CACHE[key]


def correct_letter(quiz_id):
    return LETTERS[QUIZZES[quiz_id].correct]


# --------------------------------------------------------------------------- proofs

def prove_seq_to_token():
    """Conditional score means vanish, hence cross terms vanish and F = E[sum f];
    yet single token scores are not zero (refutes 'every token score is zero')."""
    for name in ("default", "no_eos", "weighted_prompts"):
        r = result(name)
        pol = r.streams["policy"]
        T = r.cross_terms.shape[0]
        diag = max(np.abs(r.cross_terms[t, t]).max() for t in range(T))
        assert pol.cond_score_max.max() <= ZERO_ATOL * max(1.0, diag)
        for u in range(T):
            for t in range(T):
                if u != t:
                    assert np.abs(r.cross_terms[u, t]).max() <= ZERO_ATOL * diag
        assert rel_err(r.sequence_fisher, r.token_fisher_sum) <= RTOL
    task = load_config("default")
    xi = response_token_scores(task, 0, result("default").sequences["tokens"][-1])
    assert np.abs(xi).max() > 1e-3
    return "averages to zero given the tokens before it"


def prove_cross_term_single():
    """Per-response products xi_1 xi_2 take both signs; their probability-weighted mean is 0."""
    task, r = load_config("default"), result("default")
    seqs = r.sequences
    XI = np.stack([response_token_scores(task, p, t)
                   for p, t in zip(seqs["prompt"], seqs["tokens"])])  # (M, T, P)
    prod = XI[:, 0, :] * XI[:, 1, :]  # (M, P)
    assert (prod > 1e-3).any() and (prod < -1e-3).any()
    mean = seqs["prob"] @ prod  # (P,)
    assert np.abs(mean).max() <= ZERO_ATOL * np.abs(prod).max()
    assert np.abs(mean - r.cross_terms[0, 1]).max() <= ZERO_ATOL * np.abs(prod).max()
    return "only its average over all responses is zero"


def prove_uniform_shift():
    rng = np.random.default_rng(0)
    p = softmax(rng.normal(size=(6, 7)))  # (B, V)
    J = rng.normal(size=(6, 4, 7))  # (B, P, V)
    c = rng.normal(scale=10.0, size=(6, 4, 1))
    f = token_fisher(p, J)
    assert f.min() > 1e-3  # not zero: refutes 'becomes zero'
    assert rel_err(token_fisher(p, J + c), f) <= RTOL
    assert rel_err(token_fisher_pairwise(p, J + c), f) <= RTOL
    return "unchanged"


def prove_tea_coffee():
    p = np.array([0.46, 0.40, 0.08, 0.05, 0.01])
    J = np.array([[1.0, 1.0, 0.0, 0.0, 0.0],    # theta_1: both up
                  [1.0, -1.0, 0.0, 0.0, 0.0]])  # theta_2: tea up, coffee down
    f = token_fisher(p, J)
    assert f[1] > 5 * f[0] > 0
    return "changes the preference between the two likely tokens"


def prove_likely_alike():
    """Sensitivities nearly equal on likely tokens: f small against f_unif and against a
    parameter of the same size that separates the likely tokens."""
    rng = np.random.default_rng(1)
    p = np.array([0.3, 0.3, 0.3] + [0.02] * 5)
    alike = 2.0 + np.concatenate([0.01 * rng.normal(size=3), rng.normal(size=5)])
    apart = alike.copy()
    apart[:3] = [2.0, -2.0, 0.0]
    J = np.stack([alike, apart])[None]  # (1, 2, V)
    f = token_fisher(p[None], J)[0]
    fu = uniform_token_fisher(J)[0]
    assert f[0] < 0.25 * fu[0]
    assert f[0] < 0.1 * f[1]
    likely_part = pairwise_terms(p, J[0])[0][:3, :3].sum()
    assert likely_part < 1e-3 * f[1]
    return "A small token Fisher"


def prove_ratio_below_one():
    """The permutation average of f is c f_unif with c <= 1 (brute force over all V!
    arrangements of p, no library formula); the default model's share of ratios below 1 is
    matched by shuffled p; a ratio below 1 can come with mass on a token moved *apart*."""
    rng = np.random.default_rng(2)
    V = 5
    p = softmax(3.0 * rng.normal(size=(1, V)))[0]  # (V,) concentrated
    J = rng.normal(size=(4, V))  # (P, V)
    brute = np.mean([token_fisher(p[list(q)], J) for q in itertools.permutations(range(V))],
                    axis=0)
    c = (1 - (p ** 2).sum()) / (1 - 1 / V)
    assert c < 1 and rel_err(brute, c * uniform_token_fisher(J)) <= RTOL
    # refutes A: ratio < 1 while the likely token is moved apart from the rest
    q = np.array([0.97, 0.01, 0.01, 0.01])
    j = np.array([[1.0, 0.0, 0.0, 0.0]])
    f, fu = token_fisher(q, j)[0], uniform_token_fisher(j)[0]
    shuffled = np.mean([token_fisher(q[list(o)], j)[0]
                        for o in itertools.permutations(range(4))])
    assert f < fu and f > shuffled  # below uniform, above its own shuffle: anti-aligned
    # refutes B: a uniform model gives ratio exactly 1
    assert rel_err(token_fisher(np.full(V, 1.0 / V), J), uniform_token_fisher(J)) <= RTOL
    # on the default model, shuffling p at each state keeps the share below 1 about where it is
    task, r = load_config("default"), result("default")
    st = r.states
    Js = state_sensitivities(task, st)  # (N, P, V)
    fu_all = uniform_token_fisher(Js)  # (N, P)
    ok = fu_all > 1e-12 * fu_all.max()
    w = np.broadcast_to(st["reach"][:, None], ok.shape)[ok]

    def share(ff):
        return (w * (ff[ok] < fu_all[ok])).sum() / w.sum()

    gen = np.random.default_rng(5)
    shuf = [share(token_fisher(gen.permuted(st["probs"], axis=1), Js)) for _ in range(200)]
    actual = share(token_fisher(st["probs"], Js))
    assert min(shuf) <= actual <= max(shuf) and min(shuf) > 0.5
    return "Little about alignment"


def prove_confident_state():
    task = load_config("default")
    toks = result("default").states["tokens"][:1]
    W = state_windows(toks, (toks >= 0).sum(axis=1), task.model.context, task.model.bos)
    z = task.model.logits(task.theta, W)  # (1, V)
    from fisher_ref.models.sensitivities import sensitivities
    J = sensitivities(task.model, task.theta, W)  # (1, P, V)
    fs = [token_fisher(softmax(b * z), J)[0].max() for b in (1.0, 5.0, 20.0, 40.0)]
    assert all(a > b for a, b in zip(fs, fs[1:]))
    assert fs[-1] < 1e-8 * fs[0]
    return "It goes to zero"


def prove_zero_fisher_zero_gradient():
    for name in list_configs():
        r = result(name)
        scale = max(np.abs(r.gradient).max(), 1e-300)
        assert np.all(np.abs(r.gradient) <= r.bound * (1 + RTOL) + ZERO_ATOL * scale)
        zero = r.sequence_fisher == 0
        if zero.any():
            assert np.abs(r.gradient[zero]).max() <= ZERO_ATOL * scale
    assert (result("default").sequence_fisher == 0).sum() >= 1  # the case does occur
    return "Only zero"


def prove_constant_baseline():
    """Two routes: the stream's shift formula, and exact() rerun with b - 5 as baseline."""
    task, r = load_config("default"), result("default")
    assert rel_err(r.streams["policy"].gradient_with_constant(5.0), r.gradient) <= RTOL
    shifted = exact(task.with_(baseline=task.baseline - 5.0), progress=False)
    assert rel_err(shifted.gradient, r.gradient) <= RTOL
    return "Nothing: $E[h] = 0$"


def prove_centering_needs_mu():
    for name in OFFPOLICY:
        task = load_config(name)
        V = task.model.vocab_size
        r = result(name, tuple(range(1, V + 1)))
        assert np.abs(r.streams["raw"].score_mean).max() > 1e-3          # refutes C
        assert np.abs(r.streams["centered"].score_mean).max() <= ZERO_ATOL
        assert np.abs(r.streams[f"top{V}"].score_mean).max() <= ZERO_ATOL
        for k in range(1, V):                                              # partial mu: biased
            assert np.abs(r.streams[f"top{k}"].score_mean).max() > 1e-3
    return "The whole next-token distribution"


def prove_uncentered_constant():
    c = 10.0
    for name in OFFPOLICY:
        task = load_config(name)
        r = result(name)
        raw, cen = r.streams["raw"], r.streams["centered"]
        shifted = exact(task.with_(baseline=task.baseline - c), progress=False)
        drift = shifted.streams["raw"].gradient - raw.gradient
        assert rel_err(drift, c * raw.score_mean) <= 1e-9
        assert (np.abs(shifted.streams["raw"].gradient) > raw.bound * (1 + 1e-6)).any()
        assert rel_err(shifted.streams["centered"].gradient, cen.gradient) <= RTOL
        assert rel_err(shifted.streams["raw"].sequence_fisher, raw.sequence_fisher) <= RTOL
    return "for a large enough $c$ it exceeds"


def prove_rao_blackwell():
    for name in list_configs():
        r = result(name)
        pol = r.streams["policy"]
        v = pol.variances
        live = v["h2"] > ZERO_ATOL * v["h2"].max()
        assert np.all(v["token_sum"][live] < v["h2"][live])
        T = r.cross_terms.shape[0]
        diag = np.stack([r.cross_terms[t, t] for t in range(T)])  # (T, P): E[xi_t^2]
        assert rel_err(diag, pol.token_fisher_by_depth) <= RTOL    # E[xi_t^2 | s_t] = f(s_t)
        assert rel_err(pol.token_fisher_sum_paths, r.sequence_fisher) <= RTOL  # both unbiased
    return "replaces each sampled token's squared score"


def prove_se_scaling():
    r = result("default")
    var = r.streams["policy"].variances["h2"]
    live = var > 0
    se = lambda n: np.sqrt(var[live] / n)  # noqa: E731
    assert np.allclose(se(100) / se(10_000), 10.0, rtol=RTOL)
    x = np.random.default_rng(3).normal(size=(400, 2))
    small, large = mean_estimate(x).se, mean_estimate(np.tile(x, (100, 1))).se
    assert np.allclose(small / large, 10.0, rtol=1e-2)
    return "10 times narrower"


def prove_window():
    """The window is the last k tokens; states that share it share their distribution."""
    task, r = load_config("default"), result("default")
    m = task.model
    assert windows_for([(3, 4, 1)], m.context, m.bos).tolist() == [[4, 1]]
    st = r.states
    seen = {}
    for toks, probs in zip(st["tokens"], st["probs"]):
        toks = tuple(int(t) for t in toks if t >= 0)
        if len(toks) >= m.context:
            seen.setdefault(toks[-m.context:], []).append(probs)
    shared = [ps for ps in seen.values() if len(ps) > 1]
    assert shared  # some windows are reached from more than one state
    for ps in shared:
        assert all(np.array_equal(ps[0], q) for q in ps[1:])
    return "the last two tokens"


def prove_adam_bf16():
    """One Adam step is lr G/(|G| + eps); the set it changes at bf16 follows small |theta|,
    not high F or high |G| (default config, a step size that changes a minority)."""
    task, r = load_config("default"), result("default")
    lr, eps = 3e-4, 1e-8
    tr = policy_gradient(task, steps=1, lr=lr, optimizer="adam", eps=eps)
    assert rel_err(tr.thetas[1] - tr.thetas[0], lr * r.gradient / (np.abs(r.gradient) + eps)) <= 1e-9
    changed = bf16_changed(*tr.thetas)  # (P,)
    n = int(changed.sum())
    assert 0 < n < 0.5 * changed.size  # some change (refutes D), a minority
    got = set(np.flatnonzero(changed).tolist())

    def overlap(score):
        return len(got & set(np.argsort(-score, kind="stable")[:n].tolist())) / n

    small, by_f, by_g = overlap(-np.abs(task.theta)), overlap(r.sequence_fisher), overlap(np.abs(r.gradient))
    assert small >= 1.5 * max(by_f, by_g) and by_g < 0.5
    return "whose own magnitude"


def prove_key_bias():
    """On both GPT-2 configs, every block: the key bias's Fisher is at rounding level (a squared
    score of 1e-12 relative) while the query bias's is not (refutes D); a finite random change of
    the key bias moves no logit at any state (a route without derivatives), at the shipped theta
    and at an unrelated random theta (refutes B and C)."""
    for name in ("gpt2_small", "gpt2_offpolicy"):
        task, r = load_config(name), result(name)
        m, F = task.model, r.sequence_fisher
        d = m.spec.embed_dim
        toks = r.states["tokens"]
        W = m.windows(toks, (toks >= 0).sum(axis=1))  # (N, n_positions)
        rng = np.random.default_rng(11)
        other = 2.0 * rng.standard_normal(m.num_params)  # (P,) not the shipped theta
        offsets = {n: off for n, _, off in m.layout()}
        for layer in range(m.spec.n_layer):
            off = offsets[f"transformer.h.{layer}.attn.c_attn.bias"]
            query, key = off + np.arange(d), off + d + np.arange(d)
            assert F[key].max() <= ZERO_ATOL ** 2 * F.max()
            assert F[query].max() > 1e-6 * F.max()
            for theta in (task.theta, other):
                z = m.logits(theta, W)  # (N, V)
                moved = theta.copy()
                moved[key] += rng.standard_normal(d)
                assert np.abs(m.logits(moved, W) - z).max() <= ZERO_ATOL * np.abs(z).max()
    return "the same for every key"


PROOFS = {
    "key-bias": prove_key_bias,
    "window": prove_window,
    "adam-bf16": prove_adam_bf16,
    "seq-to-token": prove_seq_to_token,
    "cross-term-single": prove_cross_term_single,
    "uniform-shift": prove_uniform_shift,
    "tea-coffee": prove_tea_coffee,
    "likely-alike": prove_likely_alike,
    "ratio-below-one": prove_ratio_below_one,
    "confident-state": prove_confident_state,
    "zero-fisher-zero-gradient": prove_zero_fisher_zero_gradient,
    "constant-baseline": prove_constant_baseline,
    "centering-needs-mu": prove_centering_needs_mu,
    "uncentered-constant": prove_uncentered_constant,
    "rao-blackwell": prove_rao_blackwell,
    "se-scaling": prove_se_scaling,
}
PROOFS.update(PROOFS_08)  # lesson 8: proved in test_lesson08.py


def test_every_quiz_has_a_proof():
    assert set(PROOFS) == set(QUIZZES)


@pytest.mark.parametrize("quiz_id", list(QUIZZES))
def test_correct_answer_is_proved(quiz_id):
    """The computation establishes a fact; the one option that states it is the stored answer."""
    claim = PROOFS[quiz_id]()
    q = QUIZZES[quiz_id]
    holders = [k for k, opt in enumerate(q.options) if claim in opt]
    assert holders == [q.correct], (quiz_id, claim, holders, correct_letter(quiz_id))


# --------------------------------------------------------------------------- usage

def _notebook_sources():
    out = {}
    for path in sorted(LESSONS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        out[path.stem] = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    return out


def test_every_quiz_used_in_exactly_one_notebook():
    sources = _notebook_sources()
    assert len(sources) == 9
    for qid, q in QUIZZES.items():
        shown = [stem for stem, src in sources.items() if f'show("{qid}")' in src]
        checked = [stem for stem, src in sources.items() if f'check("{qid}", answer)' in src]
        assert shown == [q.lesson] and checked == [q.lesson], (qid, shown, checked)
        src = sources[q.lesson]
        assert src.count(f'show("{qid}")') == 1 and src.count(f'check("{qid}"') == 1
    used = set(re.findall(r'check\("([^"]+)"', "\n".join(sources.values())))
    assert used == set(QUIZZES), "a notebook checks a quiz id that does not exist"


def test_every_lesson_has_a_quiz_of_its_own():
    for stem in _notebook_sources():
        own = [q for q in quizzes.quizzes_for(stem) if q.id not in SEED_QUIZZES]
        assert len(own) >= 1, stem
    assert QUIZZES["seq-to-token"].lesson == "01_sequence_to_tokens"
    assert QUIZZES["likely-alike"].lesson == "03_where_mass_lands"


# --------------------------------------------------------------------------- check()

@pytest.mark.parametrize("quiz_id", list(QUIZZES))
def test_check_grades_every_option(quiz_id, capsys):
    q = QUIZZES[quiz_id]
    for k in range(len(q.options)):
        for letter in (LETTERS[k], LETTERS[k].lower(), f" {LETTERS[k]} "):
            assert check(quiz_id, letter) is (k == q.correct)
        out = capsys.readouterr().out
        assert q.feedback[k] in out
        assert ("is right" in out) == (k == q.correct)


def test_feedback_renders_as_markdown_in_a_notebook(monkeypatch):
    """In a kernel the feedback goes to IPython's display as Markdown (maths rendered), and
    check() returns None there so no bare True/False is echoed; without jupyterquiz, show()
    falls back to Markdown too."""
    display_mod = pytest.importorskip("IPython.display", reason="IPython ships with ipykernel")
    shown = []
    monkeypatch.setattr(quizzes, "in_notebook", lambda: True)
    monkeypatch.setattr(display_mod, "display", shown.append)
    monkeypatch.setitem(sys.modules, "jupyterquiz", None)  # not installed
    q = QUIZZES["se-scaling"]
    assert check("se-scaling", LETTERS[q.correct]) is None
    assert check("se-scaling", LETTERS[(q.correct + 1) % 4]) is None
    quizzes.show("se-scaling")
    assert all(isinstance(m, display_mod.Markdown) for m in shown) and len(shown) == 3
    assert q.feedback[q.correct] in shown[0].data and "**se-scaling**" in shown[0].data
    assert "is right" in shown[0].data and "is not right" in shown[1].data
    assert "Try another letter." in shown[1].data
    assert q.question in shown[2].data


def test_not_in_notebook_outside_a_kernel():
    assert quizzes.in_notebook() is False


def test_unanswered_quiz_returns_none(capsys):
    assert check("seq-to-token", None) is None
    assert "not answered yet" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["E", "", "AB", 1, 0.0, "?"])
def test_bad_answer_names_the_letters(bad):
    with pytest.raises(ValueError, match="A, B, C, D"):
        check("seq-to-token", bad)


def test_unknown_quiz_id_names_the_known_ones():
    with pytest.raises(KeyError, match="seq-to-token"):
        check("no-such-quiz", "A")


def test_render_shows_question_and_lettered_options(capsys):
    q = QUIZZES["tea-coffee"]
    text = quizzes.render_text("tea-coffee")
    assert q.question in text
    for k, opt in enumerate(q.options):
        assert f"{LETTERS[k]}. {opt}" in text
    assert all(f"**{LETTERS[k]}.**" in quizzes.render_html("tea-coffee") for k in range(4))
    quizzes.show("tea-coffee")  # outside a kernel: plain text
    assert "A. " in capsys.readouterr().out


def test_quiz_docstring_examples():
    res = doctest.testmod(quizzes, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0 and res.failed == 0
