"""Generate the lesson notebooks from the cells below (the single source of truth).

    python lessons/build.py          # write lessons/*.ipynb and docs/sharp_bits.md
    python lessons/build.py --check  # exit 1 if any of them differs

The cells of each notebook are data in ``lessons/lesson_cells/lNN.py``: a list of
``(kind, source)`` pairs, kind ``"md"``, ``"code"`` or ``"checks"`` (a code cell holding the
lesson's asserts, tagged ``hide-input`` and collapsed, so the docs site and JupyterLab keep
it out of the reader's way while the test suite still runs it). Cell ids are
``<lesson number>-<cell number>`` so regenerating is byte-stable. Quizzes come
from :mod:`fisher_ref.teaching.quizzes`, exercises from :mod:`fisher_ref.teaching.exercises` (of
this checkout: the repository root goes first on ``sys.path``).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # this checkout's fisher_ref, not an installed one
from lesson_cells import LESSONS  # noqa: E402  (one module of cells per lesson)

#: The tag of each lesson's cell of asserts (myst-nb and Jupyter Book collapse its input).
CHECKS_TAG = "hide-input"
#: The widest line a lesson may print: what an output block of the documentation site shows
#: at 1280 px without scrolling sideways. The tests execute every lesson and apply
#: :func:`wide_output` to the result.
MAX_PRINTED = 88


def wide_output(nb, limit=MAX_PRINTED):
    """The printed lines of an executed notebook ``nb`` wider than ``limit`` characters.

    Returns:
        a list of ``(cell id, line)`` pairs, over every stream output (``print``) of every
        code cell.
    """
    return [(cell.get("id"), line) for cell in nb.cells if cell.cell_type == "code"
            for out in cell.get("outputs", []) if out.get("output_type") == "stream"
            for line in out.get("text", "").splitlines() if len(line) > limit]


def build(stem):
    """The notebook ``stem`` as an :class:`nbformat.NotebookNode` (no outputs)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    number = stem.split("_", 1)[0]
    for k, (kind, src) in enumerate(LESSONS[stem], start=1):
        make = nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell
        cell = make(src)
        if kind == "checks":
            cell.metadata = {"tags": [CHECKS_TAG], "jupyter": {"source_hidden": True}}
        cell.id = f"{number}-{k:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


#: The note under each quiz on the documentation site, saying what the page above it shows:
#: buttons where jupyterquiz was installed for the build (the ``docs`` extra has it), text
#: otherwise.
QUIZ_NOTES = {
    True: "Click an option of the quiz above to see its feedback. In JupyterLab "
          "(`jupyter lab lessons/`) you can also set `answer` to a letter in the cell above and "
          "run it: `check` explains the option you chose. On this page that cell ran unanswered.",
    False: "This build shows the quiz as text. In JupyterLab (`jupyter lab lessons/`), set "
           "`answer` to a letter in the cell above and run it: `check` explains the option "
           "you chose. On this page that cell ran unanswered.",
}


def quiz_id(cell):
    """The id of the quiz whose answer cell ``cell`` is (``check("id", answer)``), or None."""
    m = re.search(r'check\("([^"]+)", answer\)', cell.source) if cell.cell_type == "code" else None
    return m.group(1) if m else None


def take_home(stem):
    """The Markdown the site adds under a lesson's first cell: a download of the notebook and
    the line that opens it in JupyterLab."""
    return (f"```{{admonition}} Take this lesson home\n"
            f"{{download}}`Download the notebook <../../lessons/{stem}.ipynb>` (stored "
            f"without outputs), or run it from a clone of the repository:\n\n"
            f"    pip install -e \".[lessons]\"\n    jupyter lab lessons/{stem}.ipynb\n```")


def site_notebook(stem, clickable):
    """The documentation site's copy of lesson ``stem`` (an :class:`nbformat.NotebookNode`).

    The stored notebook, plus: a take-home cell after the first (:func:`take_home`); after
    each quiz's answer cell a note (:data:`QUIZ_NOTES`, for a build whose quizzes are
    ``clickable`` or not) under a target ``refute-<quiz id>`` that other pages link to; and
    links into the repository's ``docs/`` rewritten for the copy's place, ``docs/lessons/``.
    """
    nb = build(stem)
    cells = []
    for k, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            cell.source = cell.source.replace("](../docs/", "](../")
        cells.append(cell)
        if k == 0:
            extra = nbformat.v4.new_markdown_cell(take_home(stem))
            extra.id = f"{cell.id}-home"
            cells.append(extra)
        qid = quiz_id(cell)
        if qid:
            note = nbformat.v4.new_markdown_cell(
                f"(refute-{qid})=\n```{{note}}\n{QUIZ_NOTES[clickable]}\n```")
            note.id = f"{cell.id}-note"
            cells.append(note)
    nb.cells = cells
    return nb


SHARP_BITS = HERE.parent / "docs" / "sharp_bits.md"


def sharp_bits():
    """The text of ``docs/sharp_bits.md``: every wrong option of every quiz, the belief it
    stands for, with the quiz's feedback on it and a link to the lesson cell that refutes it
    (the target :func:`site_notebook` puts right after the quiz, above the computation that
    answers it)."""
    from lesson_cells._cells import PATH
    from fisher_ref.teaching.quizzes import quizzes_for
    out = ["# Sharp bits: what the quizzes catch", "",
           "Each quiz of the lessons asks a question whose wrong options are beliefs that sound "
           "right. Here they are, lesson by lesson: the belief, why it is wrong (the quiz's "
           "feedback), and a link to the place in the lesson where the cells that follow the "
           "quiz compute the answer. The page is generated from the quizzes by "
           "`python lessons/build.py` (a test fails when it drifts from them).", ""]
    for k, (stem, title) in enumerate(PATH):
        quizzes = quizzes_for(stem)
        if not quizzes:
            continue
        out += [f"## Lesson {k}. {title}", ""]
        for q in quizzes:
            out += [f"**{q.question}** ({{ref}}`the cells that answer it <refute-{q.id}>`, quiz "
                    f"`{q.id}`)", ""]
            for i, (option, feedback) in enumerate(zip(q.options, q.feedback)):
                if i != q.correct:
                    out.append(f"- *Belief:* {option} {feedback}")
            out += ["", f"*What holds:* {q.options[q.correct]}", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def render(stem):
    """The exact text written to ``lessons/<stem>.ipynb``."""
    return nbformat.writes(build(stem)) + "\n"


def main(argv):
    check_only = "--check" in argv
    stale = []
    for stem in LESSONS:
        path = HERE / f"{stem}.ipynb"
        text = render(stem)
        if check_only:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(HERE.parent)}")
    text = sharp_bits()
    if check_only:
        if not SHARP_BITS.exists() or SHARP_BITS.read_text() != text:
            stale.append("docs/sharp_bits.md")
    else:
        SHARP_BITS.write_text(text)
        print("wrote docs/sharp_bits.md")
    if stale:
        print("stale (run python lessons/build.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
