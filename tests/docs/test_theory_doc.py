"""docs/theory.md held to the code where that is cheap.

Each test reads a table, a heading or a number the document states and
recomputes it: by brute force, from the document's own closed form, or with
the code the document describes. Prose is not tested.
"""
import ast
import itertools
import json
import re
from pathlib import Path

import autograd.numpy as anp
import numpy as np
import pytest
from scipy.stats import norm

from fisher_ref import exact, load_config
from fisher_ref.engine.plan import count_states
from fisher_ref.models.function import FunctionModel
from fisher_ref.models.mlp import MLPModel
from fisher_ref.models.base import ModelSpec
from fisher_ref.models.tabular import TabularModel
from fisher_ref.rewards import evaluate_reward, make_reward
from fisher_ref.tasks import Task
from fisher_ref.checks.identities import verify_task

DOC = Path(__file__).resolve().parents[2] / "docs" / "theory.md"
RTOL = 1e-10  # exact float64 values against the numbers the document states
VOCAB = 5  # vocabulary for the reward examples (every token they name is < 5)


@pytest.fixture(scope="module")
def doc():
    return DOC.read_text(encoding="utf-8")


def _section(doc, heading):
    """Text of the section whose heading line starts with ``heading``, up to the
    next heading of the same or a higher level."""
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
    assert start is not None, f"docs/theory.md has no heading starting {heading!r}"
    level = len(heading) - len(heading.lstrip("#"))
    end = next((i for i in range(start + 1, len(lines))
                if re.match(r"#{1,%d} " % level, lines[i])), len(lines))
    return "\n".join(lines[start:end])


def _table(text):
    """Rows (lists of stripped cells, backticks removed) of the first Markdown table in ``text``."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert len(rows) >= 3, "expected a Markdown table"
    cells = [[c.strip().strip("`") for c in r.strip().strip("|").split("|")] for r in rows]
    return cells[2:]  # skip the header and the |---| line


def _shape(expr, sizes):
    """Evaluate a shape cell such as ``(V+1, d)`` or ``((V+1)^k, V)``."""
    tree = ast.parse(expr.replace("^", "**"), mode="eval")
    allowed = (ast.Expression, ast.Tuple, ast.BinOp, ast.Add, ast.Mult, ast.Pow, ast.Name,
               ast.Constant, ast.Load)
    assert all(isinstance(n, allowed) for n in ast.walk(tree)), f"unexpected shape {expr!r}"
    return tuple(eval(compile(tree, "<shape>", "eval"), {"__builtins__": {}}, dict(sizes)))


def _stated(text, pattern):
    """The number captured by ``pattern`` in ``text`` (whitespace collapsed to single spaces)."""
    m = re.search(pattern, " ".join(text.split()))
    assert m, f"docs/theory.md no longer states a number matching {pattern!r}"
    return float(m.group(1))


def _sizes(cell):
    """``"V=5, k=2"`` -> ``{"V": 5, "k": 2}``."""
    return {k.strip(): int(v) for k, v in (kv.split("=") for kv in cell.split(","))}


# -- identities: every identity the verify table names has its section --------------

def test_every_verify_identity_has_a_section(doc):
    task = load_config("offpolicy_temperature")
    _, rows = verify_task(task, mc=200, seed=0, progress=False)
    labels = {r.identity.removeprefix("mc ").split(" ")[0] for r in rows} - {"", "-"}
    numbered = {int(k) for k in re.findall(r"^#### Identity \((\d+)\)", doc, re.M)}
    assert numbered == set(range(1, max(numbered) + 1)), f"identity numbers {sorted(numbered)}"
    for label in labels:
        if label.isdigit():
            assert int(label) in numbered, f"verify row identity {label} has no section"
        else:
            assert label in ("off", "off-policy"), f"unknown verify identity {label!r}"
            assert re.search(r"^## \d+\. Off-policy", doc, re.M), "no off-policy section"
    assert {str(k) for k in numbered} <= labels, "a documented identity that verify never checks"


# -- §7.2: counts of states and responses ------------------------------------------

def _walk_counts(V, T, eos):
    """Open states and complete responses of one prompt's tree, by walking it."""
    states = responses = 0
    frontier = [()]
    while frontier:
        s = frontier.pop()
        states += 1
        for a in range(V):
            child = s + (a,)
            if (eos and a == 0) or len(child) == T:
                responses += 1
            else:
                frontier.append(child)
    return states, responses


def _doc_closed_form(V, T, eos):
    """The closed forms of docs/theory.md §7.2."""
    beta = V - 1 if eos else V
    N = T if beta == 1 else (beta ** T - 1) // (beta - 1)
    return N, (N + (V - 1) ** T if eos else V ** T)


def test_enumeration_counts_table(doc):
    rows = _table(_section(doc, "### 7.2"))
    assert len(rows) >= 4
    for V, T, eos, N, M in rows:
        V, T, N, M, eos = int(V), int(T), int(N), int(M), {"on": True, "off": False}[eos]
        assert _walk_counts(V, T, eos) == (N, M), (V, T, eos)
        assert _doc_closed_form(V, T, eos) == (N, M), (V, T, eos)
        assert count_states(V, T, eos, n_prompts=3) == (3 * N, 3 * M), (V, T, eos)


def test_count_closed_form_beyond_the_table():
    for V, T, eos in itertools.product(range(2, 6), range(1, 5), (True, False)):
        assert _doc_closed_form(V, T, eos) == _walk_counts(V, T, eos), (V, T, eos)


# -- §4: parameter layouts and counts ----------------------------------------------

def _gpt2_layout(doc, sizes):
    """(name, shape) of every block of §4.4's table, the ``h.{l}`` rows per layer."""
    rows = _table(_section(doc, "### 4.4"))
    head = [(n, _shape(s, sizes)) for n, s in rows if "{l}" not in n and ".h." not in n]
    layer = [(n, _shape(s, sizes)) for n, s in rows if "{l}" in n]
    emb, final = head[:2], head[2:]
    blocks = [(n.replace("{l}", str(l)), s) for l in range(sizes["L"]) for n, s in layer]
    return emb + blocks + final


def test_parameter_count_table(doc):
    mlp = _table(_section(doc, "### 4.1"))
    tab = _table(_section(doc, "### 4.2"))
    rows = _table(_section(doc, "### 4.5"))
    assert {r[0] for r in rows} == {"mlp_window", "tabular", "gpt2"}
    for arch, sizes, P in rows:
        sz, P = _sizes(sizes), int(P)
        if arch == "mlp_window":
            model = MLPModel(ModelSpec(vocab_size=sz["V"], context=sz["k"], embed_dim=sz["d"],
                                       hidden=sz["H"]))
            layout = [(n, tuple(s)) for n, s, _ in model.layout()]
            assert layout == [(n, _shape(s, sz)) for n, s in mlp]
            assert model.num_params == P
            V, k, d, H = sz["V"], sz["k"], sz["d"], sz["H"]
            assert (V + 1) * d + k * d * H + H + H * V + V == P  # the §4.1 formula
        elif arch == "tabular":
            model = TabularModel(sz["V"], context=sz["k"])
            assert [(n, tuple(s)) for n, s, _ in model.layout()] == \
                [(n, _shape(s, sz)) for n, s in tab]
            assert model.num_params == P
        else:
            layout = _gpt2_layout(doc, sz)
            assert sum(int(np.prod(s)) for _, s in layout) == P
            V, npos, d, L = sz["V"], sz["n_positions"], sz["d"], sz["L"]
            assert (V + 1) * d + npos * d + L * (12 * d * d + 13 * d) + 2 * d == P
            assert len(layout) == 4 + 12 * L


# -- §5: reward examples -------------------------------------------------------------

def _is_complete(response, T, eos):
    if eos:
        ended = len(response) > 0 and response[-1] == 0
        return 0 not in response[:-1] and 1 <= len(response) <= T and (ended or len(response) == T)
    return len(response) == T


def test_reward_examples_table(doc):
    rows = _table(_section(doc, "## 5."))
    names = set()
    for spec, eos, T, response, R in rows:
        eos, spec, response = {"on": True, "off": False}[eos], json.loads(spec), json.loads(response)
        assert _is_complete(response, int(T), eos), f"{response} is no complete response at T={T}"
        reward = make_reward(spec, eos=eos)
        reward.check_vocabulary(VOCAB, eos)
        assert evaluate_reward(reward, (1,), response) == float(R), (spec, eos, response)
        names.add(spec["name"])
    assert names == {"count", "match", "length"}


# -- §8: numbers stated in the Monte Carlo section ------------------------------------

def _two_token_example():
    """The task of §8.3: V = 2, no EOS, T = 2, one parameter at theta = 0."""
    bos = 2
    slope, offset = np.zeros(9), np.zeros(9)  # indexed by window key 3*c1 + c2
    slope[3 * bos + 0], offset[3 * bos + 0] = 1.0, np.log(9.0)  # first state: p = (0.9, 0.1)
    slope[3 * 0 + 0] = 1.8  # after token 0: p = (1/2, 1/2), j = (1.8, 0)
    slope[3 * 0 + 1] = 0.2  # after token 1: p = (1/2, 1/2), j = (0.2, 0)

    def logits(theta, windows):
        key = windows[:, 0] * 3 + windows[:, 1]  # (B,)
        z0 = offset[key] + slope[key] * theta[0]  # (B,)
        return anp.stack([z0, anp.zeros(windows.shape[0])], axis=1)  # (B, 2)

    model = FunctionModel(logits, num_params=1, vocab_size=2, context=2, eos=False)
    return Task(model=model, theta=np.zeros(1), prompts=[(0,)], prompt_weights=[1.0],
                max_len=2, reward={"name": "count", "token": 1})


def test_rao_blackwell_counterexample(doc):
    text = _section(doc, "### 8.3")
    stated = {name: _stated(text, pattern) for name, pattern in (
        ("F", r"\$F = ([0-9.]+)\$"),
        ("h2", r"\\mathrm\{Var\}\(h\^2\) = ([0-9.]+)\$"),
        ("token_sum", r"\\mathrm\{Var\}\(g\) = ([0-9.]+)\$"))}
    r = exact(_two_token_example(), progress=False)
    v = r.streams["policy"].variances
    np.testing.assert_allclose(r.sequence_fisher, [stated["F"]], rtol=RTOL)
    np.testing.assert_allclose(r.token_fisher_sum, [stated["F"]], rtol=RTOL)
    np.testing.assert_allclose(v["h2"], [stated["h2"]], rtol=RTOL)
    np.testing.assert_allclose(v["token_sum"], [stated["token_sum"]], rtol=RTOL)
    assert stated["h2"] < stated["token_sum"]


def test_single_entry_bonferroni_threshold(doc):
    text = _section(doc, "### 8.4")
    stated = _stated(text, r"for a single entry this is \$([0-9.]+)\$")
    assert round(norm.isf(1e-6 / 2), 2) == stated


# -- identities (5) and (8) tell the lessons' story, with the lessons' numbers -------------
#
# Each number below is computed as lessons 3 and 4 compute it (the same functions, seeds
# and configurations) and must be what the theory page states; a sentence the lessons
# refute may not come back.

def _lesson03_shares():
    """Lesson 3: the reach-weighted share of (state, parameter) pairs with f < f_unif on the
    default model, and the range of that share over 200 shuffles of p (seed 0)."""
    from fisher_ref.teaching.views import fisher_ratio, shuffle_control
    task = load_config("default")
    r = exact(task, progress=False)
    ratio = fisher_ratio(r)
    reach = np.broadcast_to(r.states["reach"][:, None], ratio.shape)
    ok = np.isfinite(ratio) & (ratio > 0)
    below = (reach[ok] * (ratio[ok] < 1)).sum() / reach[ok].sum()
    shuffled = shuffle_control(task, r, np.random.default_rng(0), shuffles=200)["shuffled_share"]
    return below, shuffled.min(), shuffled.max()


def _lesson04_numbers():
    """Lesson 4: on the medium config the spreads of log10 cap and log10 |corr| and the top-1%
    overlap; on the default model the Fisher rank of the largest |G| and its |corr|."""
    from importlib import resources
    from fisher_ref import load_task
    medium = exact(load_task(resources.files("fisher_ref") / "configs" / "scale" / "medium.json"),
                   progress=False)
    live = (medium.bound > 0) & (medium.correlation > 0)
    (_, _, overlap, rnd), = medium.topk_overlap((0.01,))
    r = exact(load_config("default"), progress=False)
    top = int(np.argmax(np.abs(r.gradient)))
    return {"sd_cap": np.log10(medium.bound[live]).std(),
            "sd_corr": np.log10(medium.correlation[live]).std(),
            "P_medium": medium.gradient.size, "overlap": overlap, "random": rnd,
            "rank": 1 + int(np.sum(r.sequence_fisher > r.sequence_fisher[top])),
            "P": r.gradient.size, "corr": r.correlation[top]}


def refuted_sentences(text):
    """The sentences of ``text`` that state what lessons 3 and 4 refute: that the largest
    gradients sit among the largest Fisher entries (the default model's largest |G| ranks in
    the lower half by Fisher), or that the ratio to the uniform reference is an alignment
    diagnostic (on the default model its share below 1 is what shuffled p gives)."""
    flat = " ".join(text.split())
    patterns = [r"largest gradients? (?:should|must|will) sit among the largest Fisher",
                r"\*\*alignment diagnostic\*\*", r"ratio \S* ?is the alignment diagnostic"]
    return [m.group(0) for p in patterns for m in re.finditer(p, flat, flags=re.I)]


def test_refuted_sentences_finds_the_old_wording():
    old8 = ("by identity (7) the largest gradients should sit among the largest Fisher "
            "entries, and the overlap says how much more often than chance.")
    old5 = r"The ratio $f_i(s)/f^{\mathrm{unif}}_i(s)$ is the **alignment diagnostic** (id"
    assert refuted_sentences(old8) and refuted_sentences(old5)
    assert not refuted_sentences("A large Fisher is necessary, not sufficient.")


def test_theory_page_says_no_sentence_the_lessons_refute(doc):
    n = _lesson04_numbers()
    assert n["rank"] > n["P"] // 2  # the refutation of identity (8)'s old sentence, computed
    below, lo, hi = _lesson03_shares()
    assert lo <= below <= hi         # ... and of reading identity (5)'s ratio as alignment
    assert not refuted_sentences(doc), refuted_sentences(doc)


def test_identity_5_states_lesson_3s_numbers(doc):
    text = " ".join(_section(doc, "#### Identity (5)").split())
    assert "concentration" in text.split(".")[0] and r"\kappa(s)\,\alpha_i(s)" in text
    below, lo, hi = _lesson03_shares()
    m = re.search(r"([\d.]+)% of the \(state, parameter\) pairs, weighted by reach, have a "
                  r"ratio below 1, and shuffling \$p\$ .*? gives ([\d.]+)% to ([\d.]+)% over "
                  r"200 shuffles", text)
    assert m, "identity (5) no longer states lesson 3's shares"
    assert [float(x) for x in m.groups()] == [round(100 * v, 1) for v in (below, lo, hi)]
    assert "there the share is concentration" in text and lo <= below <= hi


def test_identity_8_states_lesson_4s_numbers(doc):
    text = " ".join(_section(doc, "#### Identity (8)").split())
    assert "diagnostic, not a law" in text and "necessary for a large gradient entry, not " \
        "sufficient" in text
    n = _lesson04_numbers()
    m = re.search(r"\(`configs/scale/medium.json`, ([\d,]+) parameters\) the standard deviations "
                  r"over the parameters are ([\d.]+) decades for .*? and ([\d.]+) for .*? share "
                  r"(\d+)% of their parameters against ([\d.]+)% at random", text)
    assert m, "identity (8) no longer states lesson 4's medium-model numbers"
    assert int(m.group(1).replace(",", "")) == n["P_medium"]
    assert float(m.group(2)) == round(n["sd_cap"], 2) and float(m.group(3)) == round(n["sd_corr"], 2)
    assert n["sd_corr"] > n["sd_cap"]  # the spread of the correlation outweighs the cap's
    assert int(m.group(4)) == round(100 * n["overlap"]) and float(m.group(5)) == round(
        100 * n["random"], 1)
    m = re.search(r"ranks (\d+)th of (\d+) by Fisher, with \$\|\\rho\^\{Ah\}\| = ([\d.]+)\$", text)
    assert m, "identity (8) no longer states the default model's Fisher rank of the top |G|"
    assert (int(m.group(1)), int(m.group(2))) == (n["rank"], n["P"])
    assert float(m.group(3)) == round(n["corr"], 2)
