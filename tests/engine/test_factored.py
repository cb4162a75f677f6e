"""The last level of an MLP run from the factors of the scores (fisher_ref.engine.factored).

- ``quantities="fisher"``: at every call, the same sums as the dense route
  (fisher_ref.engine.complete._last_level_fisher, which forms (parents, P) arrays);
- every quantity: the whole run equal to the dense route's (level_sums and the window
  cache's deferred products) at 1e-12, and to the plain engine's at 1e-10;

with grandparents' groups cut by sub-blocks into ragged pieces, with samplers and top-k
centers, responses of length 2 (no earlier slot), and on random tasks."""
import numpy as np
import pytest
from hypothesis import given, settings

from cases import CASES, rel, with_options
from fisher_ref import Task, load_config
from fisher_ref.engine import complete, factored
from fisher_ref.parallel.run import exact
from fisher_ref.engine.plan import Budgets
from fisher_ref.reference import exact_reference
from fisher_ref.parallel.shards import merge
from fisher_ref.models.mlp import MLPModel
from fisher_ref.engine.factors import row_width
from fisher_ref.parallel import exact_param_shard
from tests.engine.test_fast import assert_same, result_errors
from tests.engine.test_identities_exact import small_tasks


def _checked_run(task, monkeypatch, **kw):
    """``exact(task, quantities="fisher", **kw)`` with every factored call held to the dense
    route on the same arguments (1e-12 relative to the sums' scale); the parents of each call."""
    calls = []

    def both(cache, block, arrs, s, sl, gen, W, r):
        got = factored.last_level_fisher(cache, block, arrs, s, sl, gen, W, r)
        ref = complete._last_level_fisher(cache, block, arrs, s, sl, gen, W, r)
        # the scale of each sum: E[h] cancels to rounding, so it is judged on its terms'
        # (sum W |h| <= sqrt(mass sum W h^2), Cauchy-Schwarz)
        h2 = max(float(np.abs(ref["h2"]).max()), 1e-300)
        scales = {"mass": abs(ref["mass"]), "h": np.sqrt(abs(ref["mass"]) * h2), "h2": h2}
        for key, scale in scales.items():
            assert rel(got[key], ref[key], max(scale, 1e-300)) <= 1e-12, (key, len(calls))
        calls.append(len(W))
        return got

    monkeypatch.setattr(complete, "last_level_fisher", both)
    kw.setdefault("progress", False)
    if task.sampler is not None:
        kw.setdefault("topk", (1, 2))
    if "param_shard" in kw:  # a parameter shard's run
        return exact_param_shard(task, kw.pop("param_shard"), quantities="fisher",
                                 **with_options(kw)), calls
    return exact(task, quantities="fisher", **with_options(kw)), calls


def about(calls, parents):
    """The sub-blocks of a budget of ``parents`` parents, in blocks larger than that: even
    slices of a block (engine.complete._sub_blocks), the largest at most half as large
    again and at least two thirds of it."""
    return 2 * parents / 3 <= max(calls) <= 1.5 * parents


@pytest.mark.parametrize("name", ["default", "offpolicy_stale", "offpolicy_temperature",
                                  "weighted_prompts", "no_eos"])
@pytest.mark.parametrize("parents", [1, 3, 7, None])
def test_factored_sums_equal_the_dense_ones_in_ragged_groups(name, parents, monkeypatch):
    """Sub-blocks of about 1, 3 or 7 parents (even, so up to half as many again) cut the
    grandparents' groups of V - 1 siblings into pieces of unequal length (the padded groups
    of the batched products)."""
    task = load_config(name)
    budgets = Budgets(sub_elements=parents * row_width(task.model.spec)) if parents else None
    r, calls = _checked_run(task, monkeypatch, budgets=budgets)
    assert calls  # the factored route ran
    assert parents is None or about(calls, parents)
    ref = exact_reference(task, progress=False,
                          topk=(1, 2) if task.sampler is not None else ())
    assert_same(r, ref, f"{name}, factored, {parents} parents per sub-block")


MLP_CASES = sorted(c for c in CASES if isinstance(CASES[c]().model, MLPModel))


@pytest.mark.parametrize("case", MLP_CASES)
def test_factored_sums_on_every_mlp_case(case, monkeypatch):
    """Masked tokens and EOS, tempered and rounded samplers, extreme scales."""
    task = CASES[case]()
    _, calls = _checked_run(task, monkeypatch,
                            budgets=Budgets(sub_elements=5 * row_width(task.model.spec)))
    assert calls


@settings(derandomize=True, database=None, deadline=None, max_examples=15)
@given(small_tasks())
def test_factored_sums_on_random_tasks(task):
    with pytest.MonkeyPatch.context() as mp:
        r, calls = _checked_run(task, mp,
                                budgets=Budgets(sub_elements=3 * row_width(task.model.spec)))
    assert_same(r, exact_reference(task, progress=False,
                                   topk=(1, 2) if task.sampler is not None else ()),
                "random task, factored")


@pytest.mark.parametrize("n", [2, 3, 7])
def test_parameter_shards_sum_their_blocks_from_factors(n, monkeypatch):
    """A slice of the parameters (param_shard, what workers=N runs) sums, from the factors,
    the blocks inside it (cut blocks whole, then their columns): each slice's fisher sums
    equal the dense route's at every call, and the merged slices of a default run equal
    the dense route's and one run's at 1e-12."""
    task = load_config("offpolicy_stale")
    kw = {"progress": False, "topk": (1, 2)}
    for i in range(n):
        _, calls = _checked_run(task, monkeypatch, param_shard=(i, n))
        assert calls
    got = merge(task, [exact_param_shard(task, (i, n), **kw) for i in range(n)])
    with pytest.MonkeyPatch.context() as mp:
        _dense(mp)
        ref = merge(task, [exact_param_shard(task, (i, n), **kw) for i in range(n)])
    _assert_close(got, ref, f"{n} parameter shards")
    _assert_close(got, exact(task, **with_options(kw)), f"{n} parameter shards against one run")


@pytest.mark.parametrize("name", ["default", "offpolicy_stale"])
def test_one_parameter_slices_cut_every_block_and_bias_row(name):
    """One parameter per slice: every cut the layout can meet (inside a weight block's row,
    between a block and its bias, inside the bias row a first factor's last entry 1 stands
    for, inside E's slots) sums its one column from the factors, and the merged slices of a
    default run equal the dense route's at 1e-12."""
    task = load_config(name)
    kw = {"progress": False, "topk": (1, 2) if task.sampler is not None else ()}
    n, calls = task.model.num_params, []
    real = complete.last_level_all

    def counted(*args):
        calls.append(args[0].columns)
        return real(*args)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(complete, "last_level_all", counted)
        got = merge(task, [exact_param_shard(task, (i, n), **kw) for i in range(n)])
    assert {(c.start, c.stop) for c in calls} == {(i, i + 1) for i in range(n)}
    with pytest.MonkeyPatch.context() as mp:
        _dense(mp)
        ref = exact(task, **with_options(kw))
    _assert_close(got, ref, f"{name}, {n} one-parameter slices against the dense route")


def _dense(monkeypatch):
    """Turn the factored last level off: the dense route (level_sums, deferred products)."""
    from fisher_ref.engine import fast
    monkeypatch.setattr(fast, "factors_last_level", lambda task: False)


def _both(task, **kw):
    """A default run by the factored route and by the dense one, the calls of the first."""
    calls = []
    real = complete.last_level_all

    def counted(*args):
        calls.append(len(args[6]))
        return real(*args)

    kw.setdefault("progress", False)
    if task.sampler is not None:
        kw.setdefault("topk", (1, 2))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(complete, "last_level_all", counted)
        got = exact(task, **with_options(kw))
    with pytest.MonkeyPatch.context() as mp:
        _dense(mp)
        ref = exact(task, **with_options(kw))
    return got, ref, calls


def _assert_close(got, ref, label, tol=1e-12):
    errs = result_errors(got, ref)
    bad = {k: e for k, e in errs.items() if not e <= tol}
    assert not bad, (label, bad)


@pytest.mark.parametrize("name", ["default", "offpolicy_stale", "offpolicy_temperature",
                                  "weighted_prompts", "no_eos"])
@pytest.mark.parametrize("parents", [1, 3, 7, None])
def test_every_quantity_by_factors_equals_the_dense_route(name, parents):
    """Sub-blocks of 1, 3 or 7 parents (ragged groups); every quantity, the per-state and
    per-response arrays too, at 1e-12 of the dense route; and the plain engine's."""
    task = load_config(name)
    budgets = Budgets(sub_elements=parents * row_width(task.model.spec)) if parents else None
    got, ref, calls = _both(task, budgets=budgets)
    assert calls and (parents is None or about(calls, parents))
    _assert_close(got, ref, f"{name}, {parents} parents")
    assert_same(got, exact_reference(task, progress=False,
                                     topk=(1, 2) if task.sampler is not None else ()),
                f"{name}, factored, every quantity")


@pytest.mark.parametrize("case", MLP_CASES)
def test_every_quantity_by_factors_on_every_mlp_case(case):
    task = CASES[case]()
    got, ref, calls = _both(task, budgets=Budgets(sub_elements=5 * row_width(task.model.spec)))
    assert calls
    _assert_close(got, ref, case)


def test_responses_of_length_two_have_no_earlier_slot():
    """max_len 2: the last level's parents are the prompt's children (d = 1), whose cross
    terms have no slot before the last token's."""
    task = load_config("default")
    task = Task(model=task.model, theta=task.theta, prompts=task.prompts,
                prompt_weights=task.prompt_weights, max_len=2, reward=task.reward,
                baseline=task.baseline)
    got, ref, calls = _both(task)
    assert calls
    _assert_close(got, ref, "max_len 2")


@settings(derandomize=True, database=None, deadline=None, max_examples=15)
@given(small_tasks())
def test_every_quantity_by_factors_on_random_tasks(task):
    got, ref, calls = _both(task, budgets=Budgets(sub_elements=3 * row_width(task.model.spec)))
    assert calls or task.max_len < 2
    _assert_close(got, ref, "random task")


_CONTEXT3 = {"model": {"vocab_size": 3, "context": 3, "embed_dim": 2, "hidden": 3,
                       "eos": True, "init_seed": 4, "init_scale": 1.0},
             "prompts": [[1, 1], [2]], "max_len": 4, "reward": {"name": "count", "token": 1}}


@pytest.mark.parametrize("name", ["default", "offpolicy_stale", "context3"])
def test_rows_own_slot_is_held_only_where_it_can_be_nonzero(name, monkeypatch):
    """The E block's own slot (a parent's last token) is held as 0 (None) in the scores of a
    grandparent's window and every product with them, so that the slot sums skip it; the
    rows of the parents' own windows hold it, not vacuously (some hold nonzero values
    there); and the run equals the dense route. ``context3``: three group slots, and tokens
    repeated within windows (merged slots)."""
    from fisher_ref import task_from_json
    task = task_from_json(_CONTEXT3) if name == "context3" else load_config(name)
    kept = []
    real = factored.LastLevel.totals

    def totals(self, sums):
        kept.append(self)
        return real(self, sums)
    monkeypatch.setattr(factored.LastLevel, "totals", totals)
    got = exact(task, progress=False)
    assert kept, "no last level was summed from the factors"
    held = nonzero = 0
    for L in {id(x): x for x in kept}.values():
        for (l, _), rows in L._rows.items():
            if rows.E is None or rows.slots.at_last is None:
                continue
            own = rows.E[1]
            # a product with a grandparent's score (l >= 1) holds 0 there: held as None
            assert (own is None) == (l >= 1), (l, own is None)
            if own is not None:
                held += 1
                nonzero += bool(own.any())
    assert held and nonzero, (held, nonzero)
    monkeypatch.undo()
    with pytest.MonkeyPatch.context() as mp:
        _dense(mp)
        ref = exact(task, progress=False)
    _assert_close(got, ref, f"{name}: own slots")


def test_window_sums_in_several_batches_equal_one(monkeypatch):
    """The window cache contracts the per-(window, token) weights a batch of windows at a
    time (their rows bounded by J_ELEMENTS); batches of a few windows each add up to the
    one batch a small run takes."""
    from fisher_ref.engine import window_sums
    task = load_config("offpolicy_stale")
    kw = {"progress": False, "topk": (1, 2)}
    calls = []
    real = factored.window_sums

    def counted(cache, s, acc, powers, lo, hi):
        calls.append(hi - lo)
        return real(cache, s, acc, powers, lo, hi)
    monkeypatch.setattr(window_sums, "window_sums", counted)
    one = exact(task, **with_options(kw))
    n_one = len(calls)
    monkeypatch.setattr(window_sums, "J_ELEMENTS", 1)
    several = exact(task, **with_options(kw))
    assert len(calls) - n_one > n_one and max(calls[n_one:]) == 1, calls
    _assert_close(several, one, "window sums a window at a time")
