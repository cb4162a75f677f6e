r"""The walk over the prefix tree of the fast engine.

States are visited depth-first in blocks of at most ``chunk`` rows (:func:`depth_first`),
so memory stays bounded by one block's children, not by ``V^T``. A *block*
(:class:`Block`) holds ``B`` states of one depth: their prompts, tokens and reach, the
per-stream arrays the engine carries (stream axis first, ``(S, B, ...)``), and the fast
engine's window bookkeeping.

The torch twin is :mod:`fisher_ref.torch.tree` (its own ``Block``, of tensors).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

__all__ = ["Block", "PER_STREAM", "root_block", "take_rows", "depth_first", "terminal",
           "expand"]


PER_STREAM = ("H", "G")


@dataclass
class Block:
    r"""``B`` states of one depth (module docstring). Fields a block does not carry are
    ``None``.

    Attributes:
        prompt: ``(B,)`` the prompt index; depth: tokens generated so far.
        rp, rq: ``(B,)`` reach probability under the policy ``p`` and the sampler ``mu``
            (equal without a sampler).
        tokens: ``(B, L + 1)`` prompt then generated tokens, ``-1`` padded (``L`` = longest
            prompt + ``max_len``); length: ``(B,)`` real tokens per row. (``None`` in a
            block of complete responses whose tokens the caller writes itself.)
        H: ``(S, B, P)`` the sum of the scores of the generated tokens; G: ``(S, B, P)`` the
            path sum of token moments.
        wpath: ``(B, T)`` run-wide window ids of the states' ancestors (the fast engine);
        wid: ``(B,)`` the states' own window ids; path_rows: ``(B, depth)`` the ancestors'
            window-cache rows (both set when the block's arrays are formed).
        last: ``(B, S, P)`` the score of each state's last token.
        src, parents: in the fast engine's last level, each state's parent row ``(B,)``
            and the parents' ``(H, G, last)``, from which its own are formed a sub-block at
            a time.
        shard_key: ``(B,)`` the states' keys in a shard plan
            (:meth:`fisher_ref.parallel.shards.ShardPlan.child_keys`); silent: the block lies
            above a shard's units, walked but added by another shard.
        ahead: levels below the block whose windows the fast engine has computed already
            (:func:`fisher_ref.engine.fast._windows_ahead`).
    """

    prompt: np.ndarray
    depth: int
    rp: np.ndarray
    rq: np.ndarray
    tokens: np.ndarray = None
    length: np.ndarray = None
    H: np.ndarray = None
    G: np.ndarray = None
    wpath: np.ndarray = None
    wid: np.ndarray = None
    path_rows: np.ndarray = None
    last: np.ndarray = None
    src: np.ndarray = None
    parents: tuple = None
    shard_key: np.ndarray = None
    silent: bool = False
    ahead: int = 0

    @property
    def size(self):
        """``B``, the states in the block."""
        return self.prompt.shape[0]

    def reach(self, dist):
        """The reach ``(B,)`` under ``dist``: ``"p"`` (the policy) or ``"q"`` (the sampler)."""
        return self.rp if dist == "p" else self.rq

    def update(self, values=(), **more):
        """Set fields from a mapping and keywords (a misspelt name is an error)."""
        for name, value in dict(values, **more).items():
            if name not in _FIELDS:
                raise AttributeError(f"Block has no field {name!r}")
            setattr(self, name, value)
        return self


def root_block(task, n_streams, carried, P=None):
    """The block of the prompts (depth 0), carrying zeroed per-stream arrays ``carried``.

    Args:
        task: a :class:`fisher_ref.tasks.Task`.
        n_streams: ``S``.
        carried: names from :data:`PER_STREAM`.
        P: the parameters the arrays hold (default: all of the model's).
    """
    n, T = len(task.prompts), task.max_len
    P = task.model.num_params if P is None else P
    L = max(len(p) for p in task.prompts) + T
    tokens = np.full((n, L + 1), -1, dtype=np.int64)  # (n, L+1)
    for i, pr in enumerate(task.prompts):
        tokens[i, :len(pr)] = pr
    w = task.prompt_weights.astype(float)  # (n,)
    block = Block(prompt=np.arange(n), depth=0, rp=w.copy(), rq=w.copy(), tokens=tokens,
                  length=np.array([len(p) for p in task.prompts], dtype=np.int64))
    for k in carried:
        setattr(block, k, np.zeros((n_streams, n, P)))
    return block


_FIELDS = frozenset(f.name for f in fields(Block))


def take_rows(block, idx):
    """Rows ``idx`` (slice, index or boolean array) of a block: axis 1 of the
    per-stream arrays, axis 0 of the other arrays (a last level's ``parents`` are whole,
    indexed through ``src``)."""
    def rows(name, v):
        if name in PER_STREAM and v is not None:
            return v[:, idx]
        return v[idx] if isinstance(v, np.ndarray) and v.ndim else v
    return Block(**{f: rows(f, getattr(block, f)) for f in _FIELDS})


def depth_first(stack, chunk, last_chunk=None):
    """Pop blocks of at most ``chunk`` states from ``stack`` until it is empty
    (``last_chunk`` for the blocks of the last level, those that carry ``src``, when
    given).

    A larger block is split: its last ``chunk`` rows are yielded, the rest go
    back on the stack. The caller pushes each block's open children onto
    ``stack``, so memory holds one path of blocks, not the whole tree.
    """
    while stack:
        block = stack.pop()
        n = block.size
        size = last_chunk if last_chunk and block.src is not None else chunk
        if n > size:
            stack.append(take_rows(block, slice(0, n - size)))
            block = take_rows(block, slice(n - size, n))
        yield block


def terminal(task, block):
    """Which children end a response: ``(B*V,)`` bool, row ``b*V + a`` is state ``b``
    followed by token ``a``; a child ends at depth ``max_len`` or on EOS (token 0)."""
    V = task.model.vocab_size
    a_tok = np.tile(np.arange(V), block.size)  # (B*V,)
    return (block.depth + 1 == task.max_len) | ((a_tok == 0) & task.model.eos)


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
    child = Block(prompt=block.prompt[par], depth=block.depth + 1,
                  rp=block.rp[par] * p[par, tok], rq=block.rq[par] * q[par, tok])
    if tokens:
        rows = block.tokens[par]  # (C, L+1)
        rows[np.arange(len(idx)), block.length[par]] = tok
        child.update(tokens=rows, length=block.length[par] + 1)
    return par, tok, child
