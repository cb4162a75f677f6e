r"""The prefix tree in torch, walked depth-first in blocks of at most ``chunk`` states.

A :class:`Block` holds ``B`` open states of one depth (prompt then generated tokens) and
what each carries for ``S`` streams: the scores :math:`\xi_u` of its generated tokens
(``hist``), their running sum ``H`` and the running path sum ``G`` of the token moments.
A state's children are all ``V`` tokens; those ending a response (EOS, or ``max_len``
tokens) are summed where they end, the others form the next block, pushed onto a stack.
:func:`depth_first` pops blocks and splits any larger than ``chunk``, so memory holds one
path of blocks — at most ``T`` blocks of ``chunk * V`` rows — never the tree.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

__all__ = ["Block", "root_block", "depth_first", "ending_tokens", "open_children"]


@dataclass
class Block:
    """``B`` open states of depth ``depth``.

    Attributes:
        prompt: ``(B,)`` long, the prompt index.
        tokens: ``(B, L)`` long, prompt then generated tokens, ``-1`` padded.
        length: ``(B,)`` long, real tokens per row.
        depth: generated tokens so far.
        rp, rq: ``(B,)`` reach probability under the policy and the sampler.
        hist: ``(S, B, depth, P)`` scores of the generated tokens.
        H: ``(S, B, P)`` their sum; G: ``(S, B, P)`` the path sum of token moments.
    """

    prompt: torch.Tensor
    tokens: torch.Tensor
    length: torch.Tensor
    depth: int
    rp: torch.Tensor
    rq: torch.Tensor
    hist: torch.Tensor
    H: torch.Tensor
    G: torch.Tensor

    @property
    def size(self):
        return self.prompt.shape[0]

    def rows(self, idx):
        """The block of rows ``idx`` (a slice or index tensor)."""
        return replace(self, prompt=self.prompt[idx], tokens=self.tokens[idx],
                       length=self.length[idx], rp=self.rp[idx], rq=self.rq[idx],
                       hist=self.hist[:, idx], H=self.H[:, idx], G=self.G[:, idx])


def root_block(task, n_streams, device, dtype):
    """The prompts at depth 0, with zero scores; tokens ``(n, L)``, ``L`` = longest prompt
    + ``max_len``."""
    n, P = len(task.prompts), task.model.num_params
    L = max(len(p) for p in task.prompts) + task.max_len
    tokens = torch.full((n, L), -1, dtype=torch.long)
    for i, pr in enumerate(task.prompts):
        tokens[i, :len(pr)] = torch.tensor(pr, dtype=torch.long)
    w = torch.as_tensor(task.prompt_weights, dtype=dtype, device=device)  # (n,)
    zeros = torch.zeros((n_streams, n, P), dtype=dtype, device=device)
    return Block(prompt=torch.arange(n, device=device), tokens=tokens.to(device),
                 length=torch.tensor([len(p) for p in task.prompts], device=device),
                 depth=0, rp=w, rq=w.clone(), hist=zeros.new_zeros((n_streams, n, 0, P)),
                 H=zeros, G=zeros.clone())


def depth_first(stack, chunk):
    """Pop blocks of at most ``chunk`` states until ``stack`` is empty; a larger block is
    split (its last ``chunk`` rows are yielded, the rest go back on the stack)."""
    while stack:
        block = stack.pop()
        if block.size > chunk:
            stack.append(block.rows(slice(0, block.size - chunk)))
            block = block.rows(slice(block.size - chunk, block.size))
        yield block


def ending_tokens(task, depth, device):
    """Tokens whose child ends the response at ``depth``: all ``V`` at ``max_len - 1``, EOS
    (id 0) before that when the model has one, else none. Returns ``(ending, open)``, two
    long tensors."""
    V = task.model.vocab_size
    ar = torch.arange(V, device=device)
    if depth + 1 == task.max_len:
        return ar, ar[:0]
    if task.model.eos:
        return ar[:1], ar[1:]
    return ar[:0], ar


def open_children(block, cols, p, q, scores, G):
    r"""The children of ``block`` by tokens ``cols``: row ``b * len(cols) + j`` is state ``b``
    followed by ``cols[j]``, reach :math:`\pi(s)\,p(a|s)`, its score appended.

    Args:
        cols: ``(k,)`` long tensor of tokens.
        p, q: ``(B, V)`` policy and sampler probabilities.
        scores: ``(S, B, k, P)`` score of each child's last token, per stream.
        G: ``(S, B, P)`` path sums including the states' own token moments.
    """
    B, k = block.size, cols.shape[0]
    par = torch.arange(B, device=p.device).repeat_interleave(k)  # (B*k,)
    tokens = block.tokens[par]  # (B*k, L)
    tokens[torch.arange(B * k, device=p.device), block.length[par]] = cols.repeat(B)
    x = scores.reshape(scores.shape[0], B * k, -1)  # (S, B*k, P)
    return Block(prompt=block.prompt[par], tokens=tokens, length=block.length[par] + 1,
                 depth=block.depth + 1, rp=(block.rp[:, None] * p[:, cols]).reshape(-1),
                 rq=(block.rq[:, None] * q[:, cols]).reshape(-1),
                 hist=torch.cat([block.hist[:, par], x[:, :, None]], dim=2),
                 H=block.H[:, par] + x, G=G[:, par])
