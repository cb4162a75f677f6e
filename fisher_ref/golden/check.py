r"""Check your own implementation against the shipped golden files.

Light by design: it imports numpy and the standard library only (no autograd,
scipy, matplotlib or torch), so ``pip install fisher-ref`` is enough::

    import pytest
    from fisher_ref.golden.check import compare_to_golden, golden_cases

    @pytest.mark.parametrize("golden", golden_cases())
    def test_my_fisher(golden):
        assert compare_to_golden(my_arrays(golden), golden)

``my_arrays(golden)`` returns a dict of any golden keys you computed, from
``golden.meta`` (model, task, layout) and ``golden["theta"]``. Each key is
judged on the scale of its kind (:data:`fisher_ref.golden.format.SCALE_KINDS`,
``docs/golden_format.md``):

.. math:: \mathrm{err}_k = \frac{\max|a - g|}{\max(\max|a|, \max|g|, \mathrm{floor}_k)}

with the floor 0 for plain values, :math:`R_s` for rewards,
:math:`S = \sqrt{\max F}` for scores, :math:`S^2` for products of two scores,
:math:`R_s S` for reward-times-score quantities and 1 for correlations, so an
array that vanishes in exact arithmetic (``score_mean``) is judged against the
size of what cancelled in it, not against its own rounding noise.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from fisher_ref.checks.tolerances import EXACT_RTOL
from fisher_ref.golden.format import SCALE_KINDS, Golden, load_golden, scale_kind
from fisher_ref.golden.archive import GoldenFileError

__all__ = ["RTOL", "GOLDEN_DIR", "golden_names", "golden_path", "golden_cases", "load_golden",
           "compare_to_golden", "compare_golden", "KeyResult", "Comparison", "file_scales",
           "GoldenFileError", "Golden"]

RTOL = EXACT_RTOL  # exact float64 agreement on the documented scale
GOLDEN_DIR = Path(str(resources.files("fisher_ref") / "golden_data"))


def golden_names():
    """Names of the golden files shipped with the package (``golden_data/*.npz``), sorted."""
    return sorted(p.stem for p in GOLDEN_DIR.glob("*.npz"))


def golden_path(name):
    """Path of the shipped golden file ``name`` (see :func:`golden_names`).

    Raises:
        ValueError: ``name`` is not a plain name (a path separator, ``..``, a leading
            dot, not a string), or no shipped file has it; the resolved path never
            leaves the package's golden data.
    """
    if not isinstance(name, str) or not name or name.startswith(".") or \
            any(c in name for c in ("/", "\\", "\0")) or Path(name).name != name:
        raise ValueError(f"golden name must be a plain name such as 'default' (no path "
                         f"separator, no '..'), got {name!r:.80}; shipped: "
                         f"{', '.join(golden_names())}")
    path = GOLDEN_DIR / f"{name}.npz"
    if path.resolve().parent != GOLDEN_DIR.resolve():  # a link pointing out, say
        raise ValueError(f"golden name {name!r} resolves outside the shipped golden data "
                         f"({path.resolve()})")
    if not path.is_file():
        raise ValueError(f"no shipped golden file {name!r}; shipped: {', '.join(golden_names())}")
    return path


def golden_cases(names=None, *, offpolicy=None, max_params=None, arch=None):
    """The shipped golden files as ``pytest.param`` objects with readable ids.

    Use with ``@pytest.mark.parametrize("golden", golden_cases())``; each value
    is a loaded :class:`~fisher_ref.golden.format.Golden`.

    Args:
        names: which files (default: all of :func:`golden_names`).
        offpolicy: keep only files with (``True``) or without (``False``) a sampler.
        max_params: keep only files with at most this many parameters ``P``.
        arch: keep only files of this model architecture (``"mlp_window"``,
            ``"tabular"``, ``"gpt2"``).
    """
    import pytest  # only a test run needs it
    out = []
    for name in golden_names() if names is None else list(names):
        g = load_golden(golden_path(name))
        if offpolicy is not None and g.meta["offpolicy"] != bool(offpolicy):
            continue
        if max_params is not None and g.sizes["P"] > max_params:
            continue
        if arch is not None and g.meta["model"]["arch"] != arch:
            continue
        out.append(pytest.param(g, id=name))
    return out


def file_scales(arrays):
    r"""``(S, Rs)`` of a golden file's arrays: :math:`S = \sqrt{\max F}` over
    ``sequence_fisher`` (and ``offpolicy_sequence_fisher``), :math:`R_s` the largest
    :math:`\sqrt{E[R^2]} + |b|` over the streams present (from ``expected_reward``,
    ``reward_std``, ``baseline`` and their ``offpolicy_`` versions).

    Example:
        >>> file_scales({"sequence_fisher": np.array([4.0, 1.0]), "expected_reward": 3.0,
        ...              "reward_std": 4.0, "baseline": -1.0})
        (2.0, 6.0)
    """
    fishers = [np.max(arrays[k], initial=0.0) for k in ("sequence_fisher",
               "offpolicy_sequence_fisher") if k in arrays]
    S = float(np.sqrt(max(fishers, default=0.0)))
    rewards = [float(np.hypot(float(arrays[p + "reward_std"]),
                              float(arrays[p + "expected_reward"])))
               + abs(float(arrays[p + "baseline"]))
               for p in ("", "offpolicy_") if p + "reward_std" in arrays]
    return S, max(rewards, default=0.0)


@dataclass
class KeyResult:
    """One key: largest absolute error (and where), the denominator, the relative error."""

    key: str
    kind: str
    max_abs: float
    scale: float
    rel: float
    rtol: float
    passed: bool
    where: tuple = ()
    yours: float = float("nan")
    golden: float = float("nan")
    problem: str = ""

    def message(self):
        """One line saying what is wrong (empty when the key passed)."""
        if self.passed:
            return ""
        if self.problem:
            return f"{self.key}: {self.problem}"
        return (f"{self.key}: relative error {self.rel:.3e} > {self.rtol:g} on the "
                f"{self.kind} scale {SCALE_KINDS[self.kind]} = {self.scale:.6g}; worst entry "
                f"{list(self.where)}: yours {self.yours!r}, golden {self.golden!r}")


class Comparison:
    """Per-key results of :func:`compare_to_golden`; true (``bool``) when every key passed.

    ``str()`` is a table; ``result[key]`` is a :class:`KeyResult`; ``failed`` lists the
    keys that failed and :meth:`messages` says why, one line each.
    """

    def __init__(self, results, name=None):
        self.results, self.name = list(results), name

    @property
    def passed(self):
        return all(r.passed for r in self.results)

    def __bool__(self):
        return self.passed

    def __getitem__(self, key):
        for r in self.results:
            if r.key == key:
                return r
        raise KeyError(key)

    @property
    def failed(self):
        return [r.key for r in self.results if not r.passed]

    def messages(self):
        return [r.message() for r in self.results if not r.passed]

    def __str__(self):
        head = (f"golden {self.name!r}: " if self.name else "golden: ") + (
            f"PASS ({len(self.results)} keys)" if self.passed
            else f"FAIL ({len(self.failed)} of {len(self.results)} keys)")
        lines = [head, f"{'key':38s} {'kind':11s} {'max abs err':>11s} {'scale':>11s} "
                       f"{'rel err':>10s}  ok"]
        for r in self.results:
            lines.append(f"{r.key:38s} {r.kind:11s} {r.max_abs:11.3e} {r.scale:11.3e} "
                         f"{r.rel:10.2e}  {'yes' if r.passed else 'NO'}")
        lines += self.messages()
        return "\n".join(lines)

    __repr__ = __str__


def _floor(kind, S, Rs):
    return {"value": 0.0, "reward": Rs, "score": S, "fisher": S * S, "gradient": Rs * S}[kind]


def _compare_exact(key, y, gold, rtol):
    bad = np.argwhere(y != gold)
    if not bad.size:
        return KeyResult(key, "exact", 0.0, 1.0, 0.0, rtol, True)
    where = tuple(int(i) for i in bad[0])
    return KeyResult(key, "exact", float(np.max(np.abs(y - gold))), 1.0, float("inf"), rtol,
                     False, where, float(y[where]), float(gold[where]),
                     f"integer arrays differ at {len(bad)} entries, first at {list(where)}: "
                     f"yours {y[where]}, golden {gold[where]}")


class _Refused(TypeError):
    """An array of a kind no golden value can be compared with."""


def _check_real(key, y):
    """Refuse complex, boolean, string and bytes arrays (numpy would drop an imaginary
    part with a warning, read ``True`` as 1 and parse ``"1.5"``): ``TypeError`` naming
    the key."""
    kinds = {"c": "complex", "b": "boolean", "U": "string", "S": "bytes", "V": "structured"}
    if y.dtype.kind == "O":  # None, strings, or numbers mixed with them
        flat = y.ravel()
        bad = next((i for i, x in enumerate(flat) if isinstance(x, bool) or
                    not isinstance(x, numbers.Real)), None)
        if bad is not None:
            where = [int(i) for i in np.unravel_index(bad, y.shape)] if y.ndim else []
            raise _Refused(f"{key}: your array holds Python objects (dtype object), "
                           f"{flat[bad]!r:.60} at {where}; golden values are real numbers: "
                           "pass a float or integer array")
    if y.dtype.kind in kinds:
        raise _Refused(f"{key}: your array holds {kinds[y.dtype.kind]} values (dtype "
                       f"{y.dtype}); golden values are real numbers: pass a float or integer "
                       "array" + (" (take .real only if the imaginary part is truly 0)"
                                  if y.dtype.kind == "c" else ""))


def check_rtol(rtol):
    """``rtol`` as a float if it is a finite number ``>= 0``; else ``ValueError`` (a NaN
    or infinite tolerance would pass anything, NaN included).

    Example:
        >>> check_rtol(1e-10)
        1e-10
    """
    if isinstance(rtol, bool) or not isinstance(rtol, numbers.Real) or \
            not math.isfinite(float(rtol)) or rtol < 0:
        raise ValueError(f"rtol must be a finite number >= 0 (such as 1e-10), got {rtol!r}")
    return float(rtol)


def _compare_key(key, yours, g, S, Rs, rtol):
    """One key of your arrays against golden ``g`` on its documented scale."""
    kind, gold = scale_kind(key), g[key]
    fail = dict(key=key, kind=kind, max_abs=float("inf"), scale=float("nan"),
                rel=float("inf"), rtol=rtol, passed=False)
    try:
        y = np.asarray(yours)
        _check_real(key, y)
        y = y if kind == "exact" and y.dtype.kind != "O" else np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, _Refused):
            raise
        return KeyResult(**fail, problem=f"not a numeric array ({exc})")
    if y.shape != gold.shape:
        return KeyResult(**fail, problem=f"shape {y.shape}, golden has {gold.shape}")
    if kind == "exact":
        return _compare_exact(key, y, gold, rtol)
    gv = gold.astype(np.float64)
    same = (y == gv) | (np.isnan(y) & np.isnan(gv))  # equal entries (inf == inf included)
    finite = np.isfinite(y) & np.isfinite(gv)
    diff = np.where(same, 0.0, np.where(finite, np.abs(y - gv), np.inf))
    if kind == "correlation":  # a ratio |Cov|/B: its error weighted by the bound B
        bound = g["offpolicy_bound" if key.startswith("offpolicy_") else "bound"]
        diff = np.where(diff > 0, diff * bound, 0.0)
        scale = max(float(np.max(bound, initial=0.0)), Rs * S)
    else:
        own = max(float(np.max(np.abs(np.where(np.isfinite(gv), gv, 0.0)), initial=0.0)),
                  float(np.max(np.abs(np.where(np.isfinite(y), y, 0.0)), initial=0.0)))
        scale = max(own, _floor(kind, S, Rs))
    err = float(np.max(diff, initial=0.0))
    rel = 0.0 if err == 0 else (err / scale if scale > 0 else float("inf"))
    where = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    problem = "" if np.isfinite(err) else (
        f"non-finite or unequal infinite entries, first at {list(where)}: "
        f"yours {y[where]}, golden {gv[where]}")
    return KeyResult(key, kind, err, scale, rel, rtol, bool(rel <= rtol), where,
                     float(y[where]), float(gv[where]), problem)


def _as_golden(golden):
    if isinstance(golden, Golden):
        return golden
    if isinstance(golden, (str, Path)):
        path = Path(golden)
        if not path.suffix and not path.exists():
            path = golden_path(str(golden))  # a shipped file by name
        return load_golden(path)
    raise TypeError(f"golden must be a Golden, a path or a shipped name, got "
                    f"{type(golden).__name__}")


def compare_to_golden(arrays, golden, keys=None, rtol=RTOL):
    r"""Compare your ``arrays`` with a golden file, key by key, on the documented scales.

    Args:
        arrays: dict key -> array-like, any subset of the golden keys.
        golden: a :class:`~fisher_ref.golden.format.Golden`, a path, or the name of a
            shipped file (:func:`golden_names`).
        keys: the keys to check (default: every key of ``arrays``); a key missing from
            ``arrays`` fails.
        rtol: largest relative error that passes (default 1e-10).

    Returns:
        :class:`Comparison` (true when every key passed; ``str`` is a table).

    Raises:
        KeyError: a key that no golden file has (a typo), or one this file lacks
            (an off-policy key in an on-policy file).
        TypeError: ``arrays`` is not a dict, or an array holds complex, boolean,
            string or non-numeric object values (``None``), naming the key (never
            silently converted).
        ValueError: nothing to compare (no arrays and no keys), or ``rtol`` is not a
            finite number ``>= 0``.

    Example:
        >>> g = load_golden(golden_path("tabular"))
        >>> mine = {"sequence_fisher": g["seq_prob"] @ g["seq_score"] ** 2,
        ...         "score_mean": g["seq_prob"] @ g["seq_score"]}
        >>> compare_to_golden(mine, g).passed
        True
        >>> bad = compare_to_golden({"sequence_fisher": 1.01 * mine["sequence_fisher"]}, g)
        >>> bad.passed, bad.failed
        (False, ['sequence_fisher'])
    """
    rtol = check_rtol(rtol)
    if not isinstance(arrays, Mapping):
        raise TypeError(f"arrays must be a dict of golden key -> array, got "
                        f"{type(arrays).__name__}")
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"keys must be a list of golden keys, got the string {keys!r:.60} "
                        f"(write keys=[{keys!r:.60}])")
    g = _as_golden(golden)
    keys = list(arrays) if keys is None else list(keys)
    if not keys:
        raise ValueError("nothing to compare: no arrays (and no keys) were given; an empty "
                         "comparison is not a pass")
    for key in keys:
        try:
            scale_kind(key)
        except KeyError:
            raise KeyError(f"{key!r} is not a golden-file key (see docs/golden_format.md)") \
                from None
        if key not in g:
            raise KeyError(f"golden file {g.name!r} has no key {key!r} (offpolicy="
                           f"{g.meta['offpolicy']}, matrices={g.meta['matrices']})")
    S, Rs = file_scales(g.arrays)
    results = []
    for key in keys:
        if key not in arrays:
            results.append(KeyResult(key, scale_kind(key), float("nan"), float("nan"),
                                     float("inf"), rtol, False, problem="missing from your arrays"))
        else:
            results.append(_compare_key(key, arrays[key], g, S, Rs, rtol))
    return Comparison(results, g.name)


def compare_golden(a, b, rtol=RTOL):
    """Every key of golden ``a`` against ``b`` (a Golden, a path or a dict of arrays):
    :func:`compare_to_golden` of ``b`` on ``a``'s keys."""
    ga = _as_golden(a)
    arrays = b.arrays if isinstance(b, Golden) else (
        _as_golden(b).arrays if isinstance(b, (str, Path)) else dict(b))
    return compare_to_golden(arrays, ga, keys=sorted(ga.keys()), rtol=rtol)
