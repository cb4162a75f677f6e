r"""The walk over the prefix tree, shared by both numpy engines.

States are visited depth-first in blocks of at most ``chunk`` rows (:func:`depth_first`),
so memory stays bounded by one block's children, not by ``V^T``. A *block* is a dict of
``B`` states of one depth:

- ``prompt (B,)``, ``tokens (B, L + 1)`` (prompt then generated tokens, ``-1``
  padded, ``L`` = longest prompt + ``max_len``), ``length (B,)``, ``depth``;
- ``rp``, ``rq`` ``(B,)``: reach probability under the policy ``p`` and the
  sampler ``mu`` (equal without a sampler);
- per-stream arrays named in :data:`PER_STREAM`, stream axis first ``(S, B, ...)``.

The torch twin is :mod:`fisher_ref.torch.tree` (a ``Block`` dataclass).
"""
from __future__ import annotations

import numpy as np

from fisher_ref.rewards import evaluate_reward

__all__ = ["PER_STREAM", "root_block", "take_rows", "depth_first", "terminal", "expand", "carry",
           "responses"]


PER_STREAM = ("hist", "H", "G")


def root_block(task, n_streams, carried):
    """The block of the prompts (depth 0), carrying zeroed per-stream arrays ``carried``.

    Args:
        task: a :class:`fisher_ref.tasks.Task`.
        n_streams: ``S``.
        carried: names from :data:`PER_STREAM`.
    """
    n, T, P = len(task.prompts), task.max_len, task.model.num_params
    L = max(len(p) for p in task.prompts) + T
    tokens = np.full((n, L + 1), -1, dtype=np.int64)  # (n, L+1)
    for i, pr in enumerate(task.prompts):
        tokens[i, :len(pr)] = pr
    w = task.prompt_weights.astype(float)  # (n,)
    block = {"prompt": np.arange(n), "tokens": tokens,
             "length": np.array([len(p) for p in task.prompts], dtype=np.int64), "depth": 0,
             "rp": w.copy(), "rq": w.copy()}
    for k in carried:
        block[k] = np.zeros((n_streams, n, T, P) if k == "hist" else (n_streams, n, P))
    return block


def take_rows(block, idx):
    """Rows ``idx`` (slice, index or boolean array) of a block: axis 1 of the
    per-stream arrays, axis 0 of the other arrays."""
    return {k: (v[:, idx] if k in PER_STREAM else
                v[idx] if isinstance(v, np.ndarray) and v.ndim else v)
            for k, v in block.items()}


def depth_first(stack, chunk):
    """Pop blocks of at most ``chunk`` states from ``stack`` until it is empty.

    A larger block is split: its last ``chunk`` rows are yielded, the rest go
    back on the stack. The caller pushes each block's open children onto
    ``stack``, so memory holds one path of blocks, not the whole tree.
    """
    while stack:
        block = stack.pop()
        n = block["prompt"].shape[0]
        if n > chunk:
            stack.append(take_rows(block, slice(0, n - chunk)))
            block = take_rows(block, slice(n - chunk, n))
        yield block


def terminal(task, block):
    """Which children end a response: ``(B*V,)`` bool, row ``b*V + a`` is state ``b``
    followed by token ``a``; a child ends at depth ``max_len`` or on EOS (token 0)."""
    V = task.model.vocab_size
    a_tok = np.tile(np.arange(V), block["prompt"].shape[0])  # (B*V,)
    return (block["depth"] + 1 == task.max_len) | ((a_tok == 0) & task.model.eos)


def expand(task, block, idx, p, q, tokens=True):
    r"""The children ``idx`` (rows ``b*V + a``) of a block, without per-stream arrays.

    A child's reach is :math:`\pi(s)\,p(a|s)` under each distribution.

    Args:
        idx: ``(C,)`` sorted child rows.
        p, q: ``(B, V)`` next-token probabilities under the policy and the sampler.
        tokens: also the children's token rows and lengths (not needed for complete
            responses whose tokens the caller writes itself).

    Returns:
        ``(par, tok, child)``: parent row and token ``(C,)`` each, and the child block.
    """
    V = task.model.vocab_size
    par, tok = idx // V, idx % V  # (C,)
    child = {"prompt": block["prompt"][par], "depth": block["depth"] + 1,
             "rp": block["rp"][par] * p[par, tok], "rq": block["rq"][par] * q[par, tok]}
    if tokens:
        rows = block["tokens"][par]  # (C, L+1)
        rows[np.arange(len(idx)), block["length"][par]] = tok
        child.update(tokens=rows, length=block["length"][par] + 1)
    return par, tok, child


def carry(block, par, xi, G):
    """Per-stream arrays of the children with parents ``par (C,)``: the score
    history with ``xi`` in slot ``depth``, ``H + xi`` if the block carries ``H``,
    and the path sums ``G (S, B, P)`` that already include the parents' own ``m``.

    Args:
        xi: ``S`` arrays ``(C, P)``, the score of each child's last token.
    """
    depth = block["depth"]
    out = {"hist": block["hist"][:, par]}  # (S, C, T, P)
    if "H" in block:
        out["H"] = block["H"][:, par]  # (S, C, P)
    for s, x in enumerate(xi):
        out["hist"][s, :, depth, :] = x
        if "H" in out:
            out["H"][s] += x
    out["G"] = G[:, par]  # (S, C, P)
    return out


def responses(task, done):
    """Response tokens, rewards and prompt lengths of a block of complete responses.

    Returns:
        ``(resp, R, plen)``: ``(M, T)`` int (-1 padded), ``(M,)`` float, ``(M,)`` int.
    """
    T = task.max_len
    M = done["tokens"].shape[0]
    plen = np.array([len(p) for p in task.prompts], dtype=np.int64)[done["prompt"]]  # (M,)
    n_resp = done["length"] - plen  # (M,)
    col = plen[:, None] + np.arange(T)[None, :]  # (M, T)
    resp = done["tokens"][np.arange(M)[:, None], np.minimum(col, done["tokens"].shape[1] - 1)]
    resp = np.where(np.arange(T)[None, :] < n_resp[:, None], resp, -1)  # (M, T)
    R = np.array([evaluate_reward(task.reward, task.prompts[pi], r[:k].tolist())
                  for pi, r, k in zip(done["prompt"], resp, n_resp)], dtype=float)  # (M,)
    return resp, R, plen
