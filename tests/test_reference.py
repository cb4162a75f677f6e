"""The readable judge (fisher_ref/reference.py): held to the brute force of tests/cases.py
and to every shipped golden file; one file that imports nothing of the fast engine; its
refusals. tests/engine/test_fast.py holds the fast engine to it quantity by quantity."""
import ast
from pathlib import Path

import numpy as np
import pytest

from cases import RTOL, get_brute, get_task, rel
from fisher_ref import EnumerationTooLarge, FunctionReward, exact, load_config, task_from_json
from fisher_ref.golden.check import RTOL as GOLDEN_RTOL, compare_golden, golden_cases
from fisher_ref.golden.export import golden_arrays
from fisher_ref.reference import exact_reference, reference_cost
from tests.engine.test_fast import natural_scale

SOURCE = Path(__file__).resolve().parents[1] / "fisher_ref" / "reference.py"
MAX_LINES = 400  # a reader holds it in one hand (docs: about 330)


@pytest.mark.parametrize("case", ["config:no_eos", "config:offpolicy_temperature",
                                  "masked_eos", "custom_reward", "tabular_context2"])
def test_judge_equals_the_brute_force(case):
    """Every score by autograd of log p at each state, every response by recursion
    (tests/cases.py): the sequence Fisher, cross terms, path sums and gradient on policy,
    and with a sampler the centered stream's."""
    task, b = get_task(case), get_brute(case)
    r = exact_reference(task, progress=False)
    h, hc = b["xi"].sum(axis=1), b["xc"].sum(axis=1)  # (M, P) each
    on = r.streams["policy"]
    assert rel(on.sequence_fisher, b["P"] @ h ** 2) <= RTOL
    assert rel(on.cross_terms, np.einsum("m,mup,mtp->utp", b["P"], b["xi"], b["xi"])) <= RTOL
    assert rel(on.token_fisher_sum_paths, b["P"] @ b["g"]) <= RTOL
    assert rel(on.gradient, b["P"] @ ((b["R"] - on.baseline)[:, None] * h),
               natural_scale(on)) <= RTOL
    if task.sampler is not None:
        c = r.streams["centered"]
        assert rel(c.sequence_fisher, b["Pmu"] @ hc ** 2) <= RTOL
        assert rel(c.token_fisher_sum_paths, b["Pmu"] @ b["gc"]) <= RTOL


def test_reference_flag_runs_the_judge():
    """``exact(reference=True)`` is this file's run (the same numbers, bit for bit)."""
    task = load_config("offpolicy_stale")
    a = exact(task, reference=True, progress=False, topk=(1,))
    b = exact_reference(task, progress=False, topk=(1,))
    for name in b.streams:
        assert np.array_equal(a.streams[name].sequence_fisher, b.streams[name].sequence_fisher)
    assert np.array_equal(a.gradient_autodiff, b.gradient_autodiff)


@pytest.mark.parametrize("golden", golden_cases())
def test_judge_reproduces_every_golden_file(golden):
    """Each shipped file's task and theta, run through the judge and written as a golden
    file's arrays, equal the committed arrays at the golden tolerance."""
    data = dict(golden.meta["task"], theta=golden["theta"].tolist())
    task = task_from_json(data, name=golden.name)
    r = exact_reference(task, progress=False, keep_states=True, keep_sequences=True)
    arrays = golden_arrays(task, r, matrices=golden.meta["matrices"])
    result = compare_golden(golden, arrays, rtol=GOLDEN_RTOL)
    assert result.passed, f"{golden.name}:\n{result}"


def _imported_modules(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.module or ""


def test_judge_is_one_short_file_apart_from_the_fast_engine():
    """The judge imports nothing of the fast engine or of the parallel machinery (the
    import-linter contract in pyproject.toml checks the imports of its imports too)."""
    mods = list(_imported_modules(SOURCE))
    assert "fisher_ref.numerics" in mods  # the walk found the imports
    bad = [m for m in mods if m.split(".")[:2] in (["fisher_ref", "engine"],
                                                   ["fisher_ref", "parallel"])]
    assert not bad, bad
    lines = len(SOURCE.read_text().splitlines())
    assert lines <= MAX_LINES, f"fisher_ref/reference.py has {lines} lines"


def test_refusals_name_the_limit():
    task = load_config("default")
    with pytest.raises(EnumerationTooLarge, match="estimated memory .* exceeds the limit"):
        exact_reference(task, progress=False, max_bytes=1000)
    with pytest.raises(EnumerationTooLarge, match="estimated time .* exceeds the limit"):
        exact_reference(task, progress=False, max_seconds=1e-6)
    with pytest.raises(EnumerationTooLarge, match="no machine lists"):
        exact_reference(task.with_(max_len=10 ** 6), progress=False)


@pytest.mark.parametrize("name", ["offpolicy_temperature", "gpt2_small", "tabular"])
def test_cost_bounds_the_memory_the_judge_holds(name):
    """The estimate the refusal reads is an upper bound of the peak memory the run
    allocates (numpy's arrays and Python's objects, as tracemalloc counts them)."""
    import tracemalloc
    task = load_config(name)
    topk = (1,) if task.sampler is not None else ()
    cost = reference_cost(task, n_streams=4 if topk else 1)
    tracemalloc.start()
    r = exact_reference(task, progress=False, topk=topk, keep_states=True, keep_sequences=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert (cost.n_states, cost.n_responses) == (len(r.states["depth"]), len(r.sequences["prob"]))
    assert peak <= cost.bytes, (peak, cost.bytes)


@pytest.mark.parametrize("kw, error, message", [
    (dict(topk=(1,)), ValueError, "topk centering needs a sampler"),
    (dict(topk=(0,)), ValueError, "topk entries must be positive integers"),
    (dict(quantities="Fisher"), ValueError, "quantities must be one of"),
    (dict(quantities="fisher", keep_sequences=True), ValueError, "keep_sequences=True needs"),
    (dict(max_bytes="8 GiB"), TypeError, "max_bytes must be a positive number"),
])
def test_bad_arguments_are_refused_by_name(kw, error, message):
    with pytest.raises(error, match=message):
        exact_reference(load_config("default"), progress=False, **kw)


def test_a_task_is_required():
    with pytest.raises(TypeError, match="load_config"):
        exact_reference("default")


def test_fisher_quantities_evaluate_no_reward():
    """``quantities="fisher"`` computes no reward (a reward that fails is never called),
    and keeps no per-response arrays."""
    def broken(prompt, response):
        raise AssertionError("the reward was called")
    task = load_config("default").with_(reward=FunctionReward(broken))
    r = exact_reference(task, progress=False, quantities="fisher")
    full = exact_reference(load_config("default"), progress=False)
    assert r.sequences is None and r.computed == ("score_mean", "sequence_fisher",
                                                  "token_fisher_sum")
    assert np.array_equal(r.sequence_fisher, full.sequence_fisher)


def test_the_independent_reference_shares_no_code():
    """tests/independent_reference.py stays independent of the package (its docstring says
    why it is kept beside the judge): it imports nothing of fisher_ref."""
    path = Path(__file__).resolve().parent / "independent_reference.py"
    mods = list(_imported_modules(path))
    assert "autograd" in mods and not [m for m in mods if m.split(".")[0] == "fisher_ref"]


def test_a_constant_reward_has_exactly_zero_spread():
    """Every response of the same length: E[R] is that reward exactly (not its sum times a
    total probability of 1 - 1e-16), so std(A), the advantages and the covariance are 0.
    (Hypothesis found the rounding in a GPT-2 task; the fast engine keeps it exact.)"""
    task = load_config("tabular")  # total probability 1 - 2e-16
    task = task.with_(reward=FunctionReward(lambda prompt, response: 3.0), baseline="mean")
    r = exact_reference(task, progress=False)
    assert r.expected_reward == 3.0 and r.reward_std == 0.0
    assert not r.sequences["advantage"].any() and not r.covariance.any()
