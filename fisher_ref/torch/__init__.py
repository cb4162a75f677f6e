"""The torch twin of fisher_ref: exact enumeration and Monte Carlo in torch, on any
device and dtype, for any model with a torch adapter — the shipped MLP, tabular and
GPT-2 (through ``transformers``) models, and any ``torch.nn.Module`` a user brings —
held against the float64 numpy engines by ``compare``.

- :mod:`fisher_ref.torch.adapters` — the adapter interface, the MLP and tabular adapters,
  the three-line token Fisher, the samplers' logits;
- :mod:`fisher_ref.torch.module` — any torch causal LM as an adapter (:func:`from_module`;
  what it reads off the module: :mod:`~fisher_ref.torch.module_parameters`);
  :mod:`fisher_ref.torch.module_model` — the same module as a model of the numpy engines
  (:func:`causal_lm_task`); :mod:`fisher_ref.torch.gpt2` — the GPT-2 through ``transformers``;
  :mod:`fisher_ref.torch.registry` — the adapter of any model (:func:`torch_model`);
- :mod:`fisher_ref.torch.exact` — exact enumeration (:func:`torch_exact`,
  :func:`exact_causal_lm`), depth-first in bounded blocks
  (:mod:`~fisher_ref.torch.tree`, :mod:`~fisher_ref.torch.window_cache`,
  :mod:`~fisher_ref.torch.moments`);
- :mod:`fisher_ref.torch.precision` — every module evaluation in the run's dtype
  throughout (float32 casts of stock ``transformers`` models rewritten, or refused with
  ``strict=True``); :mod:`fisher_ref.torch.self_check` — the exact identities every result
  carries, and the result's layout by parameter name;
- :mod:`fisher_ref.torch.monte_carlo` — ancestral sampling and estimators in torch;
- ``fisher_ref.torch.recorder`` — :class:`GradientRecorder`, the gradient a Hugging Face
  trainer applies, step by step (imports ``transformers`` when first used);
  ``fisher_ref.torch.tiny`` — a tiny stock Llama and a tokenizer whose ids are a task's
  vocabulary, to run a real trainer on a task fisher_ref enumerates.

Importing this subpackage imports torch (an optional dependency: the ``torch`` extra).
"""
from fisher_ref.torch.adapters import (TorchAdapter, TorchMLP, TorchTabular, accumulation_dtype,
                                       resolve_dtype, token_fisher)
from fisher_ref.torch.exact import exact_causal_lm, torch_exact
from fisher_ref.torch.module import from_module, sampler_from_module
from fisher_ref.torch.module_model import causal_lm_task
from fisher_ref.torch.registry import torch_model
from fisher_ref.torch.monte_carlo import torch_monte_carlo

__all__ = ["torch_exact", "exact_causal_lm", "causal_lm_task", "from_module",
           "sampler_from_module",
           "torch_monte_carlo", "TorchAdapter", "TorchMLP", "TorchTabular", "torch_model",
           "token_fisher", "resolve_dtype", "accumulation_dtype", "GradientRecorder"]


def __getattr__(name):
    """``GradientRecorder`` on first use (it imports ``transformers``)."""
    if name == "GradientRecorder":
        from fisher_ref.torch.recorder import GradientRecorder
        return GradientRecorder
    raise AttributeError(f"module 'fisher_ref.torch' has no attribute {name!r}")
