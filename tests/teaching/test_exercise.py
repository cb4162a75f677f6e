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


def test_constant_ratio_finds_a_sign_flip_a_factor_of_2_and_nothing_else():
    from fisher_ref.teaching.exercise import constant_ratio
    ref = np.array([0.5, -1.5, 0.0, 2.0])
    assert constant_ratio(-ref, ref) == -1.0 and constant_ratio(2 * ref, ref) == 2.0
    assert constant_ratio(ref, ref) is None                        # right: not a slip
    assert constant_ratio(np.zeros(4), ref) is None                # zero: no ratio
    assert constant_ratio(ref + [0, 0, 1e-3, 0], ref) is None      # a zero entry moved
    assert constant_ratio(ref * [1, 1, 1, 1.01], ref) is None      # not constant
    assert constant_ratio(np.ones(3), np.ones(4)) is None          # shapes differ


def test_close_to_names_a_constant_ratio_in_its_message():
    judge = close_to(lambda ns: np.array([1.0, -2.0, 0.5]), rtol=1e-10)
    for value, phrase in [([-1.0, 2.0, -0.5], "the sign is flipped"),
                          ([2.0, -4.0, 1.0], "off by a factor of 2 (twice the reference)"),
                          ([0.5, -1.0, 0.25], "off by a factor of 2 (half the reference)"),
                          ([3.0, -6.0, 1.5], "3 times the reference everywhere: a constant "
                                             "factor")]:
        ok, message = judge(value, {})
        assert not ok and phrase in message, (value, message)
    ok, message = judge([1.0, -2.0, 0.7], {})
    assert not ok and "times the reference" not in message
    scalar = close_to(lambda ns: 0.25, rtol=1e-10)
    assert "the sign is flipped" in scalar(-0.25, {})[1]
    assert "times the reference" not in scalar(0.3, {})[1]         # a lone number: no cue
