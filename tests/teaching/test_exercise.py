"""What an exercise is and how an answer is judged (fisher_ref.teaching.exercise): its
docstring examples of matches and close_to run and print what they say, and a close_to
judge refuses what is not a finite answer of the right shape and size."""
import doctest

import numpy as np

import fisher_ref.teaching.exercise as judging
from fisher_ref.teaching.exercise import close_to


def test_exercise_docstring_examples():
    res = doctest.testmod(judging, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0 and res.failed == 0


def test_close_to_judges_shape_finiteness_and_tolerance():
    judge = close_to(lambda ns: ns["x"], rtol=1e-3, atol=1e-6)  # tolerance 1e-6 + 1e-3 * 2
    x = {"x": np.array([1.0, -2.0])}
    assert judge(np.array([1.0, -2.0 + 2e-3]), x)[0] is True
    ok, why = judge(np.array([1.0, -2.0 + 2.1e-3]), x)
    assert ok is False and "> 2.0e-03" in why
    assert judge(np.array([np.nan, -2.0]), x) == (False, "the answer holds NaN or inf")
    assert judge("two", x) == (False, "expected a number or an array of numbers, got str")
    assert judge(np.array([1.0]), x) == (False, "expected shape (2,), got (1,)")
