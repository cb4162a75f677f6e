r"""A torch module as a model of the numpy engines: :class:`TorchModuleModel` and
:func:`causal_lm_task`.

:class:`TorchModuleModel` is a fisher_ref model whose logits are an autograd primitive
evaluated by the module's :class:`fisher_ref.torch.module.ModuleAdapter`, with
derivatives by plain ``torch.autograd`` (one backward pass per logit), so
:func:`fisher_ref.exact`, ``verify`` and ``compare`` run on a user's module too.
"""
from __future__ import annotations

import numpy as np
import torch
from autograd.extend import defvjp, primitive

from fisher_ref.torch.module import from_module

__all__ = ["TorchModuleModel", "causal_lm_task"]


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

    def check_prompt_ids(self, prompts):
        """The adapter's prompt-id rule: ``0..n_embeddings-1`` (input-only ids ``>= V``
        allowed), no BOS of its own (:meth:`fisher_ref.torch.module.ModuleAdapter.check_prompt_ids`)."""
        self.adapter.check_prompt_ids(prompts)

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

    # no init_params: theta is the module's weights (adapter.theta0), not a documented
    # draw, so a golden file of a module task records theta_source "given"

    def describe(self):
        return {"arch": self.name, "vocab_size": self.vocab_size, "eos": self.eos,
                "bos": self.bos, "positions": self.context}


def causal_lm_task(module, prompts, max_len, reward, *, vocab_size, eos, bos=None,
                   prompt_weights=None, baseline=0.0, sampler=None, vectorize=True,
                   name="torch_module", params="all", strict=False, n_embeddings=None):
    """A :class:`fisher_ref.tasks.Task` over a torch causal LM, its ``theta`` the selected
    parameters of the module (``params``).

    ``positions`` is the longest input of the task (BOS, the longest prompt and
    ``max_len - 1`` generated tokens). The task runs on the torch engine
    (:func:`fisher_ref.torch.torch_exact`) and on the numpy engines (through
    :class:`TorchModuleModel`). Arguments as in :func:`fisher_ref.torch.from_module` and
    :class:`fisher_ref.tasks.Task`; ``prompt_weights`` default to uniform. Prompts may hold
    the input-only ids ``V..n_embeddings-1`` (checked here, never generated).
    """
    from fisher_ref.tasks import Task
    if not isinstance(prompts, (list, tuple)) or not all(isinstance(p, (list, tuple))
                                                         for p in prompts):
        raise ValueError(f"prompts must be a list of token lists, got {prompts!r:.80}")
    longest = max((len(p) for p in prompts), default=0)
    if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < 1:
        raise ValueError(f"max_len must be an integer >= 1, got {max_len!r}")
    positions = longest + int(max_len) - (0 if bos is not None else 1)
    adapter = from_module(module, vocab_size, eos, bos, positions=max(positions, 1),
                          vectorize=vectorize, name=name, params=params, strict=strict,
                          n_embeddings=n_embeddings)
    if bos is None and any(len(p) == 0 for p in prompts):
        raise ValueError("an empty prompt needs a bos id: without one the module would be "
                         "called on an empty sequence")
    adapter.check_prompt_ids(prompts)
    n = len(prompts)
    weights = np.full(n, 1.0 / n) if prompt_weights is None and n else prompt_weights
    # Task checks the prompt ids through TorchModuleModel.check_prompt_ids (the adapter's
    # range, input-only ids included)
    return Task(model=TorchModuleModel(adapter), theta=adapter.theta0, prompts=prompts,
                prompt_weights=weights, max_len=max_len, reward=reward, baseline=baseline,
                sampler=sampler, name=name)
