"""What an exercise is, and how an answer is judged.

An :class:`Exercise` is data: a prompt, the code that builds its inputs, the
learner's variable, a solution with the reason it is right, the plausible mistakes
(each with the feedback a learner who made it should read) and a judge. A judge is
a function ``judge(value, namespace) -> (ok, message)``; :func:`close_to` builds
the common one, an elementwise comparison with a reference the judge computes
itself from the setup's variables, which also names an answer that is a constant
multiple of the reference (:func:`constant_ratio`: "the sign is flipped", "off by a
factor of 2"). :func:`matches` tells whether a wrong answer is
one of the recorded mistakes, so the feedback can name it. The lessons' exercises
live in :mod:`fisher_ref.teaching.exercise_bank` (lessons 0-6) and
:mod:`fisher_ref.teaching.exercises_transformer` (lesson 7);
:mod:`fisher_ref.teaching.exercise_bank` holds the one registry and
:mod:`fisher_ref.teaching.exercises` the notebook API.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["Exercise", "Mistake", "close_to", "matches", "constant_ratio", "describe_ratio"]


@dataclass(frozen=True)
class Mistake:
    """A plausible wrong answer and what to tell the learner who gives it.

    Attributes:
        code: code that sets the exercise's answer variable the wrong way.
        feedback: what went wrong, in a sentence (markdown).
    """

    code: str
    feedback: str


@dataclass(frozen=True)
class Exercise:
    """One "try it yourself" exercise.

    Attributes:
        id: short key, unique.
        lesson: the notebook stem it belongs to.
        title: a few words.
        prompt: the task (markdown, may hold ``$...$`` math).
        setup: self-contained code that builds the inputs (shown in the notebook).
        answer: name of the variable the learner sets.
        solution: code that sets ``answer`` from the setup's variables.
        why: why the solution is right, in a sentence or two (markdown).
        mistakes: :class:`Mistake` s the checker must reject, each with its feedback.
        judge: ``judge(value, namespace) -> (ok, message)``; ``namespace`` holds the
            setup's variables.
    """

    id: str
    lesson: str
    title: str
    prompt: str
    setup: str
    answer: str
    solution: str
    why: str
    mistakes: tuple
    judge: Callable


def _arrays(value):
    """``value`` as a tuple of float arrays (one for a number or an array), or None."""
    parts = value if isinstance(value, tuple) else (value,)
    try:
        return tuple(np.asarray(v, dtype=float) for v in parts)
    except (TypeError, ValueError):
        return None


def matches(value, other, rtol=1e-6):
    """True when ``value`` equals ``other`` (numbers, arrays or tuples of them) to ``rtol``.

    Example:
        >>> matches(2.0000001, 2.0), matches([1.0, 2.0], [1.0, 2.5]), matches("x", 1.0)
        (True, False, False)
    """
    a, b = _arrays(value), _arrays(other)
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x.shape == y.shape and np.allclose(x, y, rtol=rtol, atol=1e-12 * max(
        1.0, float(np.max(np.abs(y), initial=0.0)))) for x, y in zip(a, b))


#: Factors a learner's slip commonly leaves, and how to name them.
_NAMED = {-1.0: "the sign is flipped", 2.0: "off by a factor of 2 (twice the reference)",
          0.5: "off by a factor of 2 (half the reference)",
          -2.0: "off by a factor of 2 and the sign is flipped",
          -0.5: "off by a factor of 2 and the sign is flipped"}


def constant_ratio(value, reference, rtol=1e-6):
    """The number ``c`` with ``value == c * reference`` everywhere (to ``rtol``), or None.

    Entries where the reference is 0 must be 0 in ``value`` too; at least one entry of the
    reference must be non-zero, and ``c`` must be neither 0 nor 1.

    Example:
        >>> constant_ratio([-2.0, 4.0, 0.0], [1.0, -2.0, 0.0])
        -2.0
        >>> constant_ratio([1.0, 3.0], [1.0, 2.0]) is None
        True
    """
    got, want = np.asarray(value, dtype=float), np.asarray(reference, dtype=float)
    if got.shape != want.shape or not np.all(np.isfinite(got)):
        return None
    scale = float(np.max(np.abs(want), initial=0.0))
    live = np.abs(want) > 1e-12 * scale
    if not live.any() or np.any(np.abs(got[~live]) > 1e-9 * max(scale, 1e-300)):
        return None
    ratios = got[live] / want[live]
    c = float(np.median(ratios))
    if (c == 0 or not np.allclose(ratios, c, rtol=rtol, atol=0)
            or np.isclose(c, 1.0, rtol=rtol, atol=0)):
        return None
    return c


def describe_ratio(c, entries):
    """A sentence naming a constant ratio ``c`` of an answer to its reference, or "" when a
    single number's ratio says nothing (it is always some constant).

    Example:
        >>> describe_ratio(-1.0, 5)
        'your answer is -1 times the reference everywhere: the sign is flipped'
        >>> describe_ratio(2.0, 1)
        'your answer is 2 times the reference: off by a factor of 2 (twice the reference)'
        >>> describe_ratio(3.7, 1)
        ''
    """
    named = next((text for k, text in _NAMED.items() if np.isclose(c, k, rtol=1e-6)), None)
    where = " everywhere" if entries > 1 else ""
    if named:
        return f"your answer is {c:.4g} times the reference{where}: {named}"
    if entries > 1:
        return (f"your answer is {c:.4g} times the reference everywhere: a constant factor, "
                f"so look for a missing or extra normalisation")
    return ""


def close_to(expected, rtol=1e-8, atol=0.0):
    """A judge comparing an array (or number) with ``expected(namespace)`` elementwise.

    ``|value - expected| <= atol + rtol * max|expected|`` everywhere, shapes equal.

    Example:
        >>> judge = close_to(lambda ns: ns["x"] ** 2, rtol=1e-12)
        >>> judge(4.0, {"x": 2.0})
        (True, 'largest difference from the reference 0.0e+00 (tolerance 4.0e-12)')
        >>> judge([4.0], {"x": 2.0})
        (False, 'expected shape (), got (1,)')
    """
    def judge(value, ns):
        want = np.asarray(expected(ns), dtype=float)
        try:
            got = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            return False, f"expected a number or an array of numbers, got {type(value).__name__}"
        if got.shape != want.shape:
            return False, f"expected shape {want.shape}, got {got.shape}"
        if not np.all(np.isfinite(got)):
            return False, "the answer holds NaN or inf"
        err = float(np.max(np.abs(got - want), initial=0.0))
        tol = atol + rtol * float(np.max(np.abs(want), initial=0.0))
        if err <= tol:
            return True, f"largest difference from the reference {err:.1e} (tolerance {tol:.1e})"
        message = f"largest difference from the reference {err:.2e} > {tol:.1e}"
        c = constant_ratio(got, want)
        hint = describe_ratio(c, int(np.count_nonzero(want))) if c is not None else ""
        return False, message + (f"; {hint}" if hint else "")
    return judge
