"""Stock Hugging Face causal LMs, float64-exact: every quantity of fisher_ref's torch
engine on tiny random-weight Llama, Qwen2, Mistral, GPT-NeoX, OPT, Gemma and Phi (and
more families on-policy) against the brute force of ``tests/torch/hf_brute.py``, which
shares no code with fisher_ref and keeps the module in float64 its own way.

The stock models cast to float32 inside (RMSNorm, eager softmax, rotary angles); without
fisher_ref's dtype audit the results are off by about 1e-7
(``test_without_the_audit_a_stock_llama_is_off``), far outside :data:`RTOL`.
"""
import copy
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")
pytest.importorskip("transformers", reason="the hf extra (transformers) is needed")

from fisher_ref.samplers import TemperatureSampler  # noqa: E402
from fisher_ref.torch.exact import exact_causal_lm  # noqa: E402
from fisher_ref.torch.module import sampler_from_module  # noqa: E402
from tests.torch.hf_brute import brute_force, plain_logits  # noqa: E402
from tests.torch.hf_families import FAMILIES, MORE, V, tiny  # noqa: E402

pytestmark = pytest.mark.torch

RTOL = 1e-12  # float64 against float64: the same sums in another order
PROMPTS, WEIGHTS, T, TEMPERATURE = [[2]], [1.0], 3, 1.6
QUANTITIES = ("score_mean", "sequence_fisher", "token_fisher_sum", "cross_terms", "gradient",
              "covariance", "bound", "reward_std", "expected_reward", "importance_gradient")


def reward(prompt, response):
    return float(list(response).count(2)) + 0.25 * len(response)


def rel(a, b, scale=None):
    a, b = np.asarray(a, float), np.asarray(b, float)
    s = float(np.max(np.abs(b))) if scale is None else scale
    d = float(np.max(np.abs(a - b)))
    return d / s if s > 0 else d


def errors(out, want, streams):
    """Relative error of every quantity of every stream, and of the per-state arrays."""
    errs = {}
    for s in streams:
        w, g = want[s], out["streams"][s]
        for q in QUANTITIES:
            # E[h] is 0 on the policy and centered streams: judge it on the score's size
            scale = max(float(np.max(np.abs(w[q]))), float(np.sqrt(np.max(w["sequence_fisher"]))))
            errs[f"{s}.{q}"] = rel(g[q], w[q], scale if q == "score_mean" else None)
    errs["gradient_autodiff"] = rel(out["gradient_autodiff"], want["gradient_autodiff"])
    errs["states.token_fisher"] = rel(out["states"]["token_fisher"], want["states.token_fisher"])
    return errs


def run(model, sampler=None, max_len=T, **kw):
    return exact_causal_lm(model, PROMPTS, max_len, reward, vocab_size=V, eos=True, bos=V,
                           prompt_weights=WEIGHTS, baseline="mean", sampler=sampler, **kw)


def brute(model, temperature=None, logits=None, max_len=T):
    params = [p for _, p in model.named_parameters()]
    kw = {} if logits is None else {"logits": logits}
    return brute_force(model, params, PROMPTS, WEIGHTS, max_len, V, True, V, reward,
                       temperature=temperature, **kw)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_stock_family_is_float64_exact_on_and_off_policy(family):
    """One off-policy run holds all three streams (the policy stream is the on-policy
    one); Llama and OPT also run without a sampler, a path of its own."""
    attn = "eager" if family in ("llama", "gemma", "gpt_neox") else "sdpa"
    model = tiny(family, attn)
    want = brute(model, TEMPERATURE)
    off = run(model, TemperatureSampler(TEMPERATURE))
    bad = {k: v for k, v in errors(off, want, ("policy", "raw", "centered")).items()
           if not v <= RTOL}
    if family in ("llama", "opt"):
        bad.update({f"on-policy run {k}": v for k, v in errors(run(model), want,
                                                               ("policy",)).items()
                    if not v <= RTOL})
    assert not bad, f"{family} ({attn}): {bad}"
    assert all(r["passed"] for r in off["checks"]), off["checks"]
    if family != "opt":  # OPT with sdpa has no float32 cast
        assert off["upcasts"], "the audit saw none of the stock float32 casts"


@pytest.mark.parametrize("family", list(MORE))
def test_further_families_are_float64_exact(family):
    model = tiny(family, "eager")
    want = brute(model, max_len=2)
    out = run(model, max_len=2)
    bad = {k: v for k, v in errors(out, want, ("policy",)).items() if not v <= RTOL}
    assert not bad, f"{family}: {bad}"


@pytest.mark.parametrize("vectorize", [True, False])
def test_a_family_torch_func_cannot_differentiate_is_refused_by_name(vectorize):
    with pytest.raises(ValueError, match="torch.func"):
        run(tiny("bloom", "eager"), max_len=2, vectorize=vectorize)


def test_a_second_model_as_the_sampler_is_exact():
    """mu = a stale Llama (other weights, eager attention and its float32 casts, run in
    float64 by sampler_from_module): every stream against the brute force."""
    policy, stale = tiny("llama", "sdpa"), tiny("llama", "eager", seed=5)
    want = brute_force(policy, list(policy.parameters()), PROMPTS, WEIGHTS, 2, V, True, V,
                       reward, sampler=stale)
    out = run(policy, sampler_from_module(stale, V), max_len=2)
    bad = {k: v for k, v in errors(out, want, ("policy", "raw", "centered")).items()
           if not v <= RTOL}
    assert not bad, bad
    assert abs(out["streams"]["raw"]["score_mean"]).max() > 1e-3  # mu is not p


def test_a_mixture_of_experts_is_exact_with_vectorize_false():
    """Stock Mixtral cannot run in float64 (grouped_mm has no float64 kernel): fisher_ref's
    private copy takes the eager experts; the brute force sets them itself."""
    model = tiny("mixtral", "eager")
    reference = copy.deepcopy(model)
    reference.set_experts_implementation("eager")
    want = brute(reference, max_len=2)
    with pytest.raises(ValueError, match="vectorize=False"):
        run(model, max_len=2)
    out = run(model, max_len=2, vectorize=False)
    bad = {k: v for k, v in errors(out, want, ("policy",)).items() if not v <= RTOL}
    assert not bad, bad


def test_without_the_audit_a_stock_llama_is_off():
    """The brute force run as the stock model runs (its float32 casts left in) differs
    from the float64 truth by far more than RTOL: the family test can fail."""
    model = tiny("llama", "eager")
    stock = brute(model, logits=plain_logits, max_len=2)
    out = run(model, max_len=2)
    err = rel(out["streams"]["policy"]["sequence_fisher"], stock["policy"]["sequence_fisher"])
    assert err > 1e3 * RTOL, err


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_sdpa_and_eager_agree_without_warnings(attn):
    """No warning per call (sdpa's "no batching rule" one among them), and the same
    numbers from both attention implementations."""
    model, other = tiny("qwen2", attn), tiny("qwen2", "eager" if attn == "sdpa" else "sdpa")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run(model, max_len=2)
    assert not caught, [str(w.message) for w in caught]
    ref = run(other, max_len=2)
    assert rel(out["streams"]["policy"]["sequence_fisher"],
               ref["streams"]["policy"]["sequence_fisher"]) <= RTOL
