"""Enumeration: closed-form counts against brute force, the cost refusal, windows,
and streaming results independent of the block size."""
import numpy as np
import pytest

from cases import get_task
from fisher_ref import EnumerationTooLarge, exact, load_config
from fisher_ref.engine.plan import EngineOptions, check_cost, count_states, estimate_cost
from fisher_ref.models.base import state_windows
from fisher_ref.models.base import windows_for

CHUNK_RTOL = 1e-12


@pytest.mark.parametrize("name", ["config:default", "config:no_eos", "config:weighted_prompts",
                                  "masked_logits", "logits_sampler"])
def test_count_states_matches_exact(name):
    from cases import get_result
    task, r = get_task(name), get_result(name)
    n, m = count_states(task.model.vocab_size, task.max_len, task.model.eos, len(task.prompts))
    assert (r.n_states, r.n_responses) == (n, m)
    assert len(r.states["depth"]) == n and len(r.sequences["prob"]) == m


def test_enumeration_too_large_refuses_before_computing(monkeypatch):
    task = load_config("default").with_(max_len=40)

    def no_logits(theta, windows):
        raise AssertionError("the model was evaluated before the refusal")

    monkeypatch.setattr(task.model, "logits", no_logits)
    with pytest.raises(EnumerationTooLarge) as info:
        exact(task, progress=False)
    msg = str(info.value)
    for words in ("exact enumeration refused", "estimated time", "exceeds the limit",
                  "states", "responses", "V=5", "T=40", "Monte Carlo"):
        assert words in msg
    assert isinstance(info.value, ValueError)


def test_memory_limit_is_named():
    cost = estimate_cost(load_config("default"))
    with pytest.raises(EnumerationTooLarge, match="estimated memory .* GiB exceeds the limit"):
        check_cost(cost, max_bytes=1)


def test_state_windows_matches_windows_for():
    seqs = [(), (1,), (1, 2), (3, 1, 2, 4)]
    L = 5
    tokens = np.full((len(seqs), L), -1)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = s
    lengths = np.array([len(s) for s in seqs])
    for k in (1, 2, 3):
        assert np.array_equal(state_windows(tokens, lengths, k, 9), windows_for(seqs, k, 9))


@pytest.mark.parametrize("name", ["config:weighted_prompts", "config:offpolicy_stale",
                                  "masked_logits"])
def test_results_independent_of_chunk(name):
    task = get_task(name)
    topk = (1, 2) if task.sampler is not None else ()
    runs = [exact(task, topk=topk, progress=False,
                  options=EngineOptions(chunk=c)) for c in (1, 7, None)]
    ref = runs[-1]
    for r in runs[:-1]:
        for s, stream in ref.streams.items():
            for q in ("sequence_fisher", "token_fisher_sum", "token_fisher_sum_paths",
                      "cross_terms", "gradient", "score_mean", "importance_gradient"):
                a, b = getattr(r.streams[s], q), getattr(stream, q)
                scale = max(np.abs(b).max(), np.sqrt(stream.sequence_fisher.max()))
                assert np.abs(a - b).max() <= CHUNK_RTOL * scale, (s, q)
        assert np.abs(r.gradient_autodiff - ref.gradient_autodiff).max() <= \
            CHUNK_RTOL * np.sqrt(ref.sequence_fisher.max()) * max(1, ref.reward_std)
        score_scale = np.sqrt(ref.states["token_fisher"].max())
        for k in ref.states:
            # per-state score means are rounding noise around 0: scale by sqrt(f)
            scale = score_scale if k.endswith("score_mean") else np.abs(ref.states[k]).max()
            assert np.abs(r.states[k] - ref.states[k]).max() <= CHUNK_RTOL * scale, k
        for k in ref.sequences:
            assert np.allclose(r.sequences[k], ref.sequences[k], rtol=CHUNK_RTOL, atol=0), k


def test_keep_states_false_still_gives_the_aggregates():
    task = load_config("offpolicy_temperature")
    full = exact(task, progress=False)
    lean = exact(task, progress=False,
                 options=EngineOptions(keep_states=False, keep_sequences=False))
    assert lean.states is None and lean.sequences is None
    for s in full.streams:
        assert np.array_equal(lean.streams[s].sequence_fisher, full.streams[s].sequence_fisher)
        assert np.array_equal(lean.streams[s].gradient, full.streams[s].gradient)


@pytest.mark.parametrize("kw, words", [
    (dict(topk=(0,)), "topk entries must be positive integers"),
    (dict(topk=3), "topk must be a sequence"),
    (dict(options=EngineOptions(chunk=0)), "chunk must be a positive integer"),
    (dict(options=EngineOptions(chunk=2.5)), "chunk must be a positive integer"),
])
def test_bad_engine_arguments(kw, words):
    with pytest.raises(ValueError, match=words):
        exact(load_config("offpolicy_temperature"), progress=False, **kw)


@pytest.mark.parametrize("P,V,T,S,eos", [(1044, 12, 4, 1, True), (4376, 16, 4, 1, True),
                                          (119, 5, 3, 3, True), (68, 4, 3, 1, False),
                                          (10 ** 6, 50, 8, 4, True), (12, 3, 2, 1, True)])
def test_default_chunk_is_a_multiple_of_a_run_of_siblings(P, V, T, S, eos):
    """With ``siblings`` the default block size is the plain one rounded down to a
    multiple of the largest power of beta it holds (so a level's runs of beta^j states
    that share their first tokens are never cut), and never 0."""
    from fisher_ref.engine.plan import default_chunk
    plain = default_chunk(P, V, T, S)
    beta = V - eos
    chunk = default_chunk(P, V, T, S, siblings=beta)
    run = 1
    while run * beta <= plain:
        run *= beta
    assert 1 <= chunk <= plain and chunk % run == 0 and plain - chunk < run
    assert estimate_cost(load_config("default")).chunk % 4 == 0  # beta = 4 on default


def test_memory_estimate_counts_the_prompt_length():
    """Every state carries its prompt: a long prompt must raise the memory estimate (a
    3,000,000-token prompt was estimated at 0.01 GiB and peaked at 4.1 GB)."""
    from fisher_ref.tasks import task_from_json
    spec = load_config("tabular").to_json()
    short = estimate_cost(task_from_json(spec), keep_states=True, keep_sequences=True)
    spec["prompts"] = [[1] * 1000]
    spec["prompt_weights"] = [1.0]
    long = estimate_cost(task_from_json(spec), keep_states=True, keep_sequences=True)
    tokens = 8 * 1000 * (long.n_states + long.n_responses)  # int64 tokens kept per row
    assert long.bytes - short.bytes >= tokens


def test_engine_options_are_the_keyword_arguments_of_exact():
    """exact() takes what is computed as keywords, with EngineOptions' defaults, and the
    knobs in its options; EngineOptions (its budgets apart) holds exactly the keyword
    arguments of the plain judge, with its defaults; plan() takes nothing else."""
    import inspect

    from fisher_ref.engine import fast
    from fisher_ref.engine.plan import WHAT
    from fisher_ref.reference import exact_reference
    from fisher_ref.engine.run import plan
    from fisher_ref.reference import exact_reference
    opts = EngineOptions()
    for fn in (exact, fast.exact):
        params = inspect.signature(fn).parameters
        assert {k: params[k].default for k in WHAT} == {k: getattr(opts, k) for k in WHAT}
        assert params["options"].default is None and params["reference"].default is False
        assert not set(params) & (set(opts.as_kwargs()) - set(WHAT)), fn  # no knob
    judged = {k: v for k, v in opts.as_kwargs().items() if k != "chunk"}  # no blocks
    params = inspect.signature(exact_reference).parameters
    assert {k: params[k].default for k in judged} == judged
    assert set(params) - {"task"} == set(judged)
    task = load_config("default")
    assert plan(task, opts)[1] == plan(task, opts.with_(progress=False))[1]
    assert opts.unlimited().max_seconds == opts.unlimited().max_bytes == float("inf")
    with pytest.raises(TypeError, match="EngineOptions"):
        plan(task, opts.as_kwargs())
    with pytest.raises(EnumerationTooLarge):
        plan(task, opts.with_(max_bytes=1))
