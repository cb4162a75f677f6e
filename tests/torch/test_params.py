"""theta over the parameters users train (``params=``), its layout by name, a PEFT LoRA
adapter, and input-only prompt ids: each against the independent brute force of
``tests/torch/hf_brute.py`` over exactly the selected tensors."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")
pytest.importorskip("transformers", reason="the hf extra (transformers) is needed")
peft = pytest.importorskip("peft", reason="the hf extra (peft) is needed")

from fisher_ref.engine.fast import exact  # noqa: E402
from fisher_ref.torch.module_model import causal_lm_task
from fisher_ref.torch.exact import exact_causal_lm
from tests.torch.hf_brute import brute_force  # noqa: E402
from tests.torch.hf_families import V, tiny  # noqa: E402

pytestmark = pytest.mark.torch

RTOL = 1e-12
T = 2


def reward(prompt, response):
    return float(list(response).count(2)) + 0.25 * len(response)


def rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    s = float(np.max(np.abs(b)))
    return float(np.max(np.abs(a - b))) / s if s > 0 else float(np.max(np.abs(a - b)))


def check(out, want):
    pol, w = out["streams"]["policy"], want["policy"]
    errs = {q: rel(pol[q], w[q]) for q in ("sequence_fisher", "token_fisher_sum", "gradient",
                                           "cross_terms", "bound")}
    errs["gradient_autodiff"] = rel(out["gradient_autodiff"], want["gradient_autodiff"])
    bad = {k: v for k, v in errs.items() if not v <= RTOL}
    assert not bad, bad


def frozen_llama():
    """A tiny Llama with everything frozen but the attention projections of layer 0."""
    model = tiny("llama", "sdpa")
    for name, p in model.named_parameters():
        p.requires_grad_("self_attn" in name)
    return model


def run(model, prompts=((2,),), **kw):
    return exact_causal_lm(model, [list(p) for p in prompts], T, reward, vocab_size=V,
                           eos=True, bos=V, **kw)


def test_trainable_params_are_theta_and_match_a_brute_force_over_them():
    model = frozen_llama()
    out = run(model, params="trainable")
    chosen = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert out["params"] == [n for n, _ in chosen]
    assert out["streams"]["policy"]["sequence_fisher"].shape == (sum(p.numel()
                                                                     for _, p in chosen),)
    check(out, brute_force(model, [p for _, p in chosen], [[2]], [1.0], T, V, True, V, reward))


def test_names_and_predicates_select_the_same_theta():
    model = frozen_llama()
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    a = run(model, params="trainable")
    b = run(model, params=names)
    c = run(model, params=lambda name, p: "self_attn" in name)
    for other in (b, c):
        assert other["layout"] == a["layout"]
        np.testing.assert_array_equal(other["streams"]["policy"]["sequence_fisher"],
                                      a["streams"]["policy"]["sequence_fisher"])


def test_by_name_returns_the_block_shaped_like_the_parameter():
    model = frozen_llama()
    out = run(model, params="trainable")
    name = "model.layers.0.self_attn.q_proj.weight"
    shape = tuple(dict(model.named_parameters())[name].shape)
    (_, _, off), = [b for b in out["layout"] if b[0] == name]
    F = out["streams"]["policy"]["sequence_fisher"]
    n = int(np.prod(shape))
    np.testing.assert_array_equal(out.by_name(name), F[off:off + n].reshape(shape))
    assert out.by_name(name, "gradient").shape == shape
    assert out.by_name(name, "token_fisher").shape == (len(out["states"]["tokens"]),) + shape
    assert out.by_name(name, "cross_terms").shape == (T, T) + shape
    with pytest.raises(KeyError, match="q_proj"):
        out.by_name("q_proj.weight")
    with pytest.raises(ValueError, match="last axis is P"):
        out.by_name(name, np.zeros(3))


def test_lora_adapter_fisher_equals_a_brute_force_over_the_adapter_weights():
    model = tiny("llama", "sdpa")
    cfg = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                          lora_dropout=0.0, init_lora_weights=False)
    torch.manual_seed(1)
    lora = peft.get_peft_model(model, cfg).double().eval()
    adapters = [(n, p) for n, p in lora.named_parameters() if p.requires_grad]
    assert adapters and all("lora_" in n for n, _ in adapters)
    out = run(lora, params="trainable")
    assert out["params"] == [n for n, _ in adapters]
    P = sum(p.numel() for _, p in adapters)
    assert out["gradient_autodiff"].shape == (P,)
    want = brute_force(lora, [p for _, p in adapters], [[2]], [1.0], T, V, True, V, reward)
    check(out, want)
    assert float(np.max(want["policy"]["sequence_fisher"])) > 0


def test_the_numpy_engine_runs_the_same_selection():
    """causal_lm_task(params="trainable") on the numpy engine (one backward pass per logit)
    agrees with the torch engine's vmap(jacrev) on the frozen Llama."""
    model = frozen_llama()
    task = causal_lm_task(model, [[2]], T, reward, vocab_size=V, eos=True, bos=V,
                          params="trainable")
    ref = exact(task, progress=False)
    out = run(model, params="trainable")
    assert task.model.layout() == out["layout"]
    for q in ("sequence_fisher", "gradient", "cross_terms"):
        assert rel(getattr(ref.streams["policy"], q), out["streams"]["policy"][q]) <= 1e-10, q


def test_input_only_ids_in_prompts_match_the_brute_force_and_the_numpy_engine():
    """An embedding of V + 3 rows: ids 0..3 generated, BOS 4, 5 and 6 input-only (system
    and separator tokens), allowed in prompts and never generated."""
    model = tiny("llama", "sdpa", vocab_rows=V + 3)
    prompts = [[5, 2, 6], [6]]
    out = run(model, prompts, prompt_weights=[0.5, 0.5])
    assert out["streams"]["policy"]["sequence_fisher"].shape[0] == sum(
        p.numel() for p in model.parameters())
    assert out["states"]["probs"].shape[1] == V  # ids 5, 6 are never generated
    want = brute_force(model, list(model.parameters()), prompts, [0.5, 0.5], T, V, True, V,
                       reward)
    check(out, want)
    task = causal_lm_task(model, prompts, T, reward, vocab_size=V, eos=True, bos=V)
    ref = exact(task, progress=False)
    assert rel(ref.streams["policy"].sequence_fisher,
               out["streams"]["policy"]["sequence_fisher"]) <= 1e-10


@pytest.mark.parametrize("prompt, match", [
    ([7], r"prompt 0 holds token id 7, out of range 0\.\.6 \(vocab_size=4; ids 4\.\.6 are "
          r"input-only\)"),
    ([4], r"bos id: bos=4 is put before every input"),
    ([-1], "out of range"),
])
def test_bad_prompt_ids_are_named(prompt, match):
    with pytest.raises(ValueError, match=match):
        run(tiny("llama", "sdpa", vocab_rows=V + 3), [prompt])


def test_a_bos_above_v_is_not_mistaken_for_a_prompt_id():
    """bos=7 on an 8-row embedding: id 4 is an input-only id, fine in a prompt; 8 is
    refused as outside the embedding, not as 'the BOS'."""
    model = tiny("llama", "sdpa", vocab_rows=8)
    out = exact_causal_lm(model, [[4, 1]], T, reward, vocab_size=V, eos=True, bos=7)
    assert all(r["passed"] for r in out["checks"])
    with pytest.raises(ValueError, match=r"token id 8, out of range 0\.\.7"):
        exact_causal_lm(model, [[8]], T, reward, vocab_size=V, eos=True, bos=7)
