"""The torch twin of any fisher_ref model: :func:`torch_model`.

One table maps each numpy model class to the constructor of its torch adapter; a model
built from a torch module (:class:`fisher_ref.torch.module_model.TorchModuleModel`)
carries its own adapter.
"""
from __future__ import annotations

import torch

from fisher_ref.models.mlp import MLPModel
from fisher_ref.models.tabular import TabularModel
from fisher_ref.models.gpt2 import GPT2Model
from fisher_ref.torch.adapters import TorchAdapter, TorchMLP, TorchTabular
from fisher_ref.torch.gpt2 import gpt2_adapter
from fisher_ref.torch.module_model import TorchModuleModel

__all__ = ["torch_model", "adapter_of", "ADAPTERS"]

#: numpy model class -> constructor ``(model, device, dtype) -> adapter``
ADAPTERS = {MLPModel: TorchMLP, TabularModel: TorchTabular}


def torch_model(model, device="cpu", dtype="float64"):
    """The torch adapter of a fisher_ref model, or :class:`NotImplementedError` naming its arch.

    MLP and tabular models get :class:`TorchMLP` / :class:`TorchTabular`; the GPT-2 gets
    ``transformers``' ``GPT2LMHeadModel`` over the flat ``theta``
    (:func:`fisher_ref.torch.gpt2.gpt2_adapter`); a model built from a torch module
    (:func:`fisher_ref.torch.module_model.causal_lm_task`) gets its own module adapter.
    """
    if isinstance(model, TorchAdapter):
        return model
    for cls, make in ADAPTERS.items():
        if isinstance(model, cls):
            return make(model, device=device, dtype=dtype)
    adapter = adapter_of(model, device=device, dtype=dtype)
    if adapter is None:
        arch = getattr(model, "name", type(model).__name__)
        raise NotImplementedError(
            f"the torch engine covers the arches 'mlp_window', 'tabular', 'gpt2' and torch "
            f"modules (fisher_ref.torch.from_module); this task's model has arch {arch!r}, "
            "an autograd function with no torch twin")
    return adapter


def adapter_of(model, device="cpu", dtype="float64"):
    """The module adapter of a GPT-2 or a :class:`TorchModuleModel` (else ``None``)."""
    if isinstance(model, TorchModuleModel):
        ad = model.adapter
        if torch.device(device) == ad.device and ad.dtype == torch.float64 and dtype in (
                "float64", torch.float64):
            return ad
        return ad.respecified(device, dtype)
    if isinstance(model, GPT2Model):
        try:
            return gpt2_adapter(model, device=device, dtype=dtype)
        except ModuleNotFoundError as exc:
            if exc.name != "transformers":
                raise
            raise NotImplementedError(
                "the torch twin of the GPT-2 is transformers' GPT2LMHeadModel: install the "
                "hf extra (pip install -e \".[hf]\")") from None
    return None
