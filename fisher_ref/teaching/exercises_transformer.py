"""Exercises of lesson 7 (a small GPT-2): reading its parameter layout.

Each judge computes its reference from the model itself (:meth:`unpack` of a vector, the
model's spec), not from the solution's route. They join the one registry in
:mod:`fisher_ref.teaching.exercise_bank`.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.teaching.exercise import Exercise, Mistake, close_to

__all__ = ["TRANSFORMER_EXERCISES"]

LESSON = "07_transformer"
C_ATTN_WEIGHT = "transformer.h.0.attn.c_attn.weight"


def _fisher_blocks(ns):
    """The sequence Fisher of the setup's task, as named blocks."""
    return ns["task"].model.unpack(ns["r"].sequence_fisher)


def _expected_key_weight(ns):
    """Flat indices of block 0's key weights: unpack a vector that holds its own indices."""
    model = ns["task"].model
    d = model.spec.embed_dim
    # (d, 3d)
    where = model.unpack(np.arange(model.num_params, dtype=float))[C_ATTN_WEIGHT]
    return np.sort(where[:, d:2 * d].ravel())  # (d * d,)


def _expected_proj_share(ns):
    attn = {name: v.sum() for name, v in _fisher_blocks(ns).items()
            if name.split(".")[3:4] == ["attn"]}
    return sum(v for name, v in attn.items() if name.split(".")[4] == "c_proj") / sum(
        attn.values())


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
    Exercise(
        "key-weight-slice", LESSON, "find the key weights",
        r"`transformer.h.0.attn.c_attn.weight` has shape $(d, 3d)$: it maps the $d$ inputs "
        r"to the queries, keys and values, $d$ outputs each, in that order, and `theta` holds "
        r"it row by row. Set `key` to the flat indices in `theta` of the **key** weights, in "
        r"increasing order (an integer array of length $d^2$). Then compare `F[key]` with the "
        r"key bias's Fisher: is it zero too?",
        _GPT2, "key", f"""(d, d3), off = layout["{C_ATTN_WEIGHT}"]
# (d, 3d) index of each entry
flat = off + np.arange(d * d3).reshape(d, d3)
key = np.sort(flat[:, d:2 * d].ravel())
print(F[key].max())                        # not zero: K_u = Y_u W_K varies with u""",
        r"The key outputs are columns $d..2d-1$ of every row, so in a row-major layout they "
        r"are $d$ short runs, not one block. Their Fisher is not zero: $Y_u W_K$ changes "
        r"with the key position $u$, unlike the shared shift $b_K$.",
        (Mistake(f"""(d, d3), off = layout["{C_ATTN_WEIGHT}"]
key = off + np.arange(d * d, 2 * d * d)""",
                 "the key part is not a contiguous run: the block is stored row by row, shape "
                 "$(d, 3d)$, and the keys are columns $d..2d-1$ of *every* row."),
         Mistake(f"""(d, d3), off = layout["{C_ATTN_WEIGHT}"]
key = np.sort((off + np.arange(d * d3).reshape(d, d3))[:, :d].ravel())""",
                 "those are the query columns; the order is query, key, value, so the keys "
                 "are the second third.")),
        close_to(_expected_key_weight, rtol=0)),
    Exercise(
        "attention-proj-share", LESSON, "inside attention",
        r"Of the Fisher $\sum_i F_i$ that gpt2_small's attention parameters hold "
        r"(`attn.c_attn` and `attn.c_proj`, weights and biases, of every block), what share "
        r"sits in the output projection `attn.c_proj`? Set `share` to a number between 0 "
        r"and 1.",
        _GPT2, "share", """attn = {name: F[off:off + int(np.prod(shape))].sum()
        for name, (shape, off) in layout.items() if ".attn." in name}
share = sum(v for name, v in attn.items() if ".c_proj." in name) / sum(attn.values())""",
        r"Select blocks by the name part `attn`: `c_proj` alone is ambiguous, since the MLP "
        r"has a `c_proj` too. The share is of attention's own Fisher, so that is the "
        r"denominator.",
        (Mistake("""attn = sum(F[off:off + int(np.prod(shape))].sum()
           for name, (shape, off) in layout.items() if ".attn." in name)
share = sum(F[off:off + int(np.prod(shape))].sum()
            for name, (shape, off) in layout.items() if "c_proj" in name) / attn""",
                 "your selection also catches the MLP's `mlp.c_proj`; keep only names with "
                 "`.attn.` in them."),
         Mistake("""share = sum(F[off:off + int(np.prod(shape))].sum()
            for name, (shape, off) in layout.items() if ".attn.c_proj." in name) / F.sum()""",
                 "that is a share of the whole model's Fisher; the question asks for a share "
                 "of attention's Fisher.")),
        close_to(_expected_proj_share, rtol=1e-10)),
    Exercise(
        "unused-positions", LESSON, "positions no state reaches",
        r"Predict before you compute. gpt2_small has `n_positions` $= 8$, prompts `[1, 2]` "
        r"and `[3]`, and responses of at most `max_len` $= 3$ tokens; a state's input is "
        r"BOS, the prompt and the tokens generated so far. Which rows of the position "
        r"embedding `wpe` (positions 0..7) have $F_i = 0$, because no input is that long? "
        r"Set `unused` to those positions in increasing order; then check them against `F`.",
        _GPT2, "unused", """# BOS, the longest prompt, then T - 1 generated tokens
longest = 1 + max(len(p) for p in task.prompts) + task.max_len - 1
unused = np.arange(longest, task.model.spec.n_positions)""",
        r"The longest input is BOS, the longest prompt and $T - 1$ generated tokens: the "
        r"last drawn token is never read, since no state follows it. Positions from that "
        r"length on never enter an input, so their `wpe` rows get no Fisher.",
        (Mistake("""unused = np.arange(max(len(p) for p in task.prompts) + task.max_len - 1,
                   task.model.spec.n_positions)""",
                 "count BOS: it takes position 0 of every input."),
         Mistake("""unused = np.arange(1 + max(len(p) for p in task.prompts) + task.max_len,
                   task.model.spec.n_positions)""",
                 "the last token of a response is never read: no state follows it, so the "
                 "longest input holds only $T - 1$ generated tokens.")),
        close_to(_expected_unused, rtol=0)),
]
