"""Any autograd-differentiable batched logits function as a fisher_ref model."""
from __future__ import annotations

import numpy as np

from fisher_ref.limits import MAX_CONTEXT, check_size
from fisher_ref.models.base import WindowModel, check_positive_int

__all__ = ["FunctionModel"]


class FunctionModel(WindowModel):
    """Wrap any autograd-differentiable ``logits_fn(theta, windows) -> (B, V)``.

    Args:
        logits_fn: batched logits function, differentiable by autograd in theta.
        num_params: length of theta.
        vocab_size: ``V``.
        context: window length ``k`` (use the longest state length for a model
            that reads its whole history).
        eos: whether id 0 is EOS.
        name: a label for reports.
    """

    def __init__(self, logits_fn, num_params, vocab_size, context, eos=True, name="custom"):
        if not callable(logits_fn):
            raise TypeError(f"FunctionModel needs a callable logits_fn(theta, windows), got "
                            f"{type(logits_fn).__name__}")
        self._fn = logits_fn
        self.num_params = check_positive_int(num_params, "num_params")
        self.vocab_size = check_positive_int(vocab_size, "vocab_size")
        self.context = check_positive_int(context, "context")
        check_size(self.context, "context", MAX_CONTEXT, "tokens a model reads")
        if not isinstance(eos, (bool, np.bool_)):
            raise ValueError(f"eos must be True or False, got {eos!r}")
        if eos and self.vocab_size < 2:
            raise ValueError("vocab_size must be at least 2 when eos is on")
        self.eos = bool(eos)
        self.bos = self.vocab_size
        self.name = name

    def layout(self):
        return [("theta", (self.num_params,), 0)]

    def logits(self, theta, windows):
        return self._fn(theta, windows)

    def describe(self):
        return {"arch": self.name, "vocab_size": self.vocab_size, "context": self.context,
                "eos": self.eos, "bos": self.bos}
