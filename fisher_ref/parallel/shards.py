r"""Shards of one exact enumeration, and their exact merge.

The prefix tree of a task splits into independent subtrees, one per prompt and
first generated tokens. Every sum the engines form is a sum over states or over
complete responses, so it is the sum of its subtrees' sums; the few quantities that
are not sums merge otherwise (the reward spread by Chan's update, the largest
conditional score mean by a maximum), and everything derived from the sums (the
baseline, the gradient, the variances) is formed once, after the merge.

- :func:`plan_shards` cuts the tree at a depth ``c`` (0: whole prompts) into *units*,
  the subtrees under the open states of depth ``c``; every unit has the same
  closed-form state count (:func:`fisher_ref.engine.plan.count_states` of the
  ``T - c`` levels under it), so shard ``i`` of ``n`` takes the units numbered
  ``bounds[i]..bounds[i + 1]``: at most one unit more than any other shard. The cut is
  the shallowest with at least :data:`UNITS_PER_SHARD` units per shard (or
  ``c = T - 1``). Units are numbered last token first (:meth:`ShardPlan.child_keys`): a
  shard holds units that share their last cut tokens, so the windows its deeper states
  read (a model's last ``k`` tokens) are mostly its own, and the per-window work each
  shard repeats stays small.
- The states above the cut (depth ``< c``) belong to the shard of one unit under them
  (:meth:`ShardPlan.select`). A shard walks the others above its own units without
  adding them (*silent* blocks: their arrays are formed, their children carried,
  nothing summed).
- ``exact_shard(task, (i, n))`` (:mod:`fisher_ref.parallel.run`) returns a
  :class:`ShardResult`: the raw sums of each stream
  (:class:`fisher_ref.engine.moments.Moments`), the autodiff gradient, and, when kept,
  the shard's per-state and per-response rows with their places in the sorted arrays.
- :func:`merge` adds the shards of one task and finishes once: the same
  :class:`fisher_ref.results.ExactResult` as a single run, to rounding.

Every shard takes the reward of the first response (prompt 0, then token 0 at every
step) as its reference reward ``r0``, so that the shards' sums of ``R - r0`` add.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fisher_ref.engine.moments import Moments, finish_fisher, finish_stream
from fisher_ref.engine.columns import param_columns
from fisher_ref.parallel.param_shards import merge_params, param_shard_result
from fisher_ref.engine.plan import count_states
from fisher_ref.parallel.shard_result import (ShardError, ShardResult, check_arrays,
                                              check_payload, check_shard, task_key)
from fisher_ref.engine.tree import take_rows
from fisher_ref.results import ExactResult, GatheredStates

__all__ = ["UNITS_PER_SHARD", "ShardPlan", "ShardResult", "ShardWalk", "ShardError",
           "check_shard", "plan_shards", "first_reward", "merge", "param_columns",
           "param_shard_result", "task_key"]

#: The cut goes deep enough for this many units per shard (or to the last level): the
#: shards' state counts then differ by at most one unit in this many.
UNITS_PER_SHARD = 32


def _ceil_div(a, b):
    return -(-a // b)


@dataclass(frozen=True)
class ShardPlan:
    """How a task's tree is cut into ``n`` shards (module docstring).

    Attributes:
        n: shards; depth: the cut ``c``; beta: open children of an open state
            (``V - 1`` with EOS, whose open states never hold token 0; ``V`` without);
        low: the smallest open token (1 with EOS, else 0); n_prompts: prompts;
        bounds: ``n + 1`` boundaries: shard ``i`` holds the units numbered
            ``bounds[i]..bounds[i+1]`` (:meth:`child_keys`);
        unit_states, unit_responses: states and responses of one unit;
        eos: whether the model has EOS (a state above the cut then ends one response).
    """

    n: int
    depth: int
    beta: int
    low: int
    n_prompts: int
    bounds: tuple
    unit_states: int
    unit_responses: int
    eos: bool

    def _owned_above(self, i):
        """States above the cut that shard ``i`` owns: at depth ``d``, those whose key
        (below ``n_prompts * beta ** d``) is one of its units' numbers."""
        lo, hi = self.bounds[i], self.bounds[i + 1]
        return sum(max(0, min(hi, M) - min(lo, M))
                   for M in (self.n_prompts * self.beta ** d for d in range(self.depth)))

    def n_states(self, i):
        """States shard ``i`` adds (closed form)."""
        return (self.bounds[i + 1] - self.bounds[i]) * self.unit_states + self._owned_above(i)

    def n_responses(self, i):
        """Complete responses shard ``i`` adds: its units' and the EOS child of each state
        above the cut it owns."""
        return ((self.bounds[i + 1] - self.bounds[i]) * self.unit_responses
                + (self._owned_above(i) if self.eos else 0))

    def select(self, i, depth, keys):
        """Which states of ``depth <= c`` with keys ``keys (C,)`` (:meth:`child_keys`)
        shard ``i`` walks, and which of those it adds: ``(keep, own)``, boolean ``(C,)``.

        The units under a state of key ``k`` at depth ``d`` are the numbers
        ``k + j * M`` (``M = n_prompts * beta ** d``): the state is walked when one of
        them is the shard's, and added by the shard of ``k`` itself (the unit under it
        whose later tokens are all the lowest)."""
        lo, hi = self.bounds[i], self.bounds[i + 1]
        M = self.n_prompts * self.beta ** depth
        keep = lo + (keys - lo) % M < hi  # the shard's first number k + j M
        return keep, keep & (keys >= lo) & (keys < hi)

    def child_keys(self, keys, depth, tokens):
        """Keys of the children (tokens ``tokens (C,)``) of states of ``depth`` with keys
        ``keys (C,)``. A state's key is its prompt and open tokens as a number whose lowest
        digit is the prompt (base ``n_prompts``), then the first token, the second ... (base
        ``beta``): units whose *last* tokens differ are far apart, so consecutive units share
        their last tokens, and a shard's states deeper down read windows (the last tokens)
        that the other shards' mostly do not."""
        return keys + (tokens - self.low) * (self.n_prompts * self.beta ** depth)


def plan_shards(task, n):
    """The :class:`ShardPlan` of ``task`` in ``n`` shards.

    Raises:
        ValueError: ``n`` is not a positive integer (a bool is not one)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"plan_shards: n (the number of shards) must be a positive integer, "
                         f"got {n!r}")
    n = int(n)
    m = task.model
    V, T, eos, n_p = m.vocab_size, task.max_len, bool(m.eos), len(task.prompts)
    beta = V - 1 if eos else V
    depth = 0
    while depth < T - 1 and beta > 1 and n_p * beta ** depth < UNITS_PER_SHARD * n:
        depth += 1
    units = n_p * beta ** depth
    unit_states, unit_responses = count_states(V, T - depth, eos)
    return ShardPlan(n=n, depth=depth, beta=beta, low=int(eos), n_prompts=n_p,
                     bounds=tuple(i * units // n for i in range(n + 1)),
                     unit_states=unit_states, unit_responses=unit_responses, eos=eos)


def first_reward(task):
    """The reward of the first response in sorted order (prompt 0, token 0 at every step:
    EOS at once with EOS): every shard's reference reward ``r0``."""
    n = 1 if task.model.eos else task.max_len
    resp = np.full((1, task.max_len), -1, dtype=np.int64)
    resp[0, :n] = 0
    return float(task.reward.batch(resp, np.array([n]), task.prompts, np.array([0]))[0])


def _merge_rows(parts, attr, total, what):
    """Kept rows of every shard written into their places: ``{name: (total, ...)}``; every
    place must be written exactly once."""
    first = next(getattr(p, attr) for p in parts if getattr(p, attr) is not None)
    out = {k: np.empty((total,) + v.shape[1:], dtype=v.dtype)
           for k, v in first.items() if k != "place"}
    seen, count, offset = np.zeros(total, dtype=bool), 0, 0
    for p in parts:
        rows, shift = getattr(p, attr), offset
        if attr == "states" and p.window_tables:  # window ids: rows of the merged tables
            offset += len(next(iter(p.window_tables.values())))
        if rows is None:
            continue
        at = rows["place"]
        for k in out:
            out[k][at] = rows[k] + shift if k == "window" else rows[k]
        seen[at], count = True, count + len(at)
    if count != total or not seen.all():
        raise ShardError(f"the shards hold {count} {what} rows for {int(seen.sum())} of "
                         f"{total} places")
    return out


def _add_moments(m, d):
    """Add a shard's :class:`Moments` fields ``d`` to ``m``: the sums add, the reward
    spreads merge by Chan's update (:meth:`Moments.merge_spread`; the first is taken as it
    is, so that equal rewards keep a spread of exactly 0), the largest conditional score
    means by a maximum. Every shard takes the same ``r0``."""
    if d["r0"] is not None:
        if m.r0 is not None and m.r0 != d["r0"]:
            raise ShardError(f"shards with different reference rewards r0 ({m.r0} and "
                             f"{d['r0']}) do not add")
        m.r0 = d["r0"]
    for name, value in d.items():
        if not name.startswith("spread_") and name not in ("r0", "cond_mean_max"):
            setattr(m, name, getattr(m, name) + value)
    m.cond_mean_max = np.maximum(m.cond_mean_max, d["cond_mean_max"])
    if d["spread_mass"] <= 0:
        return
    if m.spread_mass <= 0:
        for name in d:
            if name.startswith("spread_"):
                setattr(m, name, d[name])
    else:
        m.merge_spread(d["spread_mass"], d["spread_mean"], d["spread_m2"], d["spread_unit"])


def merge(task, parts):
    """The :class:`fisher_ref.results.ExactResult` of the whole run from its shards.

    Args:
        task: the task every shard ran.
        parts: every :class:`ShardResult` ``(0, n) .. (n - 1, n)`` of one run, in any order.

    Raises:
        ShardError: a shard missing or repeated, shards of different runs, or of another
            task, a shard changed since it was made (its checksum,
            :meth:`ShardResult.digest`) or whose arrays have the wrong shapes (the message
            names them). A partial set of shards is never summed.
    """
    parts = list(parts)
    if not parts or not all(isinstance(p, ShardResult) for p in parts):
        raise ShardError("merge needs the ShardResult of every shard, from "
                         "exact_shard(task, (i, n)) or exact_param_shard(task, (i, n))")
    n = parts[0].shard[1]
    ids = sorted(p.shard[0] for p in parts)
    if any(p.shard[1] != n for p in parts) or ids != list(range(n)):
        missing = sorted(set(range(n)) - set(ids))
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        raise ShardError(f"merge needs each of the {n} shards once: got shards {ids} of "
                         f"{sorted({p.shard[1] for p in parts})}; missing {missing}, "
                         f"repeated {repeated}")
    parts.sort(key=lambda p: p.shard[0])
    for p in parts:  # as it was made: no sum scaled, no array cut short
        check_payload(p)
    want = task_key(task)
    foreign = [p.label for p in parts if p.key[0] is not None and p.key[0] != want]
    if foreign:
        raise ShardError(f"{', '.join(foreign)} of the {n} were computed for another task")
    if len({p.key for p in parts}) != 1:
        odd = [p.label for p in parts if p.key != parts[0].key]
        raise ShardError(f"the shards come from different runs (task or options differ): "
                         f"{', '.join(odd)} differ from {parts[0].label}")
    if parts[0].columns is not None:
        return merge_params(task, parts)
    head = parts[0]
    P, T = task.model.num_params, task.max_len
    for p in parts:
        check_arrays(p, P, T, P)
    results = {}
    for stream in head.streams:
        name = stream.name
        m = Moments(P, T)
        for p in parts:
            _add_moments(m, p.moments[name])
        results[name] = finish_fisher(m) if head.quantities == "fisher" else \
            finish_stream(m, task.baseline)
    grad = np.sum([p.grad_ad for p in parts], axis=0)
    kept = [p for p in parts if p.states is not None]
    states = _merge_rows(parts, "states", head.cost.n_states, "state") if kept else None
    seqs = [p for p in parts if p.sequences is not None]
    seqs = _merge_rows(parts, "sequences", head.cost.n_responses, "response") if seqs else None
    out = ExactResult.build(task, head.cost, results, grad, None, seqs, head.quantities)
    if states is not None:
        held = [p.window_tables for p in parts if p.window_tables]  # as _merge_rows counts
        tables = {k: np.concatenate([t[k] for t in held]) for k in held[0]} if held else {}
        window = states.pop("window", None)
        out.states = GatheredStates(states, tables, window) if window is not None else states
    return out


class ShardWalk:
    """What :class:`fisher_ref.engine.run.Run` needs to walk shard ``i`` of ``n`` of
    ``task``: the blocks it walks (:meth:`roots`, :meth:`children`), the rows it keeps
    with their places (:meth:`keep`) and its :class:`ShardResult` (:meth:`result`)."""

    def __init__(self, task, shard):
        self.i, n = check_shard(shard)
        self.task, self.plan = task, plan_shards(task, n)
        self.n_states, self.n_responses = self.plan.n_states(self.i), self.plan.n_responses(self.i)
        self.rows, self.filled = {}, {}

    def start(self, run):
        """Set up ``run`` (a :class:`fisher_ref.engine.run.Run` of this shard): every shard
        takes the same ``r0`` (one more call of the reward per shard)."""
        if run.quantities == "all":
            for m in run.moments.values():
                m.r0 = first_reward(self.task)

    def roots(self, root):
        """The prompts' states this shard walks, as blocks: those it adds and the silent
        ones above its units (``block.silent``), each with its ``shard_key``."""
        out = []
        for rows, extra in self._split(root.prompt, 0):
            block = take_rows(root, rows)
            block.update(extra)
            out.append(block)
        return out

    def children(self, block, idx):
        """``[(idx, extra)]``: the open children ``idx`` (rows ``b*V + a``) of a block this
        shard walks, in blocks of silent or added states, and what each block carries."""
        d, V = block.depth, self.task.model.vocab_size
        if d >= self.plan.depth:  # inside this shard's units
            return [(idx, {})]
        keys = self.plan.child_keys(block.shard_key[idx // V], d, idx % V)
        return [(idx[rows], extra) for rows, extra in self._split(keys, d + 1)]

    def _split(self, keys, depth):
        keep, own = self.plan.select(self.i, depth, keys)
        out = []
        for mask, silent in ((keep & ~own, True), (own, False)):
            rows = np.flatnonzero(mask)
            if len(rows):
                out.append((rows, {"shard_key": keys[rows], "silent": silent}))
        return out

    def keep(self, part, rec, at):
        """Keep rows ``rec`` (``{name: (B, ...)}``) of ``part`` (``"states"`` or
        ``"sequences"``) whose places in the sorted arrays are ``at (B,)``."""
        total = self.n_states if part == "states" else self.n_responses
        store = self.rows.get(part)
        if store is None:
            store = self.rows[part] = {k: np.empty((total,) + v.shape[1:], dtype=v.dtype)
                                       for k, v in rec.items()}
            store["place"], self.filled[part] = np.empty(total, dtype=np.int64), 0
        lo = self.filled[part]
        hi = lo + len(at)
        if hi > total:
            raise RuntimeError(f"shard {self.i} wrote more than its {total} {part} rows "
                               "(a bug in the walk)")
        for k, v in rec.items():
            store[k][lo:hi] = v
        store["place"][lo:hi] = at
        self.filled[part] = hi

    def result(self, run):
        """The :class:`ShardResult` of ``run`` (a finished
        :class:`fisher_ref.engine.run.Run` of this shard)."""
        for part, total in (("states", self.n_states), ("sequences", self.n_responses)):
            if part in self.rows and self.filled[part] != total:
                raise RuntimeError(f"shard {self.i} wrote {self.filled[part]} of its {total} "
                                   f"{part} rows (a bug in the walk)")
        key = (task_key(self.task), repr(run.streams), run.quantities, bool(run.keep_states),
               bool(run.keep_sequences), self.plan.depth)
        return ShardResult(shard=(self.i, self.plan.n), key=key, quantities=run.quantities,
                           streams=list(run.streams), cost=run.cost,
                           moments={k: dict(vars(m)) for k, m in run.moments.items()},
                           grad_ad=run.grad_ad, states=self.rows.get("states"),
                           sequences=self.rows.get("sequences"), n_states=self.n_states)
