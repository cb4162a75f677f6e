"""Exercises: every solution runs and is accepted, every recorded mistake is rejected, and
every exercise sits in exactly one notebook with its collapsed solution."""
import doctest
import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

import fisher_ref.teaching.exercises as exercises
import fisher_ref.teaching.exercises_transformer as exercises_transformer
import fisher_ref.teaching.exercise as judging
from fisher_ref.teaching.exercises import EXERCISES, check_exercise

LESSONS = Path(__file__).resolve().parents[2] / "lessons"
STEMS = ["00_start_here", "01_sequence_to_tokens", "02_pairwise_differences",
         "03_where_mass_lands", "04_gradient_is_covariance", "05_offpolicy_centering",
         "06_monte_carlo", "07_transformer", "08_rl_estimators"]


def run(code_parts):
    """Execute the code parts, in order, in one fresh namespace."""
    ns = {}
    for code in code_parts:
        exec(compile(code, "<exercise>", "exec"), ns)
    return ns


@pytest.mark.parametrize("ex_id", list(EXERCISES))
def test_solution_is_accepted(ex_id, capsys):
    ex = EXERCISES[ex_id]
    ns = run([ex.setup, ex.solution])
    assert check_exercise(ex_id, ns[ex.answer]) is True
    assert "right" in capsys.readouterr().out


@pytest.mark.parametrize("ex_id", list(EXERCISES))
def test_mistake_is_rejected(ex_id, capsys):
    ex = EXERCISES[ex_id]
    for mistake in ex.mistakes:
        ns = run([ex.setup, mistake.code])
        assert check_exercise(ex_id, ns[ex.answer]) is False
        out = capsys.readouterr().out
        assert "not yet" in out and "solution" in out and mistake.feedback in out


@pytest.mark.parametrize("ex_id", list(EXERCISES))
def test_nonsense_is_rejected_and_none_is_not_tried(ex_id, capsys):
    assert check_exercise(ex_id, "forty-two") is False
    assert check_exercise(ex_id, None) is None
    assert "not tried yet" in capsys.readouterr().out


def test_edited_inputs_cannot_fool_the_checker():
    """The checker reruns the setup; a learner who changes the inputs is judged on the originals."""
    ex = EXERCISES["pairwise-by-broadcasting"]
    ns = run([ex.setup, "p = np.full(6, 1 / 6)", ex.solution])
    assert check_exercise(ex.id, ns["f"]) is False


def test_anti_aligned_judge_reads_its_conditions():
    """The open-ended exercise: the judge refuses inputs that are not a distribution."""
    judge = EXERCISES["anti-aligned"].judge
    assert judge((np.array([0.5, 0.6]), np.array([1.0, 0.0])), {})[0] is False
    assert judge((np.array([0.5, 0.5]), np.array([1.0, 1.0])), {})[0] is False  # f_unif = 0
    ok, why = judge((np.array([0.9, 0.05, 0.05]), np.array([2.0, 0.0, 0.0])), {})
    assert ok and "alignment factor" in why


def test_unknown_exercise_names_the_known_ones():
    with pytest.raises(KeyError, match="count-params"):
        check_exercise("no-such-exercise", 1)


def test_every_lesson_has_at_least_two_exercises():
    for stem in STEMS:
        assert len(exercises.exercises_for(stem)) >= 2, stem
    assert {e.lesson for e in EXERCISES.values()} == set(STEMS)


def test_every_exercise_sits_in_one_notebook_with_its_solution():
    cells = {}
    for path in sorted(LESSONS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cells[path.stem] = nb.cells
    for ex in EXERCISES.values():
        where = [stem for stem, cs in cells.items()
                 if any(c.cell_type == "code" and f'check_exercise("{ex.id}"' in c.source
                        for c in cs)]
        assert where == [ex.lesson], (ex.id, where)
        cs = cells[ex.lesson]
        k = next(n for n, c in enumerate(cs) if c.cell_type == "code"
                 and f'check_exercise("{ex.id}"' in c.source)
        assert cs[k].source == exercises.cell_code(ex.id)
        assert cs[k - 1].cell_type == "markdown" and ex.prompt in cs[k - 1].source
        assert cs[k + 1].cell_type == "markdown"
        assert cs[k + 1].source == exercises.solution_markdown(ex.id)
        assert re.search(r"<details>.*</details>", cs[k + 1].source, flags=re.S)


def test_solution_prints(capsys):
    exercises.solution("count-params")
    assert "n_params =" in capsys.readouterr().out


@pytest.mark.parametrize("module", [exercises, judging])
def test_exercise_docstring_examples(module):
    res = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0 and res.failed == 0


def test_one_registry_holds_the_transformer_exercises():
    """Lesson 7's exercises live in their own module and are found through the one registry."""
    ids = [e.id for e in exercises_transformer.TRANSFORMER_EXERCISES]
    assert ids and all(EXERCISES[i] is e for i, e in
                       zip(ids, exercises_transformer.TRANSFORMER_EXERCISES))
    assert [e.id for e in exercises.exercises_for("07_transformer")] == ids
