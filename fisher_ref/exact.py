r"""The exact engine: every quantity of DESIGN §1 by enumerating every response.

It computes what :func:`fisher_ref.exact_reference.exact_reference` computes
— the same streams (``"policy"``; with a sampler ``"raw"``, ``"centered"``,
``"top{k}"``; see that module), every response-level expectation as a sum over
complete responses of probability times the response's own value, every
token-level one as a sum over states of reach times the state's value —
and nothing here assumes the identities of §1 that relate the two routes.

Speed without changing what is summed (the plain engine,
:func:`fisher_ref.exact_reference.exact_reference`, is the judge at 1e-10):

- everything a state computes (logits, ``j``, centers, scores) depends on the
  state only through its window of the last ``k`` tokens, so it is computed
  once per distinct window of a block and gathered;
- each open state carries its running score sum ``H`` and its score history;
  a complete response's ``h = H(parent) + xi(parent, a)`` is formed per
  response, so :math:`E[h^2]`, :math:`E[h^4]`, :math:`E[Ah]` stay sums of each
  response's own value;
- cross terms are the same finite sum over responses, grouped by parent: the
  responses ending at a block's children share the parent's history
  :math:`\xi_u` for ``u < depth``, so
  :math:`\sum_a w_a\,\xi_u\,\xi_t(a) = \xi_u \sum_a w_a\,\xi_t(a)`. This is
  only the distributive law on a finite sum over enumerated responses; it does
  not use that conditional score means vanish.
"""
from __future__ import annotations

import numpy as np

from .enumeration import DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, responses
from .exact_reference import exact_reference
from .walk import (REACH, BlockArrays, Run, autodiff_gradient, check_support, checked_sensitivities,
                   model_probs, topk_center)
from .token_fisher import mean_sensitivity, token_fisher, token_second_moment, uniform_token_fisher

__all__ = ["exact", "topk_center", "WINDOW_CACHE_BYTES"]

# Response-state rows gathered before one autodiff call (fewer calls, bounded memory).
_AUTODIFF_ROWS = 2 ** 16
# Bytes of per-window arrays kept between blocks (speed only; results do not depend on it).
WINDOW_CACHE_BYTES = 256 * 2 ** 20
# Per-state arrays kept for result.states (with a sampler, also _KEPT_SAMPLER).
_KEPT = ("token_fisher", "uniform", "score_mean")
_KEPT_SAMPLER = ("sampler_token_fisher", "raw_score_mean")


class _WindowCache:
    """Per-window arrays (probabilities, centered scores, token moments), computed
    once per distinct window of ``k`` tokens and reused by every state ending in it.

    Holds at most ``budget`` bytes: when a block's new windows would not fit, it
    is emptied first (memory stays bounded; only speed depends on the budget).
    """

    def __init__(self, task, streams, keep_states, budget=None):
        self.task, self.streams, self.keep = task, streams, keep_states
        V, P = task.model.vocab_size, task.model.num_params
        self.centers = list(dict.fromkeys(c for _, _, c in streams))
        per = 8 * (len(self.centers) * V * P + (2 * len(streams) + 6) * P + 2 * V)
        budget = WINDOW_CACHE_BYTES if budget is None else budget
        self.capacity = max(1, budget // per)
        # window entries lie in -1..V (-1 pads a model's whole-history window)
        self.base = (V + 2) ** np.arange(task.model.context, dtype=object)
        self.exact_keys = (V + 2) ** task.model.context < 2 ** 62
        self.clear()

    def clear(self):
        self.index, self.parts, self.n = {}, [], 0
        self.arrays = None

    def _keys(self, W):
        if self.exact_keys:
            return ((W + 1) * self.base.astype(np.int64)).sum(axis=1).tolist()  # (B,)
        return [tuple(r) for r in W.tolist()]

    def rows(self, W):
        """Row of each window of ``W (B, k)`` in :attr:`arrays` (computing new ones)."""
        keys = self._keys(W)
        new = {}
        for i, key in enumerate(keys):
            if key not in self.index and key not in new:
                new[key] = i
        if new:
            if self.n + len(new) > self.capacity:
                self.clear()
                return self.rows(W) if len(set(keys)) <= self.capacity else self._uncached(W)
            for key in new:
                self.index[key] = self.n
                self.n += 1
            self.parts.append(self._compute(W[list(new.values())]))
            self.arrays = None
        if self.arrays is None:
            self.parts = [{k: np.concatenate([p[k] for p in self.parts]) for k in self.parts[0]}]
            self.arrays = self.parts[0]
        return self.arrays, np.array([self.index[k] for k in keys], dtype=np.int64)

    def _uncached(self, W):
        Wu, inv = np.unique(W, axis=0, return_inverse=True)
        return self._compute(Wu), inv.ravel()

    def _compute(self, Wu):
        """Arrays of distinct windows ``Wu (U, k)``."""
        task, theta = self.task, self.task.theta
        pu, qu = model_probs(task, theta, Wu)  # (U, V) each
        J = checked_sensitivities(task, Wu)  # (U, P, V)
        jbar = {"p": mean_sensitivity(pu, J), "q": mean_sensitivity(qu, J)}  # (U, P)
        dist = {"p": pu, "q": qu}
        out = {"p": pu, "q": qu}
        for c in self.centers:
            center = jbar[c] if isinstance(c, str) else topk_center(qu, J, c)  # (U, P)
            xi = J - center[:, :, None]  # (U, P, V): the score of every candidate token
            out[f"xiT{c}"] = np.ascontiguousarray(xi.transpose(0, 2, 1))  # (U, V, P)
            out[f"center{c}"] = center
        for s, (_, wname, c) in enumerate(self.streams):
            out[f"m{s}"] = token_second_moment(dist[wname], J, out[f"center{c}"])  # (U, P)
            out[f"cond{s}"] = np.einsum("uv,uvp->up", dist[wname], out[f"xiT{c}"])  # E[xi|s]
        if self.keep:
            out["token_fisher"] = token_fisher(pu, J)
            out["uniform"] = uniform_token_fisher(J)
            out["score_mean"] = np.einsum("uv,uvp->up", pu, out["xiTp"])
            if task.sampler is not None:
                out["sampler_token_fisher"] = token_fisher(qu, J)
                out["raw_score_mean"] = np.einsum("uv,uvp->up", qu, out["xiTp"])
        return out


class _AutodiffBatch:
    """Complete responses gathered for one :func:`autodiff_gradient` call."""

    def __init__(self, task):
        self.task, self.parts, self.rows = task, [], 0

    def add(self, done, plen, R):
        """Queue a block's responses; True once about ``_AUTODIFF_ROWS`` state rows wait."""
        self.parts.append((done["tokens"], done["length"], plen,
                           self.task.prompt_weights[done["prompt"]], R))
        self.rows += len(R) * self.task.max_len
        return self.rows >= _AUTODIFF_ROWS

    def flush(self):
        """Gradient ``(P,)`` of the queued responses' expected reward; empties the queue."""
        if not self.parts:
            return 0.0
        args = [np.concatenate(a) for a in zip(*self.parts)]
        self.parts, self.rows = [], 0
        return autodiff_gradient(self.task, self.task.theta, *args)


def _block_arrays(run, cache, block):
    """A block's per-state arrays, gathered from the per-window cache; adds its
    token-level terms and keeps its state records."""
    task, S = run.task, len(run.streams)
    W = task.model.windows(block["tokens"], block["length"])  # (B, k)
    arr, inv = cache.rows(W)  # per-window arrays, (B,) row of each state
    p, q = arr["p"][inv], arr["q"][inv]  # (B, V)
    if task.sampler is not None:
        check_support(block, p, q)
    ms = [arr[f"m{s}"][inv] for s in range(S)]  # S arrays (B, P)
    run.add_states(block, ms, [arr[f"cond{s}"][inv] for s in range(S)])
    if run.keep_states:
        keys = _KEPT + (_KEPT_SAMPLER if task.sampler is not None else ())
        run.keep_state_arrays(block, p, q, {k: arr[k][inv] for k in keys})
    xiT = [arr[f"xiT{c}"] for _, _, c in run.streams]  # S arrays (U, V, P)
    return BlockArrays(p, q, inv, xiT, block["G"] + np.stack(ms))  # G: (S, B, P)


def _complete(run, batch, block, arrs, par, xi, done):
    r"""Complete responses: :math:`h = H(\text{parent}) + \xi` formed per response
    (so :math:`h^2, h^4, Ah` are summed response by response); path sums and cross
    terms grouped by parent, which shares :math:`\xi_u` for ``u < depth``.

    Args:
        par: ``(C,)`` parent row of each response (sorted); ``xi``: ``S`` arrays
            ``(C, P)``, the score of its last token; ``done``: the responses' block.
    """
    task, depth = run.task, block["depth"]
    resp, R, plen = responses(task, done)
    starts = np.flatnonzero(np.r_[True, par[1:] != par[:-1]])  # (Pn,) first row per parent
    pg = par[starts]  # (Pn,) parents with complete children
    for s, (name, wname, _) in enumerate(run.streams):
        h = block["H"][s, par] + xi[s]  # (C, P): each response's own h
        run.moments[name].add_responses_grouped(
            done[REACH[wname]], R, h, done["rp"], starts, arrs.G[s, pg],
            block["hist"][s, pg, :depth], xi[s], depth)
    if batch.add(done, plen, R):
        run.grad_ad += batch.flush()
    run.keep_responses(done, resp, R)


def exact(task, *, topk=(), chunk=None, keep_states="auto", keep_sequences="auto",
          max_seconds=DEFAULT_MAX_SECONDS, max_bytes=DEFAULT_MAX_BYTES, progress=True,
          reference=False):
    r"""Every quantity of DESIGN §1 for ``task``, exactly, in float64.

    Args:
        task: a :class:`fisher_ref.tasks.Task`.
        topk: with a sampler, also center with only the top-``k`` tokens of ``mu``
            for each ``k`` here (what partial knowledge of ``mu`` costs).
        chunk: states per block (default: sized to about 256 MiB of work arrays).
        keep_states, keep_sequences: keep the per-state / per-response arrays
            (``"auto"``: when they fit in about 1 GiB).
        max_seconds, max_bytes: refuse (:class:`EnumerationTooLarge`) past these.
        progress: show a progress bar on stderr once the run exceeds 2 s.
        reference: run the plain engine
            (:func:`fisher_ref.exact_reference.exact_reference`) instead.

    Returns:
        :class:`fisher_ref.results.ExactResult`.

    Example:
        >>> from fisher_ref import load_config, exact
        >>> r = exact(load_config("default"))
        >>> bool(np.allclose(r.sequence_fisher, r.token_fisher_sum, rtol=1e-10, atol=0))
        True
    """
    kw = dict(topk=topk, chunk=chunk, keep_states=keep_states, keep_sequences=keep_sequences,
              max_seconds=max_seconds, max_bytes=max_bytes, progress=progress)
    if reference:
        return exact_reference(task, **kw)
    run = Run(task, **kw)
    cache = _WindowCache(task, run.streams, run.keep_states)
    batch = _AutodiffBatch(task)
    run.walk(("hist", "H", "G"), lambda block: _block_arrays(run, cache, block),
             lambda *args: _complete(run, batch, *args))
    run.grad_ad += batch.flush()
    return run.finish()
