r"""The walk over the prefix tree of the fast engine, and what it feeds.

The fast engine (:mod:`fisher_ref.engine.fast`) is a thin strategy over this module (the
readable judge, :mod:`fisher_ref.reference`, walks the tree its own way):

- :func:`plan` validates the engine arguments, sizes the run and refuses it past
  the limits (:mod:`fisher_ref.engine.plan` counts in closed form);
- :func:`fisher_ref.next_token.model_probs`, :func:`~fisher_ref.next_token.checked_sensitivities`,
  :func:`~fisher_ref.next_token.check_support` give the checked per-state probabilities of
  the policy and the sampler and the logit sensitivities
  :math:`j_{i,a}(s) = \partial z_a(s)/\partial\theta_i` (shared with the readable judge,
  :mod:`fisher_ref.reference`);
- :func:`fisher_ref.results.stream_specs` names the streams (distribution drawn from,
  centering);
- :class:`Run` walks every state depth-first in bounded blocks and accumulates
  per-stream :class:`fisher_ref.engine.moments.Moments`, the autodiff gradient and the
  kept per-state and per-response records;
- :mod:`fisher_ref.engine.autodiff` holds the second route to the policy gradient
  (the derivative of the exact expected reward by autograd), which the engine adds
  up as it walks.

Streams (see docs/theory.md): ``"policy"`` — drawn from ``p``, centered at
:math:`\bar j_p`; with a sampler ``"raw"`` (from ``mu``, centered at
:math:`\bar j_p`), ``"centered"`` (from ``mu``, at :math:`\bar j_\mu`) and
``"top{k}"`` (from ``mu``, centered with only the top-``k`` tokens of ``mu``).
"""
from __future__ import annotations

from collections import namedtuple
from functools import lru_cache

import numpy as np

from fisher_ref.engine.tree import depth_first, expand, root_block, terminal
from fisher_ref.engine.plan import (EngineOptions, check_chunk, check_cost,
                                    count_states, estimate_cost, resolve_keep)
from fisher_ref._progress import Progress
from fisher_ref.engine.moments import Moments, finish_fisher, finish_stream
from fisher_ref.engine.columns import column_count
from fisher_ref.next_token import check_logits, check_support, checked_sensitivities, model_probs
from fisher_ref.results import ExactResult, Stream, check_quantities, check_topk, stream_specs
from fisher_ref.tasks import require_task

__all__ = ["BlockArrays", "Stream", "check_topk", "stream_specs", "check_logits",
           "model_probs", "checked_sensitivities", "check_support", "plan", "state_places",
           "response_places", "last_scores", "Run"]

#: What a block's states pass on to their children: probabilities ``p, q (B, V)``,
#: ``rows (B,)`` the row of each state in the ``xiT`` arrays, ``xiT`` one array
#: ``(U, V, P)`` per stream (the score of every candidate token), and ``G (S, B, P)``
#: the path sums of ``m`` including the states' own.
BlockArrays = namedtuple("BlockArrays", "p q rows xiT G")


def plan(task, options, workers=1):
    """Validate the engine's options (an :class:`fisher_ref.engine.plan.EngineOptions`), size
    the run (in ``workers`` processes) and refuse it past the limits.

    Returns:
        ``(streams, cost, keep_states, keep_sequences)`` with the ``"auto"`` choices
        resolved (keep the arrays when they fit in about 1 GiB; never the per-response
        arrays, which hold rewards and advantages, with ``quantities="fisher"``).
    """
    if not isinstance(options, EngineOptions):
        raise TypeError(f"options must be a fisher_ref.engine.plan.EngineOptions, got "
                        f"{options!r:.80}")
    o = options
    topk, chunk, keep_states, keep_sequences, quantities = (
        o.topk, o.chunk, o.keep_states, o.keep_sequences, o.quantities)
    P, T = require_task(task).model.num_params, task.max_len
    topk = check_topk(topk)
    if check_quantities(quantities) == "fisher":
        if keep_sequences is True:
            raise ValueError("keep_sequences=True needs quantities='all': the per-response "
                             "arrays hold rewards and advantages, which quantities='fisher' "
                             "does not compute")
        keep_sequences = False
    if topk and task.sampler is None:
        raise ValueError("topk centering needs a sampler mu; this task is on-policy "
                         "(add a 'sampler' to the task)")
    chunk = check_chunk(chunk)
    streams = stream_specs(task, topk)
    cost = estimate_cost(task, n_streams=len(streams), chunk=chunk)
    keep_states, keep_sequences = resolve_keep(keep_states, keep_sequences, cost.n_states,
                                               cost.n_responses, P, T)
    cost = estimate_cost(task, n_streams=len(streams), chunk=chunk, keep_states=keep_states,
                         keep_sequences=keep_sequences, quantities=quantities, workers=workers)
    check_cost(cost, o.max_seconds, o.max_bytes)
    return streams, cost, keep_states, keep_sequences


def state_places(task, block):
    """Place of each state of a block among all states sorted by (prompt, depth,
    generated tokens), as in :attr:`fisher_ref.results.ExactResult.states`: ``(B,)``.

    Per prompt there are :math:`\beta^t` open states at depth ``t`` (``beta = V - 1``
    with EOS, whose open states never hold token 0; ``V`` without), in
    lexicographic order of their generated tokens."""
    V, T, d = task.model.vocab_size, task.max_len, block.depth
    low = 1 if task.model.eos else 0
    beta = V - low
    gen = block.tokens[np.arange(block.size)[:, None],
                          (block.length - d)[:, None] + np.arange(d)]  # (B, d)
    rank = (gen - low) @ (beta ** np.arange(d - 1, -1, -1, dtype=np.int64))  # (B,)
    per_prompt = sum(beta ** t for t in range(T))
    return block.prompt * per_prompt + sum(beta ** t for t in range(d)) + rank


def response_places(task, prompt, resp):
    """Place of each complete response among all responses sorted by (prompt, generated
    tokens), as in :attr:`fisher_ref.results.ExactResult.sequences`: ``(M,)``.

    Responses are prefix-free (each ends with EOS or at ``max_len``), so the order is
    lexicographic in the tokens, and a response's place counts the responses before it:
    at each of its positions ``t``, every smaller token ends one response (EOS, or any
    token at the last position) or opens a subtree of ``S(t + 1)`` responses.

    Args:
        prompt: ``(M,)`` prompt index; ``resp``: ``(M, T)`` tokens, ``-1`` past the end.
    """
    V, T, eos = task.model.vocab_size, task.max_len, task.model.eos
    per_prompt, table = _places_before(V, T, eos)
    flat = table.ravel()  # position by position: a sum over a short last axis is slower
    place = prompt * per_prompt
    for t in range(T):
        place = place + np.take(flat, resp[:, t] + (t * (V + 1) + 1))
    return place


@lru_cache(maxsize=64)
def _places_before(V, T, eos):
    """``(S[0], table (T, V + 1))`` for :func:`response_places`: ``table[t, a + 1]`` the
    responses before one with token ``a`` at position ``t`` among those sharing its tokens
    before ``t`` (0 for ``a = -1``, past the end); ``S[0]`` the responses of one prompt."""
    S = np.array(_subtree_responses(V, T, eos), dtype=np.int64)
    a, t = np.arange(V)[None, :], np.arange(T)[:, None]  # (1, V), (T, 1)
    opens = eos & (t < T - 1)  # EOS ends the response; the other tokens open subtrees
    below = np.where(opens, np.where(a >= 1, 1 + (a - 1) * S[t + 1], 0), a * S[t + 1])
    table = np.zeros((T, V + 1), dtype=np.int64)
    table[:, 1:] = below
    table.setflags(write=False)
    return int(S[0]), table


@lru_cache(maxsize=64)
def _subtree_responses(V, T, eos):
    """``S[t]``, ``t = 0..T``: the responses under a state with ``t`` generated tokens (a
    subtree of ``T - t`` tokens; 1 at ``t = T``), for :func:`response_places`."""
    return tuple(count_states(V, T - t, eos)[1] for t in range(T)) + (1,)


def last_scores(arrs, par, tok):
    """The score of token ``tok (C,)`` at parent rows ``par (C,)``: ``S`` arrays ``(C, P)``."""
    return [x[arrs.rows[par], tok] for x in arrs.xiT]


class Run:
    """One enumeration of the fast engine: the walk over the prefix tree and
    what it accumulates (per-stream :class:`Moments`, the autodiff gradient, the
    kept per-state and per-response records).

    Args:
        task: a :class:`fisher_ref.tasks.Task`.
        options: an :class:`fisher_ref.engine.plan.EngineOptions` (its ``budgets`` too).
        columns: the parameters whose sums the run forms (a slice of ``0..P``, or a
            :class:`fisher_ref.engine.mlp_columns.UnitColumns`; ``None``: all); the autodiff
            gradient is of every parameter.
        cut: ``None`` to walk every state; else the part of the tree to walk, an object
            with ``n_states``, ``start(run)``, ``roots(root)``, ``children(block, idx)``,
            ``keep(part, rec, at)`` and ``result(run)`` (a subtree shard of the parallel
            layer, :class:`fisher_ref.parallel.shards.ShardWalk`, which the run hands
            its kept rows and its end).
    """

    def __init__(self, task, options=EngineOptions(), columns=None, cut=None):
        quantities = options.quantities
        self.task, self.quantities, self.budgets = task, quantities, options.budgets
        self.streams, self.cost, self.keep_states, self.keep_sequences = plan(task, options)
        P, T = task.model.num_params, task.max_len
        self.columns = slice(0, P) if columns is None else columns
        self.P = column_count(self.columns, P)
        self.moments = {stream.name: Moments(self.P, T) for stream in self.streams}
        # the rows that hold no parameter (per-state records, per-response arrays, the
        # autodiff gradient): a run over some of the parameters may leave them to another
        self.records = True
        self.cut = cut
        self.grad_ad = np.zeros(P)  # (P,)
        self.states, self.seqs = [], []
        self.written = {}  # part -> (rows written in place, which places were written)
        self.width = max(len(p) for p in task.prompts) + T - 1  # longest state
        self.bar = Progress(self.cost.n_states if cut is None else cut.n_states,
                            "exact enumeration", enabled=options.progress)
        if cut is not None:
            cut.start(self)

    def walk(self, carried, block_arrays, complete, carry, last_chunk=None):
        """Visit every state depth-first (then call :meth:`finish`).

        Args:
            carried: per-stream arrays each state carries (names in ``PER_STREAM``).
            block_arrays: ``block -> BlockArrays``; adds the block's token-level terms.
            complete: ``(block, arrs, idx)`` adds the complete responses, children
                ``idx`` (rows ``b*V + a``, sorted) of the block.
            carry: ``(block, par, tok, arrs) -> {field: value}``, the
                :class:`fisher_ref.engine.tree.Block` fields the children with parent rows
                ``par (C,)`` and last tokens ``tok (C,)`` carry.
            last_chunk: the states of one block of the last level, when the engine sums
                that level in bounded pieces of its own (default ``chunk``).
        """
        stack = [root_block(self.task, len(self.streams), carried, self.P)]
        if self.cut is not None:  # its subtrees, and silent blocks above them
            stack = self.cut.roots(stack[0])
        for block in depth_first(stack, self.cost.chunk, last_chunk):
            arrs = block_arrays(block)
            term = terminal(self.task, block)  # (B*V,)
            if term.any() and not block.silent:  # complete responses
                complete(block, arrs, np.flatnonzero(term))
            if not term.all():
                idx = np.flatnonzero(~term)
                for idx, extra in ([(idx, {})] if self.cut is None else
                                   self.cut.children(block, idx)):
                    par, tok, child = expand(self.task, block, idx, arrs.p, arrs.q)
                    child.update(carry(block, par, tok, arrs), **extra)
                    stack.append(child)

    def add_states(self, reach, ms, conds, depth, n_states):
        """Token-level terms: ``reach`` maps ``"p"``, ``"q"`` to ``(B,)`` reach
        probabilities, ``ms``, ``conds`` are ``S`` arrays ``(B, P)``, the token second
        moment ``m`` and :math:`E[\\xi | s]` of each stream, per state (the fast engine sums
        per window instead, :meth:`WindowCache.accumulate_states`); ``n_states`` advances
        the bar."""
        for s, stream in enumerate(self.streams):
            name, wname = stream.name, stream.drawn_from
            self.moments[name].add_states(reach[wname], ms[s], conds[s], depth)
        self.bar.update(n_states)

    def keep_state_arrays(self, block, p, q, values, at=None):
        """Record a block's states if states are kept. ``values``: name -> ``(B, ...)``
        array.

        With ``at`` (:func:`state_places`), write them straight into their place in
        the sorted per-state arrays; else keep the block's records, sorted at the end."""
        if not self.keep_states:
            return
        n = block.size
        rec = {"tokens": block.tokens[:, :self.width], "prompt": block.prompt,
               "depth": np.full(n, block.depth), "reach": block.rp, "probs": p}
        if self.task.sampler is not None:
            rec.update({"sampler_reach": block.rq, "sampler_probs": q})
        rec.update(values)
        if at is None:
            rec["tokens"] = rec["tokens"].copy()  # not a view that keeps the block alive
            self.states.append(rec)
            return
        if self.cut is not None:  # the cut's rows, with their places (merged later)
            return self.cut.keep("states", rec, at)
        if not isinstance(self.states, dict):  # the first block: room for every state
            N = self.cost.n_states
            self.states = {k: np.empty((N,) + v.shape[1:], dtype=v.dtype)
                           for k, v in rec.items()}
        self._mark("states", at, self.cost.n_states)
        lo = int(at[0])
        run = n and int(at[-1]) - lo == n - 1 and (np.diff(at) == 1).all()  # consecutive places
        for k, v in rec.items():
            if run:
                self.states[k][lo:lo + n] = v
            else:
                self.states[k][at] = v

    def _mark(self, part, at, total):
        count, seen = self.written.get(part, (0, np.zeros(total, dtype=bool)))
        seen[at] = True
        self.written[part] = (count + len(at), seen)

    def keep_responses(self, done, resp, R):
        """Record complete responses ``resp (M, T)`` with rewards ``R (M,)`` if kept, each
        written straight into its sorted place (:func:`response_places`)."""
        if not self.keep_sequences:
            return
        rec = {"tokens": resp, "prompt": done.prompt, "prob": done.rp,
               "sampler_prob": done.rq, "reward": R}
        at = response_places(self.task, done.prompt, resp)
        if self.cut is not None:
            return self.cut.keep("sequences", rec, at)
        if not isinstance(self.seqs, dict):  # the first block: room for every response
            M = self.cost.n_responses
            self.seqs = {k: np.empty((M,) + v.shape[1:], dtype=v.dtype) for k, v in rec.items()}
        self._mark("sequences", at, self.cost.n_responses)
        for k, v in rec.items():
            self.seqs[k][at] = v

    def finish(self):
        """Close the progress bar; the :class:`ExactResult` of the accumulated sums (of a
        cut: what its ``result(run)`` returns, a shard's result, merged later).

        Arrays written in place must have had every row written once: a walk that
        missed or repeated a state or response is an error, not uninitialised rows."""
        self.bar.close()
        if self.cut is not None:
            return self.cut.result(self)
        for part, (count, seen) in self.written.items():
            if count != len(seen) or not seen.all():
                raise RuntimeError(f"the walk wrote {count} {part} rows into "
                                   f"{int(seen.sum())} of {len(seen)} places (a bug in the walk)")
        fisher = self.quantities == "fisher"
        results = {st.name: finish_fisher(self.moments[st.name]) if fisher else
                   finish_stream(self.moments[st.name], self.task.baseline)
                   for st in self.streams}
        return ExactResult.build(self.task, self.cost, results, self.grad_ad, self.states,
                                 self.seqs, self.quantities)
