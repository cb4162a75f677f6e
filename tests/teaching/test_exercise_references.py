"""What the exercises' judges compute (fisher_ref.teaching.exercise_references): the
open-ended exercise's judge reads its conditions; the references of the others are held
to every solution and mistake in tests/teaching/test_exercises.py."""
import numpy as np

import fisher_ref.teaching.exercise_references as references
from fisher_ref.teaching.exercises import EXERCISES


def test_anti_aligned_judge_reads_its_conditions():
    """The open-ended exercise: the judge refuses inputs that are not a distribution."""
    judge = EXERCISES["anti-aligned"].judge
    assert judge is references.anti_aligned
    assert judge((np.array([0.5, 0.6]), np.array([1.0, 0.0])), {})[0] is False
    assert judge((np.array([0.5, 0.5]), np.array([1.0, 1.0])), {})[0] is False  # f_unif = 0
    ok, why = judge((np.array([0.9, 0.05, 0.05]), np.array([2.0, 0.0, 0.0])), {})
    assert ok and "alignment factor" in why
