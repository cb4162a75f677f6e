"""The quizzes as data (fisher_ref.teaching.quiz_bank): a malformed Quiz is refused, the
right letters are balanced, and no question names a parameter like an option letter.
Each quiz's answer is proved in tests/teaching/test_quizzes.py."""
import re
from collections import Counter

import pytest

from fisher_ref.teaching.quiz_bank import QUIZZES, Quiz
from tests.teaching.test_quizzes import correct_letter


def test_correct_letters_are_balanced():
    """Guessing one letter must not pay: no letter is right more than once above any other."""
    counts = Counter(correct_letter(qid) for qid in QUIZZES)
    four = [counts.get(x, 0) for x in "ABCD"]
    assert all(len(q.options) == 4 for q in QUIZZES.values())
    assert max(four) - min(four) <= 1, counts


def test_option_letters_are_not_parameter_names():
    """Question text names no parameter 'A'..'D' that could be read as an option letter."""
    for q in QUIZZES.values():
        assert not re.search(r"[Pp]arameter [A-D]\b", q.question), q.id


@pytest.mark.parametrize("kwargs, match", [
    (dict(options=("a",), feedback=("x",), correct=0), "2..8 options"),
    (dict(options=("a", "b"), feedback=("x",), correct=0), "one feedback per option"),
    (dict(options=("a", "b"), feedback=("x", "y"), correct=2), "out of range"),
])
def test_malformed_quiz_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Quiz(id="bad", lesson="x", question="?", **kwargs)
