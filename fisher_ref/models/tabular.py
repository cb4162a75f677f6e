"""The tabular model: the logits of each window are parameters."""
from __future__ import annotations

import math

import autograd.numpy as anp
import numpy as np

from fisher_ref.limits import MAX_CONTEXT, check_size, readable
from fisher_ref.models.base import (WindowModel, check_common_fields, check_param_count,
                                    check_positive_int)

__all__ = ["TabularModel"]


class TabularModel(WindowModel):
    r"""Logits are the parameters: one row of ``V`` logits per possible window.

    ``theta`` reshaped to ``((V+1)^k, V)``; the row of a window
    ``c_1..c_k`` is :math:`\sum_p c_p (V+1)^{k-p}`. Its token Fisher is
    :math:`f = p(1-p)` for the visited row and 0 elsewhere.
    """

    name = "tabular"

    def __init__(self, vocab_size, context=1, eos=True, init_seed=0, init_scale=1.0):
        self.vocab_size = check_positive_int(vocab_size, "model.vocab_size")
        self.context = check_positive_int(context, "model.context")
        check_size(self.context, "model.context", MAX_CONTEXT, "tokens a model reads")
        check_common_fields(vocab_size, eos, init_seed, init_scale)
        # (V+1)^k V parameters, compared in logs before the power is formed
        check_param_count(self.context * math.log10(self.vocab_size + 1)
                          + math.log10(self.vocab_size), "tabular",
                          f"vocab_size={readable(self.vocab_size)}, context={self.context}")
        self.eos = bool(eos)
        self.bos = self.vocab_size
        self.rows = (self.vocab_size + 1) ** self.context
        self.num_params = self.rows * self.vocab_size
        self.init_seed, self.init_scale = init_seed, init_scale

    def layout(self):
        return [("table", (self.rows, self.vocab_size), 0)]

    def init_params(self):
        rng = np.random.default_rng(self.init_seed)
        return self.init_scale * rng.standard_normal(self.num_params)

    def row_index(self, windows):
        base = (self.vocab_size + 1) ** np.arange(self.context - 1, -1, -1)
        return windows @ base  # (B,)

    def logits(self, theta, windows):
        table = anp.reshape(theta, (self.rows, self.vocab_size))
        return table[self.row_index(windows)]  # (B, V)

    def describe(self):
        return {"arch": self.name, "vocab_size": self.vocab_size, "context": self.context,
                "eos": self.eos, "bos": self.bos, "init_seed": self.init_seed,
                "init_scale": self.init_scale}
