"""The torch exact engine (fisher_ref.torch.exact) against the numpy engine, chunking,
bounded memory and bad input."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")

import cases  # noqa: E402
from fisher_ref import list_configs, load_config  # noqa: E402
from fisher_ref.engine.fast import exact  # noqa: E402
from fisher_ref.samplers import LogitsSampler  # noqa: E402
from fisher_ref.torch.exact import torch_exact  # noqa: E402
from fisher_ref.engine.plan import EngineOptions  # noqa: E402
from torch_checks import mismatches  # noqa: E402
from tests.engine.test_identities_exact import small_tasks  # noqa: E402

pytestmark = pytest.mark.torch

RTOL = 1e-10  # float64 against float64: the same sums in another order
ROOT = Path(__file__).resolve().parents[2]
GIB = 2 ** 30
MEMORY_LIMIT = 2 * GIB  # the V=16, T=4, H=128 task must run within this (peak RSS)
# hand-made cases whose models have a torch adapter (the others are autograd functions)
ADAPTED_CASES = ["tabular_context2", "logits_sampler", "custom_reward", "zero_weight_prompt"]


def _ref(task):
    return exact(task, progress=False,
                 options=EngineOptions(keep_states=True, keep_sequences=True))


@pytest.mark.parametrize("config", list_configs())
def test_float64_matches_numpy_engine_on_every_shipped_config(config):
    task = load_config(config)
    bad = mismatches(task, _ref(task), torch_exact(task), RTOL)
    assert not bad, f"{config}: {bad}"


@pytest.mark.parametrize("case", ADAPTED_CASES)
def test_float64_matches_numpy_engine_on_hand_made_cases(case):
    task = cases.get_task(case)
    bad = mismatches(task, _ref(task), torch_exact(task), RTOL)
    assert not bad, f"{case}: {bad}"


@settings(derandomize=True, database=None, deadline=None, max_examples=20)
@given(small_tasks())
def test_float64_matches_numpy_engine_on_random_mlp_tasks(task):
    bad = mismatches(task, _ref(task), torch_exact(task, chunk=3), RTOL)
    assert not bad, f"{task.model.spec}: {bad}"


@st.composite
def gpt2_tasks(draw):
    """Task files of small GPT-2s: vocabulary, layers, heads, widths, prompts, EOS,
    reward, baseline and sampler drawn."""
    from fisher_ref.tasks import task_from_json
    V, eos, T = draw(st.integers(2, 4)), draw(st.booleans()), draw(st.integers(1, 2))
    heads = draw(st.integers(1, 2))
    prompts = draw(st.lists(st.lists(st.integers(0, V - 1), max_size=2), min_size=1,
                            max_size=2))
    spec = {"model": {"arch": "gpt2", "vocab_size": V, "eos": eos,
                      "n_positions": max(len(p) for p in prompts) + T + draw(st.integers(0, 2)),
                      "embed_dim": heads * draw(st.integers(1, 3)),
                      "n_layer": draw(st.integers(1, 2)), "n_head": heads,
                      "init_seed": draw(st.integers(0, 10 ** 6)),
                      "init_scale": draw(st.floats(0.1, 1.5))},
            "prompts": prompts, "max_len": T,
            "reward": {"name": "count", "token": draw(st.integers(0, V - 1))},
            "baseline": draw(st.one_of(st.just("mean"), st.floats(-1.0, 1.0)))}
    if draw(st.booleans()):
        spec["sampler"] = {"kind": "temperature", "temperature": draw(st.floats(0.5, 2.0))}
    return task_from_json(spec)


@settings(derandomize=True, database=None, deadline=None, max_examples=8)
@given(gpt2_tasks())
def test_float64_matches_numpy_engine_on_random_gpt2_tasks(task):
    bad = mismatches(task, _ref(task), torch_exact(task), RTOL)
    assert not bad, f"{task.spec}: {bad}"


@pytest.mark.parametrize("chunk", [1, 2, 7])
def test_results_do_not_depend_on_the_block_size(chunk):
    task = load_config("offpolicy_stale")
    bad = mismatches(task, _ref(task), torch_exact(task, chunk=chunk), RTOL)
    assert not bad, f"chunk {chunk}: {bad}"


def test_kept_arrays_and_variances_are_optional_and_change_nothing():
    task = load_config("offpolicy_stale")
    full = torch_exact(task)
    lean = torch_exact(task, keep_states=False, keep_sequences=False, variances=False)
    assert lean["states"] is None and lean["sequences"] is None and lean["ranges"] is None
    for s, d in full["streams"].items():
        assert lean["streams"][s]["variances"] is None
        for q, v in d.items():
            if q != "variances":
                np.testing.assert_allclose(lean["streams"][s][q], v, rtol=RTOL, atol=0)


def test_sampler_without_support_is_refused_naming_the_token():
    task = load_config("default")
    sampler = LogitsSampler(lambda W: np.where(np.arange(5)[None, :] == 3, -np.inf, 0.0)
                            + 0 * W[:, -1:])
    with pytest.raises(ValueError, match="sampler gives probability 0 to token 3"):
        torch_exact(task.with_(sampler=sampler))


@pytest.mark.parametrize("chunk", [0, -1, 2.5, True])
def test_bad_chunk_is_refused(chunk):
    with pytest.raises(ValueError, match="chunk must be a positive integer"):
        torch_exact(load_config("default"), chunk=chunk)


def test_v16_task_runs_within_2_gib():
    """fisher_ref/configs/scale/v16.json (V=16, T=4, H=128, P=4,376; 54,241 responses) in a
    fresh process; its peak resident memory (VmHWM: interpreter and torch included)
    stays below 2 GiB. The numbers are checked against the numpy engine elsewhere; here
    only that it completes and F equals the token sum."""
    code = textwrap.dedent("""
        import json, torch
        from fisher_ref.perf.memory import peak_rss_bytes
        torch.set_num_threads(1)
        from fisher_ref.perf.scaling import load_scale_config
        from fisher_ref.torch.exact import torch_exact
        out = torch_exact(load_scale_config("v16"))["streams"]["policy"]
        F, tsum = out["sequence_fisher"], out["token_fisher_sum"]
        print(json.dumps({"maxrss": peak_rss_bytes(),
                          "P": int(F.size), "err": float(abs(F - tsum).max() / abs(F).max())}))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["P"] == 4376
    assert got["err"] <= RTOL
    assert got["maxrss"] < MEMORY_LIMIT, f"peak RSS {got['maxrss'] / GIB:.2f} GiB"


def test_every_torch_entry_point_refuses_a_huge_vocabulary_before_allocating(monkeypatch):
    """issue 46 item 15: a Llama with V=50,000 and max_len 3 made exact_causal_lm and
    torch_exact try to allocate 320 GB (an allocator error after 1.8 s), where
    exact(causal_lm_task(...)) refused at once with an estimate. Every entry point now
    refuses with the same estimate, in well under a second, before the walk is set up."""
    import time

    transformers = pytest.importorskip("transformers", reason="the hf extra is needed")
    import fisher_ref.torch.exact as tex
    from fisher_ref.engine.plan import EnumerationTooLarge
    from fisher_ref.torch import causal_lm_task, exact_causal_lm

    V = 50_000
    config = transformers.LlamaConfig(
        vocab_size=V + 1, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8)
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(config).double().eval()

    def no_walk(*args, **kwargs):
        raise AssertionError("the walk was set up: the guard came too late")
    monkeypatch.setattr(tex, "_Run", no_walk)
    monkeypatch.setattr(tex, "torch_model", no_walk)
    reward = lambda prompt, response: float(response.count(2))  # noqa: E731
    kw = dict(vocab_size=V, eos=True, bos=V)
    task = causal_lm_task(llama, [[1]], 3, reward, **kw)
    calls = {"exact (numpy)": lambda: exact(task),
             "torch_exact": lambda: torch_exact(task),
             "torch_exact shard": lambda: torch_exact(task, shard=(0, 2)),
             "exact_causal_lm": lambda: exact_causal_lm(llama, [[1]], 3, reward, **kw)}
    for name, call in calls.items():
        start = time.perf_counter()
        with pytest.raises(EnumerationTooLarge, match=r"estimated memory [\d,.]+ GiB exceeds the "
                           r"limit .* V=50,000, T=3") as info:
            call()
        took = time.perf_counter() - start
        assert took < 1.0, (name, took)
        assert "Use Monte Carlo instead" in str(info.value), name
    # the limits are those of exact(): raised, the estimate is still judged on memory
    with pytest.raises(EnumerationTooLarge, match="estimated memory"):
        torch_exact(task, max_seconds=float("inf"))
