"""How the lessons teach: quizzes before their answers and not guessable by length, exercises
with targeted feedback and a reason, asserts out of the reader's way, cells that fit, one
notation table, clickable quizzes that keep ``import fisher_ref`` light."""
import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest

import fisher_ref.teaching.exercises as exercises
import fisher_ref.teaching.quizzes as quizzes
from fisher_ref.teaching.exercises import EXERCISES, check_exercise
from fisher_ref.teaching.quizzes import LETTERS, QUIZZES, check

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ROOT / "lessons"
STEMS = sorted(p.stem for p in LESSONS.glob("*.ipynb"))
MAX_LINE = 88        # characters a code block of the documentation site (and a JupyterLab
#                      cell) shows without scrolling sideways
MAX_CELL_LINES = 30  # a code cell is one idea; exercise cells (setup + blank) excepted


def _load(rel, name):
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BUILD = _load("lessons/build.py", "lessons_build_pedagogy")


def _cells(stem):
    return nbformat.read(LESSONS / f"{stem}.ipynb", as_version=4).cells


def _code(stem):
    return [c for c in _cells(stem) if c.cell_type == "code"]


def _is_checks(cell):
    return BUILD.CHECKS_TAG in cell.metadata.get("tags", [])


def _is_exercise(cell):
    return "check_exercise(" in cell.source and "import numpy" in cell.source


# --------------------------------------------------------------------------- rendering

def too_long(text, limit=MAX_LINE):
    """The lines of ``text`` longer than ``limit`` characters."""
    return [line for line in text.splitlines() if len(line) > limit]


def test_too_long_finds_a_long_line_and_a_wide_table():
    assert too_long("x = 1\n" + "y" * 89) == ["y" * 89] and not too_long("y" * 88)
    table = "\n".join("  ".join(f"{k:>20}" for k in range(6)) for _ in range(3))  # 130 wide
    assert len(too_long(table)) == 3 and too_long("a | b\n1 | 2") == []


@pytest.mark.parametrize("stem", STEMS)
def test_code_lines_fit_a_cell(stem):
    for cell in _code(stem):
        assert not too_long(cell.source), (stem, cell.id, too_long(cell.source))


@pytest.mark.parametrize("stem", STEMS)
def test_solution_code_fits_a_block(stem):
    """The collapsed solutions hold their code in ```python blocks: those lines fit too."""
    for cell in _cells(stem):
        if cell.cell_type == "markdown":
            for block in re.findall(r"```python\n(.*?)```", cell.source, flags=re.S):
                assert not too_long(block), (stem, cell.id, too_long(block))


@pytest.mark.parametrize("stem", STEMS)
def test_code_cells_are_short(stem):
    for cell in _code(stem):
        if not (_is_exercise(cell) or _is_checks(cell)):
            n = len(cell.source.splitlines())
            assert n <= MAX_CELL_LINES, (stem, cell.id, n)


@pytest.mark.parametrize("stem", STEMS)
def test_markdown_has_no_escaped_quotes(stem):
    """A raw string holding \\" renders as a literal backslash and quote."""
    for cell in _cells(stem):
        if cell.cell_type == "markdown":
            assert '\\"' not in cell.source, (stem, cell.id)


# --------------------------------------------------------------------------- asserts

@pytest.mark.parametrize("stem", STEMS)
def test_asserts_sit_in_one_collapsed_cell_after_the_computations(stem):
    code = _code(stem)
    tagged = [c for c in code if _is_checks(c)]
    if stem == "00_start_here":
        assert len(tagged) <= 1
    else:
        assert len(tagged) == 1, stem
    for cell in tagged:
        assert cell.metadata["jupyter"]["source_hidden"] is True
        after = code[code.index(cell) + 1:]
        assert all(_is_exercise(c) for c in after), "only exercises follow the checks"
        assert cell.source.count("assert ") >= 3
    for cell in code:
        if not _is_checks(cell):
            assert not re.search(r"^\s*assert\b", cell.source, flags=re.M), (stem, cell.id)


# --------------------------------------------------------------------------- quizzes

def longest_is_correct(quiz):
    """True when the correct option is (one of) the longest."""
    lengths = [len(o) for o in quiz.options]
    return lengths[quiz.correct] == max(lengths)


def test_longest_option_is_right_in_at_most_a_third_of_the_quizzes():
    rigged = [q.id for q in QUIZZES.values() if longest_is_correct(q)]
    assert 3 * len(rigged) <= len(QUIZZES), rigged


def test_longest_is_correct_can_fail():
    q = quizzes.Quiz("x", "y", "?", ("short", "the longest option"), 1, ("a", "b"))
    assert longest_is_correct(q) and not longest_is_correct(q.__class__(
        "x", "y", "?", ("short", "the longest option"), 0, ("a", "b")))


#: Words that soften a claim. An option that alone carries one reads as the careful, hence
#: right, answer ("Usually ...", "Mostly ..."): a form cue, like length.
HEDGES = re.compile(r"\b(usually|mostly|often|generally|typically|roughly|approximately|"
                    r"nearly|almost|largely|mainly|may|might|in general|on average|"
                    r"in expectation|tends? to|sometimes)\b", re.I)


def length_place(quiz):
    """``"longest"``, ``"shortest"`` or ``"middle"``: where the right option's length falls
    among the options (a tie for the longest or shortest counts as that end)."""
    lengths = [len(o) for o in quiz.options]
    right = lengths[quiz.correct]
    return ("longest" if right == max(lengths) else
            "shortest" if right == min(lengths) else "middle")


def quiz_form_cues(quizzes):
    """What lets a learner guess the right option from its form alone, across ``quizzes``:
    the right option always (or never) the longest, always (or never) the shortest (the
    share at each end must lie between 1/8 and 1/3), or a right option that is the only
    hedged one of its quiz. A list of sentences; empty when there is no cue."""
    quizzes = list(quizzes)
    places = [length_place(q) for q in quizzes]
    cues = []
    for end in ("longest", "shortest"):
        share = places.count(end) / len(quizzes)
        if not 1 / 8 <= share <= 1 / 3:
            cues.append(f"the right option is the {end} in {places.count(end)} of "
                        f"{len(quizzes)} quizzes (wanted between 1/8 and 1/3)")
    for q in quizzes:
        hedged = [bool(HEDGES.search(o)) for o in q.options]
        if hedged[q.correct] and sum(hedged) == 1:
            cues.append(f"{q.id}: the right option is the only hedged one "
                        f"({HEDGES.search(q.options[q.correct]).group(0)!r})")
    return cues


def test_quizzes_give_no_form_cue():
    assert not quiz_form_cues(QUIZZES.values()), quiz_form_cues(QUIZZES.values())


def _quiz(k, options, correct):
    return quizzes.Quiz(f"q{k}", "x", "?", tuple(options), correct, ("f",) * len(options))


def test_quiz_form_cues_finds_a_length_rank_that_never_varies_and_a_lone_hedge():
    # the right option never the longest (as in the bank before this lint: 0 of 22)
    never_longest = [_quiz(k, ["a" * 30, "b" * 20, "c" * 10, "d" * 25], k % 3 + 1)
                     for k in range(12)]
    cues = quiz_form_cues(never_longest)
    assert any("the longest in 0 of 12" in c for c in cues)
    always_longest = [_quiz(k, ["a" * 30, "b" * 20, "c" * 10], 0) for k in range(8)]
    assert any("the longest in 8 of 8" in c for c in quiz_form_cues(always_longest))
    spread = [_quiz(k, ["a" * 30, "b" * 20, "c" * 10, "d" * 25], k % 4) for k in range(12)]
    assert not quiz_form_cues(spread)
    lone = _quiz(99, ["Usually non-zero.", "Exactly zero.", "Always one."], 0)
    assert quiz_form_cues(spread + [lone])[-1].startswith("q99: the right option is the only")
    both = _quiz(98, ["Usually non-zero.", "Mostly zero.", "Always one."], 0)
    assert not quiz_form_cues(spread + [both])


@pytest.mark.parametrize("stem", STEMS)
def test_every_quiz_comes_before_a_computation(stem):
    """Predict, then reveal: after each quiz's check cell there is code that computes."""
    code = _code(stem)
    for k, cell in enumerate(code):
        m = re.search(r'check\("([^"]+)", answer\)', cell.source)
        if m:
            later = [c for c in code[k + 1:] if not (_is_exercise(c) or _is_checks(c)
                                                     or c.source.startswith("show("))]
            assert later, f"{stem}: quiz {m.group(1)} comes after every computation"


def test_check_does_not_echo_in_a_notebook(monkeypatch, capsys):
    """In a kernel check() and check_exercise() show feedback and return None, so no bare
    True/False is printed under it; outside a kernel they return the verdict."""
    shown = []
    monkeypatch.setattr(quizzes, "in_notebook", lambda: True)
    monkeypatch.setattr(exercises, "in_notebook", lambda: True)
    monkeypatch.setattr(quizzes, "emit", lambda md, text: shown.append(md))
    monkeypatch.setattr(exercises, "emit", lambda md, text: shown.append(md))
    q = QUIZZES["se-scaling"]
    assert check("se-scaling", LETTERS[q.correct]) is None
    assert check_exercise("count-params", 1044) is None and len(shown) == 2
    monkeypatch.undo()
    assert check("se-scaling", LETTERS[q.correct]) is True


def test_as_jupyterquiz_keeps_letters_feedback_and_maths():
    q = QUIZZES["seq-to-token"]
    (item,) = quizzes.as_jupyterquiz("seq-to-token")
    assert item["type"] == "multiple_choice" and len(item["answers"]) == len(q.options)
    assert [a["correct"] for a in item["answers"]] == [k == q.correct for k in range(4)]
    assert all(a["answer"].startswith(f"{LETTERS[k]}. ") for k, a in enumerate(item["answers"]))
    assert "u&lt;t" in item["answers"][q.correct]["feedback"]  # '<' escaped
    assert "<code>" in quizzes.as_jupyterquiz("window")[0]["question"]


@pytest.mark.parametrize("quiz_id", list(QUIZZES))
def test_clickable_quiz_holds_no_raw_latex(quiz_id):
    """JupyterLab 4 gives jupyterquiz no global MathJax: the buttons get HTML, not LaTeX."""
    (item,) = quizzes.as_jupyterquiz(quiz_id)
    texts = [item["question"]] + [a[k] for a in item["answers"] for k in ("answer", "feedback")]
    for text in texts:
        assert "$" not in text and "\\" not in text and "^" not in text, (quiz_id, text)
        assert "_" not in re.sub(r"<[^>]+>", "", text) or "`" in text, (quiz_id, text)
        prose = re.sub(r"<code>.*?</code>", "", text)
        assert not re.search(r"sqrt|frac|mathrm", prose), (quiz_id, text)  # a command lost its \\


def test_show_uses_jupyterquiz_in_a_notebook(monkeypatch):
    """Clickable where jupyterquiz is importable (answers in order, so letters match check())."""
    calls, shown = [], []
    fake = types.ModuleType("jupyterquiz")
    fake.display_quiz = lambda ref, **kw: calls.append((ref, kw))
    monkeypatch.setitem(sys.modules, "jupyterquiz", fake)
    monkeypatch.setattr(quizzes, "in_notebook", lambda: True)
    monkeypatch.setattr(quizzes, "emit", lambda md, text: shown.append(md))
    quizzes.show("tea-coffee")
    assert calls == [(quizzes.as_jupyterquiz("tea-coffee"), {"shuffle_answers": False})]
    assert 'check("tea-coffee", "A")' in shown[0]
    monkeypatch.setitem(sys.modules, "jupyterquiz", None)  # not installed: Markdown fallback
    quizzes.show("tea-coffee")
    assert len(calls) == 1 and QUIZZES["tea-coffee"].question in shown[-1]


def test_import_fisher_ref_stays_light():
    code = ("import sys, fisher_ref, fisher_ref.teaching.quizzes; "
            "print('jupyterquiz' in sys.modules, 'IPython' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.split()
    assert out == ["False", "False"]


# --------------------------------------------------------------------------- exercises

@pytest.mark.parametrize("ex_id", list(EXERCISES))
def test_exercise_says_why_and_records_two_mistakes(ex_id):
    ex = EXERCISES[ex_id]
    assert len(ex.why.split()) >= 12 and ex.why in exercises.solution_markdown(ex_id)
    assert len(ex.mistakes) >= 2
    assert len({m.feedback for m in ex.mistakes}) == len(ex.mistakes)


@pytest.mark.parametrize("ex_id", list(EXERCISES))
def test_each_mistake_gets_its_own_feedback(ex_id, capsys):
    ex = EXERCISES[ex_id]
    for mistake, value in zip(ex.mistakes, exercises.mistake_values(ex_id)):
        assert check_exercise(ex_id, value) is False
        out = capsys.readouterr().out
        assert mistake.feedback in out, (ex_id, mistake.code)
        others = [m.feedback for m in ex.mistakes if m is not mistake]
        assert not any(f in out for f in others)


def test_an_unrecorded_wrong_answer_gets_no_mistake_feedback(capsys):
    assert check_exercise("count-params", 7) is False
    out = capsys.readouterr().out
    assert "Likely cause" not in out and "not yet" in out


# --------------------------------------------------------------------------- notation

def _table_rows(text):
    """The ``| symbol | meaning | lessons |`` rows of the notation table in ``text``."""
    start = text.index("| symbol | meaning | lessons |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line.strip())
    return rows


def test_one_notation_table_in_lesson_0_and_the_theory_page():
    lesson = "\n".join(c.source for c in _cells("00_start_here") if c.cell_type == "markdown")
    theory = (ROOT / "docs" / "theory.md").read_text()
    rows = _table_rows(lesson)
    assert rows and rows == _table_rows(theory)
    symbols = [r.split("|")[1].strip() for r in rows]
    assert len(set(symbols)) == len(symbols), "a symbol listed twice"


def test_compact_table_fits_a_cell_and_uses_the_lessons_symbols():
    """lesson 7 prints verify's rows with compact_table: every line within a cell, every row
    there, and the reach written rho(s) (the lessons keep pi for a permutation)."""
    from fisher_ref import exact, load_config
    from fisher_ref.checks.identities import exact_checks
    from fisher_ref.teaching.views import compact_table

    rows = exact_checks(exact(load_config("offpolicy_stale"), progress=False))
    text = compact_table(rows)
    assert not too_long(text) and len(text.splitlines()) >= 2 + len(rows)
    assert "pi(s)" not in text and "rho(s)" in text and "f(j + c)" not in text
    assert sum(line.endswith(("PASS", "FAIL", "info")) for line in text.splitlines()) == len(rows)


def broken_table_rows(markdown):
    """Markdown table rows with a ``|`` inside ``$...$`` (it splits the cell, breaking the
    table): some cell then holds an odd number of dollar signs."""
    rows = [line for line in markdown.splitlines() if line.startswith("|")]
    return [row for row in rows
            if any(cell.count("$") % 2 for cell in re.split(r"(?<!\\)\|", row.strip("| ")))]


def test_broken_table_rows_finds_a_bar_inside_maths():
    assert broken_table_rows("| a | $|G|$ |") and not broken_table_rows(r"| a | $\lvert G \rvert$ |")


@pytest.mark.parametrize("stem", STEMS)
def test_markdown_tables_keep_their_columns(stem):
    for cell in _cells(stem):
        if cell.cell_type == "markdown":
            assert not broken_table_rows(cell.source), (stem, cell.id)
