"""Generate the lesson notebooks from the cells below (the single source of truth).

    python lessons/build.py          # write lessons/*.ipynb
    python lessons/build.py --check  # exit 1 if any stored notebook differs

The cells of each notebook are data in ``lessons/lesson_cells/lNN.py``: a list of
``(kind, source)`` pairs, kind ``"md"``, ``"code"`` or ``"checks"`` (a code cell holding the
lesson's asserts, tagged ``hide-input`` and collapsed, so the docs site and JupyterLab keep
it out of the reader's way while the test suite still runs it). Cell ids are
``<lesson number>-<cell number>`` so regenerating is byte-stable. Quizzes come
from :mod:`fisher_ref.teaching.quizzes`, exercises from :mod:`fisher_ref.teaching.exercises` (of
this checkout: the repository root goes first on ``sys.path``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # this checkout's fisher_ref, not an installed one
from lesson_cells import LESSONS  # noqa: E402  (one module of cells per lesson)

#: The tag of each lesson's cell of asserts (myst-nb and Jupyter Book collapse its input).
CHECKS_TAG = "hide-input"


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
    if stale:
        print("stale notebooks (run python lessons/build.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
