"""Lesson 7's exercises (fisher_ref.teaching.exercises_transformer) join the one registry;
tests/teaching/test_exercises.py runs their solutions and mistakes with every other's."""
import fisher_ref.teaching.exercises as exercises
import fisher_ref.teaching.exercises_transformer as exercises_transformer
from fisher_ref.teaching.exercises import EXERCISES


def test_one_registry_holds_the_transformer_exercises():
    """Lesson 7's exercises live in their own module and are found through the one registry."""
    ids = [e.id for e in exercises_transformer.TRANSFORMER_EXERCISES]
    assert ids and all(EXERCISES[i] is e for i, e in
                       zip(ids, exercises_transformer.TRANSFORMER_EXERCISES))
    assert [e.id for e in exercises.exercises_for("07_transformer")] == ids
