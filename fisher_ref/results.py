r"""The exact results: the streams a run computes (:class:`Stream`, :func:`stream_specs`),
one stream's quantities (:class:`StreamResult`, and
:class:`FisherStreamResult` for ``exact(..., quantities="fisher")``), the whole run's
:class:`ExactResult`, its per-state arrays gathered on demand (:class:`GatheredStates`),
and the top-k overlap of two parameter rankings.

The engines accumulate each stream's sums in a :class:`fisher_ref.engine.moments.Moments`
and finish them into a :class:`StreamResult` there.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

__all__ = ["StreamResult", "FisherStreamResult", "ExactResult", "GatheredStates",
           "topk_overlap", "QUANTITIES", "check_quantities", "require_all_quantities",
           "sorted_by_tokens", "Stream", "stream_specs", "check_topk"]

#: What ``exact(..., quantities=...)`` computes: ``"all"`` (the default) every quantity;
#: ``"fisher"`` only the Fisher ones of each stream (:class:`FisherStreamResult`), with
#: the per-state arrays when they are kept.
QUANTITIES = ("all", "fisher")


def check_quantities(quantities):
    """``quantities`` checked against :data:`QUANTITIES`."""
    if not isinstance(quantities, str) or quantities not in QUANTITIES:
        raise ValueError(f"quantities must be one of {QUANTITIES}, got {quantities!r}")
    return quantities


def require_all_quantities(result, who):
    """Raise ``ValueError`` naming ``who`` unless ``result`` holds every quantity (it was not
    computed with ``exact(..., quantities="fisher")``)."""
    quantities = getattr(result, "quantities", "all")
    if quantities != "all":
        raise ValueError(f"{who} needs every exact quantity, but this result comes from "
                         f"exact(..., quantities={quantities!r}); run exact(...) with "
                         "quantities='all' (the default)")


def _not_computed(obj, name, fields):
    """The error for reading a quantity that ``exact(..., quantities="fisher")`` skipped."""
    if name in fields:
        return AttributeError(
            f"{name} was not computed: this result comes from exact(..., quantities='fisher'), "
            f"which computes only {', '.join(obj.computed)}; run exact(..., quantities='all') "
            "for every quantity")
    return AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}")


def check_topk(topk):
    """``topk`` as a tuple of positive integers (``k >= V`` means full centering)."""
    try:
        ks = tuple(topk)
    except TypeError:
        raise ValueError(f"topk must be a sequence of positive integers, got {topk!r}") from None
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"topk entries must be positive integers, got {k!r} in {topk!r}")
    return tuple(int(k) for k in ks)


class Stream(NamedTuple):
    """One expectation the engines compute: its ``name``, the distribution its responses are
    ``drawn_from`` (``"p"`` the policy, ``"q"`` the sampler) and where its scores are
    ``center``-ed (``"p"``, ``"q"`` or ``k``: the renormalised top-``k`` of the sampler)."""

    name: str
    drawn_from: str
    center: object


def stream_specs(task, topk):
    """The :class:`Stream` of every stream of ``task``: ``policy``; with a sampler also
    ``raw``, ``centered`` and ``top{k}`` for each ``k`` in ``topk``."""
    if task.sampler is None:
        return [Stream("policy", "p", "p")]
    out = [Stream("policy", "p", "p"), Stream("raw", "q", "p"), Stream("centered", "q", "q")]
    out += [Stream(f"top{k}", "q", k) for k in topk]
    return out


@dataclass
class StreamResult:
    r"""Exact quantities of one stream (all ``(P,)`` unless noted).

    Attributes:
        score_mean: :math:`E[h]`.
        sequence_fisher: :math:`E[h^2]` (the sequence Fisher when centered on the
            drawing distribution).
        token_fisher_sum: :math:`\sum_s \pi(s) m(s)` (by states).
        token_fisher_sum_paths: :math:`E[\sum_t m(s_t)]` (by responses).
        cross_terms: ``(T, T, P)`` :math:`E[\xi_u\xi_t]`; the diagonal holds
            :math:`E[\xi_t^2]`.
        cond_score_max: :math:`\max_s |E[\xi|s]|` over reachable states.
        expected_reward, reward_std: scalars; ``reward_std`` is ``std(A)``.
        baseline: the constant ``b`` in ``A = R - b``.
        gradient: :math:`E[A h]`; covariance: :math:`E[Ah] - E[A]E[h]`.
        gradient_shift: :math:`dE[(A+c)h]/dc = E[h]`.
        bound: :math:`std(A)\sqrt{E[h^2]}`; correlation: ``|covariance| / bound``.
        importance_gradient: :math:`E[\rho A h]` with :math:`\rho = P(y)/w(y)`.
        variances: exact variances of the per-response estimands, for z-tests.
    """

    score_mean: np.ndarray
    sequence_fisher: np.ndarray
    token_fisher_sum: np.ndarray
    token_fisher_sum_paths: np.ndarray
    token_fisher_by_depth: np.ndarray
    cross_terms: np.ndarray
    cond_score_max: np.ndarray
    mass: float
    expected_reward: float
    reward_std: float
    baseline: float
    gradient: np.ndarray
    covariance: np.ndarray
    gradient_shift: np.ndarray
    bound: np.ndarray
    correlation: np.ndarray
    importance_gradient: np.ndarray
    variances: dict = field(repr=False)

    def gradient_with_constant(self, c):
        r""":math:`E[(A + c) h]`: the gradient after adding ``c`` to every advantage."""
        return self.gradient + c * self.gradient_shift


@dataclass
class FisherStreamResult:
    r"""The Fisher quantities of one stream, all that ``exact(..., quantities="fisher")``
    computes (fields as in :class:`StreamResult`); reading any other field of
    :class:`StreamResult` raises an ``AttributeError`` that says so."""

    score_mean: np.ndarray
    sequence_fisher: np.ndarray
    token_fisher_sum: np.ndarray
    token_fisher_by_depth: np.ndarray
    cond_score_max: np.ndarray
    mass: float

    @property
    def computed(self):
        """The fields this result holds."""
        return tuple(self.__dataclass_fields__)

    def __getattr__(self, name):  # only for names not found: the skipped quantities
        raise _not_computed(self, name, tuple(StreamResult.__dataclass_fields__)
                            + ("gradient_with_constant",))


def topk_overlap(G, F, fractions=(0.01, 0.05, 0.1, 0.25)):
    """Share of the top-k% parameters by ``|G|`` that are also top-k% by ``F``.

    Returns a list of ``(fraction, n, overlap, random)`` where ``random = n / P``
    is the expected share for a random choice of ``n`` parameters.

    Example:
        >>> topk_overlap(np.array([3., 1., 2., 0.]), np.array([9., 0., 1., 5.]), (0.5,))
        [(0.5, 2, 0.5, 0.5)]
    """
    P = len(G)
    out = []
    for frac in fractions:
        n = max(1, int(round(frac * P)))
        top_g = set(np.argsort(-np.abs(G), kind="stable")[:n].tolist())
        top_f = set(np.argsort(-np.asarray(F), kind="stable")[:n].tolist())
        out.append((frac, n, len(top_g & top_f) / n, n / P))
    return out


def _concat(records, key):
    return np.concatenate([r[key] for r in records]) if records else None


def sorted_by_tokens(records, keys):
    """Block records ``[{name: array}]`` concatenated and sorted by ``keys`` (the last the
    most significant), then by the ``tokens`` columns: the order of
    :attr:`ExactResult.states` (``keys = ("depth", "prompt")``)."""
    return _sorted_records(records, lambda o: [o["tokens"][:, c] for c in range(
        o["tokens"].shape[1] - 1, -1, -1)] + [o[k] for k in keys])


def _sorted_records(records, sort_keys):
    """The records' arrays concatenated and sorted by ``sort_keys(out) -> lexsort keys``,
    where ``out`` holds the concatenated small (1-D and integer) arrays. Each large array
    is written once, straight into its sorted place (no concatenated copy)."""
    small = {k: _concat(records, k) for k, v in records[0].items()
             if v.ndim == 1 or v.dtype.kind in "iub"}
    order = np.lexsort(sort_keys(small))  # (N,)
    dest = np.empty(len(order), dtype=np.int64)  # (N,) sorted place of each row
    dest[order] = np.arange(len(order))
    out = {k: v[order] for k, v in small.items()}
    for k, v in records[0].items():
        if k not in small:
            out[k] = np.empty((len(dest),) + v.shape[1:], dtype=v.dtype)
            lo = 0
            for r in records:
                n, at = r[k].shape[0], dest[lo:lo + r[k].shape[0]]
                if n and at[-1] - at[0] == n - 1 and (np.diff(at) == 1).all():
                    out[k][at[0]:at[0] + n] = r[k]  # a block of consecutive states: one copy
                else:
                    out[k][at] = r[k]
                lo += n
    return out


class GatheredStates(Mapping):
    """Per-state arrays (``ExactResult.states``), some of them kept once per distinct
    window and gathered into per-state rows on first access.

    A read-only mapping (the judge's ``states`` is a ``dict``): ``dict(states)``
    forms every array and gives a plain dictionary.

    A state enters its token-level arrays only through its window, so the fast
    engine keeps those ``(U, P)`` per window and the window of each state; reading
    ``states[key]`` gathers the ``(N, P)`` array once and keeps it. The values are
    the same numbers as stored per state, in the same order.

    Args:
        arrays: ``{key: (N, ...) array}`` stored per state.
        tables: ``{key: (U, ...) array}`` stored per window, or a list of
            ``(columns, (U, P_i) array)``, column blocks each placed at its columns (a
            slice or an index array: parameter shards' parameters), together every column.
        window: ``(N,)`` row of each state's window in ``tables``.

    Example:
        >>> st = GatheredStates({"depth": np.array([0, 1, 1])},
        ...                     {"f": np.array([[1.0], [2.0]])}, np.array([0, 1, 1]))
        >>> sorted(st), st["f"][:, 0].tolist()
        (['depth', 'f'], [1.0, 2.0, 2.0])
    """

    def __init__(self, arrays, tables, window):
        self._arrays, self._tables, self._window = dict(arrays), dict(tables), window
        self._keys = list(arrays) + [k for k in tables if k not in arrays]

    def __getitem__(self, key):
        if key not in self._arrays:
            if key not in self._tables:
                raise KeyError(key)
            table = self._tables.pop(key)
            if isinstance(table, list):  # column blocks: each gathered into its columns
                out = np.empty((len(self._window), sum(t.shape[1] for _, t in table)))
                for cols, t in table:
                    out[:, cols] = np.take(t, self._window, axis=0)
                self._arrays[key] = out
            else:
                self._arrays[key] = np.take(table, self._window, axis=0)
        return self._arrays[key]

    def __contains__(self, key):
        return key in self._arrays or key in self._tables

    def __iter__(self):
        return iter(self._keys)

    def __len__(self):
        return len(self._keys)

    def __repr__(self):
        return f"GatheredStates({len(self._window)} states: {', '.join(self._keys)})"


class ExactResult:
    """Everything the exact engine computed for one task.

    On-policy quantities are attributes (``sequence_fisher``, ``token_fisher_sum``,
    ``cross_terms``, ``score_mean``, ``gradient``, ``covariance``,
    ``gradient_autodiff``, ``bound``, ``correlation``, ``reward_std``, ...) taken
    from ``streams["policy"]``. With a sampler, ``streams["raw"]``,
    ``streams["centered"]`` and ``streams["top{k}"]`` hold the off-policy ones.
    ``states`` and ``sequences`` hold the per-state and per-response arrays
    (sorted by prompt, depth, tokens) when they were kept. ``quantities`` is ``"all"`` or,
    from ``exact(..., quantities="fisher")``, ``"fisher"``: then the streams are
    :class:`FisherStreamResult`, ``computed`` lists the on-policy attributes held, reading
    another raises an ``AttributeError`` that says why, and ``sequences`` is ``None``.
    ``build`` takes the
    states as block records (sorted here) or as arrays already in that order, and the
    responses as arrays already in order.
    """

    _ON_POLICY = ("score_mean", "sequence_fisher", "token_fisher_sum", "token_fisher_sum_paths",
                  "cross_terms", "expected_reward", "reward_std", "baseline", "gradient",
                  "covariance", "bound", "correlation")

    @classmethod
    def build(cls, task, cost, streams, grad_ad, states, seqs, quantities="all"):
        """The result of a run; with ``quantities="fisher"`` the streams are
        :class:`FisherStreamResult` and ``grad_ad``, ``seqs`` are not used."""
        self = cls()
        self.task, self.cost, self.streams, self.quantities = task, cost, streams, quantities
        on = streams["policy"]
        if quantities == "all":
            self.gradient_autodiff = grad_ad
        for name in self._ON_POLICY:
            if quantities == "all" or name in on.computed:
                setattr(self, name, getattr(on, name))
        self.states = states if isinstance(states, dict) else cls._sorted_states(states)
        self.sequences = cls._sorted_seqs(seqs, on.baseline, streams) if quantities == "all" \
            else None
        return self

    @property
    def computed(self):
        """The on-policy attributes this result holds (fewer with ``quantities="fisher"``)."""
        return tuple(n for n in self._ON_POLICY + ("gradient_autodiff",) if n in self.__dict__)

    def __getattr__(self, name):  # only for names not found: the skipped quantities
        if name.startswith("__") or "quantities" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        raise _not_computed(self, name, self._ON_POLICY + ("gradient_autodiff",))

    @staticmethod
    def _sorted_states(states):
        if not states:
            return None
        return sorted_by_tokens(states, ("depth", "prompt"))

    @staticmethod
    def _sorted_seqs(seqs, baseline, streams):
        if not seqs:
            return None
        out = seqs  # written in sorted order (fisher_ref.engine.run.response_places)
        out["advantage"] = out["reward"] - baseline
        if "centered" in streams:
            out["sampler_advantage"] = out["reward"] - streams["centered"].baseline
        return out

    def gathered(self):
        """This result with every per-state array formed (the fast engine keeps some per
        window until they are read, :class:`GatheredStates`): what timing against an
        implementation that stores them all should call."""
        if self.states is not None:
            for key in self.states:
                self.states[key]
        return self

    @property
    def offpolicy(self):
        """The ``raw`` and ``centered`` streams (``None`` on-policy)."""
        return None if "centered" not in self.streams else self.streams

    def topk_overlap(self, fractions=(0.01, 0.05, 0.1, 0.25)):
        """:func:`topk_overlap` of the on-policy gradient and sequence Fisher."""
        return topk_overlap(self.gradient, self.sequence_fisher, fractions)

    @property
    def n_states(self):
        return self.cost.n_states

    @property
    def n_responses(self):
        return self.cost.n_responses
