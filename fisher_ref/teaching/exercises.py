"""Lesson exercises: judging an answer, and the cells a notebook shows. The exercises (a prompt,
the code that builds the inputs, a checker, a solution) are data in
:mod:`fisher_ref.teaching.exercise_bank`.

A notebook shows an exercise as three cells: the prompt, a code cell that runs the
``setup`` and ends with ``check_exercise(id, answer)``, and a collapsed solution that
says why it is right::

    x = None  # your code here
    check_exercise("pairwise-by-broadcasting", x)

The checker reruns the setup in a fresh namespace (so editing the inputs cannot
fool it), computes the expected answer with fisher_ref by its own route, and
judges the learner's value; a wrong value that matches one of the exercise's
recorded mistakes gets that mistake's feedback. ``tests/teaching/test_exercises.py``
runs every solution and proves the checker accepts it and rejects every mistake
with its own feedback.
"""
from __future__ import annotations

from fisher_ref.teaching.exercise import Exercise, matches
from fisher_ref.teaching.exercise_bank import EXERCISES
from fisher_ref.teaching.quizzes import emit, in_notebook

__all__ = ["Exercise", "EXERCISES", "get", "exercises_for", "check_exercise", "solution",
           "solution_markdown", "cell_code"]


_NAMESPACES = {}
_MISTAKE_VALUES = {}


def get(ex_id):
    """The :class:`Exercise` with this id (``KeyError`` naming the known ids otherwise)."""
    try:
        return EXERCISES[ex_id]
    except KeyError:
        raise KeyError(f"unknown exercise id {ex_id!r}; known: {', '.join(EXERCISES)}") from None


def exercises_for(lesson):
    """The exercises of one lesson (notebook stem), in order."""
    return [e for e in EXERCISES.values() if e.lesson == lesson]


def setup_namespace(ex_id):
    """The variables the exercise's setup defines (run once, in a fresh namespace)."""
    if ex_id not in _NAMESPACES:
        ns = {}
        exec(compile(get(ex_id).setup, f"<exercise {ex_id} setup>", "exec"), ns)
        _NAMESPACES[ex_id] = ns
    return _NAMESPACES[ex_id]


def mistake_values(ex_id):
    """The answer each recorded mistake gives (run on a copy of the setup's variables)."""
    if ex_id not in _MISTAKE_VALUES:
        ex = get(ex_id)
        values = []
        for k, mistake in enumerate(ex.mistakes):
            ns = dict(setup_namespace(ex_id))
            exec(compile(mistake.code, f"<exercise {ex_id} mistake {k}>", "exec"), ns)
            values.append(ns[ex.answer])
        _MISTAKE_VALUES[ex_id] = values
    return _MISTAKE_VALUES[ex_id]


def feedback(ex_id, value):
    """``(ok, message)`` for an answer: the judge's verdict, and for a wrong answer that is
    one of the recorded mistakes, that mistake's feedback."""
    ex = get(ex_id)
    ok, why = ex.judge(value, setup_namespace(ex_id))
    if not ok:
        for mistake, wrong in zip(ex.mistakes, mistake_values(ex_id)):
            if matches(value, wrong):
                return False, f"{why}. Likely cause: {mistake.feedback}"
    return bool(ok), why


def check_exercise(ex_id, value):
    """Judge an answer and show why.

    Returns ``True``/``False``, or ``None`` while ``value`` is ``None`` (not tried yet).
    Inside a notebook it returns ``None`` always, so the cell shows the feedback and not a
    bare ``True``/``False`` under it.

    Example:
        >>> check_exercise("count-params", None)
        count-params: not tried yet -- set `n_params` and run the cell again.
        >>> check_exercise("count-params", 1044)
        count-params: right -- largest difference from the reference 0.0e+00 (tolerance 0.0e+00)
        True
    """
    ex = get(ex_id)
    if value is None:
        print(f"{ex.id}: not tried yet -- set `{ex.answer}` and run the cell again.")
        return None
    ok, why = feedback(ex_id, value)
    verdict = "right" if ok else "not yet"
    tail = "" if ok else " (the solution is in the collapsed cell below)"
    emit(f"**{ex.id}**: {verdict} -- {why}{tail}", f"{ex.id}: {verdict} -- {why}{tail}")
    return None if in_notebook() else ok


def solution(ex_id):
    """Print the solution code and why it is right."""
    ex = get(ex_id)
    print(f"{ex.solution}\n\n# why: {ex.why}")


def cell_code(ex_id):
    """The notebook's code cell: the setup, a blank answer, the check."""
    ex = get(ex_id)
    return (f"{ex.setup}\n\n# your code here: set `{ex.answer}`\n{ex.answer} = None\n"
            f"check_exercise(\"{ex.id}\", {ex.answer})")


def solution_markdown(ex_id):
    """A collapsed (HTML ``<details>``) Markdown block holding the solution and its reason."""
    ex = get(ex_id)
    return (f"<details><summary>Solution to <code>{ex.id}</code> (click to open)</summary>\n\n"
            f"```python\n{ex.solution}\n```\n\n**Why.** {ex.why}\n\n</details>")
