r"""The plain (reference) exact engine, kept as the judge of :mod:`fisher_ref.exact`.

It carries every response's full score history and sums every response-level
quantity response by response; :func:`fisher_ref.exact.exact` regroups the same
finite sums to run faster and is tested against this one at 1e-10 relative.

One depth-first pass over the prefix tree feeds several *streams*. A stream is
a pair (distribution the responses are drawn from, centering of the score):

- ``"policy"`` — drawn from ``p``, centered at :math:`\bar j_p` (on-policy);
- ``"raw"`` — drawn from ``mu``, centered at :math:`\bar j_p` (the raw score);
- ``"centered"`` — drawn from ``mu``, centered at :math:`\bar j_\mu`;
- ``"top{k}"`` — drawn from ``mu``, centered with only the top-``k`` tokens of
  ``mu`` known (renormalised).

Every response-level expectation is a sum over complete responses of
probability times the response's own value (:math:`h`, :math:`h^2`,
:math:`\xi_u\xi_t`, :math:`A h`); every token-level one is a sum over states
of reach probability times the state's value. The identities of docs/theory.md relate the
two routes; nothing here assumes them.

Both engines share what does not depend on how the sums are grouped (the
argument checks and sizing, the checked probabilities, the depth-first walk and
the accumulators it feeds): that lives in :mod:`fisher_ref.engine.run`.
"""
from __future__ import annotations

import numpy as np

from fisher_ref.engine.plan import DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, EngineOptions
from fisher_ref.engine.tree import carry, responses
from fisher_ref.numerics import (mean_sensitivity, token_fisher, token_second_moment,
                                 uniform_token_fisher)
from fisher_ref.engine.autodiff import autodiff_gradient
from fisher_ref.engine.run import (BlockArrays, Run, check_support,
                                   checked_sensitivities, children, model_probs)
from fisher_ref.numerics import topk_center

__all__ = ["exact_reference", "topk_center"]


def _block_arrays(run, block):
    """Every state's probabilities, sensitivities and scores, computed per state."""
    task = run.task
    W = task.model.windows(block.tokens, block.length)  # (B, k)
    p, q = model_probs(task, task.theta, W)  # (B, V) each
    if task.sampler is not None:
        check_support(block, p, q)
    J = checked_sensitivities(task, W)  # (B, P, V)
    jbar = {"p": mean_sensitivity(p, J), "q": mean_sensitivity(q, J)}  # (B, P)
    dist = {"p": p, "q": q}
    xiT, ms, conds = [], [], []
    for stream in run.streams:
        wname, cname = stream.drawn_from, stream.center
        center = jbar[cname] if isinstance(cname, str) else topk_center(q, J, cname)  # (B, P)
        xi = J - center[:, :, None]  # (B, P, V): the score of every candidate token
        ms.append(token_second_moment(dist[wname], J, center))  # (B, P)
        conds.append(np.einsum("bv,bpv->bp", dist[wname], xi))  # (B, P): E[xi | s]
        xiT.append(xi.transpose(0, 2, 1))  # (B, V, P)
    run.add_states({"p": block.rp, "q": block.rq}, ms, conds, block.depth, p.shape[0])
    if run.keep_states:
        kept = {"token_fisher": token_fisher(p, J), "uniform": uniform_token_fisher(J),
                "score_mean": np.einsum("bv,bvp->bp", p, xiT[0])}
        if task.sampler is not None:
            kept.update({"sampler_token_fisher": token_fisher(q, J),
                         "raw_score_mean": np.einsum("bv,bvp->bp", q, xiT[0])})
        run.keep_state_arrays(block, p, q, kept)
    return BlockArrays(p, q, np.arange(p.shape[0]), xiT, block.G + np.stack(ms))


def _complete(run, block, arrs, idx):
    """Complete responses (children ``idx`` of the block): every response-level sum
    taken response by response over each response's full score history ``(M, T, P)``."""
    task = run.task
    par, xi, done = children(task, block, idx, arrs)
    done.update(carry(block, par, xi, arrs.G))
    resp, R, plen = responses(task, done)
    for s, stream in enumerate(run.streams):
        name, wname = stream.name, stream.drawn_from
        run.moments[name].add_responses(done.reach(wname), R, done.hist[s], done.G[s],
                                        done.rp)
    run.grad_ad += autodiff_gradient(task, task.theta, done.tokens, done.length, plen,
                                      task.prompt_weights[done.prompt], R)
    run.keep_responses(done, resp, R)


def exact_reference(task, *, topk=(), chunk=None, keep_states="auto", keep_sequences="auto",
                    max_seconds=DEFAULT_MAX_SECONDS, max_bytes=DEFAULT_MAX_BYTES, progress=True,
                    quantities="all"):
    r"""The plain engine: the arguments and result of :func:`fisher_ref.exact.exact`.

    Every response carries its full score history and every response-level sum is
    taken response by response; it is slow, and it is the judge of the fast engine.
    It computes every quantity whatever ``quantities`` says; the result then holds
    only those ``quantities`` names.

    Example:
        >>> from fisher_ref import load_config
        >>> r = exact_reference(load_config("default"))
        >>> bool(np.allclose(r.sequence_fisher, r.token_fisher_sum, rtol=1e-10, atol=0))
        True
    """
    run = Run(task, EngineOptions(topk=topk, chunk=chunk, keep_states=keep_states,
                                  keep_sequences=keep_sequences, max_seconds=max_seconds,
                                  max_bytes=max_bytes, progress=progress, quantities=quantities))
    run.walk(("hist", "G"), lambda block: _block_arrays(run, block),
             lambda *args: _complete(run, *args))
    return run.finish()
