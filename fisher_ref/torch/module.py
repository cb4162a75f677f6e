r"""Any torch causal language model as a fisher_ref model: :func:`from_module`.

A user's ``torch.nn.Module`` maps a batch of token-id sequences ``(b, n)`` to
next-token logits: ``(b, V')`` (the next token after each sequence), ``(b, n, V')``
(one row per position; the last is taken) or an object with such a ``.logits``
(``transformers`` models). Columns ``0..V-1`` are the vocabulary; extra columns (a BOS
id ``V``, say) are dropped.

:func:`from_module` flattens the module's parameters into one ``theta``:
``named_parameters()`` order (each tied tensor once), each tensor row-major, and
evaluates the module at any ``theta`` with ``torch.func.functional_call``, so the logits
are a pure function of the flat vector and ``vmap(jacrev)`` gives every state's
:math:`j = \partial z / \partial\theta`. A state ``s`` is read as the sequence
``[bos] + s`` (no BOS when ``bos`` is ``None``); its window is that sequence
right-padded with ``-1`` to ``positions``; states of equal length are evaluated as one
unpadded batch.

The same module also serves the numpy engines: :class:`TorchModuleModel` is a fisher_ref
model whose logits are an autograd primitive evaluated by the module, with derivatives
by plain ``torch.autograd`` (one backward pass per logit), so :func:`fisher_ref.exact`,
``verify`` and ``compare`` run on a user's module too. :func:`causal_lm_task` builds the
:class:`fisher_ref.tasks.Task`.

The GPT-2 of :mod:`fisher_ref.models.gpt2` is one such module: :func:`gpt2_adapter` wraps
``transformers``' ``GPT2LMHeadModel`` (built by :func:`fisher_ref.hf.to_hf`), whose
``named_parameters()`` order is the GPT-2 ``theta`` layout.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch.func import functional_call, jacrev

from fisher_ref.models.base import layout_offsets
from fisher_ref.torch.adapters import JACOBIAN_CHUNK, TorchAdapter

__all__ = ["from_module", "ModuleAdapter", "flat_parameters"]


def flat_parameters(module):
    """``(names, shapes, theta)`` of a module: ``named_parameters()`` order (a tied tensor
    once, under its first name), ``theta`` the float64 numpy concatenation, row-major."""
    named = list(module.named_parameters())
    theta = np.concatenate([p.detach().to("cpu", torch.float64).reshape(-1).numpy()
                            for _, p in named]) if named else np.zeros(0)
    return [n for n, _ in named], [tuple(p.shape) for _, p in named], theta


def _last_logits(out, V):
    """``(b, V)`` next-token logits from a module's output (see the module docstring)."""
    out = getattr(out, "logits", out)
    if not isinstance(out, torch.Tensor) or out.ndim not in (2, 3):
        raise ValueError("the module must return next-token logits (b, V) or (b, n, V) "
                         f"(or an object with .logits); got {type(out).__name__} "
                         f"{tuple(getattr(out, 'shape', ()))}")
    out = out[:, -1] if out.ndim == 3 else out
    if out.shape[-1] < V:
        raise ValueError(f"the module returned {out.shape[-1]} logits per state, fewer than "
                         f"vocab_size={V}")
    return out[:, :V]  # (b, V)


class ModuleAdapter(TorchAdapter):
    """A torch module as a :class:`fisher_ref.torch.adapters.TorchAdapter` (see :func:`from_module`).

    Attributes:
        names, shapes: the parameter blocks of ``theta``, in order; ``layout`` the same
            with each block's offset.
        theta0: float64 numpy ``(P,)``, the module's own parameters.
    """

    whole_history = True

    def __init__(self, module, vocab_size, eos, bos, positions, device, dtype, name, vectorize):
        super().__init__(device, dtype)
        self.module = copy.deepcopy(module).to(device=self.device, dtype=self.dtype).eval()
        self.names, self.shapes, self.theta0 = flat_parameters(module)
        self.layout = layout_offsets(list(zip(self.names, self.shapes)))
        self.vocab_size, self.eos, self.bos = int(vocab_size), bool(eos), bos
        self.context = int(positions)
        self.num_params = int(self.theta0.size)
        self.name, self.vectorize = name, vectorize

    def call(self, params, ids):
        """Next-token logits ``(b, V)`` of unpadded sequences ``ids (b, n)`` with the
        parameter blocks ``params``."""
        return _last_logits(functional_call(self.module, params, (ids,)), self.vocab_size)

    def windows(self, tokens, lengths):
        """Row ``b`` = ``[bos] + tokens[b, :lengths[b]]``, ``-1`` padded: ``(B, positions)``."""
        B, N = lengths.shape[0], self.context
        head = 0 if self.bos is None else 1
        if B and int(lengths.max()) + head > N:
            raise ValueError(f"a state of {int(lengths.max())} tokens needs "
                             f"{int(lengths.max()) + head} positions, more than positions={N}")
        cols = torch.arange(N - head, device=tokens.device)[None, :]  # (1, N-head)
        width = min(tokens.shape[1], N - head)
        src = torch.full((B, N - head), -1, dtype=torch.long, device=tokens.device)
        src[:, :width] = tokens[:, :width]
        body = torch.where(cols < lengths[:, None], src, -1)  # (B, N-head)
        if head:
            body = torch.cat([torch.full((B, 1), self.bos, dtype=torch.long,
                                         device=tokens.device), body], dim=1)
        return body  # (B, N)

    def _groups(self, windows):
        """``(rows, ids)`` per distinct sequence length: ``(b,)`` rows and ``(b, n)`` ids."""
        n = (windows >= 0).sum(dim=1)  # (B,)
        for length in torch.unique(n).tolist():
            if length == 0:
                raise ValueError("a state is empty and the module has no bos id to start it; "
                                 "give from_module a bos")
            rows = torch.nonzero(n == length).flatten()
            yield rows, windows[rows, :length]

    def logits_of(self, params, windows):
        """``(B, N)`` windows -> ``(B, V)`` logits, one unpadded call per length."""
        out = None
        for rows, ids in self._groups(windows):
            z = self.call(params, ids)  # (b, V)
            out = z.new_zeros((windows.shape[0], self.vocab_size)) if out is None else out
            out = out.index_put((rows,), z)
        return out  # (B, V)

    def sensitivities(self, theta, windows):
        r""":math:`j (B, P, V)` by ``vmap(jacrev)`` per length group (a per-window ``jacrev``
        loop for modules without vmap rules, ``vectorize=False``)."""
        params = self.unpack(theta)
        out = theta.new_zeros((windows.shape[0], self.vocab_size, self.num_params))
        for rows, ids in self._groups(windows):
            if self.vectorize:
                jac = torch.cat([self.jacobian_blocks(params, chunk)
                                 for chunk in ids.split(JACOBIAN_CHUNK)])  # (b, V, P)
            else:
                jac = torch.stack([self._jac_loop(params, row) for row in ids])  # (b, V, P)
            out[rows] = jac
        return out.transpose(1, 2)  # (B, P, V)

    def _one(self, params, ids):
        return self.call(params, ids[None])[0]  # (V,)

    def _jac_loop(self, params, ids):
        """``(V, P)`` of one sequence by ``jacrev`` without ``vmap`` over windows."""
        jac = jacrev(self._one)(params, ids)  # {name: (V, *)}
        return torch.cat([jac[n].reshape(self.vocab_size, -1) for n in params], dim=1)


def from_module(module, vocab_size, eos, bos=None, *, positions, device="cpu",
                dtype="float64", vectorize=True, name="torch_module"):
    """A torch causal LM as an adapter of the torch engines.

    Args:
        module: a ``torch.nn.Module`` mapping ``(b, n)`` token ids to next-token logits
            (see the module docstring); it is copied, moved to ``device``/``dtype`` and put
            in eval mode (the caller's module is not changed).
        vocab_size: ``V``; token ids ``0..V-1``.
        eos: whether id 0 ends a response.
        bos: the id every input starts with (``None``: none; then no state may be empty).
        positions: the longest input the module reads (BOS included).
        device, dtype: where and in what precision the module runs.
        vectorize: ``vmap(jacrev)`` over windows; ``False`` loops ``jacrev`` per window
            (for modules whose ops have no vmap rule, such as ``torch.nn.GRU``).
        name: a label for reports.

    Returns:
        :class:`ModuleAdapter` (``theta0``: the module's parameters as a float64 vector).
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"from_module needs a torch.nn.Module, got {type(module).__name__}")
    for key, v in (("vocab_size", vocab_size), ("positions", positions)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{key} must be a positive integer, got {v!r}")
    if bos is not None and (isinstance(bos, bool) or not isinstance(bos, (int, np.integer))
                            or bos < 0):
        raise ValueError(f"bos must be a non-negative integer id or None, got {bos!r}")
    return ModuleAdapter(module, vocab_size, eos, bos, positions, device, dtype, name,
                         bool(vectorize))




