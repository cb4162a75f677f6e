"""The torch twin of fisher_ref: exact enumeration and Monte Carlo in torch, on any
device and dtype, for any model with a torch adapter — the shipped MLP, tabular and
GPT-2 (through ``transformers``) models, and any ``torch.nn.Module`` a user brings —
held against the float64 numpy engines by ``compare``.

- :mod:`fisher_ref.torch.model` — the adapter interface, the MLP and tabular adapters,
  the three-line token Fisher, the samplers' logits;
- :mod:`fisher_ref.torch.module` — any torch causal LM (:func:`from_module`,
  :func:`causal_lm_task`, :func:`exact_causal_lm`), the GPT-2 through ``transformers``;
- :mod:`fisher_ref.torch.exact` — exact enumeration, depth-first in bounded blocks
  (:mod:`~fisher_ref.torch.tree`, :mod:`~fisher_ref.torch.windows`,
  :mod:`~fisher_ref.torch.moments`);
- :mod:`fisher_ref.torch.monte_carlo` — ancestral sampling and estimators in torch.

Importing this subpackage imports torch (an optional dependency: the ``torch`` extra).
"""
from .exact import torch_exact
from .model import (TorchAdapter, TorchMLP, TorchTabular, accumulation_dtype, resolve_dtype,
                    token_fisher, torch_model)
from .module import causal_lm_task, exact_causal_lm, from_module
from .monte_carlo import torch_monte_carlo

__all__ = ["torch_exact", "exact_causal_lm", "causal_lm_task", "from_module",
           "torch_monte_carlo", "TorchAdapter", "TorchMLP", "TorchTabular", "torch_model",
           "token_fisher", "resolve_dtype", "accumulation_dtype"]
