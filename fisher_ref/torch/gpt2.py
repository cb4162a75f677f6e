"""The GPT-2 of :mod:`fisher_ref.models.gpt2` in torch: ``transformers``' ``GPT2LMHeadModel``
over the flat ``theta`` (built by :func:`fisher_ref.hf.to_hf`), whose ``named_parameters()``
order is the GPT-2 ``theta`` layout."""
from __future__ import annotations

import numpy as np

from fisher_ref.torch.module import from_module

__all__ = ["gpt2_adapter"]


def gpt2_adapter(model, device="cpu", dtype="float64"):
    """The GPT-2 of :mod:`fisher_ref.models.gpt2` as ``transformers``' ``GPT2LMHeadModel`` over the
    flat ``theta``: input ``[BOS] + s`` (BOS = ``V``), padded to ``n_positions``; logits of
    the last real position, columns ``0..V-1``."""
    from fisher_ref.models.hf import to_hf
    hf = to_hf(model, np.zeros(model.num_params))
    adapter = from_module(hf, model.vocab_size, model.eos, bos=model.bos,
                          positions=model.context, device=device, dtype=dtype, name="gpt2")
    want = [n for n, _, _ in model.layout()]
    if adapter.names != want:
        raise RuntimeError(f"GPT2LMHeadModel parameters {adapter.names} differ from the GPT-2 "
                           f"layout {want}")
    return adapter
