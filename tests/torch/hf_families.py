"""Tiny stock Hugging Face causal LMs (1 layer, hidden 8, V = 4 plus BOS) for the tests."""
import torch
import transformers

V = 4  # generated ids 0..3; BOS = 4; the embedding has V + 1 rows

_ATTN = dict(num_attention_heads=2, num_key_value_heads=1)
#: family -> (config class, model class, config keywords), the seven the issue names first
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(intermediate_size=16, **_ATTN)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(intermediate_size=16,
                                                       tie_word_embeddings=True, **_ATTN)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(intermediate_size=16,
                                                             sliding_window=2, **_ATTN)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(intermediate_size=16,
                                                              num_attention_heads=2,
                                                              rotary_pct=0.5)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(ffn_dim=16, num_attention_heads=2,
                                                word_embed_proj_dim=8, pad_token_id=None)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(intermediate_size=16, head_dim=4,
                                                      **_ATTN)),
    "phi": ("PhiConfig", "PhiForCausalLM", dict(intermediate_size=16, num_attention_heads=2)),
}
#: further families, run on-policy
MORE = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(intermediate_size=16, head_dim=4, **_ATTN)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(intermediate_size=16, **_ATTN,
                                                   pad_token_id=None)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(intermediate_size=16, head_dim=4,
                                                         **_ATTN)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(intermediate_size=16, **_ATTN)),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(intermediate_size=16, **_ATTN,
                                                   pad_token_id=None)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_head=2, n_embd=8, n_layer=1,
                                                   n_positions=8)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(n_head=2, n_embd=8, n_layer=1,
                                                   n_positions=8, rotary_dim=2)),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(num_attention_heads=2,
                                                         new_decoder_architecture=False)),
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(intermediate_size=16, **_ATTN)),
}
#: a mixture of experts: its default grouped_mm experts have no float64 kernel, and its
#: routing is data-dependent control flow (vectorize=False)
MOE = {"mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(intermediate_size=16,
                                                               num_local_experts=2,
                                                               num_experts_per_tok=1, **_ATTN))}
#: a family torch.func cannot differentiate (its GELU is an autograd.Function without
#: setup_context): refused with a message, not run
UNDIFFERENTIABLE = {"bloom": ("BloomConfig", "BloomForCausalLM", dict(n_head=2, n_layer=1))}


def tiny(family, attn="sdpa", seed=0, vocab_rows=V + 1):
    """A float64 one-layer model of ``family`` in eval mode, its weights the library's
    init moved off it by 0.3 N(0, 1) per entry (norms start at 1 and biases at 0);
    ``vocab_rows`` rows of embedding (``V`` generated ids, BOS ``V``, the rest input-only)."""
    cfg_name, cls_name, kw = {**FAMILIES, **MORE, **MOE, **UNDIFFERENTIABLE}[family]
    base = dict(vocab_size=vocab_rows, hidden_size=8, num_hidden_layers=1,
                max_position_embeddings=8, bos_token_id=V, eos_token_id=0)
    cfg = getattr(transformers, cfg_name)(**{**base, **kw})
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(cfg).to(torch.float64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model
