"""The window MLP of docs/theory.md §4.1: embeddings of the last ``context`` tokens, one tanh
layer, a linear head."""
from __future__ import annotations

import autograd.numpy as anp

from fisher_ref.models.base import ModelSpec, SpecModel, WindowModel
from fisher_ref.numerics import TANH_CLIP

__all__ = ["MLPModel"]


class MLPModel(SpecModel, WindowModel):
    """The MLP of docs/theory.md §4.1 over a window of the last ``k`` tokens.

    Example:
        >>> import numpy as np
        >>> m = MLPModel(ModelSpec(vocab_size=5, context=2, embed_dim=3, hidden=8))
        >>> m.num_params, m.bos
        (119, 5)
        >>> m.logits(m.init_params(), np.array([[5, 1]])).shape
        (1, 5)
    """

    name = "mlp_window"

    def __init__(self, spec: ModelSpec):
        super().__init__(spec)
        self.context = spec.context

    def hidden(self, theta, windows):
        """``(e, hid)`` for a batch of windows: ``(B, k*d)`` and ``(B, H)``."""
        p = self.unpack(theta)
        B = windows.shape[0]
        e = anp.reshape(p["E"][windows], (B, -1))  # (B, k*d)
        # tanh is exactly +-1 in float64 past |y| = 20; clipping there keeps autograd's
        # derivative 1/cosh(y)^2 from overflowing (it is 0 to rounding either way)
        hid = anp.tanh(anp.clip(anp.dot(e, p["W1"]) + p["b1"], -TANH_CLIP, TANH_CLIP))  # (B, H)
        return e, hid

    def logits(self, theta, windows):
        """``z = tanh(e W1 + b1) W2 + b2``: ``(B, k)`` windows -> ``(B, V)`` logits."""
        p = self.unpack(theta)
        _, hid = self.hidden(theta, windows)
        return anp.dot(hid, p["W2"]) + p["b2"]  # (B, V)
