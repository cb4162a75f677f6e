"""The torch twin of fisher_ref: the same models and exact quantities in torch, on
any device and dtype, held against the float64 numpy engines by ``compare``.

- :mod:`fisher_ref.torch.model` — the models in torch, logit sensitivities by
  ``torch.func``, the three-line token Fisher, the samplers' logits;
- :mod:`fisher_ref.torch.exact` — exact enumeration in torch;
- :mod:`fisher_ref.torch.monte_carlo` — ancestral sampling and estimators in torch.

Importing this subpackage imports torch (an optional dependency: the ``torch`` extra).
"""
from .exact import torch_exact
from .model import TorchMLP, accumulation_dtype, resolve_dtype, token_fisher, torch_model
from .monte_carlo import torch_monte_carlo

__all__ = ["torch_exact", "torch_monte_carlo", "TorchMLP", "torch_model", "token_fisher",
           "resolve_dtype", "accumulation_dtype"]
