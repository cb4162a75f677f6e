r"""Accumulated moments of one stream and the exact results built from them.

A :class:`Moments` accumulates, over complete responses ``y`` drawn with
probability ``w(y)`` and over states ``s`` reached with probability
:math:`\pi(s)`:

- :math:`E[h]`, :math:`E[h^2]`, :math:`E[h^4]` (response level);
- :math:`E[R]`, :math:`E[Rh]`, :math:`E[Rh^2]`, :math:`E[R^2h^2]`, each with ``R``
  taken relative to a reference reward ``r0`` (the first reward seen), so that no
  large reward offset (``1e8 + count``) enters a difference of sums;
- the weighted mean and spread of ``R``, merged block by block (Chan's update), for
  ``std(A)`` without cancellation;
- :math:`C_{u,t} = E[\xi_u\xi_t]` and :math:`E[\xi_u^2\xi_t^2]` (``T x T x P``);
- the token sum :math:`\sum_s \pi(s) m(s)` by states, and :math:`E[g]`,
  :math:`E[g^2]` for the per-response path sum :math:`g = \sum_t m(s_t)`;
- the largest conditional score mean :math:`\max_s |E[\xi | s]|`.

:func:`finish_stream` turns them into gradients, covariances, the bound, the
correlation and the exact variances the Monte Carlo z-tests use.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Moments", "StreamResult", "FisherStreamResult", "ExactResult", "GatheredStates",
           "finish_stream", "finish_fisher", "topk_overlap", "QUANTITIES", "check_quantities",
           "require_all_quantities", "sorted_by_tokens"]

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


def _power_of_two(x):
    """The smallest power of two at least ``x`` (1 for ``x = 0``): dividing by it is exact."""
    return float(2.0 ** math.frexp(x)[1]) if x > 0 and math.isfinite(x) else 1.0


def importance_weighted(w, w_policy):
    r""":math:`w\,\rho` with the importance weight :math:`\rho = P(y)/w(y)` formed
    explicitly where :math:`w(y) > 0` (responses the sampler never draws get 0)."""
    rho = np.divide(w_policy, w, out=np.zeros_like(w, dtype=float), where=w > 0)  # (M,)
    return w * rho


class Moments:
    """Running sums for one stream (see module docstring)."""

    def __init__(self, P, T):
        self.mass = 0.0
        self.r0 = None  # reference reward: every R sum is of R - r0
        # weighted mean and sum of squared deviations of R, merged block by block; the
        # squares in units of spread_unit^2 (a power of two), so that rewards below
        # 1e-154 do not underflow when squared
        self.spread_mass = self.spread_mean = self.spread_m2 = 0.0
        self.spread_unit = 0.0  # no rewards yet
        self.R = 0.0
        self.h, self.h2, self.h4 = np.zeros(P), np.zeros(P), np.zeros(P)
        self.Rh, self.Rh2, self.R2h2 = np.zeros(P), np.zeros(P), np.zeros(P)
        self.cross, self.cross4 = np.zeros((T, T, P)), np.zeros((T, T, P))
        self.token_sum = np.zeros(P)
        self.token_sum_by_depth = np.zeros((T, P))
        self.g, self.g2 = np.zeros(P), np.zeros(P)
        self.cond_mean_max = np.zeros(P)
        self.is_Rh = np.zeros(P)
        self.is_h = np.zeros(P)

    def add_states(self, reach, m, cond_mean, depth):
        """States of one depth: reach ``(B,)``, second moments ``m`` and ``E[xi|s]`` ``(B, P)``."""
        contrib = reach @ m  # (P,)
        self.token_sum += contrib
        self.token_sum_by_depth[depth] += contrib
        live = reach > 0
        if live.any():
            self.cond_mean_max = np.maximum(self.cond_mean_max,
                                            np.abs(cond_mean[live]).max(axis=0))

    def centered(self, R):
        """``R - r0`` (fixing ``r0`` at the first reward seen)."""
        if self.r0 is None and len(R):
            self.r0 = float(R[0])
        return R - (self.r0 or 0.0)

    def add_reward_spread(self, w, R):
        r"""Merge a block's rewards ``R (M,)`` with weights ``w (M,)`` into the running
        weighted mean and sum of squared deviations (Chan, Golub and LeVeque's pairwise
        update): the block's own mean :math:`\bar R_b` and :math:`M_b = \sum w (R -
        \bar R_b)^2`, then :math:`M \mathrel{+}= M_b + \delta^2 W W_b / (W + W_b)` with
        :math:`\delta = \bar R_b - \bar R`. No difference of two large sums is taken,
        so ``std(A)`` is right to rounding however far rewards sit from 0 or from ``r0``.
        The rewards are divided by a power of two ``u`` of their size before any product
        (exact), and ``M`` is kept in units of ``u^2``: the spread is homogeneous
        in ``R``, so rewards of 1e-300 give the same digits as rewards of 1."""
        Wb = float(np.sum(w))
        if Wb <= 0:
            return
        unit = _power_of_two(float(np.max(np.abs(R))))
        Rs = R / unit  # (M,) exact: a power of two
        r1 = float(Rs[0])  # a block whose rewards are all equal gets exactly that mean
        mean_b = r1 + float(w @ (Rs - r1)) / Wb
        self.merge_spread(Wb, mean_b * unit, float(w @ (Rs - mean_b) ** 2), unit)

    def merge_spread(self, mass, mean, m2, unit=1.0):  # unit: a power of two > 0
        """Merge another weighted spread (``mass``, ``mean``, ``m2`` in units of ``unit^2``,
        as this object's ``spread_*`` fields) into this one (Chan's update)."""
        u = max(self.spread_unit, unit)  # both in the larger unit: squares cannot overflow
        total = self.spread_mass + mass
        delta = (mean - self.spread_mean) / u
        self.spread_m2 = (self.spread_m2 * (self.spread_unit / u) ** 2 + m2 * (unit / u) ** 2
                          + delta * delta * self.spread_mass * mass / total)
        # mass / total first: 1 exactly for the first spread, so equal means stay equal
        self.spread_mean += (mean - self.spread_mean) * (mass / total)
        self.spread_mass, self.spread_unit = total, u

    def reward_std(self):
        """The weighted standard deviation of ``R``: ``unit * sqrt(M / W)``."""
        if self.spread_mass <= 0:
            return 0.0
        return float(self.spread_unit * np.sqrt(self.spread_m2 / self.spread_mass))

    def add_responses(self, w, R, hist, g, w_policy):
        """Responses: weights ``w (M,)``, rewards ``R (M,)``, scores ``hist (M, T, P)``,
        path sums ``g (M, P)``, policy probabilities ``w_policy (M,)`` (importance weights)."""
        h = hist.sum(axis=1)  # (M, P)
        self.add_reward_spread(w, R)
        R = self.centered(R)
        h2 = h * h
        self.mass += w.sum()
        self.R += w @ R
        self.h += w @ h
        self.h2 += w @ h2
        self.h4 += w @ (h2 * h2)
        self.Rh += (w * R) @ h
        self.Rh2 += (w * R) @ h2
        self.R2h2 += (w * R * R) @ h2
        self.cross += np.einsum("m,mup,mtp->utp", w, hist, hist)
        sq = hist * hist
        self.cross4 += np.einsum("m,mup,mtp->utp", w, sq, sq)
        self.g += w @ g
        self.g2 += w @ (g * g)
        rho_w = importance_weighted(w, w_policy)  # (M,)
        self.is_Rh += (rho_w * R) @ h
        self.is_h += rho_w @ h

    def add_sums(self, cross=None, cross4=None, **sums):
        """Add sums over responses computed elsewhere (the fast engine's regrouped
        sums): ``sums`` maps attribute names (``mass``, ``R``, ``h``, ``h2``, ...) to
        values; ``cross``, ``cross4`` ``(n, n, P)`` add to the leading ``n x n`` slots."""
        for name, value in sums.items():
            setattr(self, name, getattr(self, name) + value)
        if cross is not None:
            n = cross.shape[0]
            self.cross[:n, :n] += cross
            self.cross4[:n, :n] += cross4


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


def finish_fisher(m):
    """The Fisher quantities of one stream (``exact(..., quantities="fisher")``)."""
    return FisherStreamResult(score_mean=m.h, sequence_fisher=m.h2, token_fisher_sum=m.token_sum,
                              token_fisher_by_depth=m.token_sum_by_depth,
                              cond_score_max=m.cond_mean_max, mass=float(m.mass))


def finish_stream(m, baseline):
    """Derived quantities of one stream; ``baseline`` is a number or ``"mean"``."""
    r0 = m.r0 or 0.0
    ERc = m.R / m.mass  # E[R - r0]
    ER = r0 + ERc
    b = ER if baseline == "mean" else float(baseline)
    std_A = m.reward_std()  # merged, no cancellation, no underflow
    var_R = std_A * std_A
    d = r0 - b  # A = (R - r0) + d
    G = m.Rh + d * m.h
    cov = m.Rh - ERc * m.h
    bound = std_A * np.sqrt(m.h2)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.where(bound > 0, np.abs(cov) / np.where(bound > 0, bound, 1.0), 0.0)
    A2h2 = m.R2h2 + 2 * d * m.Rh2 + d * d * m.h2
    variances = {
        "h": m.h2 - m.h ** 2,
        "h2": m.h4 - m.h2 ** 2,
        "token_sum": m.g2 - m.g ** 2,
        "Ah": A2h2 - G ** 2,
        "cross": m.cross4 - m.cross ** 2,
        "reward": var_R,
    }
    return StreamResult(
        score_mean=m.h, sequence_fisher=m.h2, token_fisher_sum=m.token_sum,
        token_fisher_sum_paths=m.g, token_fisher_by_depth=m.token_sum_by_depth,
        cross_terms=m.cross, cond_score_max=m.cond_mean_max, mass=float(m.mass),
        expected_reward=float(ER), reward_std=float(std_A), baseline=float(b), gradient=G,
        covariance=cov, gradient_shift=m.h.copy(), bound=bound, correlation=corr,
        importance_gradient=m.is_Rh + d * m.is_h, variances=variances)


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

    A read-only mapping (the plain engine's ``states`` is a ``dict``): ``dict(states)``
    forms every array and gives a plain dictionary.

    A state enters its token-level arrays only through its window, so the fast
    engine keeps those ``(U, P)`` per window and the window of each state; reading
    ``states[key]`` gathers the ``(N, P)`` array once and keeps it. The values are
    the same numbers as stored per state, in the same order.

    Args:
        arrays: ``{key: (N, ...) array}`` stored per state.
        tables: ``{key: (U, ...) array}`` stored per window.
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
            self._arrays[key] = np.take(self._tables[key], self._window, axis=0)
            del self._tables[key]
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
