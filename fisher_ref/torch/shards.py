"""Shards of the torch engine and their merge: ``torch_exact(task, shard=(i, n))`` and
:func:`merge_torch`, the same cut as the numpy engine's (``fisher_ref.parallel.shards``), so
that the shards of one task can run on several GPUs.

A shard walks the subtrees of its units and, silently, the states above them (their
arrays formed and their children carried, nothing summed); its result holds the raw
sums of every stream (:class:`fisher_ref.torch.moments.StreamSums`), the running maxima
and minima of the ranges, the autodiff gradient, the largest ``|j|`` seen and the kept
records, on the CPU (picklable). :func:`merge_torch` adds them (Chan's update for the
reward spread, maxima and minima for the ranges) and finishes once: the dict of
``torch_exact(task)``.
"""
from __future__ import annotations

import numpy as np
import torch

from fisher_ref.parallel.shards import ShardError, check_shard, first_reward, plan_shards

__all__ = ["ShardTree", "shard_result", "merge_torch", "merge_errors"]


class ShardTree:
    """Which rows of the torch walk shard ``i`` of ``n`` visits, and which it adds."""

    def __init__(self, run, shard):
        self.i, n = check_shard(shard)
        self.plan, self.run = plan_shards(run.task, n), run
        run.r0 = first_reward(run.task)  # every shard's R sums are of R - the same r0

    def _keys(self, block):
        """Each row's key (the plan's numbering: prompt, then open tokens) ``(B,)``."""
        p, d = self.plan, block.depth
        keys = block.prompt.to(torch.long)
        plen = self.run.prompt_len[block.prompt]
        for j in range(d):
            tok = block.tokens.gather(1, (plen + j)[:, None])[:, 0]
            keys = keys + (tok - p.low) * (p.n_prompts * p.beta ** j)
        return keys.cpu().numpy()

    def parts(self, block):
        """``[(rows, silent)]``: the block's rows this shard visits, those it adds and the
        silent ones above its units."""
        if block.depth >= self.plan.depth:
            return [(block, False)]
        keep, own = self.plan.select(self.i, block.depth, self._keys(block))
        out = []
        for mask, silent in ((own, False), (keep & ~own, True)):
            idx = torch.as_tensor(mask.nonzero()[0], device=block.prompt.device)
            if len(idx):
                out.append((block.rows(idx), silent))
        return out

    def children(self, child):
        """The rows of a child block this shard walks (``None``: none)."""
        if child.depth > self.plan.depth:
            return child
        keep, _ = self.plan.select(self.i, child.depth, self._keys(child))
        idx = torch.as_tensor(keep.nonzero()[0], device=child.prompt.device)
        return child.rows(idx) if len(idx) else None


def _cpu(x):
    return x.detach().cpu() if torch.is_tensor(x) else x


def shard_result(run, shard):
    """A finished shard's sums (on the CPU, picklable): a dict."""
    return {"shard": shard, "r0": run.r0, "jmax": run.jmax, "grad": _cpu(run.grad.grad),
            "sums": [{k: _cpu(v) for k, v in vars(s).items()} for s in run.sums],
            "ranges": None if run.ranges is None else
            {"hi": {k: _cpu(v) for k, v in run.ranges.hi.items()},
             "lo": {k: _cpu(v) for k, v in run.ranges.lo.items()}},
            "states": [{k: _cpu(v) for k, v in r.items()} for r in run.states],
            "seqs": [{k: _cpu(v) for k, v in r.items()} for r in run.seqs]}


def _add(s, d, dev):
    """Add a shard's StreamSums fields ``d`` to ``s`` (the first spread taken as it is)."""
    to = {k: v.to(dev) for k, v in d.items() if torch.is_tensor(v)}
    for k, v in to.items():
        if k not in ("mass", "mean", "M2", "unit"):
            setattr(s, k, getattr(s, k) + v)
    if float(to["mass"]) <= 0:
        return
    if float(s.mass) <= 0:
        s.mass, s.mean, s.M2, s.unit = to["mass"], to["mean"], to["M2"], to["unit"]
        return
    W = s.mass + to["mass"]
    delta = to["mean"] - s.mean
    u = torch.maximum(s.unit, to["unit"])  # both M2 in units of u^2 (see StreamSums)
    us = torch.where(u > 0, u, torch.ones_like(u))
    s.mean = s.mean + delta * (to["mass"] / W)
    s.M2 = (s.M2 * (s.unit / us).square() + to["M2"] * (to["unit"] / us).square()
            + (delta / us).square() * s.mass * (to["mass"] / W))
    s.mass, s.unit = W, u


def merge_torch(run, parts):
    """Fill the fresh :class:`fisher_ref.torch.exact._Run` ``run`` with the sums of every
    shard of one run (each once; :class:`fisher_ref.parallel.shards.ShardError` otherwise)."""
    n = parts[0]["shard"][1] if parts else 0
    ids = sorted(p["shard"][0] for p in parts)
    if not parts or ids != list(range(n)) or any(p["shard"][1] != n for p in parts):
        raise ShardError(f"merge_torch needs each of the {n} shards once, got {ids}")
    parts = sorted(parts, key=lambda p: p["shard"][0])
    dev = run.adapter.device
    run.r0 = parts[0]["r0"]
    for p in parts:
        for s, d in zip(run.sums, p["sums"]):
            _add(s, d, dev)
        run.grad.grad += p["grad"].to(dev)
        run.jmax = max(run.jmax, p["jmax"])
        if run.ranges is not None:
            for k in run.ranges.hi:
                run.ranges.hi[k] = torch.maximum(run.ranges.hi[k], p["ranges"]["hi"][k].to(dev))
                run.ranges.lo[k] = torch.minimum(run.ranges.lo[k], p["ranges"]["lo"][k].to(dev))
        run.states += p["states"]
        run.seqs += p["seqs"]
    return run


_SCALED = ("score_mean", "gradient", "covariance", "importance_gradient")
_MEAN_SQ = {"h": "sequence_fisher", "token_sum": "token_fisher_sum_paths", "Ah": "gradient",
            "cross": "cross_terms"}


def merge_errors(merged, one):
    """How far the result of merged shards is from one run of the same task: a dict
    {field: relative error}, every field of both results (dicts of :func:`torch_exact`).

    Each error is the largest absolute difference over the larger of the two fields'
    largest magnitudes, on a wider scale where a quantity is 0 in exact arithmetic or is
    formed by cancellation: ``score_mean``, ``gradient``, ``covariance`` and
    ``importance_gradient`` on the natural scale ``sqrt(max F) * (|E[R]| + sd(R) +
    |b|)``; the variances on the square of the mean they are formed from; the
    correlation only where its bound is above ``1e-6`` of its largest (elsewhere it is
    rounding over rounding). Integer and boolean arrays of the kept records must be
    equal.

    Raises:
        ShardError: one result kept per-state or per-response records and the other did
            not, or an integer or boolean record differs (naming it).
    """
    out = {}
    for name, b in one["streams"].items():
        a = merged["streams"][name]
        natural = np.sqrt(np.max(b["sequence_fisher"])) * max(
            1.0, abs(b["expected_reward"]) + b["reward_std"] + abs(b["baseline"]))
        for k, vb in b.items():
            if k == "variances":
                for kk, x in vb.items():
                    y = a[k][kk]
                    sq = np.max(np.abs(b[_MEAN_SQ[kk]])) ** 2 if kk in _MEAN_SQ else 0.0
                    if kk == "h2":
                        sq = np.max(b["sequence_fisher"]) ** 2
                    s = max(np.max(np.abs(x)), np.max(np.abs(y)), sq, 1e-300)
                    out[f"{name}.variances.{kk}"] = float(np.max(np.abs(np.asarray(x) - y)) / s)
                continue
            x, y = np.asarray(vb, dtype=float), np.asarray(a[k], dtype=float)
            if k == "correlation":  # judged where its bound is above rounding (a GPT-2's
                # key bias has scores 0 in exact arithmetic); both parts are judged above
                live = np.asarray(b["bound"]) > 1e-6 * np.max(b["bound"])
                x, y = x[live], y[live]
            s = max(np.max(np.abs(x)), np.max(np.abs(y)), natural if k in _SCALED else 0.0)
            out[f"{name}.{k}"] = float(np.max(np.abs(x - y)) / s) if s > 0 else 0.0
    g1, g2 = one["gradient_autodiff"], merged["gradient_autodiff"]
    out["gradient_autodiff"] = float(np.max(np.abs(g1 - g2)) / max(np.max(np.abs(g1)), 1e-300))
    for part in ("states", "sequences"):
        if (one[part] is None) != (merged[part] is None):
            raise ShardError(f"{part}: kept by one result and not by the other")
        for k, v in (one[part] or {}).items():
            if v.dtype.kind in "iub":
                if not np.array_equal(v, merged[part][k]):
                    raise ShardError(f"{part}.{k} differs between the two results")
            else:
                s = np.sqrt(np.max(one["streams"]["policy"]["sequence_fisher"])) \
                    if k == "score_mean" else max(np.max(np.abs(v)), 1e-300)
                out[f"{part}.{k}"] = float(np.max(np.abs(v - merged[part][k])) / s)
    return out
