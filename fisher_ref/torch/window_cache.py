r"""Per-window arrays of the torch engine, computed once per distinct window.

Everything a state contributes — probabilities under the policy and the sampler, the
score of every candidate token :math:`\xi_a = j_{\cdot,a} - c` for each centering ``c``,
the token moment :math:`m = \sum_a q_a \xi_a^2` of each stream, the token Fisher and its
uniform reference — depends on the state only through its window (the last ``k`` tokens
for the MLP). A :class:`WindowCache` computes them once per distinct window, with
``vmap(jacrev)`` for :math:`j`, and keeps them up to a byte budget (emptied when full:
memory stays bounded, only speed depends on the budget). A model that reads the whole
history (GPT-2, a user's module) has no repeated windows and is computed block by block.
"""
from __future__ import annotations

import numpy as np
import torch

from fisher_ref.engine.plan import count_states
from fisher_ref.torch.adapters import sampler_logits

__all__ = ["WindowCache", "WINDOW_CACHE_BYTES", "unique_windows"]

#: Bytes of per-window arrays kept between blocks (speed only; results do not depend on it).
WINDOW_CACHE_BYTES = 2 ** 30


class WindowCache:
    """Per-window arrays for one run (see the module docstring).

    Args:
        run: the engine's run (``task``, ``adapter``, ``streams``, ``theta``,
            ``theta_mu``, ``keep_states``).
        budget: bytes of cached arrays (default :data:`WINDOW_CACHE_BYTES`).
    """

    def __init__(self, run, budget=None):
        self.run = run
        ad = run.adapter
        V, P, S = ad.vocab_size, ad.num_params, len(run.streams)
        self.centers = list(dict.fromkeys(stream.center for stream in run.streams))
        per = 8 * (len(self.centers) * V * P + (S + 2) * P + 2 * V)
        budget = WINDOW_CACHE_BYTES if budget is None else budget
        self.capacity = 0 if ad.whole_history else max(1, budget // per)
        # distinct windows possible: tokens 0..V-1 and BOS in each of k places, or the states
        n_states = count_states(V, run.task.max_len, ad.eos, len(run.task.prompts))[0]
        self.most = min(n_states, (V + 1) ** ad.context) if ad.context < 16 else n_states
        self.clear()

    def clear(self):
        self.index, self.arrays, self.n = {}, None, 0

    def _append(self, part):
        """Store the arrays of new windows after the first ``n`` rows (storage grows by
        doubling, so each row is copied a bounded number of times)."""
        m = next(iter(part.values())).shape[0]
        if self.arrays is None or self.n + m > next(iter(self.arrays.values())).shape[0]:
            size = min(self.capacity, self.most, max(2 * (self.n + m), 16))
            grown = {k: v.new_empty((size,) + v.shape[1:]) for k, v in part.items()}
            if self.arrays is not None:
                for k, v in grown.items():
                    v[:self.n] = self.arrays[k][:self.n]
            self.arrays = grown
        for k, v in part.items():
            self.arrays[k][self.n:self.n + m] = v
        self.n += m

    def rows(self, W):
        """``(arrays, inv)``: per-window arrays ``{name: (U, ...)}`` and the row ``(B,)`` of
        each window of ``W (B, k)`` among them."""
        if self.capacity == 0:
            return self._compute(W), torch.arange(W.shape[0], device=W.device)
        keys = [tuple(r) for r in W.tolist()]
        new = {}
        for i, key in enumerate(keys):
            if key not in self.index and key not in new:
                new[key] = i
        if new:
            if self.n + len(new) > self.capacity:
                self.clear()
                if len(set(keys)) > self.capacity:
                    Wu, inv = unique_windows(W, self.run.adapter.vocab_size)
                    return self._compute(Wu), inv
                return self.rows(W)
            rows = torch.as_tensor(list(new.values()), device=W.device)
            for j, key in enumerate(new):
                self.index[key] = self.n + j
            self._append(self._compute(W[rows]))
        return self.arrays, torch.as_tensor([self.index[k] for k in keys], device=W.device)

    def _compute(self, Wu):
        """Arrays of windows ``Wu (U, k)``: ``p, q (U, V)``, ``xi{c} (U, V, P)`` per center,
        ``m{s} (U, P)`` per stream, ``uniform (U, P)`` when states are kept."""
        run, ad = self.run, self.run.adapter
        acc = ad.acc_dtype
        z = ad.logits(run.theta, Wu)  # (U, V)
        _check_logits(z, "model")
        J = ad.sensitivities(run.theta, Wu).to(acc)  # (U, P, V)
        if not torch.isfinite(J).all():
            raise ValueError("non-finite logit sensitivities (check the model's derivatives)")
        if J.numel():
            run.jmax = max(run.jmax, float(J.abs().max()))
        za = z.to(acc)
        dist = {"p": za.softmax(-1)}  # (U, V)
        if run.task.sampler is None:
            dist["q"] = dist["p"]
        else:
            zq = sampler_logits(run.task.sampler, ad, run.theta, run.theta_mu, Wu, z)
            _check_logits(zq, "sampler")
            dist["q"] = zq.to(acc).softmax(-1)
        out = dict(dist)
        for c in self.centers:
            jbar = (J * dist[c][:, None, :]).sum(-1)  # (U, P)
            out[f"xi{c}"] = (J - jbar[:, :, None]).transpose(1, 2).contiguous()  # (U, V, P)
        for s, stream in enumerate(run.streams):
            wname, c = stream.drawn_from, stream.center
            out[f"m{s}"] = torch.einsum("uv,uvp->up", dist[wname], out[f"xi{c}"].square())
        if run.keep_states:
            out["uniform"] = J.var(dim=-1, correction=0)  # (U, P): token Fisher at p = 1/V
        return out


def _check_logits(z, who):
    if torch.isnan(z).any() or torch.isposinf(z).any():
        raise ValueError(f"the {who} returned NaN or +inf logits")
    if torch.isneginf(z).all(dim=-1).any():
        raise ValueError(f"the {who} returned a state whose logits are all -inf")


def unique_windows(W, V):
    """``(Wu, inv)``: the distinct rows of ``W (B, k)`` (entries ``-1..V``, or up to the
    largest entry: input-only ids and a BOS above ``V``) and the row of each, by one sort of
    integer keys when they fit in 62 bits, else ``torch.unique(dim=0)``."""
    k = W.shape[1]
    if W.numel():
        V = max(V, int(W.max()))
    if k * np.log2(V + 2) >= 62:
        return torch.unique(W, dim=0, return_inverse=True)
    base = (V + 2) ** torch.arange(k, device=W.device)  # (k,)
    keys, inv = torch.unique(((W + 1) * base).sum(1), return_inverse=True)  # (U,), (B,)
    first = torch.empty_like(keys).scatter_(0, inv, torch.arange(W.shape[0], device=W.device))
    return W[first], inv
