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


# The five slips a learner working lessons 0, 1, 4, 5 and 8 made, each recorded as a
# mistake whose feedback names it (the checker answered them with only "largest difference").
SLIPS = [
    ("b2-moves-logits", "/ 1e-6", "a central difference spans two steps"),
    ("second-token-square", "XI[:, 2, i]", "positions count from 0"),
    ("raw-score-mean", "J.mean(axis=1)", "the plain mean"),
    ("overlap-spread", "np.argsort(F)[:n]", "sorts in increasing order, so both"),
    ("difficulty-weight-by-hand", "(R[0] - R.mean())\n", "GRPO normalises each advantage"),
]


def test_the_five_slips_are_recorded_with_targeted_feedback(capsys):
    for ex_id, code, phrase in SLIPS:
        ex = EXERCISES[ex_id]
        (k,) = [k for k, m in enumerate(ex.mistakes) if code in m.code + "\n"]
        mistake, value = ex.mistakes[k], exercises.mistake_values(ex_id)[k]
        assert phrase in mistake.feedback
        assert exercises.check_exercise(ex_id, value) is False
        out = capsys.readouterr().out
        assert f"Likely cause: {mistake.feedback}" in out, (ex_id, out)


def test_a_sign_flip_and_a_factor_of_2_are_named_without_a_recorded_mistake(capsys):
    ns = exercises.setup_namespace("raw-score-mean")
    assert exercises.check_exercise("raw-score-mean", -2 * (ns["J"] @ (ns["mu"] - ns["p"]))) is False
    assert "off by a factor of 2 and the sign is flipped" in capsys.readouterr().out
    ns = exercises.setup_namespace("pairwise-by-broadcasting")
    from fisher_ref.numerics import token_fisher
    assert exercises.check_exercise("pairwise-by-broadcasting",
                                    -token_fisher(ns["p"], ns["J"])) is False
    assert "the sign is flipped" in capsys.readouterr().out
