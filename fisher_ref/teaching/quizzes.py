"""Lesson quizzes: showing one and checking an answer. The questions (question, options,
the correct one, feedback per option) are data in :mod:`fisher_ref.teaching.quiz_bank`.

A notebook shows a quiz with :func:`show` *before* the cell that computes its answer, and
answers it either by clicking (in JupyterLab and on the documentation site, through the
optional package ``jupyterquiz``) or with :func:`check`, which works anywhere::

    show("seq-to-token")
    answer = None  # put your letter here, e.g. "B"
    check("seq-to-token", answer)

``tests/teaching/test_quizzes.py`` proves every correct answer with a computation from
fisher_ref, so a quiz cannot drift from the code; ``tests/teaching/test_pedagogy.py`` checks
that the right option's form gives it away nowhere: it is the longest in between an eighth
and a third of the quizzes, the shortest likewise, and never the only hedged option.
"""
from __future__ import annotations

import html
import re

from fisher_ref.teaching.quiz_bank import LETTERS, QUIZZES, Quiz

__all__ = ["Quiz", "QUIZZES", "get", "quizzes_for", "render_text", "render_html", "show",
           "check", "emit", "in_notebook", "as_jupyterquiz", "LETTERS"]


def get(quiz_id):
    """The :class:`Quiz` with this id (``KeyError`` naming the known ids otherwise)."""
    try:
        return QUIZZES[quiz_id]
    except KeyError:
        raise KeyError(f"unknown quiz id {quiz_id!r}; known: {', '.join(QUIZZES)}") from None


def quizzes_for(lesson):
    """The quizzes of one lesson (notebook stem), in order."""
    return [q for q in QUIZZES.values() if q.lesson == lesson]


def render_text(quiz_id):
    """Plain-text rendering: the question and lettered options.

    Example:
        >>> print(render_text("se-scaling").splitlines()[-1])
          D. as wide as before.
    """
    q = get(quiz_id)
    lines = [f"Quiz [{q.id}]: {q.question}"]
    lines += [f"  {LETTERS[k]}. {opt}" for k, opt in enumerate(q.options)]
    return "\n".join(lines)


def render_html(quiz_id):
    """Markdown rendering (for ``IPython.display.Markdown``)."""
    q = get(quiz_id)
    opts = "\n".join(f"- **{LETTERS[k]}.** {opt}" for k, opt in enumerate(q.options))
    return (f"**Quiz `{html.escape(q.id)}`.** {q.question}\n\n{opts}\n\n"
            f"*Answer with* `check(\"{q.id}\", \"A\")` *(your letter).*")


#: LaTeX commands of the quizzes and the characters that stand for them in HTML.
_TEX_SYMBOLS = {
    "\\,": "\u2009", "\\;": " ", "\\!": "", "\\|": "\u2016", "\\approx": "\u2248",
    "\\cdot": "\u00b7", "\\le": "\u2264", "\\ge": "\u2265", "\\ne": "\u2260", "\\pm": "\u00b1",
    "\\sim": "~", "\\to": "\u2192", "\\mid": "|", "\\nabla": "\u2207", "\\sum": "\u03a3",
    "\\prod": "\u03a0", "\\infty": "\u221e", "\\times": "\u00d7", "\\in": "\u2208",
    "\\alpha": "\u03b1", "\\beta": "\u03b2", "\\gamma": "\u03b3", "\\delta": "\u03b4",
    "\\Delta": "\u0394", "\\epsilon": "\u03b5", "\\eta": "\u03b7", "\\theta": "\u03b8",
    "\\kappa": "\u03ba", "\\lambda": "\u03bb", "\\mu": "\u03bc", "\\xi": "\u03be",
    "\\pi": "\u03c0", "\\rho": "\u03c1", "\\sigma": "\u03c3", "\\tau": "\u03c4",
    "\\phi": "\u03c6", "\\zeta": "\u03b6", "\\lvert": "|", "\\rvert": "|",
    "\\left": "", "\\right": ""}
_SUB = re.compile(r"_\{([^{}]*)\}|_(\w\u0304?)")
_SUP = re.compile(r"\^\{([^{}]*)\}|\^(\w)")


def _math_html(tex):
    r"""One ``$...$`` formula of the quizzes as plain HTML (Greek letters, sub- and superscripts).

    jupyterquiz leaves maths to a global MathJax, which JupyterLab 4 does not provide, so its
    buttons would show raw LaTeX there; this keeps them readable everywhere. Commands it does
    not know lose their backslash (``\log`` reads ``log``).

    Example:
        >>> _math_html(r"|G_i| \le \mathrm{std}(A)\sqrt{F_i}")
        '|G<sub>i</sub>| ≤ std(A)√(F<sub>i</sub>)'
        >>> _math_html(r"A = \pm 1/\sqrt2")
        'A = ± 1/√2'
    """
    out = re.sub(r"\\(?:mathrm|text|mathcal|mathbf|mathbb|operatorname)\{([^{}]*)\}", r"\1", tex)
    out = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", out)
    out = re.sub(r"\\(?:mathcal|mathbf|mathbb|mathrm)\s*", "\u2009", out)  # \mathcal L: L
    out = re.sub(r"\\(log|exp|min|max)(?=\s*[A-Za-z\\])", "\u2009\\1\u2009", out)  # A\log p
    out = re.sub(r"\\bar\s*\{?(\w)\}?", "\\1\u0304", out)
    out = re.sub(r"\\hat\s*\{?(\w)\}?", "\\1\u0302", out)
    out = re.sub(r"\\tilde\{?\\xi\}?", "\u03be\u0303", out)
    out = re.sub(r"\\tilde\s*\{?(\w)\}?", "\\1\u0303", out)
    for command in sorted(_TEX_SYMBOLS, key=len, reverse=True):
        end = r"(?![A-Za-z])" if command[-1].isalpha() else ""
        out = re.sub(re.escape(command) + end, _TEX_SYMBOLS[command], out)
    out = re.sub(r"\\sqrt\{([A-Za-z]|\d+)\}|\\sqrt\s*([A-Za-z]\b|\d)",  # \sqrt n, \sqrt2
                 lambda m: "\u221a" + (m[1] or m[2]), out)
    out = re.sub(r"\\sqrt\{([^{}]*)\}", "\u221a(\\1)", out)
    out = re.sub(r"\\([A-Za-z]+)", r"\1", out)  # \log, \min, \max ...: the plain word
    for _ in range(2):  # j_{y_t}: the inner subscript, then the outer one
        out = _SUB.sub(lambda m: f"<sub>{m[1] or m[2]}</sub>", out)
        out = _SUP.sub(lambda m: f"<sup>{m[1] or m[2]}</sup>", out)
    return out.replace("{", "").replace("}", "")


def _inline_html(markdown):
    """The little markdown the quizzes use (code, bold, italics, ``$`` maths) as HTML."""
    text = html.escape(markdown, quote=False)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)
    text = re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?![\w*])", r"<i>\1</i>", text)
    return re.sub(r"\$([^$]+)\$", lambda m: _math_html(m[1]), text)


def as_jupyterquiz(quiz_id):
    """The quiz in jupyterquiz's format: a list of one multiple-choice question.

    Options keep their letters, so a click and :func:`check` name the same answer.

    Example:
        >>> q = as_jupyterquiz("se-scaling")[0]
        >>> q["type"], [a["correct"] for a in q["answers"]]
        ('multiple_choice', [False, True, False, False])
    """
    q = get(quiz_id)
    answers = [{"answer": f"{LETTERS[k]}. {_inline_html(opt)}", "correct": k == q.correct,
                "feedback": _inline_html(q.feedback[k])} for k, opt in enumerate(q.options)]
    return [{"question": _inline_html(q.question), "type": "multiple_choice",
             "answers": answers}]


def in_notebook():
    """True inside a Jupyter kernel (where Markdown renders), False in a terminal or script."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is optional
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def emit(markdown, text):
    """Show ``markdown`` rendered in a notebook, print ``text`` everywhere else."""
    if in_notebook():
        from IPython.display import Markdown, display
        display(Markdown(markdown))
    else:
        print(text)


def show(quiz_id):
    """Display a quiz: clickable buttons in a notebook (with ``jupyterquiz`` installed, the
    ``lessons`` extra), Markdown in a notebook without it, plain text otherwise."""
    if in_notebook():
        try:
            from jupyterquiz import display_quiz  # optional: pip install -e ".[lessons]"
        except ImportError:
            emit(render_html(quiz_id), render_text(quiz_id))
            return
        display_quiz(as_jupyterquiz(quiz_id), shuffle_answers=False)
        emit(f"*Click an option, or answer in the next cell:* `check(\"{quiz_id}\", \"A\")`.",
             "")
    else:
        print(render_text(quiz_id))


def check(quiz_id, answer):
    """Check an answer and show the feedback (Markdown with rendered maths in a notebook).

    Args:
        quiz_id: the quiz's id.
        answer: a letter (``"B"`` or ``"b"``), or ``None`` while not answered.

    Returns:
        ``True`` (right), ``False`` (wrong) or ``None`` (not answered yet). Inside a notebook
        it returns ``None`` always, so the cell shows the feedback and not a bare
        ``True``/``False`` under it.

    Example:
        >>> check("se-scaling", None)
        se-scaling: not answered yet -- set `answer` to a letter, run again.
        >>> check("se-scaling", "b")
        se-scaling: B is right. Right: $\\sqrt{100} = 10$.
        True
    """
    q = get(quiz_id)
    if answer is None:
        print(f"{q.id}: not answered yet -- set `answer` to a letter, run again.")
        return None
    letters = LETTERS[:len(q.options)]
    a = answer.strip().upper() if isinstance(answer, str) else ""
    if len(a) != 1 or a not in letters:
        raise ValueError(f"answer must be one of the letters {', '.join(letters)} "
                         f"(or None), got {answer!r}")
    k = letters.index(a)
    ok = k == q.correct
    verdict = "is right." if ok else "is not right."
    text = f"{q.id}: {letters[k]} {verdict} {q.feedback[k]}"
    markdown = f"**{q.id}**: **{letters[k]}** {verdict} {q.feedback[k]}"
    if not ok:
        text += "\nTry another letter."
        markdown += "\n\nTry another letter."
    emit(markdown, text)
    return None if in_notebook() else ok
