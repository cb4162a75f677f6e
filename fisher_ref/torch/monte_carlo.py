r"""Monte Carlo in torch: ancestral sampling on the device with a ``torch.Generator``.

``n`` responses are drawn from the policy all at once, one depth per step: the
prompt from the prompt weights, then :math:`y_t \sim p(\cdot|s_t)` with
``torch.multinomial``. Along each response it accumulates the sequence score
:math:`h = \sum_t (j_{\cdot,y_t} - \bar j(s_t))` and the Rao–Blackwellised token
sum :math:`g = \sum_t f(s_t)` (the seeds' snippet), and returns sample means
with standard errors :math:`\mathrm{sd}/\sqrt n`:

.. math:: \hat F = \tfrac1n \sum_r h_r^2,\qquad \widehat{E[\textstyle\sum_t f]} = \tfrac1n \sum_r g_r,
    \qquad \widehat{E[h]} = \tfrac1n \sum_r h_r.
"""
from __future__ import annotations

import numpy as np
import torch

from fisher_ref.torch.window_cache import unique_windows
from fisher_ref.torch.adapters import token_fisher
from fisher_ref.torch.registry import torch_model

__all__ = ["torch_monte_carlo"]


def torch_monte_carlo(task, n, generator, device="cpu", dtype="float64"):
    """Estimates of ``E[h^2]``, ``E[sum_t f(s_t)]`` and ``E[h]`` from ``n`` on-policy draws.

    Logits and sensitivities are computed once per distinct window of a depth and
    gathered for the draws that share it.

    Args:
        task: a :class:`fisher_ref.tasks.Task` whose model has a torch adapter
            (:func:`fisher_ref.torch.registry.torch_model`).
        n: number of responses.
        generator: a ``torch.Generator`` on ``device`` (the only randomness used).
        device, dtype: as in :func:`fisher_ref.torch.exact.torch_exact`.

    Returns:
        dict ``{quantity: (mean (P,), se (P,))}`` for ``"sequence_fisher"``,
        ``"token_fisher_sum"``, ``"score_mean"`` (float64 numpy), plus ``"n"``.

    Example:
        >>> from fisher_ref import load_config
        >>> gen = torch.Generator().manual_seed(0)
        >>> est = torch_monte_carlo(load_config("default"), 100, gen)
        >>> est["sequence_fisher"][0].shape
        (119,)
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"Monte Carlo needs an integer n >= 2 samples, got {n!r}")
    tm = torch_model(task.model, device=device, dtype=dtype)
    acc, dev, T = tm.acc_dtype, tm.device, task.max_len
    th = tm.theta(task.theta)
    L = max(len(p) for p in task.prompts) + T
    prompts = torch.full((len(task.prompts), L), -1, dtype=torch.long)
    for i, pr in enumerate(task.prompts):
        prompts[i, :len(pr)] = torch.tensor(pr, dtype=torch.long)
    plen = torch.tensor([len(p) for p in task.prompts], dtype=torch.long)
    w = torch.as_tensor(task.prompt_weights, dtype=torch.float64, device=dev)
    pick = torch.multinomial(w, n, replacement=True, generator=generator).cpu()  # (n,)
    tokens, length = prompts[pick].to(dev), plen[pick].to(dev)  # (n, L), (n,)
    alive = torch.ones(n, dtype=torch.bool, device=dev)
    h = torch.zeros((n, tm.num_params), dtype=acc, device=dev)
    g = torch.zeros_like(h)
    rows = torch.arange(n, device=dev)
    for _ in range(T):
        Wu, inv = unique_windows(tm.windows(tokens, length), tm.vocab_size)  # (U, k), (n,)
        zu = tm.logits(th, Wu).to(acc)  # (U, V)
        Ju = tm.sensitivities(th, Wu).to(acc)  # (U, P, V)
        pu = zu.softmax(-1)  # (U, V)
        y = torch.multinomial(pu[inv], 1, generator=generator).squeeze(1)  # (n,)
        xi = Ju[inv, :, y] - (Ju * pu[:, None, :]).sum(-1)[inv]  # (n, P)
        live = alive[:, None].to(acc)
        h += live * xi
        g += live * token_fisher(zu, Ju)[inv]
        tokens[rows[alive], length[alive]] = y[alive]
        length = length + alive.long()
        if tm.eos:
            alive = alive & (y != 0)
    out = {"n": int(n)}
    for name, x in (("sequence_fisher", h * h), ("token_fisher_sum", g), ("score_mean", h)):
        x = x.to(torch.float64)
        out[name] = (x.mean(0).cpu().numpy(), (x.std(0) / n ** 0.5).cpu().numpy())
    return out
