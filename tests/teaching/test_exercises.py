"""Exercises: every solution runs and is accepted, every recorded mistake is rejected, and
every exercise sits in exactly one notebook with its collapsed solution."""
import doctest
import re
from pathlib import Path

import nbformat
import pytest

import fisher_ref.teaching.exercises as exercises
from fisher_ref.teaching.exercises import EXERCISES, check_exercise

LESSONS = Path(__file__).resolve().parents[2] / "lessons"


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


def test_unknown_exercise_names_the_known_ones():
    with pytest.raises(KeyError, match="count-params"):
        check_exercise("no-such-exercise", 1)


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


def test_exercise_docstring_examples():
    res = doctest.testmod(exercises, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0 and res.failed == 0
