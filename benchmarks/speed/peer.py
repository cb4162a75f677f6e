r"""An independent torch peer of fisher_ref's exact engine: the benchmark baseline.

It shares no code with fisher_ref. From a task file's JSON (an ``mlp_window``
model, docs/theory.md §4.1) it builds its own parameters, its own windows and
its own MLP forward in torch (float64), and computes, by enumerating every
response:

- ``fisher``: the sequence Fisher :math:`F = E[h^2]` and ``score_mean``
  :math:`E[h]`;
- ``token_fisher``: the token Fisher :math:`f(s) = \sum_a p_a\,\xi_a(s)^2` of
  every open state, with the state's ``prompt``, ``depth`` and generated
  ``tokens``.

It walks the prefix tree level by level. The scores
:math:`\xi_a = \partial\log p_a / \partial\theta` of a window come from
``torch.func.vmap(jacrev(...))`` with respect to each parameter tensor, once per
distinct window of the whole run.
A response ending under parent ``b`` has :math:`h = H_b + \xi_a`, with
:math:`H_b` the parent's running sum. Two ways to sum over the responses:

- ``expand=True`` (the default, the faster): where every token ends a response, per
  parent :math:`\sum_a p_a h^2 = W_b H_b^2 + 2 H_b \odot m_1 + f` and
  :math:`\sum_a p_a h = W_b H_b + m_1` with the window's :math:`W = \sum_a p_a`,
  :math:`m_1 = \sum_a p_a \xi_a` and token Fisher :math:`f` (the binomial theorem on a
  finite sum; no identity such as :math:`m_1 = 0` is used);
- ``expand=False``: each response's own :math:`h` formed explicitly, the method issue 9
  describes for its peer.

Either way responses are summed in chunks of about 2 MiB, so memory holds one level's
running sums, the distinct windows' scores and a chunk.

This module holds the peer alone. ``benchmarks/speed/peer_timing.py`` times it against
``exact``, and ``fisher_ref.perf.bench`` runs :func:`peer_exact` as its ``torch_peer`` side.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.func import jacrev, vmap
from fisher_ref.engine.plan import EngineOptions

__all__ = ["peer_exact", "peer_theta"]

# Elements of one chunk of complete responses' score sums (about 2 MiB).
CHUNK_ELEMENTS = 2 ** 18
# Distinct windows per vmap(jacrev) call.
WINDOWS_PER_CALL = 256
# Window keys are looked up in a table of every possible key up to this many keys.
DENSE_KEYS = 2 ** 24


def peer_theta(model):
    """The flat parameters of a task-file model: ``init_scale`` times a standard normal
    draw of ``numpy.random.default_rng(init_seed)`` (docs/theory.md §4)."""
    V, k, d, H = (model[key] for key in ("vocab_size", "context", "embed_dim", "hidden"))
    P = (V + 1) * d + k * d * H + H + H * V + V
    rng = np.random.default_rng(model.get("init_seed", 0))
    return model.get("init_scale", 1.0) * rng.standard_normal(P)


def _split(theta, V, k, d, H):
    """The flat parameters as the MLP's tensors (views), in the layout of docs/theory.md
    §4.1: ``E (V+1, d)``, ``W1 (k*d, H)``, ``b1 (H,)``, ``W2 (H, V)``, ``b2 (V,)``, each
    row-major."""
    o1 = (V + 1) * d
    o2 = o1 + k * d * H
    o3, o4 = o2 + H, o2 + H + H * V
    return (theta[:o1].reshape(V + 1, d), theta[o1:o2].reshape(k * d, H), theta[o2:o3],
            theta[o3:o4].reshape(H, V), theta[o4:o4 + V])


def _log_probs(E, W1, b1, W2, b2, window):
    """Log-softmax of the MLP at one window ``(k,)``: ``(V,)``."""
    e = E[window].reshape(-1)  # (k*d,)
    hid = torch.tanh(e @ W1 + b1)  # (H,)
    return torch.log_softmax(hid @ W2 + b2, dim=0)


class _Windows:
    """Scores ``(U, V, P)``, probabilities ``(U, V)`` and token Fisher ``(U, P)`` of every
    distinct window seen so far, each computed once (room for ``capacity`` windows)."""

    def __init__(self, theta, dims, capacity):
        V, k, P = dims[0], dims[1], theta.numel()
        self.parts, self.n = _split(theta, *dims), 0
        # a window's entries lie in 0..V (V pads the start): its key is a base-(V+1) number,
        # looked up in a table of every key when that is small, else in a dict of tuples
        self.dense = (V + 1) ** k <= DENSE_KEYS
        self.base = (V + 1) ** torch.arange(k - 1, -1, -1)  # (k,)
        self.slot = torch.full(((V + 1) ** k,), -1, dtype=torch.long) if self.dense else {}
        # the Jacobian with respect to each tensor, not to slices of the flat vector (whose
        # backward writes every slice's gradient into a zeroed copy of the whole vector)
        self.jac = vmap(jacrev(_log_probs, argnums=(0, 1, 2, 3, 4)), in_dims=(None,) * 5 + (0,))
        self.cuts = np.cumsum([0] + [x.numel() for x in self.parts])  # each tensor's columns
        self.logp_of = vmap(_log_probs, in_dims=(None,) * 5 + (0,))  # (B, k) -> (B, V)
        self.S = torch.empty(capacity, V, P, dtype=torch.float64)
        self.p = torch.empty(capacity, V, dtype=torch.float64)
        self.f = torch.empty(capacity, P, dtype=torch.float64)
        self.m1 = torch.empty(capacity, P, dtype=torch.float64)

    def _slots(self, win):
        """Each window's key and row (-1: not computed yet)."""
        if self.dense:
            keys = win @ self.base  # (n,)
            return keys, self.slot[keys]
        keys = [tuple(r) for r in win.tolist()]
        return keys, torch.tensor([self.slot.get(key, -1) for key in keys], dtype=torch.long)

    def rows(self, win):
        """Row of each window of ``win (n, k)``, computing the new ones."""
        keys, slots = self._slots(win)
        fresh = torch.nonzero(slots < 0)[:, 0]  # (m,) windows not computed yet
        if len(fresh) == 0:
            return slots
        if self.dense:  # one window of each new key
            new, inv = torch.unique(keys[fresh], return_inverse=True)
            at = torch.empty(len(new), dtype=torch.long)
            at[inv] = fresh
        else:
            first = {}
            for i in fresh.tolist():
                first.setdefault(keys[i], i)
            new, at = list(first), torch.tensor(list(first.values()), dtype=torch.long)
        W, n = win[at], self.n  # (U_new, k)
        for lo in range(0, len(W), WINDOWS_PER_CALL):
            w = W[lo:lo + WINDOWS_PER_CALL]
            r = slice(n + lo, n + lo + len(w))
            S = self.S[r]  # (u, V, P): each tensor's Jacobian written into its columns
            for g, lo_c, hi_c in zip(self.jac(*self.parts, w), self.cuts, self.cuts[1:]):
                S[:, :, lo_c:hi_c] = g.reshape(S.shape[0], S.shape[1], -1)
            p = self.p[r] = torch.exp(self.logp_of(*self.parts, w))  # (u, V)
            self.f[r] = torch.einsum("uv,uvp->up", p, S * S)  # (u, P)
            self.m1[r] = torch.einsum("uv,uvp->up", p, S)  # (u, P): sum_a p_a xi_a
        if self.dense:
            self.slot[new] = torch.arange(n, n + len(W))
        else:
            self.slot.update({key: n + i for i, key in enumerate(new)})
        self.n += len(W)
        return self._slots(win)[1]


def _add_complete(table, rows, Hs, reach, term, last, F, Eh):
    """Add to ``F``, ``Eh`` the responses ending at tokens ``term`` of a level's states
    (window rows ``rows``, running sums ``Hs``, reach ``reach``), chunk by chunk."""
    P, K = Hs.shape[1], len(term)
    if K == 0:
        return
    step = max(1, CHUNK_ELEMENTS // (K * P))
    buf = torch.empty(min(step, len(rows)) * K * P, dtype=Hs.dtype)  # reused chunk to chunk
    for lo in range(0, len(rows), step):
        r = rows[lo:lo + step]
        h = buf[:len(r) * K * P].view(len(r), K, P)
        if last:  # every token ends a response
            torch.index_select(table.S, 0, r, out=h)
            p = table.p.index_select(0, r)  # (c, V)
        else:  # only the tokens ``term``: gather just those rows
            h.copy_(table.S[r[:, None], term[None, :]])
            p = table.p[r[:, None], term[None, :]]  # (c, K)
        h += Hs[lo:lo + step, None]  # (c, K, P): each response's own h
        h = h.view(-1, P)
        w = (reach[lo:lo + step, None] * p).reshape(-1)  # (c*K,)
        Eh += w @ h
        F += w @ h.square_()


def _add_expanded(table, rows, Hs, reach, F, Eh):
    """Add to ``F``, ``Eh`` the responses of a level where every token ends one, expanded
    per parent (module docstring), chunk by chunk."""
    P = Hs.shape[1]
    step = max(1, CHUNK_ELEMENTS // P)
    for lo in range(0, len(rows), step):
        r, H, rc = rows[lo:lo + step], Hs[lo:lo + step], reach[lo:lo + step]
        m1 = table.m1.index_select(0, r)  # (c, P)
        w = rc * table.p.index_select(0, r).sum(1)  # (c,) the parents' responses' weight
        Eh += w @ H + rc @ m1
        F += w @ H.square() + 2 * torch.einsum("c,cp,cp->p", rc, H, m1) \
            + rc @ table.f.index_select(0, r)


def peer_exact(task, expand=True):
    """``F = E[h^2]``, ``E[h]`` and the token Fisher of every state of a task-file dict.

    Args:
        task: the JSON of a task file with an ``mlp_window`` model (``prompts``,
            ``prompt_weights`` (default uniform), ``max_len``, optional ``theta``).
        expand: sum the last level's responses per parent (module docstring); else form
            each response's ``h``.

    Returns:
        dict: ``fisher``, ``score_mean`` ``(P,)``; ``token_fisher`` ``(N, P)`` with
        ``prompt``, ``depth`` ``(N,)`` and ``tokens`` (a tuple per state: the generated
        tokens), states level by level.
    """
    model = task["model"]
    if model.get("arch", "mlp_window") != "mlp_window":
        raise ValueError(f"the torch peer knows the mlp_window model only, not {model['arch']!r}")
    V, k, d, H = (model[key] for key in ("vocab_size", "context", "embed_dim", "hidden"))
    eos, T = bool(model.get("eos", True)), task["max_len"]
    theta = torch.tensor(task["theta"] if "theta" in task else peer_theta(model),
                         dtype=torch.float64)
    prompts = [list(x) for x in task["prompts"]]
    n = len(prompts)
    beta = V - 1 if eos else V
    table = _Windows(theta, (V, k, d, H), min(n * sum(beta ** t for t in range(T)),
                                             (V + 1) ** k))
    win = torch.tensor([([V] * k + x)[-k:] for x in prompts], dtype=torch.long)  # (n, k)
    reach = torch.tensor(task.get("prompt_weights") or [1.0 / n] * n, dtype=torch.float64)
    Hs = torch.zeros(n, theta.numel(), dtype=torch.float64)  # (n, P) running score sums
    prompt, gen = torch.arange(n), torch.zeros(n, 0, dtype=torch.long)
    F, Eh = torch.zeros_like(theta), torch.zeros_like(theta)
    N = n * sum(beta ** t for t in range(T))  # open states
    out = {"token_fisher": torch.empty(N, theta.numel(), dtype=torch.float64), "prompt": [],
           "depth": [], "tokens": []}
    at = 0  # states written so far
    keep = torch.arange(1 if eos else 0, V)  # tokens that leave a state open
    for depth in range(T):
        rows = table.rows(win)  # (n,)
        torch.index_select(table.f, 0, rows, out=out["token_fisher"][at:at + len(rows)])
        at += len(rows)
        out["prompt"].append(prompt)
        out["depth"].append(torch.full_like(prompt, depth))
        out["tokens"] += [tuple(t) for t in gen.tolist()]
        last = depth == T - 1
        term = torch.arange(V) if last else torch.tensor([0] if eos else [], dtype=torch.long)
        if last and expand:
            _add_expanded(table, rows, Hs, reach, F, Eh)
        else:
            _add_complete(table, rows, Hs, reach, term, last, F, Eh)
        if not last:  # the next level: every open child
            par = torch.arange(len(rows)).repeat_interleave(len(keep))  # (C,)
            tok = keep.repeat(len(rows))  # (C,)
            Hs = Hs[par] + table.S[rows[par], tok]  # (C, P)
            reach = reach[par] * table.p[rows[par], tok]
            win = torch.cat([win[par, 1:], tok[:, None]], dim=1)
            prompt, gen = prompt[par], torch.cat([gen[par], tok[:, None]], dim=1)
    return {"fisher": F.numpy(), "score_mean": Eh.numpy(),
            "token_fisher": out["token_fisher"].numpy(),
            "prompt": torch.cat(out["prompt"]).numpy(), "depth": torch.cat(out["depth"]).numpy(),
            "tokens": out["tokens"]}
