r"""Exact enumeration in torch, depth-first in blocks on the device, for any adapter.

The same finite sums as :func:`fisher_ref.exact.exact` (docs/theory.md §2, §3, §7),
computed in torch on any device and dtype, for any model with a torch adapter
(:func:`fisher_ref.torch.registry.torch_model`: the MLP, the tabular model, the GPT-2
through ``transformers``, any ``torch.nn.Module`` through
:func:`fisher_ref.torch.module.from_module`). Streams: ``"policy"`` (drawn from ``p``,
centered at :math:`\bar j_p`); with a sampler ``"raw"`` (drawn from :math:`\mu`, centered
at :math:`\bar j_p`) and ``"centered"`` (drawn from :math:`\mu`, centered at
:math:`\bar j_\mu`).

The steps, one block of open states at a time (:mod:`fisher_ref.torch.tree`):

1. :func:`visit_block` — the block's windows, their arrays from the
   :class:`~fisher_ref.torch.window_cache.WindowCache` (logits, ``j`` by ``vmap(jacrev)`` once
   per distinct window, scores, token moments), the token sums by states;
2. :func:`add_complete` — the responses ending at the block's children: each one's own
   :math:`h = H(\text{parent}) + \xi(a)` and reward, the per-response sums, and the
   cross terms grouped by parent (:class:`~fisher_ref.torch.moments.StreamSums`);
3. the open children go onto the stack as the next block
   (:func:`~fisher_ref.torch.tree.open_children`);
4. :class:`GradientBatch` — the second route to the policy gradient: torch autograd of
   the exact :math:`E[R] = \sum_y w_x \prod_t p(y_t|s_t) R(y)` over batches of responses.

Memory is bounded by ``chunk`` (states per block), never by the number of responses: the
stack holds at most ``T`` blocks of ``chunk * V`` rows and no ``(M, T, P)`` history exists.
"""
from __future__ import annotations

import math
import warnings

import numpy as np  # noqa: F401 (the doctest below uses it)
import torch

from fisher_ref.engine.plan import (DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, check_chunk,
                                    check_cost, count_states, default_chunk, estimate_cost,
                                    resolve_keep)
from fisher_ref.results import sorted_by_tokens
from fisher_ref.rewards import evaluate_reward
from fisher_ref.engine.run import stream_specs
from fisher_ref.torch.module_model import causal_lm_task
from fisher_ref.torch.registry import torch_model
from fisher_ref.torch.moments import Ranges, StreamSums
from fisher_ref.torch.shards import ShardTree, merge_torch, shard_result
from fisher_ref.torch.tree import depth_first, ending_tokens, open_children, root_block
from fisher_ref.torch.self_check import (SELF_CHECK_MODES, CausalLMResult, SelfCheckError,
                                         SelfCheckWarning, failed_check_text,
                                         check_finite, self_checks)
from fisher_ref.torch.window_cache import WindowCache, unique_windows

__all__ = ["torch_exact", "exact_causal_lm", "check_torch_cost", "STREAM_QUANTITIES", "GradientBatch", "visit_block", "add_complete"]

STREAM_QUANTITIES = ("score_mean", "sequence_fisher", "token_fisher_sum",
                     "token_fisher_sum_paths", "cross_terms", "gradient", "covariance",
                     "bound", "correlation", "expected_reward", "reward_std",
                     "importance_gradient")
#: Response-state rows gathered before one autograd call of the expected reward.
GRADIENT_ROWS = 2 ** 16
#: Response-parameter entries summed at once (8 MiB of float64: few Python calls, passes
#: mostly in cache).
CACHE_ROWS = 2 ** 20


class GradientBatch:
    r"""Complete responses gathered for one autograd call of
    :math:`\sum_y w_x \exp(\sum_t \log p(y_t|s_t))\,R(y)`; :meth:`flush` adds its gradient."""

    def __init__(self, run):
        self.run, self.parts, self.rows = run, [], 0
        self.grad = torch.zeros(run.adapter.num_params, dtype=run.adapter.acc_dtype,
                                device=run.adapter.device)

    def add(self, tokens, length, prompt, R):
        """Responses ``tokens (C, L)``, ``length``, ``prompt``, rewards ``R`` ``(C,)``."""
        self.parts.append((tokens, length, prompt, R))
        self.rows += tokens.shape[0] * self.run.task.max_len
        if self.rows >= GRADIENT_ROWS:
            self.flush()

    def flush(self):
        if not self.parts:
            return
        tokens, length, prompt, R = (torch.cat(x) for x in zip(*self.parts))
        self.parts, self.rows = [], 0
        run, ad = self.run, self.run.adapter
        M, T = tokens.shape[0], run.task.max_len
        t = torch.arange(T, device=tokens.device)[None, :]  # (1, T)
        plen = run.prompt_len[prompt]  # (M,)
        live = t < (length - plen)[:, None]  # (M, T) slots holding a generated token
        state_len = torch.minimum(plen[:, None] + t, length[:, None] - 1)  # (M, T)
        W = ad.windows(tokens.repeat_interleave(T, dim=0), state_len.reshape(-1))  # (M*T, k)
        Wu, inv = unique_windows(W, ad.vocab_size)  # (U, k), (M*T,)
        nxt = tokens.gather(1, state_len).reshape(-1)  # (M*T,)
        th = run.theta.detach().clone().requires_grad_(True)
        lp = torch.log_softmax(ad.logits(th, Wu).to(ad.acc_dtype), -1)  # (U, V)
        lpt = lp[inv, nxt].reshape(M, T)
        logP = torch.where(live, lpt, torch.zeros_like(lpt)).sum(1)  # (M,)
        ER = (run.prompt_weights[prompt] * logP.exp() * R).sum()
        (g,) = torch.autograd.grad(ER, th)
        self.grad += g.to(ad.acc_dtype)


class _Run:
    """One enumeration: the task, its adapter, the streams' sums and what is kept."""

    def __init__(self, task, adapter, chunk, keep_states, keep_sequences, variances):
        self.task, self.adapter = task, adapter
        ad, acc, dev = adapter, adapter.acc_dtype, adapter.device
        V, P, T = ad.vocab_size, ad.num_params, task.max_len
        self.streams = stream_specs(task, ())
        S = len(self.streams)
        N, M = count_states(V, T, ad.eos, len(task.prompts))
        self.keep_states, self.keep_seqs = resolve_keep(keep_states, keep_sequences, N, M, P, T)
        chunk = check_chunk(chunk)
        self.chunk = default_chunk(P, V, T, S) if chunk is None else chunk
        self.theta = ad.theta(task.theta)
        self.theta_mu = None if task.sampler is None else \
            ad.theta(task.sampler.params(task.model, task.theta))
        self.sums = [StreamSums(P, T, dev, acc, variances) for _ in self.streams]
        self.ranges = Ranges(P, dev, acc) if variances else None
        self.prompt_len = torch.tensor([len(p) for p in task.prompts], device=dev)
        self.prompt_weights = torch.as_tensor(task.prompt_weights, dtype=acc, device=dev)
        self.r0 = None  # reference reward: every R sum is of R - r0
        self.table = WindowCache(self)
        self.grad = GradientBatch(self)
        self.jmax = 0.0  # largest |j| seen (the scale of the E[h] = 0 self-check)
        if isinstance(getattr(adapter, "upcasts", None), dict):
            adapter.upcasts.clear()  # this run's rewrites only
        self.states, self.seqs = [], []
        self.width = max(len(p) for p in task.prompts) + T - 1  # longest state

    def rewards(self, block, cols):
        """Rewards ``(B, k)`` of the responses ``state b + token cols[j]`` and their tokens."""
        task, pl = self.task, self.prompt_len[block.prompt].tolist()
        toks, lens, cs = block.tokens.tolist(), block.length.tolist(), cols.tolist()
        R = [[evaluate_reward(task.reward, task.prompts[pi], toks[b][pl[b]:lens[b]] + [a])
              for a in cs] for b, pi in enumerate(block.prompt.tolist())]
        R = torch.as_tensor(R, dtype=torch.float64).reshape(block.size, len(cs))
        if self.r0 is None:
            self.r0 = float(R.flatten()[0])
        return R.to(self.adapter.device, self.adapter.acc_dtype)  # (B, k)


def _check_support(run, block, p, q):
    """Refuse a sampler that gives probability 0 to a token the policy can emit."""
    bad = (p > 0) & (q == 0) & (block.rp[:, None] > 0)  # (B, V)
    if bad.any():
        from fisher_ref.engine.run import check_support
        from fisher_ref.engine.tree import Block
        host = {k: getattr(block, k).cpu().numpy()
                for k in ("prompt", "rp", "rq", "tokens", "length")}
        check_support(Block(depth=block.depth, **host), p.cpu().numpy(), q.cpu().numpy())


def _pick(arr, inv, c, cols):
    """Scores of tokens ``cols`` at each state: ``(B, k, P)`` from the ``(U, V, P)`` table."""
    return arr[f"xi{c}"][inv[:, None], cols[None, :]]


def visit_block(run, block, silent=False):
    """Token-level terms of a block, its ending responses, and its open children (returned);
    ``silent``: only the children (states above a shard's units, added by another)."""
    task, S = run.task, len(run.streams)
    W = run.adapter.windows(block.tokens, block.length)  # (B, k)
    arr, inv = run.table.rows(W)
    p, q = arr["p"][inv], arr["q"][inv]  # (B, V)
    if task.sampler is not None:
        _check_support(run, block, p, q)
    ms = torch.stack([arr[f"m{s}"][inv] for s in range(S)])  # (S, B, P)
    for s, (_, wname, _) in enumerate(run.streams if not silent else ()):
        run.sums[s].add_states(block.rp if wname == "p" else block.rq, ms[s], block.depth)
    if run.keep_states and not silent:
        run.states.append({"tokens": block.tokens[:, :run.width], "prompt": block.prompt,
                           "depth": torch.full_like(block.prompt, block.depth),
                           "reach": block.rp, "probs": p, "token_fisher": ms[0],
                           "uniform": arr["uniform"][inv]})
    G = block.G + ms  # (S, B, P) path sums including the states' own moments
    ending, opening = ending_tokens(task, block.depth, p.device)
    if len(ending) and not silent:  # in groups of parents whose (k, P) rows fit in a cache
        step = max(1, CACHE_ROWS // (len(ending) * run.adapter.num_params))
        parts = [add_complete(run, block.rows(slice(lo, lo + step)), p[lo:lo + step],
                              q[lo:lo + step], arr, inv[lo:lo + step], G[:, lo:lo + step],
                              ending) for lo in range(0, block.size, step)]
        if block.depth:  # cross terms with the parents' scores, once per block
            for s, sums in enumerate(run.sums):
                Wg, X1, X2 = (torch.cat([part[s][j] for part in parts]) for j in range(3))
                sums.add_history(block.depth, Wg, X1, X2, block.hist[s])
    if len(opening):
        x = torch.stack([_pick(arr, inv, stream.center, opening) for stream in run.streams])
        return open_children(block, opening, p, q, x, G)
    return None


def add_complete(run, block, p, q, arr, inv, G, cols):
    r"""The responses ending at tokens ``cols`` of each state of ``block``: their own
    :math:`h = H + \xi(a)`, rewards, weights and scores into every stream's sums; the
    policy stream's ranges; the gradient batch and the kept sequences.

    Returns:
        per stream ``(Wg, X1, X2)``: each parent's total weight and sums of its ending
        children's last scores (:meth:`~fisher_ref.torch.moments.StreamSums.add_last`).
    """
    B, k, d = block.size, cols.shape[0], block.depth
    R = run.rewards(block, cols)  # (B, k)
    Rc = (R - run.r0).reshape(-1)  # (B*k,)
    w = {"p": block.rp[:, None] * p[:, cols], "q": block.rq[:, None] * q[:, cols]}  # (B, k)
    wp = w["p"].reshape(-1)  # (B*k,)
    out = []
    for s, stream in enumerate(run.streams):
        wname, c = stream.drawn_from, stream.center
        x = _pick(arr, inv, c, cols)  # (B, k, P)
        h = block.H[s][:, None, :] + x  # (B, k, P): each response's own h
        run.sums[s].add_rewards(w[wname].reshape(-1), R.reshape(-1))
        h2 = run.sums[s].add_responses(w[wname].reshape(-1), Rc, wp, h.reshape(B * k, -1))
        run.sums[s].add_paths(w[wname].sum(1), G[s])
        out.append((w[wname].sum(1),) + run.sums[s].add_last(d, w[wname], x))
        if s == 0 and run.ranges is not None:
            run.ranges.add("sequence_fisher", wp > 0, h2)
            run.ranges.add("token_fisher_sum", (w["p"] > 0).any(1), G[0])
    par = torch.arange(B, device=p.device).repeat_interleave(k)  # (B*k,)
    tokens = block.tokens[par]  # (B*k, L)
    tokens[torch.arange(B * k, device=p.device), block.length[par]] = cols.repeat(B)
    run.grad.add(tokens, block.length[par] + 1, block.prompt[par], R.reshape(-1))
    if run.keep_seqs:
        T = run.task.max_len
        col = run.prompt_len[block.prompt[par]][:, None] + torch.arange(T, device=p.device)
        n = (block.length[par] + 1 - run.prompt_len[block.prompt[par]])[:, None]  # (B*k, 1)
        resp = tokens.gather(1, col.clamp(max=tokens.shape[1] - 1))  # (B*k, T)
        run.seqs.append({"tokens": torch.where(torch.arange(T, device=p.device) < n, resp, -1),
                         "prompt": block.prompt[par], "prob": wp,
                         "sampler_prob": w["q"].reshape(-1), "reward": R.reshape(-1)})
    return out


def check_torch_cost(task, chunk=None, keep_states="auto", keep_sequences="auto",
                     shard=None, max_seconds=DEFAULT_MAX_SECONDS, max_bytes=DEFAULT_MAX_BYTES):
    """Refuse (:class:`~fisher_ref.engine.plan.EnumerationTooLarge`, with the estimate) a
    torch run past the limits, before anything is allocated: the estimate and the limits
    of :func:`fisher_ref.exact` (:func:`~fisher_ref.engine.plan.estimate_cost`,
    :func:`~fisher_ref.engine.plan.check_cost`). A shard (``shard=(i, n)``) is judged on
    memory only: splitting the time is what shards are for."""
    S = len(stream_specs(task, ()))
    m = task.model
    N, M = count_states(m.vocab_size, task.max_len, m.eos, len(task.prompts))
    keep_s, keep_q = resolve_keep(keep_states, keep_sequences, N, M, m.num_params,
                                  task.max_len)
    cost = estimate_cost(task, n_streams=S, chunk=check_chunk(chunk), keep_states=keep_s,
                         keep_sequences=keep_q)
    check_cost(cost, math.inf if shard is not None else max_seconds, max_bytes)


def torch_exact(task, device="cpu", dtype="float64", *, adapter=None, chunk=None,
                keep_states="auto", keep_sequences="auto", variances=True, shard=None,
                merge=None, max_seconds=DEFAULT_MAX_SECONDS, max_bytes=DEFAULT_MAX_BYTES):
    r"""Every exact quantity of ``task`` by enumeration in torch (docs/theory.md §2, §3).

    Args:
        task: a :class:`fisher_ref.tasks.Task` whose model has a torch adapter (MLP,
            tabular, GPT-2, a torch module from
            :func:`fisher_ref.torch.module_model.causal_lm_task`).
        device: torch device.
        dtype: compute dtype of logits and sensitivities (sums in
            :func:`fisher_ref.torch.adapters.accumulation_dtype`).
        adapter: the :class:`fisher_ref.torch.adapters.TorchAdapter` to use (default:
            :func:`fisher_ref.torch.registry.torch_model` of ``task.model``).
        chunk: states per block (default :func:`fisher_ref.engine.plan.default_chunk`,
            about 256 MiB of work arrays); memory grows with it, never with ``V^T``.
        keep_states, keep_sequences: return the per-state / per-response arrays
            (``"auto"``: when they fit in about 1 GiB).
        variances: also the fourth moments, the exact variances of the per-response
            values and the ``ranges`` (about a third of the work on a large task);
            ``False`` returns ``variances`` and ``ranges`` as ``None``.
        shard: ``(i, n)``: only shard ``i`` of ``n`` (the numpy engine's cut); returns its
            sums (a picklable dict, ``fisher_ref.torch.shards``) instead.
        merge: the sums of every shard of one run (same other arguments): their result,
            the dict of the whole run, with no walk.
        max_seconds, max_bytes: refuse the run
            (:class:`~fisher_ref.engine.plan.EnumerationTooLarge`, naming the estimate)
            before anything is allocated when the estimate of :func:`fisher_ref.exact`
            passes them (the same limits; ``math.inf``: none). The time is the numpy
            engine's estimate: on a GPU, raise ``max_seconds`` if you mean it.

    Returns:
        dict: ``streams`` {name: {quantity: float64 numpy}} (:data:`STREAM_QUANTITIES`,
        ``token_fisher_by_depth``, ``baseline``, ``mass`` and ``variances``),
        ``gradient_autodiff (P,)``, ``ranges`` {``"sequence_fisher"``,
        ``"token_fisher_sum"``: ``(P,)``, the largest :math:`|x(y) - E[x]|` over on-policy
        responses}, ``states`` (``tokens (N, L-1)``, ``prompt``, ``depth``, ``reach``,
        ``probs (N, V)``, ``token_fisher (N, P)``, ``uniform (N, P)``; sorted by prompt,
        depth, tokens as in fisher_ref) and ``sequences`` (``tokens (M, T)``, ``prompt``,
        ``prob``, ``sampler_prob``, ``reward``; sorted by prompt, tokens), each ``None``
        when not kept; ``dtype`` (the compute dtype: every array is returned as float64
        numpy but holds only this precision), ``upcasts`` (ops of a module run in
        ``dtype`` instead of a lower one, :mod:`fisher_ref.torch.precision`) and ``checks``
        (the exact identities of :func:`fisher_ref.torch.self_check.self_checks`).

    Raises:
        ValueError: a result array is NaN or infinite (naming it).

    Example:
        >>> from fisher_ref import load_config
        >>> out = torch_exact(load_config("default"))
        >>> pol = out["streams"]["policy"]
        >>> bool(np.allclose(pol["sequence_fisher"], pol["token_fisher_sum"], rtol=1e-10, atol=0))
        True
    """
    if merge is None:
        check_torch_cost(task, chunk, keep_states, keep_sequences, shard, max_seconds,
                         max_bytes)
    adapter = torch_model(task.model, device=device, dtype=dtype) if adapter is None else adapter
    run = _Run(task, adapter, chunk, keep_states, keep_sequences, variances)
    if merge is not None:  # the shards' sums instead of a walk (fisher_ref.torch.shards)
        return _result(merge_torch(run, merge))
    tree = None if shard is None else ShardTree(run, shard)
    stack = [root_block(task, len(run.streams), adapter.device, adapter.acc_dtype)]
    for block in depth_first(stack, run.chunk):
        for part, silent in [(block, False)] if tree is None else tree.parts(block):
            child = visit_block(run, part, silent)
            if child is not None and tree is not None:
                child = tree.children(child)
            if child is not None:
                stack.append(child)
    run.grad.flush()
    return _result(run) if shard is None else shard_result(run, shard)


def _result(run):
    """The result dict of a finished run, as float64 numpy."""
    streams = {}
    for s, stream in enumerate(run.streams):
        name = stream.name
        res = run.sums[s].finish(run.r0, run.task.baseline)
        var = res.pop("variances")
        streams[name] = {k: _np(v) for k, v in res.items()}
        streams[name]["variances"] = None if var is None else {k: _np(v) for k, v in var.items()}
    ranges = None
    if run.ranges is not None:
        pol = run.sums[0]
        ranges = {k: _np(v) for k, v in run.ranges.finish(
            {"sequence_fisher": pol.h2 / pol.mass, "token_fisher_sum": pol.g / pol.mass}).items()}
    ad = run.adapter
    out = {"streams": streams, "gradient_autodiff": _np(run.grad.grad), "ranges": ranges,
           "states": _sorted(run.states, ("depth", "prompt")) if run.keep_states else None,
           "sequences": _sorted(run.seqs, ("prompt",)) if run.keep_seqs else None,
           "dtype": str(ad.dtype).replace("torch.", ""),
           "upcasts": dict(getattr(ad, "upcasts", {}))}
    check_finite(out)
    out["checks"] = self_checks(out, run.task.baseline, run.task.max_len, run.jmax,
                                out["dtype"])
    return out


def _np(x):
    x = x.detach()
    return x.to("cpu", torch.float64).numpy() if x.ndim else float(x)


def _sorted(records, keys):
    """Concatenated records sorted by ``keys`` (last the most significant), then tokens
    (:func:`fisher_ref.results.sorted_by_tokens`, on the records moved to numpy)."""
    records = [{k: _np(v) if v.is_floating_point() else v.cpu().numpy() for k, v in r.items()}
               for r in records]
    return sorted_by_tokens(records, keys)


def exact_causal_lm(module, prompts, max_len, reward, *, vocab_size, eos, bos=None,
                    prompt_weights=None, baseline=0.0, sampler=None, vectorize=True,
                    device="cpu", dtype="float64", params="all", strict=False,
                    n_embeddings=None, self_check="raise", **engine_kwargs):
    r"""Every exact quantity of a torch causal LM on a task: :func:`causal_lm_task`, then
    :func:`fisher_ref.torch.exact.torch_exact` (``engine_kwargs``: ``chunk``,
    ``keep_states``, ``keep_sequences``, ``variances``, ``max_seconds``, ``max_bytes``: a
    task past the limits of :func:`fisher_ref.exact` is refused before the walk
    allocates anything), then the self-checks. The arguments
    not listed below are those of :func:`causal_lm_task` and :func:`torch_exact`.

    Args:
        params: what ``theta`` is (``"all"``, ``"trainable"``, a list of names, a predicate
            ``(name, param) -> bool``; :func:`fisher_ref.torch.module.select_parameters`).
        strict: raise :class:`~fisher_ref.torch.precision.LowPrecisionError` when the
            module runs an op below ``dtype`` (default: the op runs in ``dtype``, listed in
            ``result["upcasts"]``); ``strict=True`` also makes a failed self-check raise,
            whatever ``self_check`` says.
        self_check: what a failed exact identity of the result does (a module whose
            output for a window depends on the rest of its batch, say):
            ``"raise"`` (default) raises
            :class:`~fisher_ref.torch.self_check.SelfCheckError` naming the module, the
            identity and what differed; ``"warn"`` returns the result with a
            :class:`~fisher_ref.torch.self_check.SelfCheckWarning`; ``"off"`` returns it
            silently. Every result carries its rows in ``result["checks"]``.
        n_embeddings: prompts may hold ids ``0..n_embeddings-1`` (default: the rows of the
            module's input embedding); ids ``vocab_size`` and up are input-only.

    Returns:
        :class:`~fisher_ref.torch.self_check.CausalLMResult`: the dict of
        :func:`torch_exact` plus ``layout`` (``(name, shape, offset)`` of every block of
        ``theta``) and ``params`` (their names); ``result.by_name(name)`` gives a block of
        any per-parameter array, shaped like the parameter.

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
        >>> out.by_name("table.weight").shape, [r["passed"] for r in out["checks"]]
        ((4, 3), [True, True, True])
    """
    if self_check not in SELF_CHECK_MODES:
        raise ValueError(f"self_check must be one of {', '.join(map(repr, SELF_CHECK_MODES))}, "
                         f"got {self_check!r}")
    task = causal_lm_task(module, prompts, max_len, reward, vocab_size=vocab_size, eos=eos,
                          bos=bos, prompt_weights=prompt_weights, baseline=baseline,
                          sampler=sampler, vectorize=vectorize, params=params, strict=strict,
                          n_embeddings=n_embeddings)
    out = CausalLMResult(torch_exact(task, device=device, dtype=dtype, **engine_kwargs))
    out["layout"] = list(task.model.layout())
    out["params"] = [name for name, _, _ in out["layout"]]
    failed = [r for r in out["checks"] if not r["passed"]]
    mode = "raise" if strict else self_check
    if failed and mode != "off":
        text = failed_check_text(type(module).__name__, failed, out)
        if mode == "raise":
            raise SelfCheckError(text)
        warnings.warn(text, SelfCheckWarning, stacklevel=2)
    return out
