"""The fast exact engine against the readable judge, quantity by quantity.

:func:`fisher_ref.engine.fast.exact` regroups the finite sums over responses (powers
of ``h = H + xi`` expanded, sums per parent and per window), reuses per-window
arrays between states and reuses the walk's window ids in the autodiff
gradient; the judge :func:`fisher_ref.reference.exact_reference` carries every
response's score history and sums response by response. Every array of the
result must agree at 1e-10 relative on every case of ``tests/cases.py`` (every shipped
config among them), on the tasks of ``fisher_ref/golden_data/tasks``, on
hypothesis-generated MLP and GPT-2 tasks, for small chunks (block splitting),
one parent per sub-block, a window cache too small to hold a block and deferred
products used early. Each test compares the fast engine with the judge or
with the brute force of ``tests/cases.py``, never a code path with itself.
"""
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fisher_ref import list_configs, load_config, task_from_json
from fisher_ref.golden.export import GOLDEN_TASKS, golden_task
from fisher_ref.engine.fast import exact
from fisher_ref.engine.plan import Budgets
from fisher_ref.reference import exact_reference
from fisher_ref.perf.scaling import load_scale_config

from cases import CASES, RTOL, rel, with_options

import fisher_ref.engine.fast as exact_mod
from fisher_ref.engine.plan import EngineOptions
from tests.engine.test_identities_exact import small_tasks

SCALARS = ("mass", "expected_reward", "reward_std", "baseline")
# Quantities that are 0 in exact arithmetic on a centered stream: measured against the
# score's natural scale sqrt(max E[h^2]) (their own size is roundoff).
ZERO_IN_EXACT = ("score_mean", "cond_score_max", "gradient_shift")
# Sums of R h-type terms cancel (extreme logits): measured, as in test_exact, against the
# Cauchy-Schwarz size of their summands sqrt(max(E[A^2], E[R^2])) * sqrt(max F).
GRADIENT_LIKE = ("gradient", "covariance", "importance_gradient")


def natural_scale(s):
    """Cauchy-Schwarz size of the summands of E[A h] for a StreamResult ``s``."""
    ER2 = s.reward_std ** 2 + s.expected_reward ** 2
    EA2 = s.reward_std ** 2 + (s.expected_reward - s.baseline) ** 2
    return float(np.sqrt(max(ER2, EA2)) * np.sqrt(s.sequence_fisher.max())) or 1.0


def stream_errors(a, b):
    """Largest relative error of every array of two StreamResults."""
    scale = np.sqrt(max(a.sequence_fisher.max(), b.sequence_fisher.max()))
    out = {}
    for key, va in vars(a).items():
        vb = getattr(b, key)
        if key == "variances":
            # Var X = E[X^2] - E[X]^2 cancels against E[X]^2: measured on that scale
            mean_sq = {"h": b.sequence_fisher, "h2": b.sequence_fisher ** 2,
                       "token_sum": b.token_fisher_sum_paths ** 2, "Ah": b.gradient ** 2,
                       "cross": b.cross_terms ** 2, "reward": b.expected_reward ** 2}
            for k in va:
                s = max(np.abs(va[k]).max(), np.abs(vb[k]).max(), np.abs(mean_sq[k]).max())
                out[f"variances.{k}"] = rel(va[k], vb[k], s)
        elif key in GRADIENT_LIKE:
            out[key] = rel(va, vb, max(natural_scale(b), np.abs(va).max(), np.abs(vb).max()))
        elif key == "correlation":  # |covariance| / bound: checked through both parts
            continue
        elif key in ZERO_IN_EXACT:
            out[key] = rel(va, vb, max(scale, np.abs(va).max(), np.abs(vb).max()))
        else:
            out[key] = rel(va, vb)
    return out


def result_errors(fast, ref):
    errs = {}
    assert fast.streams.keys() == ref.streams.keys()
    for name in ref.streams:
        for k, e in stream_errors(fast.streams[name], ref.streams[name]).items():
            errs[f"{name}.{k}"] = e
    on = ref.streams["policy"]
    if fast.quantities == "all":
        errs["gradient_autodiff"] = rel(fast.gradient_autodiff, ref.gradient_autodiff,
                                        max(natural_scale(on), np.abs(ref.gradient_autodiff).max()))
    else:  # quantities="fisher": the Fisher fields of every stream (vars above), states only
        assert fast.sequences is None
    scale = np.sqrt(ref.sequence_fisher.max())
    for part in ("states", "sequences")[:2 if fast.quantities == "all" else 1]:
        fa, ra = getattr(fast, part), getattr(ref, part)
        assert (fa is None) == (ra is None), part
        if ra is None:
            continue
        assert fa.keys() == ra.keys(), part
        for k in ra:
            assert fa[k].shape == ra[k].shape, (part, k)
            if fa[k].dtype.kind in "iub":
                errs[f"{part}.{k}"] = 0.0 if np.array_equal(fa[k], ra[k]) else np.inf
            else:
                # E[xi|s] is 0 in exact arithmetic on policy (and raw when mu = p): measured
                # against the score's natural scale, as ZERO_IN_EXACT above
                s = scale if k in ("score_mean", "raw_score_mean") else None
                errs[f"{part}.{k}"] = rel(fa[k], ra[k], s and max(s, np.abs(ra[k]).max()))
    return errs


def assert_same(fast, ref, label):
    errs = result_errors(fast, ref)
    bad = {k: e for k, e in errs.items() if not e <= RTOL}
    worst = max(errs, key=errs.get)
    assert not bad, f"{label}: fast vs reference differ: {bad} (largest: {worst})"


def run_both(task, **kw):
    """The fast engine and the judge on ``task`` (``chunk``, the fast engine's block size,
    is not the judge's)."""
    kw.setdefault("progress", False)
    if task.sampler is not None:
        kw.setdefault("topk", (1, 2))
    return exact(task, **with_options(kw)), exact_reference(task, **{k: v for k, v in kw.items()
                                                                     if k != "chunk"})


@pytest.mark.parametrize("case", sorted(CASES))  # every shipped config and hand-made case
def test_fast_engine_matches_reference(case):
    assert_same(*run_both(CASES[case]()), case)


def test_every_shipped_config_is_a_case():
    assert {f"config:{name}" for name in list_configs()} <= set(CASES)


@pytest.mark.parametrize("name", GOLDEN_TASKS)  # the task files of fisher_ref/golden_data/tasks
def test_fast_engine_matches_reference_on_golden_tasks(name):
    assert_same(*run_both(golden_task(name)), name)


@pytest.mark.parametrize("chunk", [1, 2, 7])
def test_fast_engine_matches_reference_in_small_blocks(chunk):
    for name in ("default", "offpolicy_temperature"):
        assert_same(*run_both(load_config(name), chunk=chunk), f"{name} chunk={chunk}")


@pytest.mark.parametrize("budget", [1, 40_000])
def test_window_cache_overflow_changes_nothing(budget):
    """A cache too small for one window (or a few) is emptied and refilled; same results."""
    task = load_config("weighted_prompts")
    ref = exact_reference(task, progress=False)
    out = exact(task, progress=False,
                options=EngineOptions(chunk=5, budgets=Budgets(window_cache_bytes=budget)))
    assert_same(out, ref, f"cache budget {budget}")


@pytest.mark.parametrize("knob, value", [("sub_elements", 1), ("defer_bytes", 1),
                                         ("autodiff_rows", 1), ("dense_keys", 0)])
def test_fast_engine_split_work_changes_nothing(knob, value):
    """Sub-blocks of one parent, per-window products used after every block instead of
    gathered over many blocks, an autodiff call per block, window keys in a dict instead
    of a table: the same sums, grouped otherwise."""
    task = load_config("offpolicy_stale")
    ref = exact_reference(task, topk=(1, 2), progress=False)
    out = exact(task, topk=(1, 2), progress=False,
                options=EngineOptions(budgets=Budgets(**{knob: value})))
    assert_same(out, ref, knob)


@pytest.mark.parametrize("bad", [dict(sub_elements=0), dict(defer_bytes=-1),
                                 dict(autodiff_rows=True), dict(window_cache_bytes=1.5),
                                 dict(dense_keys=-1)])
def test_budgets_refuse_what_is_not_a_size(bad):
    with pytest.raises(ValueError, match=f"Budgets.{next(iter(bad))} must be"):
        Budgets(**bad)


def test_exact_refuses_budgets_of_another_type():
    with pytest.raises(TypeError, match="budgets must be a fisher_ref.engine.plan.Budgets"):
        exact(load_config("tabular"), progress=False,
              options=EngineOptions(budgets={"sub_elements": 1}))


def test_reference_flag_dispatches_to_the_judge(monkeypatch):
    """``reference=True`` hands the task and every option but ``chunk`` (the fast engine's
    block size) to the judge, and the default never calls it. (Running both engines and comparing their results would run
    the same code on both sides whenever the flag is honoured.)"""
    task, calls = load_config("no_eos"), []

    def plain(t, **kw):
        calls.append((t, kw))
        return "plain engine"

    monkeypatch.setattr(exact_mod, "exact_reference", plain)
    assert exact(task, reference=True, progress=False, topk=(),
                 options=EngineOptions(chunk=3)) == "plain engine"
    assert len(calls) == 1 and calls[0][0] is task
    assert "chunk" not in calls[0][1] and calls[0][1]["progress"] is False
    assert exact(task, progress=False).sequence_fisher.shape == (task.model.num_params,)
    assert len(calls) == 1  # the fast engine ran without the plain one


def test_medium_config_matches_reference_on_a_slice():
    """The medium scaling config (P=1,044), cut to T=2 to keep the test fast."""
    task = load_scale_config("medium").with_(max_len=2)
    assert_same(*run_both(task), "medium, T=2")


def test_kept_arrays_off_still_match():
    task = load_config("offpolicy_stale")
    fast, ref = run_both(task, keep_states=False, keep_sequences=False)
    assert fast.states is None and fast.sequences is None
    assert_same(fast, ref, "offpolicy_stale, nothing kept")


@settings(derandomize=True, database=None, deadline=None, max_examples=30)
@given(small_tasks())
def test_fast_engine_matches_reference_on_random_tasks(task):
    assert_same(*run_both(task), repr(task.model.spec))


_gpt2 = st.fixed_dictionaries({
    "vocab_size": st.integers(2, 4), "eos": st.booleans(), "n_layer": st.integers(1, 2),
    "n_head": st.sampled_from([1, 2]), "head_dim": st.integers(1, 2),
    "init_seed": st.integers(0, 10 ** 6), "init_scale": st.floats(0.1, 2.0),
    "max_len": st.integers(1, 3), "prompts": st.lists(st.lists(st.integers(0, 3), max_size=2),
                                                      min_size=1, max_size=2),
    "reward": st.sampled_from([{"name": "count", "token": 1}, {"name": "length"}]),
    "baseline": st.one_of(st.just("mean"), st.floats(-2, 2)),
    "sampler": st.sampled_from([None, {"kind": "temperature", "temperature": 0.7},
                                {"kind": "perturbed", "scale": 0.5, "seed": 1}]),
})


@settings(derandomize=True, database=None, deadline=None, max_examples=8,
          suppress_health_check=[HealthCheck.too_slow])
@given(_gpt2)
def test_fast_engine_matches_reference_on_random_gpt2_tasks(d):
    """The transformer reads its whole history: every state is its own window."""
    assert_same(*run_both(_gpt2_task(d)), f"gpt2 {d}")


def _gpt2_task(d):
    V, T = d["vocab_size"], d["max_len"]
    prompts = [[t % V for t in p] for p in d["prompts"]]
    data = {"model": {"arch": "gpt2", "vocab_size": V, "eos": d["eos"],
                      "n_positions": max(len(p) for p in prompts) + T,
                      "embed_dim": d["n_head"] * d["head_dim"], "n_layer": d["n_layer"],
                      "n_head": d["n_head"], "init_seed": d["init_seed"],
                      "init_scale": d["init_scale"]},
            "prompts": prompts, "max_len": T, "reward": d["reward"], "baseline": d["baseline"],
            "sampler": d["sampler"]}
    return task_from_json(json.loads(json.dumps(data)))


# ---------------------------------------------------------------- quantities="fisher"


def fisher_run(task, **kw):
    """``exact(task, quantities="fisher", **kw)`` (with a sampler, also two top-k streams)."""
    kw.setdefault("progress", False)
    if task.sampler is not None:
        kw.setdefault("topk", (1, 2))
    return exact(task, quantities="fisher", **with_options(kw))


def full_reference(task, **kw):
    """The judge's full run, the judge of every quantities="fisher" run."""
    return exact_reference(task, progress=False,
                           topk=(1, 2) if task.sampler is not None else (), **kw)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fisher_quantities_match_the_full_reference(case):
    """``exact(quantities="fisher")`` takes its own route (no rewards, no path sums, no
    cross terms, H formed only for sum w h and sum w h^2); each field it computes equals
    the judge's full run. So does the judge's own fisher result."""
    task = CASES[case]()
    fast, ref = fisher_run(task), full_reference(task)
    assert fast.quantities == "fisher" and fast.streams.keys() == ref.streams.keys()
    assert set(vars(fast.streams["policy"])) == {
        "score_mean", "sequence_fisher", "token_fisher_sum", "token_fisher_by_depth",
        "cond_score_max", "mass"}
    assert_same(fast, ref, f"{case}, quantities='fisher'")
    assert_same(fisher_run(task, reference=True), ref, f"{case}, judge, 'fisher'")


@pytest.mark.parametrize("knob, value", [("sub_elements", 1), ("window_cache_bytes", 1),
                                         (None, None)])
@pytest.mark.parametrize("chunk", [None, 2])
def test_fisher_quantities_in_small_pieces(knob, value, chunk):
    """One parent per sub-block, a cache emptied for every window, blocks of two states;
    and with no state kept."""
    budgets = Budgets(**{knob: value}) if knob else None
    for name in ("default", "offpolicy_stale"):
        task = load_config(name)
        fast = fisher_run(task, chunk=chunk, keep_states=knob is not None, budgets=budgets)
        assert (fast.states is None) == (knob is None)
        assert_same(fast, full_reference(task, keep_states=knob is not None),
                    f"{name}, quantities='fisher', {knob}={value}, chunk={chunk}")


@settings(derandomize=True, database=None, deadline=None, max_examples=20)
@given(small_tasks())
def test_fisher_quantities_match_reference_on_random_tasks(task):
    assert_same(fisher_run(task), full_reference(task), f"{task.model.spec}, 'fisher'")


@settings(derandomize=True, database=None, deadline=None, max_examples=6,
          suppress_health_check=[HealthCheck.too_slow])
@given(_gpt2)
def test_fisher_quantities_match_reference_on_random_gpt2_tasks(d):
    task = _gpt2_task(d)
    assert_same(fisher_run(task), full_reference(task), f"gpt2 {d}, 'fisher'")


@pytest.mark.parametrize("reference", [False, True])
def test_fisher_result_refuses_what_it_did_not_compute(reference):
    task = load_config("offpolicy_stale")
    r = exact(task, progress=False, quantities="fisher", reference=reference)
    assert r.quantities == "fisher" and r.sequences is None and r.states is not None
    assert r.computed == ("score_mean", "sequence_fisher", "token_fisher_sum")
    for obj, name in [(r, "gradient"), (r, "gradient_autodiff"), (r, "cross_terms"),
                      (r.streams["centered"], "variances"), (r.streams["raw"], "bound")]:
        with pytest.raises(AttributeError, match=f"{name} was not computed.*quantities='fisher'"):
            getattr(obj, name)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        r.no_such_thing
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        r.streams["policy"].no_such_thing


def test_fisher_result_pickles_and_copies():
    """The ``__getattr__`` of the results must not recurse on objects being rebuilt."""
    import copy
    import pickle
    r = exact(load_config("offpolicy_stale"), progress=False, quantities="fisher")
    for clone in (pickle.loads(pickle.dumps(r)), copy.copy(r), copy.deepcopy(r)):
        assert clone.quantities == "fisher"
        assert np.array_equal(clone.sequence_fisher, r.sequence_fisher)
        assert np.array_equal(clone.streams["raw"].sequence_fisher,
                              r.streams["raw"].sequence_fisher)
        assert not hasattr(clone, "gradient") and not hasattr(clone.streams["raw"], "bound")


def test_consumers_refuse_a_fisher_result_up_front(monkeypatch):
    """What needs every quantity says so before it does any work."""
    from fisher_ref.golden.export import golden_arrays
    from fisher_ref.monte_carlo.sampling import check_monte_carlo
    from fisher_ref.checks.identities import exact_checks
    import fisher_ref.monte_carlo.sampling as mc
    task = load_config("default")
    r = exact(task, progress=False, quantities="fisher")
    monkeypatch.setattr(mc, "estimate", lambda *a, **k: pytest.fail("sampled first"))
    for call, who in [(lambda: exact_checks(r), "exact_checks"),
                      (lambda: check_monte_carlo(task, r, 100, seed=0), "check_monte_carlo"),
                      (lambda: golden_arrays(task, r), "a golden file")]:
        with pytest.raises(ValueError, match=f"{who} needs every exact quantity.*'fisher'"):
            call()


@pytest.mark.parametrize("bad", ["Fisher", "", None, ("fisher",)])
def test_quantities_are_checked(bad):
    with pytest.raises(ValueError, match="quantities must be one of"):
        exact(load_config("default"), progress=False, quantities=bad)


def test_fisher_quantities_keep_no_sequences():
    task = load_config("default")
    with pytest.raises(ValueError, match="keep_sequences=True needs quantities='all'"):
        exact(task, progress=False, quantities="fisher",
              options=EngineOptions(keep_sequences=True))
    assert exact(task, progress=False, quantities="fisher",
                 options=EngineOptions(keep_sequences=False)).sequences is None
