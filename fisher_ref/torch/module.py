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

The GPT-2 of :mod:`fisher_ref.gpt2` is one such module: :func:`gpt2_adapter` wraps
``transformers``' ``GPT2LMHeadModel`` (built by :func:`fisher_ref.hf.to_hf`), whose
``named_parameters()`` order is the GPT-2 ``theta`` layout.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from autograd.extend import defvjp, primitive
from torch.func import functional_call, jacrev

from ..model import layout_offsets
from .model import JACOBIAN_CHUNK, TorchAdapter

__all__ = ["from_module", "ModuleAdapter", "TorchModuleModel", "causal_lm_task", "exact_causal_lm",
           "gpt2_adapter", "adapter_of", "flat_parameters"]


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
    """A torch module as a :class:`fisher_ref.torch.model.TorchAdapter` (see :func:`from_module`).

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


@primitive
def _module_logits(theta, windows, adapter):
    """Logits ``(B, V)`` of the module at a numpy ``theta`` (float64)."""
    with torch.no_grad():
        z = adapter.logits(adapter.theta(theta), torch.as_tensor(windows, device=adapter.device))
    return z.to("cpu", torch.float64).numpy()


def _module_logits_vjp(ans, theta, windows, adapter):
    def vjp(g):
        th = adapter.theta(theta).requires_grad_(True)
        z = adapter.logits(th, torch.as_tensor(windows, device=adapter.device))
        (gt,) = torch.autograd.grad(z, th, torch.as_tensor(g).to(z.device, z.dtype))
        return gt.to("cpu", torch.float64).numpy()
    return vjp


defvjp(_module_logits, _module_logits_vjp, None, None)


class TorchModuleModel:
    """A fisher_ref (numpy) model backed by a :class:`ModuleAdapter` in float64 on the CPU.

    ``logits`` is an autograd primitive (its vector-Jacobian product by
    ``torch.autograd.grad``); ``sensitivities`` takes one backward pass per state and
    logit, with no ``torch.func``: a second route to what the torch engine computes by
    ``vmap(jacrev)``.
    """

    def __init__(self, adapter):
        self.adapter = adapter
        self.vocab_size, self.eos, self.bos = adapter.vocab_size, adapter.eos, adapter.bos
        self.num_params, self.context, self.name = adapter.num_params, adapter.context, \
            adapter.name

    def check_lengths(self, longest_prompt, max_len):
        """Refuse a task whose longest input (BOS, prompt, ``max_len - 1`` tokens) would not
        fit in ``positions``, or that holds an empty state without a BOS."""
        need = longest_prompt + max_len - (0 if self.bos is not None else 1)
        if need > self.context:
            raise ValueError(f"the longest input has {need} positions (prompt "
                             f"{longest_prompt}, max_len {max_len}"
                             f"{', BOS' if self.bos is not None else ''}), more than "
                             f"positions={self.context}")

    def windows(self, tokens, lengths):
        W = self.adapter.windows(torch.as_tensor(np.asarray(tokens), dtype=torch.long),
                                 torch.as_tensor(np.asarray(lengths), dtype=torch.long))
        return W.numpy()  # (B, positions)

    def logits(self, theta, windows):
        return _module_logits(theta, np.asarray(windows), self.adapter)  # (B, V)

    def sensitivities(self, theta, windows):
        """``j (B, P, V)``: ``torch.autograd.grad`` of each logit of each state."""
        ad = self.adapter
        th = ad.theta(theta).requires_grad_(True)
        out = np.empty((len(windows), self.num_params, self.vocab_size))
        for b, w in enumerate(torch.as_tensor(np.asarray(windows))):
            z = ad.logits(th, w[None])[0]  # (V,)
            for a in range(self.vocab_size):
                (g,) = torch.autograd.grad(z[a], th, retain_graph=a + 1 < self.vocab_size)
                out[b, :, a] = g.to("cpu", torch.float64).numpy()
        return out

    def layout(self):
        return list(self.adapter.layout)

    def init_params(self):
        return self.adapter.theta0.copy()

    def describe(self):
        return {"arch": self.name, "vocab_size": self.vocab_size, "eos": self.eos,
                "bos": self.bos, "positions": self.context}


def causal_lm_task(module, prompts, max_len, reward, *, vocab_size, eos, bos=None,
                   prompt_weights=None, baseline=0.0, sampler=None, vectorize=True,
                   name="torch_module"):
    """A :class:`fisher_ref.tasks.Task` over a torch causal LM, its ``theta`` the module's.

    ``positions`` is the longest input of the task (BOS, the longest prompt and
    ``max_len - 1`` generated tokens). The task runs on the torch engine
    (:func:`fisher_ref.torch.torch_exact`) and on the numpy engines (through
    :class:`TorchModuleModel`). Arguments as in :func:`from_module` and
    :class:`fisher_ref.tasks.Task`; ``prompt_weights`` default to uniform.
    """
    from ..tasks import Task
    longest = max((len(p) for p in prompts), default=0)
    positions = longest + int(max_len) - (0 if bos is not None else 1)
    adapter = from_module(module, vocab_size, eos, bos, positions=max(positions, 1),
                          vectorize=vectorize, name=name)
    if bos is None and any(len(p) == 0 for p in prompts):
        raise ValueError("an empty prompt needs a bos id: without one the module would be "
                         "called on an empty sequence")
    n = len(prompts)
    weights = np.full(n, 1.0 / n) if prompt_weights is None and n else prompt_weights
    return Task(model=TorchModuleModel(adapter), theta=adapter.theta0, prompts=prompts,
                prompt_weights=weights, max_len=max_len, reward=reward, baseline=baseline,
                sampler=sampler, name=name)


def gpt2_adapter(model, device="cpu", dtype="float64"):
    """The GPT-2 of :mod:`fisher_ref.gpt2` as ``transformers``' ``GPT2LMHeadModel`` over the
    flat ``theta``: input ``[BOS] + s`` (BOS = ``V``), padded to ``n_positions``; logits of
    the last real position, columns ``0..V-1``."""
    from ..hf import to_hf
    hf = to_hf(model, np.zeros(model.num_params))
    adapter = from_module(hf, model.vocab_size, model.eos, bos=model.bos,
                          positions=model.context, device=device, dtype=dtype, name="gpt2")
    want = [n for n, _, _ in model.layout()]
    if adapter.names != want:
        raise RuntimeError(f"GPT2LMHeadModel parameters {adapter.names} differ from the GPT-2 "
                           f"layout {want}")
    return adapter


def adapter_of(model, device="cpu", dtype="float64"):
    """The module adapter of a GPT-2 or a :class:`TorchModuleModel` (else ``None``)."""
    from ..gpt2 import GPT2Model
    if isinstance(model, TorchModuleModel):
        ad = model.adapter
        if torch.device(device) == ad.device and ad.dtype == torch.float64 and dtype in (
                "float64", torch.float64):
            return ad
        return ModuleAdapter(ad.module, ad.vocab_size, ad.eos, ad.bos, ad.context, device,
                             dtype, ad.name, ad.vectorize)
    if isinstance(model, GPT2Model):
        try:
            return gpt2_adapter(model, device=device, dtype=dtype)
        except ModuleNotFoundError as exc:
            if exc.name != "transformers":
                raise
            raise NotImplementedError(
                "the torch twin of the GPT-2 is transformers' GPT2LMHeadModel: install the "
                "hf extra (pip install -e \".[hf]\")") from None
    return None


def exact_causal_lm(module, prompts, max_len, reward, *, vocab_size, eos, bos=None,
                    prompt_weights=None, baseline=0.0, sampler=None, vectorize=True,
                    device="cpu", dtype="float64", **engine_kwargs):
    """Every exact quantity of a torch causal LM on a task: :func:`causal_lm_task`, then
    :func:`fisher_ref.torch.exact.torch_exact` (``engine_kwargs``: ``chunk``,
    ``keep_states``, ``keep_sequences``).

    Example:
        >>> class Bigram(torch.nn.Module):  # next-token logits from the last token only
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.table = torch.nn.Embedding(4, 3)  # ids 0..2 and BOS = 3
        ...     def forward(self, ids):  # (b, n) -> (b, 3)
        ...         return self.table(ids[:, -1])
        >>> torch.manual_seed(0) and None
        >>> out = exact_causal_lm(Bigram(), [[1]], max_len=3, reward=lambda p, r: r.count(2),
        ...                       vocab_size=3, eos=True, bos=3)
        >>> pol = out["streams"]["policy"]
        >>> bool(np.allclose(pol["sequence_fisher"], pol["token_fisher_sum"], rtol=1e-10))
        True
    """
    from .exact import torch_exact
    task = causal_lm_task(module, prompts, max_len, reward, vocab_size=vocab_size, eos=eos,
                          bos=bos, prompt_weights=prompt_weights, baseline=baseline,
                          sampler=sampler, vectorize=vectorize)
    return torch_exact(task, device=device, dtype=dtype, **engine_kwargs)
