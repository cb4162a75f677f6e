"""Shards of one enumeration and their merge, against a single run of the same engine.

``exact_shard(task, (i, n))`` walks only the subtrees of shard ``i`` (cut by prompt and
first tokens, fisher_ref/parallel/shards.py); :func:`merge` adds the shards' raw sums and
finishes once. Held against ``exact(task)`` in one process at 1e-12 relative (on the
scales of tests/engine/test_fast.py for quantities that cancel), with the
per-state and per-response arrays in the same order, on every case of tests/cases.py,
hypothesis tasks, 1 to 5 shards (more than the task has subtrees included), off policy,
in small blocks, with ``quantities="fisher"`` and after pickling (in worker processes:
tests/parallel/test_workers.py).
"""
import copy
import dataclasses

import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st

from fisher_ref import load_config
from fisher_ref.parallel import shards as shards_mod
from fisher_ref.parallel.run import exact
from fisher_ref.engine.plan import EngineOptions, count_states, estimate_cost
from fisher_ref.parallel.shards import ShardError, merge, plan_shards
from fisher_ref.parallel import exact_param_shard, exact_shard
from fisher_ref.perf.scaling import load_scale_config

from cases import CASES, rel, with_options
from tests.engine.test_fast import natural_scale, result_errors
from tests.engine.test_identities_exact import small_tasks

RTOL = 1e-12


def options(task):
    return dict(progress=False, topk=(1, 2) if task.sampler is not None else ())


#: The run of one shard, by the keyword that used to name it.
SHARD_RUN = {"shard": exact_shard, "param_shard": exact_param_shard}


def sharded(task, n, by="shard", **kw):
    parts = [SHARD_RUN[by](task, (i, n), **with_options(kw)) for i in range(n)]
    return merge(task, parts), parts


def merged_errors(merged, single):
    """:func:`result_errors`, with Var(A h) = E[A^2 h^2] - E[A h]^2 measured on the size of
    the terms E[A^2 h^2] is formed from (:func:`natural_scale` squared, as E[A h] is on
    that scale), not on its own size, which may be far below them."""
    errs = result_errors(merged, single)
    for name, b in single.streams.items():
        if merged.quantities == "all":
            va, vb = merged.streams[name].variances["Ah"], b.variances["Ah"]
            errs[f"{name}.variances.Ah"] = rel(va, vb, max(
                natural_scale(b) ** 2, np.abs(va).max(), np.abs(vb).max()))
    return errs


def assert_merged_equal(task, n, label, by="shard", **kw):
    kw = {**options(task), "keep_states": True, "keep_sequences": kw.get(
        "quantities") != "fisher", **kw}
    single = exact(task, **with_options(kw))
    merged, parts = sharded(task, n, by, **kw)
    errs = merged_errors(merged, single)
    bad = {k: e for k, e in errs.items() if not e <= RTOL}
    assert not bad, f"{label}, {n} shards: merged vs single run differ: {bad}"
    assert merged.computed == single.computed
    return merged, parts


@pytest.mark.parametrize("case", sorted(CASES))
def test_merged_shards_match_a_single_run(case):
    task = CASES[case]()
    for n in range(1, 6):
        assert_merged_equal(task, n, case)


@settings(derandomize=True, database=None, deadline=None, max_examples=25)
@given(small_tasks(), st.integers(1, 5))
def test_merged_shards_match_on_random_tasks(task, n):
    assert_merged_equal(task, n, repr(task.model.spec))


@pytest.mark.parametrize("chunk", [1, 3])
def test_shards_in_small_blocks(chunk):
    for name in ("default", "offpolicy_stale"):
        assert_merged_equal(load_config(name), 3, f"{name} chunk={chunk}", chunk=chunk)


def test_fisher_quantities_merge():
    for name in ("weighted_prompts", "offpolicy_temperature"):
        task = load_config(name)
        merged, parts = assert_merged_equal(task, 4, name, quantities="fisher")
        assert merged.quantities == "fisher" and merged.sequences is None


def test_more_shards_than_subtrees():
    """V=3 with EOS, T=2, one prompt: two subtrees; shards past them are empty and merge."""
    task = load_config("default").with_(max_len=2)
    task = task.with_(prompts=task.prompts[:1], prompt_weights=[1.0])
    plan = plan_shards(task, 5)
    assert plan.bounds[-1] < 5
    merged, parts = assert_merged_equal(task, 5, "tiny")
    assert sum(p.n_states == 0 for p in parts) >= 5 - plan.bounds[-1]
    assert sum(p.n_states for p in parts) == merged.n_states


def test_plan_counts_add_up_to_the_whole_tree():
    for V, T, eos, n_p in [(3, 2, True, 1), (4, 3, False, 2), (5, 4, True, 3), (2, 5, True, 1),
                           (1, 3, True, 2), (6, 1, False, 2)]:
        N, M = count_states(V, T, eos, n_p)
        for n in (1, 2, 3, 7, 40, 200):
            model = type("M", (), {"vocab_size": V, "eos": eos})
            fake = type("T", (), {"model": model, "max_len": T, "prompts": [()] * n_p})
            plan = plan_shards(fake, n)
            assert sum(plan.n_states(i) for i in range(n)) == N, (V, T, eos, n_p, n)
            assert sum(plan.n_responses(i) for i in range(n)) == M, (V, T, eos, n_p, n)
            sizes = [plan.bounds[i + 1] - plan.bounds[i] for i in range(n)]
            assert max(sizes) - min(sizes) <= 1  # balanced: equal units, one at most apart


def test_kept_rows_come_back_in_order():
    task = load_config("offpolicy_temperature")
    merged, parts = assert_merged_equal(task, 3, "kept", keep_states=True, keep_sequences=True)
    assert sum(len(p.states["place"]) for p in parts) == merged.n_states
    assert sum(len(p.sequences["place"]) for p in parts) == merged.n_responses


def test_merge_refuses_a_partial_or_foreign_set():
    task = load_config("default")
    parts = [exact_shard(task, (i, 3)) for i in range(3)]
    with pytest.raises(ShardError, match=r"missing \[1\]"):
        merge(task, [parts[0], parts[2]])
    with pytest.raises(ShardError, match=r"repeated \[0\]"):
        merge(task, [parts[0], parts[0], parts[1], parts[2]])
    with pytest.raises(ShardError, match="another task"):
        merge(load_config("no_eos"), parts)
    other = exact_shard(task, (1, 3), quantities="fisher")
    with pytest.raises(ShardError, match="different runs"):
        merge(task, [parts[0], other, parts[2]])
    with pytest.raises(ShardError, match="ShardResult"):
        merge(task, [exact(task, progress=False)])


def _scaled(part, factor):
    """``part`` with every array of its sums multiplied by ``factor``, in place (a shard
    changed after it was made: edited, or damaged in transit)."""
    for m in part.moments.values():
        for k, v in m.items():
            if isinstance(v, np.ndarray):
                m[k] = v * factor
    return part


@pytest.mark.parametrize("by", ["shard", "param_shard"])
def test_changed_shard_sums_are_refused_naming_the_shard(by):
    """issue 46 item 9: a shard whose sums were scaled by 1.5 after it was made merged into a
    gradient 34% off; its checksum (a SHA-256 of its payload, taken when it was made) no
    longer matches, and the merge names it."""
    task = load_config("default")
    parts = [SHARD_RUN[by](task, (i, 2)) for i in range(2)]
    merge(task, parts)  # as made: merged
    kind = "parameter shard" if by == "param_shard" else "shard"
    with pytest.raises(ShardError, match=f"^{kind} 1 of 2: .*checksum"):
        merge(task, [parts[0], _scaled(copy.deepcopy(parts[1]), 1.5)])
    changed = copy.deepcopy(parts[0])
    changed.grad_ad[3] += 1e-9  # one number, in place
    with pytest.raises(ShardError, match=f"^{kind} 0 of 2: .*checksum"):
        merge(task, [changed, parts[1]])
    relabelled = dataclasses.replace(parts[1], shard=(0, 2))  # the checksum kept: refused
    with pytest.raises(ShardError, match=f"^{kind} 0 of 2: .*checksum"):
        merge(task, [relabelled, parts[1]])  # shard 1's sums as shard 0


def test_a_truncated_shard_is_refused_naming_it():
    """issue 46 item 16: a shard whose arrays were cut short failed merge with numpy's
    "operands could not be broadcast together"; it is refused by name, by its checksum, and
    by the shapes of its sums where its checksum was taken again after the cut."""
    task = load_config("default")
    parts = [exact_shard(task, (i, 2), options=EngineOptions(keep_states=True))
             for i in range(2)]
    for field in ("h", "cross"):
        cut = copy.deepcopy(parts[1])
        cut.moments["policy"][field] = cut.moments["policy"][field][..., :5]
        with pytest.raises(ShardError, match="^shard 1 of 2: .*checksum"):
            merge(task, [parts[0], cut])
        resealed = dataclasses.replace(cut, checksum=None)  # a checksum of the cut arrays
        with pytest.raises(ShardError, match=f"^shard 1 of 2: the sum '{field}' of stream "
                                             r"'policy' has shape \("):
            merge(task, [parts[0], resealed])
    cut = dataclasses.replace(parts[0], grad_ad=parts[0].grad_ad[:-1], checksum=None)
    with pytest.raises(ShardError, match="^shard 0 of 2: its autodiff gradient has shape"):
        merge(task, [cut, parts[1]])
    rows = dict(parts[0].states, place=parts[0].states["place"][:-1])
    cut = dataclasses.replace(parts[0], states=rows, checksum=None)
    with pytest.raises(ShardError, match="^shard 0 of 2: its per-state arrays differ"):
        merge(task, [cut, parts[1]])


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2", None])
def test_plan_shards_refuses_a_count_that_is_not_a_positive_integer(bad):
    """issue 46 item 16: plan_shards(task, 0) raised ZeroDivisionError and (task, -2)
    returned a plan of n=-2."""
    with pytest.raises(ValueError, match=r"plan_shards: n \(the number of shards\)"):
        plan_shards(load_config("default"), bad)


CORRUPTIONS = ("dropped", "repeated", "scaled", "truncated", "truncated, checksum taken again",
               "of another task")


def _corrupted(task, parts, by, broken, i, data, kw):
    """``parts`` with shard ``i`` ``broken`` (one of :data:`CORRUPTIONS`), and the pattern
    of the error that must name it; ``None`` where the corruption changed no byte (sums of
    zeros scaled)."""
    n = len(parts)
    label = f"{'parameter shard' if by == 'param_shard' else 'shard'} {i} of {n}"
    bad, part = list(parts), copy.deepcopy(parts[i])
    arrays = [(m, k) for m in part.moments.values() for k, v in m.items()
              if isinstance(v, np.ndarray) and v.size]
    if broken == "dropped" and n > 1:
        del bad[i]
        return bad, rf"missing \[{i}\]"
    if broken in ("dropped", "repeated"):
        return bad + [parts[i]], rf"repeated \[{i}\]"
    if broken == "scaled":
        factor = data.draw(st.sampled_from([1.5, -1.0, 1 + 1e-15, 0.0]), label="factor")
        for m, k in arrays:
            m[k] = m[k] * factor
        if all(np.array_equal(m[k], parts[i].moments[s][k]) for s, m in part.moments.items()
               for k in m if isinstance(m[k], np.ndarray)):
            return None
        bad[i] = part
        return bad, f"^{label}: .*checksum"
    if broken.startswith("truncated"):
        m, k = data.draw(st.sampled_from(arrays), label="array")
        m[k] = m[k][..., :-1]
        again = "again" in broken
        bad[i] = dataclasses.replace(part, checksum=None) if again else part
        return bad, f"^{label}[: ]" if again else f"^{label}: .*checksum"
    bad[i] = SHARD_RUN[by](task.with_(theta=task.theta + 0.25), (i, n), **with_options(kw))
    return bad, f"^{label} of the {n} were computed for another task"


@settings(derandomize=True, database=None, deadline=None, max_examples=60)
@given(small_tasks(), st.sampled_from(["shard", "param_shard"]), st.integers(1, 4), st.data())
def test_fuzz_sharding_merges_exactly_and_refuses_corruptions_by_name(task, by, n, data):
    """issue 46 (the fuzz test of the sharding surface): random small tasks cut into 1 to 4
    subtree or parameter shards merge to the single run at 1e-12, and each of a random
    shard dropped, repeated, its sums scaled, an array truncated (its checksum taken again
    or not), or computed for another task is refused with a ShardError that names the
    shard, never merged."""
    if by == "param_shard":
        n = min(n, task.model.num_params)
    kw = dict(options(task), keep_states=True, keep_sequences=True)
    merged, parts = sharded(task, n, by, **kw)
    errs = merged_errors(merged, exact(task, workers=1, **with_options(kw)))
    assert max(errs.values()) <= RTOL, errs
    for broken in CORRUPTIONS:
        i = data.draw(st.integers(0, n - 1), label="shard")
        got = _corrupted(task, parts, by, broken, i, data, kw)
        if got is None:  # no byte changed: the same merge
            event(f"{by}: {broken}: unchanged")
            continue
        with pytest.raises(ShardError, match=got[1]):
            merge(task, got[0])
        event(f"{by}: {broken}")


def test_exact_refuses_a_shard_naming_the_function_that_returns_one():
    """exact() always returns an ExactResult: a shard, which returns a ShardResult, has a
    function of its own, and the refusal names it (the plain judge takes none either)."""
    task = load_config("default")
    for kw, name in (({"shard": (0, 2)}, "fisher_ref.parallel.exact_shard"),
                     ({"param_shard": (0, 2)}, "fisher_ref.parallel.exact_param_shard")):
        for extra in ({}, {"reference": True}, {"workers": 2}):
            with pytest.raises(TypeError, match=name.replace(".", r"\.")):
                exact(task, progress=False, **kw, **extra)
    with pytest.raises(TypeError, match="reference"):  # the shard runs are the fast engine's
        exact_shard(task, (0, 2), reference=True)


def test_cost_guard_counts_every_worker(monkeypatch):
    from fisher_ref.parallel import workers
    monkeypatch.setattr(workers, "available_cores", lambda: 4)  # four workers, not capped
    task = load_scale_config("v16")
    one, four = estimate_cost(task), estimate_cost(task, workers=4)
    assert four.bytes > 3 * one.bytes and four.seconds < one.seconds and four.workers == 4
    with pytest.raises(Exception, match="memory"):
        exact(task, progress=False, workers=4, options=EngineOptions(max_bytes=2 * one.bytes))


def test_fisher_run_is_sized_as_a_fisher_run():
    task = load_scale_config("v16")
    full, fisher = estimate_cost(task), estimate_cost(task, quantities="fisher")
    assert fisher.seconds < full.seconds / 2 and fisher.bytes < full.bytes


def test_shards_module_names_its_public_parts():
    assert {"merge", "plan_shards", "ShardResult"} <= set(shards_mod.__all__)


def test_the_large_case_table_is_the_recorded_run():
    """docs/guide/distributed.md's table of large cases states what
    benchmarks/scaling/large_case.py wrote to docs/guide/large_case.json (machine, commit and
    every number)."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs/guide/distributed.md").read_text()
    rec = json.loads((root / "docs/guide/large_case.json").read_text())
    assert rec["machine"] in page and rec["commit"] in page
    for r in rec["records"]:
        (row,) = [line for line in page.splitlines() if f"`scale/{r['case']}`" in line]
        for value in (f"{r['P']:,}", f"{r['states']:,}", f"{r['responses']:,}",
                      str(r["seconds"]), str(r["peak_MiB_per_worker"]),
                      f"{r['top1pct_overlap']:.2f}"):
            assert f" {value} " in row or f" {value} (" in row, (r["case"], value, row)
        assert (root / "fisher_ref/configs/scale" / f"{r['case']}.json").is_file()


def test_the_gpu_cases_quoted_are_the_recorded_runs():
    """docs/guide/distributed.md's GPU paragraph quotes the records of docs/gpu/ and
    docs/torch/ (times, memory, errors, overlap, merges), each as its record rounds."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs/guide/distributed.md").read_text()
    section = page[page.index("### The same cases on a GPU"):]
    load = lambda p: json.loads((root / p).read_text())
    gpt2, big = load("docs/gpu/gpt2_p100k_cuda.json"), load("docs/gpu/big_task_cuda.json")
    cross, shards = load("docs/gpu/gpt2_p100k_cross.json"), load("docs/gpu/shards_cuda.json")
    cpu, big_cpu = load("docs/torch/gpt2_p100k_cpu.json"), load("docs/torch/big_task.json")
    commit = (root / "docs/gpu/commit.txt").read_text().strip()
    quoted = [f"`{commit[:7]}`", f"{gpt2['seconds']:.1f} s", f"{gpt2['peak_gpu_bytes'] / 2**30:.2f} GiB",
              f"`{cross['commit']}`",
              f"largest relative difference of {max(cross['relative_errors'].values()):.1e}",
              f"is {cross['top1pct_overlap_other']:.2f} on both sides",
              f"took {cpu['seconds']:.1f} s", f"`{cpu['commit']}`", f"{big['seconds']:.1f} s on the GPU",
              f"{big_cpu['seconds']:.0f} s", f"{sum(r['ok'] for r in shards['records'])} of "
              f"{len(shards['records'])} merges within 1e-12",
              f"{max(r['max_rel_error'] for r in shards['records']):.1e}"]
    for value in quoted:
        assert value in " ".join(section.split()), value
    assert cross["top1pct_overlap_other"] == cross["top1pct_overlap_numpy"]
    assert all(r["ok"] for r in shards["records"])
