r"""Streaming enumeration of every state and response of a task.

States are visited depth-first in blocks of at most ``chunk`` rows, so memory
stays bounded by the size of one block's children, not by ``V^T``. A state at
depth ``t`` (``t`` generated tokens) is expanded while ``t < max_len`` and its
last generated token is not EOS; its children are every token ``a`` of the
vocabulary, with reach probability :math:`\pi(s)\,p(a|s)`.

:func:`estimate_cost` counts states and responses in closed form and estimates
time and memory before anything runs; :func:`check_cost` refuses a task past
the limits with :class:`EnumerationTooLarge`. The counting, the :class:`Cost` record and the
refusal live in :mod:`fisher_ref.limits`, which the readable judge
(:mod:`fisher_ref.reference`) shares; this module holds the fast engine's estimate.

The walk itself is :mod:`fisher_ref.engine.tree`; this module plans it: counts, costs,
block sizes and what is kept.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from fisher_ref.limits import (DEFAULT_MAX_BYTES, DEFAULT_MAX_SECONDS, KEEP_BYTES, Cost,
                               EnumerationTooLarge, check_cost, count_states, resolve_keep)
from fisher_ref.rewards import Reward

__all__ = ["Cost", "EnumerationTooLarge", "estimate_cost", "check_cost", "count_states",
           "check_chunk", "resolve_keep", "KEEP_BYTES",
           "DEFAULT_MAX_SECONDS", "DEFAULT_MAX_BYTES", "Budgets", "DEFAULT_BUDGETS",
           "EngineOptions", "SUB_ELEMENTS", "KEPT_SUB_ELEMENTS", "WORK", "LAST_SHARE",
           "WHAT", "MOVED",
           "refuse_moved", "resolve_options"]

# Throughput assumed by the estimate (floating-point operations per second of
# vectorised numpy on one core, seconds of Python work per response: the reward,
# per block of responses for the built-in rewards and one call each for any other,
# and a fixed start-up). Calibrated on the 2-core x86_64 development machine against
# measured exact() CPU times (medium: 0.20 s; V=16, T=4, P=4,376: 1.6 s, under load);
# the estimate errs high.
_FLOPS = 5.0e8
_SECONDS_PER_RESPONSE = 1.0e-6
_SECONDS_PER_CALLED_REWARD = 1.0e-5
_SECONDS_FIXED = 0.01
# Starting one worker process of exact(workers=N) (spawn, then importing numpy and the
# package), and sending its task and sums.
_SECONDS_PER_WORKER = 0.5


@dataclass(frozen=True)
class Budgets:
    """The fast engine's memory and batching knobs. They set speed and memory only, never
    the numbers: every result agrees with the plain engine at 1e-10 whatever they are
    (``tests/engine/test_fast.py`` runs them at 1).

    Attributes:
        window_cache_bytes: per-window arrays kept between blocks.
        defer_bytes: parents' score sums held for the per-window products (at most what
            one block's children would hold, so that memory stays set by the block size).
        sub_elements: elements of a ``(parents, P)`` array in one sub-block of
            complete-response sums (:meth:`sub_block_elements`; a block's sub-blocks are
            even, so one holds at most half as many again); ``None`` (the default):
            :data:`SUB_ELEMENTS` (8 MiB bounds the temporaries), and for the MLP's last
            level, summed from factors, :data:`KEPT_SUB_ELEMENTS` where the process keeps
            the memory it frees (:func:`fisher_ref.engine.keep_memory.memory_kept`).
        autodiff_rows: response-state rows gathered before one autodiff call.
        dense_keys: window keys looked up in a table indexed by key when there are at
            most this many possible keys (else a dict).
        memory_kept: whether the process that runs the engine keeps the memory it frees
            (what ``sub_elements=None`` is resolved by); ``None`` (the default): the engine
            asks the process (:func:`fisher_ref.engine.keep_memory.memory_kept`).
    """

    window_cache_bytes: int = 256 * 2 ** 20
    defer_bytes: int = 64 * 2 ** 20
    sub_elements: int | None = None
    autodiff_rows: int = 2 ** 16
    dense_keys: int = 2 ** 20
    memory_kept: bool | None = None

    def __post_init__(self):
        for name in ("window_cache_bytes", "defer_bytes", "sub_elements", "autodiff_rows"):
            v = getattr(self, name)
            if name == "sub_elements" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"Budgets.{name} must be a positive integer"
                                 + (" or None" if name == "sub_elements" else "")
                                 + f", got {v!r}")
        v = self.dense_keys
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"Budgets.dense_keys must be a non-negative integer, got {v!r}")
        if self.memory_kept not in (None, True, False):
            raise ValueError(f"Budgets.memory_kept must be True, False or None, got "
                             f"{self.memory_kept!r}")

    def sub_block_elements(self, factored=False, kept=None):
        """The element budget of one sub-block: ``sub_elements``, or where it is ``None``,
        :data:`KEPT_SUB_ELEMENTS` for the factored last level (``factored``) in a process
        that keeps the memory it frees (``kept``; ``None``: :attr:`memory_kept`), else
        :data:`SUB_ELEMENTS`."""
        if self.sub_elements is not None:
            return int(self.sub_elements)
        kept = self.memory_kept if kept is None else kept
        return KEPT_SUB_ELEMENTS if factored and kept else SUB_ELEMENTS


#: The sub-block budget of :class:`Budgets` by default.
SUB_ELEMENTS = 2 ** 20
#: The sub-block budget of the MLP's factored last level where freed memory is kept: a
#: whole block of the shipped medium and V=16 tasks in one sub-block (a tenth to a sixth
#: fewer instructions a run there, ``docs/performance/speed.md``). In glibc's default memory its
#: larger temporaries are handed back and faulted in again on every run, so there it is not
#: the default.
KEPT_SUB_ELEMENTS = 2 ** 22

DEFAULT_BUDGETS = Budgets()


#: The work a parameter shard adds per parameter of ``E``, of ``W1``'s family (``W1`` and
#: ``b1``, read from :math:`\hat g`: a hidden unit weighs ``k d + 1`` of them) and of
#: ``W2``'s family, relative to ``W1``'s, by which
#: :func:`fisher_ref.engine.mlp_columns.mlp_param_shards` cuts the MLP's parameter shards.
#: A linear model, set by hand from the times of shards of one family and of two shards
#: cut at several hidden units, each run as a shard before the last, which in glibc's
#: default memory move by a tenth or more from run to run. A shard's fixed work (its
#: families' factors, its share of the walk) is spread over the parameters.
#:
#: Fitted with: ``python benchmarks/scaling/shard_balance.py --config v16 --units 98 105 108 111 114
#: 117 120`` (the "alone" columns of the record docs/bench/shards/balance_v16.txt, and of
#: balance_medium.txt with ``--config medium --units 19 21 23 25 27 29 31``).
WORK = {"E": 0.66, "G": 1.0, "D": 0.60}

#: The share of the work :func:`fisher_ref.engine.mlp_columns.mlp_param_shards` gives the
#: last shard, against the others' 1: the shard that forms the records (the per-state and
#: per-response rows and the autodiff gradient) and that ``exact(task, workers=N)`` runs in
#: the calling process, which, unlike its workers, hands the memory it frees back to the
#: system (:func:`fisher_ref.engine.keep_memory.keep_freed_memory`) and so sums in smaller
#: sub-blocks. With :data:`WORK` it cuts two shards of ``scale/v16`` after unit 111 of 128.
#: Timed alone as ``workers=2`` runs them, the worker's shard and the caller's cross a few
#: units above; inside a run the worker also writes its tables to shared memory and sends
#: its sums, so the cut sits a little below, where neither process waits for the other
#: long (the "inside" line of ``python benchmarks/scaling/shard_speedup.py``, docs/bench/shards/
#: v16_run*.txt). The caller's extra work is more nearly a fixed time than a share: on
#: ``medium`` the two cross several units above the cut this share makes.
#:
#: Fitted with: ``python benchmarks/scaling/shard_balance.py --config v16 --units 98 105 108 111 114
#: 117 120`` (the "shard 0 worker" and "shard 1 caller" columns of the record
#: docs/bench/shards/balance_v16.txt; medium's in balance_medium.txt).
LAST_SHARE = 0.78


@dataclass(frozen=True)
class EngineOptions:
    """What one numpy exact run computes, keeps and may cost, in one value that the engines,
    the plan, the local workers and the Ray driver pass on. A user gives the knobs that
    never change a number (``options=EngineOptions(chunk=..., keep_states=...)`` of
    :func:`fisher_ref.exact`); ``topk``, ``quantities`` and ``progress``, which say what is
    computed and shown, are :func:`fisher_ref.exact`'s own keywords, written in here
    (:func:`resolve_options`). They are checked where the run is planned
    (:func:`fisher_ref.engine.run.plan`).

    Attributes:
        chunk: states per block (``None``: sized to about 256 MiB of work arrays).
        keep_states, keep_sequences: keep the per-state / per-response arrays (``"auto"``:
            when they fit in about 1 GiB).
        max_seconds, max_bytes: refuse (:class:`EnumerationTooLarge`) past these.
        budgets: the fast engine's memory and batching knobs (:class:`Budgets`; ``None``:
            the defaults).
        topk, progress, quantities: as for :func:`fisher_ref.exact`.

    Example:
        >>> from fisher_ref import load_config, exact
        >>> r = exact(load_config("default"), options=EngineOptions(keep_sequences=False))
        >>> r.sequences is None
        True
    """

    topk: tuple = ()
    chunk: object = None
    keep_states: object = "auto"
    keep_sequences: object = "auto"
    max_seconds: float = DEFAULT_MAX_SECONDS
    max_bytes: float = DEFAULT_MAX_BYTES
    progress: bool = True
    quantities: str = "all"
    budgets: Budgets = DEFAULT_BUDGETS

    def with_(self, **changes):
        """A copy with ``changes``."""
        return replace(self, **changes)

    def unlimited(self):
        """A copy without the time and memory limits (for a run that checked them for a
        whole set of shards or workers already)."""
        return replace(self, max_seconds=float("inf"), max_bytes=float("inf"))

    def as_kwargs(self):
        """The options as keyword arguments of the plain judge
        (:func:`fisher_ref.reference.exact_reference`): all but the fast engine's
        ``budgets``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "budgets"}


#: What :func:`fisher_ref.exact` computes, set by its own keywords, not by its options.
WHAT = ("topk", "quantities", "progress")
#: Keywords that :func:`fisher_ref.exact` no longer takes, and where each went.
MOVED = {"shard": "fisher_ref.parallel.exact_shard(task, (i, n))",
         "param_shard": "fisher_ref.parallel.exact_param_shard(task, (i, n))",
         **{k: f"options=EngineOptions({k}=...)" for k in
            ("chunk", "keep_states", "keep_sequences", "max_seconds", "max_bytes", "budgets")}}


def refuse_moved(who, kwargs):
    """Raise a :class:`TypeError` for keywords ``kwargs`` that ``who`` does not take, naming
    where a moved one went (:data:`MOVED`): a shard has functions of its own that return it,
    and the knobs that never change a number are in :class:`EngineOptions`."""
    for k in kwargs:
        if k in MOVED:
            raise TypeError(f"{who}() takes no {k}=: use {MOVED[k]}"
                            + (" (it returns a ShardResult)" if "shard" in k else ""))
        raise TypeError(f"{who}() got an unexpected keyword argument {k!r}")


def resolve_options(options, **what):
    """``options`` (an :class:`EngineOptions`, ``None``: the defaults) with what is computed
    written in (``what``: :data:`WHAT`'s keywords). An option that the call sets both here
    and in ``options``, differently, is refused: one value, said once."""
    if options is None:
        options = EngineOptions()
    if not isinstance(options, EngineOptions):
        raise TypeError(f"options must be a fisher_ref.engine.plan.EngineOptions, got "
                        f"{options!r:.80}")
    default = EngineOptions()
    for k, v in what.items():
        mine = getattr(options, k)
        if mine != getattr(default, k) and v != getattr(default, k) and mine != v:
            raise ValueError(f"{k} is given twice, as {k}={v!r} and in options ({mine!r}): "
                             f"give it once, as {k}=")
        if v != getattr(default, k):
            options = replace(options, **{k: v})
    if options.budgets is None:
        options = replace(options, budgets=DEFAULT_BUDGETS)
    if not isinstance(options.budgets, Budgets):
        raise TypeError(f"budgets must be a fisher_ref.engine.plan.Budgets, got "
                        f"{options.budgets!r:.80}")
    return options


def default_chunk(num_params, vocab_size, max_len, n_streams, budget_bytes=256 * 2 ** 20,
                  siblings=None):
    """Rows per block so that one block's children fit in ``budget_bytes``.

    With ``siblings`` (the open children of a state, ``beta``), rounded down to a
    multiple of the largest power of ``beta`` it holds: a level's states come in runs
    of ``beta^j`` that share their first tokens, and blocks then cut no run short.

    Example:
        >>> default_chunk(1044, 12, 4, 1), default_chunk(1044, 12, 4, 1, siblings=11)
        (267, 242)
    """
    per_row = 8 * vocab_size * num_params * (n_streams * (max_len + 2) + 4)
    chunk = int(max(1, min(4096, budget_bytes // max(per_row, 1))))
    if siblings and siblings > 1:
        run = 1
        while run * siblings <= chunk:
            run *= siblings
        chunk -= chunk % run
    return chunk



def check_chunk(chunk):
    """``chunk`` (states per block) checked: a positive integer, or ``None`` (sized)."""
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer))
                              or chunk < 1):
        raise ValueError(f"chunk must be a positive integer (states per block) or None, "
                         f"got {chunk!r}")
    return None if chunk is None else int(chunk)


def estimate_cost(task, n_streams=None, chunk=None, keep_states=False, keep_sequences=False,
                  quantities="all", workers=1):
    """Estimate the size, time and peak memory of :func:`fisher_ref.exact` on ``task``."""
    # quantities="fisher": two moments per window, a few passes per state, no rewards, only
    # H carried. workers (parameter shards): the time of the slowest (a share of the work
    # per state each; the per-window work counted whole, as it is for models whose
    # sensitivities are formed for every parameter; and their start) and the memory of all
    # of them counted as whole runs (an upper bound: each holds its slice of the arrays
    # that grow with P; kept arrays once in the workers, once merged).
    m, fisher = task.model, quantities == "fisher"
    V, P, T = m.vocab_size, m.num_params, task.max_len
    S = n_streams if n_streams is not None else (1 if task.sampler is None else 3)
    chunk = chunk or default_chunk(P, V, T, S, siblings=V - bool(m.eos))
    N, M = count_states(V, T, m.eos, len(task.prompts))
    windows = min(N, (V + 1) ** m.context)
    # per distinct window: sensitivities, centers, the sums y_1..y_4 of each stream;
    # per state: about 40 passes over P (the regrouped sums of its complete responses,
    # its cross terms, what its children carry); per response: its reward
    per_window, per_state = ((6 + 4 * S), 8) if fisher else ((10 + 8 * S), 40)
    called = type(task.reward).batch is Reward.batch  # no vectorised form: one call each
    per_response = 0.0 if fisher else \
        _SECONDS_PER_CALLED_REWARD if called else _SECONDS_PER_RESPONSE
    seconds = _SECONDS_FIXED + windows * P * V * per_window / _FLOPS
    seconds += (N * P * S * per_state / _FLOPS + M * per_response) / workers
    seconds += _SECONDS_PER_WORKER if workers > 1 else 0.0  # started side by side
    cache = min(DEFAULT_BUDGETS.window_cache_bytes, 8 * windows * P * V * S * 2)
    cache += min(DEFAULT_BUDGETS.defer_bytes, 8 * N * P * S)
    # one block's work arrays, plus the children (score histories) of up to T - 1
    # partly expanded blocks waiting on the depth-first stack
    rows = min(chunk, N)  # a block never holds more states than the tree has
    carried = 2 if fisher else T + 2  # per stream and child: H (and G, the last score)
    # every state's tokens (prompt, then generated): L = longest prompt + T, int64, in the
    # block, in its children and in each waiting block
    L = max(len(p) for p in task.prompts) + T
    block = 8 * rows * V * P * (S * carried + 4) + cache + 8 * rows * (V + 1) * (L + 1) * 2
    block += max(T - 1, 0) * 8 * rows * V * (P * S * carried + L + 1)
    kept = (8 * N * (3 * P + 2 * V + 8 + L) if keep_states else 0) + \
        (8 * M * (T + 6 + L) if keep_sequences else 0)
    per_worker = block + 8 * S * T * T * P * 2
    total = per_worker + kept if workers == 1 else workers * per_worker + 2 * kept
    return Cost(N, M, P, V, T, S, chunk, float(seconds), int(total), workers)
