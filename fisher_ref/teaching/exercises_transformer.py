"""Exercises of lesson 7 (a small GPT-2): reading its parameter layout.

Each judge computes its reference from the model itself (:meth:`unpack` of the
Fisher vector, the model's spec), not from the solution's route. They join the
one registry in :mod:`fisher_ref.teaching.exercises`.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.teaching.exercise import Exercise, close_to

__all__ = ["TRANSFORMER_EXERCISES"]

LESSON = "07_transformer"
C_ATTN_BIAS = "transformer.h.0.attn.c_attn.bias"


def _fisher_blocks(ns):
    """The sequence Fisher of the setup's task, as named blocks."""
    return ns["task"].model.unpack(ns["r"].sequence_fisher)


def _expected_key(ns):
    """Flat indices of block 0's key bias: entries d..2d-1 of c_attn.bias."""
    d = ns["task"].model.spec.embed_dim
    start = next(off for name, _, off in ns["task"].model.layout() if name == C_ATTN_BIAS)
    return start + d + np.arange(d)  # (d,)


def _expected_attention_share(ns):
    blocks = _fisher_blocks(ns)
    attn = sum(v.sum() for name, v in blocks.items() if name.split(".")[3:4] == ["attn"])
    return attn / sum(v.sum() for v in blocks.values())


def _expected_unused(ns):
    wpe = _fisher_blocks(ns)["transformer.wpe.weight"]  # (n_positions, d)
    return np.flatnonzero(np.all(wpe == 0, axis=1))


_GPT2 = """\
import numpy as np
from fisher_ref import load_config, exact
task = load_config("gpt2_small")
r = exact(task, progress=False)
F = r.sequence_fisher                                        # (P,)
layout = {name: (shape, offset) for name, shape, offset in task.model.layout()}"""

TRANSFORMER_EXERCISES = [
    Exercise("key-bias-slice", LESSON, "find the key bias",
             r"`transformer.h.0.attn.c_attn.bias` holds $3d$ numbers: the query bias, then the "
             r"key bias, then the value bias, $d$ each. Using `layout`, set `key` to the flat "
             r"indices in `theta` of the **key** bias (an integer array of length $d$). Then "
             r"look at `F[key]` next to the query bias's Fisher.",
             _GPT2, "key", f"""(n3,), off = layout["{C_ATTN_BIAS}"]
d = n3 // 3
key = off + np.arange(d, 2 * d)
print(F[key].max(), F[off:off + d].max())          # key bias: rounding level; query: not""",
             f"""(n3,), off = layout["{C_ATTN_BIAS}"]
key = off + np.arange(n3 // 3)""",
             close_to(_expected_key, rtol=0, hint="The order is query, key, value.")),
    Exercise("attention-share", LESSON, "the attention share",
             r"What share of the total Fisher $\sum_i F_i$ of gpt2_small do the attention "
             r"parameters hold: `attn.c_attn` and `attn.c_proj`, weights and biases, of every "
             r"block? Set `share` to a number between 0 and 1.",
             _GPT2, "share", """share = sum(F[off:off + int(np.prod(shape))].sum()
            for name, (shape, off) in layout.items() if ".attn." in name) / F.sum()""",
             """share = sum(F[off:off + int(np.prod(shape))].sum()
            for name, (shape, off) in layout.items()
            if "c_attn" in name or "c_proj" in name) / F.sum()""",
             close_to(_expected_attention_share, rtol=1e-10,
                      hint="Does your selection catch the MLP's `mlp.c_proj` too?")),
    Exercise("unused-positions", LESSON, "positions no state reaches",
             r"Predict before you compute. gpt2_small has `n_positions` $= 8$, prompts `[1, 2]` "
             r"and `[3]`, and responses of at most `max_len` $= 3$ tokens; a state's input is "
             r"BOS, the prompt and the tokens generated so far. Which rows of the position "
             r"embedding `wpe` (positions 0..7) have $F_i = 0$, because no input is that long? "
             r"Set `unused` to those positions in increasing order; then check them against `F`.",
             _GPT2, "unused", """longest = 1 + max(len(p) for p in task.prompts) + task.max_len - 1  # BOS, prompt, T - 1
unused = np.arange(longest, task.model.spec.n_positions)""",
             """unused = np.arange(max(len(p) for p in task.prompts) + task.max_len - 1,
                   task.model.spec.n_positions)""",
             close_to(_expected_unused, rtol=0,
                      hint="Count BOS, and remember the last token of a response is never read.")),
]
