"""The exercises as data (fisher_ref.teaching.exercise_bank): one registry, every lesson
with at least two exercises. tests/teaching/test_exercises.py runs every solution and
mistake through the checker."""
import fisher_ref.teaching.exercises as exercises
from fisher_ref.teaching.exercise_bank import EXERCISES

STEMS = ["00_start_here", "01_sequence_to_tokens", "02_pairwise_differences",
         "03_where_mass_lands", "04_gradient_is_covariance", "05_offpolicy_centering",
         "06_monte_carlo", "07_transformer", "08_rl_estimators"]


def test_every_lesson_has_at_least_two_exercises():
    for stem in STEMS:
        assert len(exercises.exercises_for(stem)) >= 2, stem
    assert {e.lesson for e in EXERCISES.values()} == set(STEMS)
