r"""Conformance check for a user's token Fisher, in any framework.

A user's ``fn(logits, sens) -> f`` takes logits ``(V,)`` or ``(B, V)`` and
sensitivities ``(P, V)`` or ``(B, P, V)`` and returns
:math:`f_i = \sum_a p_a (j_{i,a} - \bar j_i)^2`, ``(P,)`` or ``(B, P)``.
:func:`check_token_fisher` runs it on a battery of cases built to catch the
usual mistakes and compares it with :func:`fisher_ref.token_fisher`.

Tolerances. Error of a case: :math:`\max|f - f_{ref}| / \max|f_{ref}|`, the
reference computed in float64 from the inputs *as the implementation received
them* (rounded to its dtype), so only the implementation's arithmetic counts.
In a dtype of unit roundoff :math:`\epsilon`, a correct implementation errs by
about :math:`\epsilon\log_2 V` in the probabilities (softmax and its sum over
``V`` terms) and by :math:`\delta_a \approx \epsilon(|j_a| + |\bar j|)` in each
centered sensitivity :math:`c_a = j_a - \bar j`; then
:math:`|\Delta f| \le 2\sum_a p_a |c_a| \delta_a \le 4\epsilon\sqrt{f}\max|j|`
(Cauchy–Schwarz), a relative error of :math:`4\epsilon\max|j|/\sqrt f`. So a
case passes when its error is at most

.. math:: \mathrm{tol} = \max\Big(\mathrm{floor},\;
          2\epsilon\,\big(\log_2 V + 4\,\kappa\big)\Big),\qquad
          \kappa = \frac{\max|j|}{\sqrt{\max f_{ref}}}

(``max |j|`` over tokens of non-zero probability, 2 a safety factor) with
``floor`` 1e-10 in float64 (docs/theory.md §9.3), 1e-5 in float32 and 5e-2 in bfloat16
(measured errors of a correct torch implementation on this machine, 2-core
x86_64 CPU: about 3e-16, 2e-7 and 1.3e-2; ``tests/test_conformance.py``).
Wrong implementations err by O(1) on at least one case.

Example:
    >>> import numpy as np
    >>> def f(z, j):
    ...     p = np.exp(z - z.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    ...     c = j - (j * p[..., None, :]).sum(-1, keepdims=True)
    ...     return (p[..., None, :] * c ** 2).sum(-1)
    >>> check_token_fisher(f).passed
    True

In a test suite, :func:`parametrize_with_cases` makes each case its own pytest item (as
scikit-learn's ``parametrize_with_checks`` does for estimators).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fisher_ref.limits import TOL_FLOAT64
from fisher_ref.numerics import log_softmax, token_fisher

__all__ = ["check_token_fisher", "conformance_cases", "ConformanceReport", "CaseResult",
           "FLOOR", "EPS", "CaseCheck", "case_checks", "parametrize_with_cases"]

FLOOR = {"float64": TOL_FLOAT64, "float32": 1e-5, "bfloat16": 5e-2}
EPS = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "bfloat16": 2.0 ** -8}
SAFETY = 2.0


def _case(name, logits, sens, note):
    return {"name": name, "logits": np.asarray(logits, float), "sens": np.asarray(sens, float),
            "note": note}


def conformance_cases(rng=None):
    """The battery: a list of dicts ``name, logits, sens, note`` (float64 numpy).

    Args:
        rng: ``numpy.random.Generator`` (default ``default_rng(0)``; the cases are fixed).
    """
    rng = np.random.default_rng(0) if rng is None else rng
    V, P, B = 7, 5, 4
    out = [_case("random", 2 * rng.standard_normal(V), rng.standard_normal((P, V)),
                 "generic logits and sensitivities"),
           _case("batch", 2 * rng.standard_normal((B, V)), rng.standard_normal((B, P, V)),
                 "a batch of B=4 states")]
    z = 1e3 * np.array([1.0, 1.0, 0.2, -1.0, 0.5, -0.3, 0.9]) + rng.standard_normal(V)
    z[1] = z[0] + 0.7  # two tokens share the mass: f is O(1)
    out.append(_case("peaked", z, rng.standard_normal((P, V)),
                     "|z| ~ 1e3: softmax needs the max subtracted"))
    zb = rng.standard_normal((B, V))
    zb[:, [1, 4]] = -np.inf
    out.append(_case("masked", zb, rng.standard_normal((B, P, V)),
                     "-inf logits (probability exactly 0)"))
    zz = rng.standard_normal(V)
    zz[[2, 5]] -= 900.0  # exp(-900) underflows to 0 in float64
    jz = rng.standard_normal((P, V))
    jz[:, [2, 5]] *= 1e3
    out.append(_case("zero_prob", zz, jz, "finite logits whose probability underflows to 0"))
    Vl = 5000
    out.append(_case("large_vocab", 3 * rng.standard_normal(Vl), rng.standard_normal((3, Vl)),
                     f"V={Vl}"))
    base_z, base_j = 2 * rng.standard_normal((B, V)), rng.standard_normal((B, P, V))
    shift = 5.0 * rng.standard_normal((B, P, 1))
    out.append(dict(_case("uniform_shift", base_z, base_j + shift,
                          "j + c_i for all tokens: f must not change"), base_sens=base_j))
    out.append(dict(_case("single_vs_batch", base_z[0], base_j[0] + shift[0],
                          "row 0 of uniform_shift alone: must equal the batched row"),
                    base_sens=base_j[0]))
    return out


@dataclass
class CaseResult:
    """One case: errors, tolerance, verdict, and the problem if it failed to run."""

    name: str
    max_abs: float
    max_rel: float
    tol: float
    passed: bool
    note: str = ""
    problem: str = ""


class ConformanceReport:
    """Per-case results; ``.passed`` is True when every case passed."""

    def __init__(self, results, dtype):
        self.results, self.dtype = list(results), dtype

    @property
    def passed(self):
        return all(r.passed for r in self.results)

    def __getitem__(self, name):
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    @property
    def failed(self):
        return [r.name for r in self.results if not r.passed]

    def __str__(self):
        lines = [f"token Fisher conformance ({self.dtype}): "
                 + ("PASS" if self.passed else f"FAIL ({', '.join(self.failed)})"),
                 f"{'case':16s} {'max abs err':>12s} {'max rel err':>12s} {'tolerance':>10s}  ok"]
        for r in self.results:
            lines.append(f"{r.name:16s} {r.max_abs:12.3e} {r.max_rel:12.3e} {r.tol:10.1e}  "
                         f"{'yes' if r.passed else 'NO'}  {r.problem or r.note}")
        return "\n".join(lines)

    __repr__ = __str__


def _reference(logits, sens):
    with np.errstate(invalid="ignore"):
        p = np.exp(log_softmax(logits))  # (..., V)
    return token_fisher(p, sens)  # (..., P)


def _round(x, dtype):
    """Round float64 inputs to what an implementation in ``dtype`` receives."""
    if dtype == "bfloat16":  # round to nearest even on the top 16 bits of float32
        b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
        b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16).astype(np.uint32)
        return np.where(np.isinf(x), x, b.view(np.float32).astype(np.float64))
    return np.asarray(x).astype(dtype).astype(np.float64)


def check_token_fisher(fn, *, convert=None, to_numpy=np.asarray, dtype="float64", rtol=None,
                       cases=None):
    r"""Run ``fn`` on every case and compare with :func:`fisher_ref.token_fisher`.

    Args:
        fn: ``fn(logits, sens) -> f``; shapes ``(V,), (P, V) -> (P,)`` and
            ``(B, V), (B, P, V) -> (B, P)``.
        convert: turns a float64 numpy input into the framework's array in
            ``dtype`` (default: ``x.astype(dtype)``; e.g.
            ``lambda x: torch.as_tensor(x, dtype=torch.float32, device="cuda")``).
        to_numpy: turns ``fn``'s output into a numpy array
            (e.g. ``lambda t: t.double().cpu().numpy()``).
        dtype: ``"float64"``, ``"float32"`` or ``"bfloat16"``: the precision ``fn``
            computes in, which sets the tolerances (module docstring).
        rtol: a fixed tolerance for every case instead.
        cases: a list from :func:`conformance_cases` (default: all of them).

    Returns:
        :class:`ConformanceReport`.
    """
    if dtype not in FLOOR:
        raise ValueError(f"dtype must be one of {sorted(FLOOR)}, got {dtype!r}")
    if rtol is not None and (isinstance(rtol, bool) or not isinstance(rtol, (int, float))
                             or not np.isfinite(rtol) or rtol < 0):
        raise ValueError(f"rtol must be a finite number >= 0 or None, got {rtol!r}")
    if convert is None:
        if dtype == "bfloat16":
            raise ValueError("dtype 'bfloat16' needs a convert function (numpy has no bfloat16)")
        convert = lambda x: np.asarray(x, dtype=dtype)  # noqa: E731
    cases = conformance_cases() if cases is None else cases
    results, outputs = [], {}
    for case in cases:
        z, j = _round(case["logits"], dtype), _round(case["sens"], dtype)
        ref = _reference(z, _round(case.get("base_sens", case["sens"]), dtype))
        scale = float(np.max(np.abs(ref)))
        live = np.exp(log_softmax(z))[..., None, :] > 0  # (..., 1, V): tokens with p > 0
        jmax = float(np.max(np.abs(np.where(live, j, 0.0))))
        kappa = jmax / np.sqrt(scale) if scale > 0 else np.inf
        tol = rtol if rtol is not None else max(
            FLOOR[dtype], SAFETY * EPS[dtype] * (np.log2(z.shape[-1]) + 4 * kappa))
        problem = ""
        try:
            got = np.asarray(to_numpy(fn(convert(case["logits"]), convert(case["sens"]))))
            if got.dtype.kind not in "fiu":  # complex, bool, strings: never converted
                raise TypeError(f"fn returned dtype {got.dtype}; f is real: return float values")
            got = got.astype(np.float64)
        except Exception as exc:  # noqa: BLE001 - any failure of the user's code is a result
            got, problem = None, f"raised {type(exc).__name__}: {exc}"
        if got is not None and got.shape != ref.shape:
            problem, got = f"returned shape {got.shape}, expected {ref.shape}", None
        if got is not None and not np.all(np.isfinite(got)):
            problem = f"returned {int(np.sum(~np.isfinite(got)))} non-finite values"
        if got is None:
            results.append(CaseResult(case["name"], np.inf, np.inf, tol, False, case["note"],
                                      problem))
            continue
        outputs[case["name"]] = got
        err = float(np.max(np.abs(got - ref))) if np.all(np.isfinite(got)) else float("inf")
        rel = err / scale if scale > 0 else err
        results.append(CaseResult(case["name"], err, rel, tol, bool(rel <= tol), case["note"],
                                  problem))
    _check_batch_consistency(results, outputs, dtype)
    return ConformanceReport(results, dtype)


def _check_batch_consistency(results, outputs, dtype):
    """``single_vs_batch`` must equal row 0 of the batched ``uniform_shift`` output."""
    if "single_vs_batch" not in outputs or "uniform_shift" not in outputs:
        return
    single, batch = outputs["single_vs_batch"], outputs["uniform_shift"][0]
    for r in results:
        if r.name == "single_vs_batch":
            diff = float(np.max(np.abs(single - batch)) / max(np.max(np.abs(batch)), 1e-300))
            if diff > r.tol:
                r.passed = False
                r.problem = f"differs from row 0 of the batched call by {diff:.2e} (relative)"


#: Cases whose check reads another case's output too: ``single_vs_batch`` is compared
#: with row 0 of ``uniform_shift``.
_NEEDS = {"single_vs_batch": ("uniform_shift",)}


class CaseCheck:
    """One conformance case of ``fn``, as a callable: ``check()`` runs
    :func:`check_token_fisher` on that case (and on the cases it is compared with) and
    returns its :class:`CaseResult`, raising ``AssertionError`` with the case's row of the
    report when it failed. ``repr`` is the case's name (the pytest id)."""

    def __init__(self, fn, name, cases, kwargs):
        self.fn, self.name, self.cases, self.kwargs = fn, name, cases, kwargs

    def __call__(self):
        report = check_token_fisher(self.fn, cases=self.cases, **self.kwargs)
        result = report[self.name]
        if not result.passed:
            raise AssertionError(str(ConformanceReport([result], report.dtype)))
        return result

    def __repr__(self):
        return self.name


def case_checks(fn, *, cases=None, **kwargs):
    """A :class:`CaseCheck` for each case (default: :func:`conformance_cases`), in order.

    Args:
        fn: the token Fisher to check, as for :func:`check_token_fisher`.
        cases: a list from :func:`conformance_cases`.
        **kwargs: ``convert``, ``to_numpy``, ``dtype``, ``rtol`` of
            :func:`check_token_fisher`.

    Example:
        >>> import numpy as np
        >>> def f(z, j):
        ...     p = np.exp(z - z.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
        ...     c = j - (j * p[..., None, :]).sum(-1, keepdims=True)
        ...     return (p[..., None, :] * c ** 2).sum(-1)
        >>> [check.name for check in case_checks(f)][:3]
        ['random', 'batch', 'peaked']
        >>> case_checks(f)[2]().passed
        True
    """
    cases = conformance_cases() if cases is None else list(cases)
    by_name = {case["name"]: case for case in cases}
    out = []
    for case in cases:
        needed = [by_name[n] for n in _NEEDS.get(case["name"], ()) if n in by_name]
        out.append(CaseCheck(fn, case["name"], [case] + needed, kwargs))
    return out


def parametrize_with_cases(fn, *, cases=None, **kwargs):
    """A pytest decorator: the decorated test runs once per conformance case of ``fn``,
    each its own item with the case's name as id (``test_mine[peaked]``), and takes the
    case's :class:`CaseCheck` as its argument ``check``.

    Args:
        fn: the token Fisher to check, as for :func:`check_token_fisher`.
        cases: a list from :func:`conformance_cases` (default: all of them).
        **kwargs: ``convert``, ``to_numpy``, ``dtype``, ``rtol`` of
            :func:`check_token_fisher`.

    Example (a test file)::

        from fisher_ref.checks.conformance import parametrize_with_cases

        @parametrize_with_cases(my_token_fisher, dtype="float32")
        def test_my_token_fisher(check):
            check()  # raises AssertionError with the case's row when it fails
    """
    import pytest  # only the test suite needs it
    checks = case_checks(fn, cases=cases, **kwargs)
    return pytest.mark.parametrize("check", checks, ids=[c.name for c in checks])
