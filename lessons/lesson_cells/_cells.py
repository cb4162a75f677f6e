"""Helpers to write lesson cells as data."""
from fisher_ref.teaching.exercises import cell_code, get as get_exercise, solution_markdown

IMPORTS = """\
import numpy as np
import matplotlib.pyplot as plt
from fisher_ref import load_config, exact
from fisher_ref.teaching.quizzes import show, check
from fisher_ref.teaching.exercises import check_exercise"""

#: Reading order: (notebook stem, title). After the last lesson come the documentation's
#: 'Check your implementation' pages (linked from the repository's lessons/ folder; the
#: documentation site's copies link them from docs/lessons/, see build.site_notebook).
PATH = [
    ("00_start_here", "Start here"),
    ("01_sequence_to_tokens", "From sequences to tokens"),
    ("02_pairwise_differences", "Token Fisher compares tokens with each other"),
    ("03_where_mass_lands", "Where the probability mass lands"),
    ("04_gradient_is_covariance", "The gradient is a covariance"),
    ("05_offpolicy_centering", "Off-policy: center the score under the sampler"),
    ("06_monte_carlo", "Monte Carlo against the exact values"),
    ("07_transformer", "A transformer: the identities hold for attention too"),
    ("08_rl_estimators", "Which RL estimator is unbiased?"),
]
NEXT_AFTER_LAST = ("hold your own Fisher, policy-gradient or RL-loss code against these exact "
                   "values, with the 'Check your implementation' pages: "
                   "[golden files](../docs/check/golden.md), "
                   "[the conformance check](../docs/check/conformance.md), "
                   "[compare](../docs/check/compare.md) and "
                   "[RL losses](../docs/check/rl_losses.md)")


def md(text):
    """A markdown cell."""
    return ("md", text.strip("\n"))


def code(text):
    """A code cell."""
    return ("code", text.strip("\n"))


def quiz(quiz_id):
    """The two cells of a quiz, placed before the computation that answers it: show it
    (clickable where jupyterquiz is installed), then an unanswered check that runs unattended."""
    return [("code", f'show("{quiz_id}")  # predict first: the cells below answer it'),
            ("code", f'answer = None  # or put your letter here, e.g. "A"\n'
                     f'check("{quiz_id}", answer)')]


def checks(text):
    """The lesson's asserts in one collapsed, tagged cell: every claim the text makes is
    checked here (the test suite runs it), out of the reader's way."""
    return ("checks", "# The claims of this lesson, checked (the test suite runs this cell).\n"
                      + text.strip("\n") + '\nprint("every claim of this lesson holds")')


def exercise(ex_id):
    """The three cells of an exercise: the prompt, setup + blank answer + check, the solution."""
    ex = get_exercise(ex_id)
    return [("md", f"### Try it yourself: {ex.title}\n\n{ex.prompt}"),
            ("code", cell_code(ex_id)),
            ("md", solution_markdown(ex_id))]


def nav(stem):
    """One line of previous / next links for lesson ``stem``."""
    stems = [s for s, _ in PATH]
    k = stems.index(stem)
    prev = (f"[← {PATH[k - 1][1]}]({PATH[k - 1][0]}.ipynb)" if k > 0 else "")
    nxt = (f"[{PATH[k + 1][1]} →]({PATH[k + 1][0]}.ipynb)" if k + 1 < len(PATH)
           else f"Next: {NEXT_AFTER_LAST}.")
    home = "[Start here](00_start_here.ipynb)" if k > 1 else ""  # lesson 1's previous is it
    return " · ".join(x for x in (prev, home, nxt) if x)


def header(stem, objectives, prerequisites, claim):
    """The first cell: title, links, objectives, prerequisites, then the lesson's claim."""
    stems = [s for s, _ in PATH]
    k = stems.index(stem)
    obj = "\n".join(f"- {o}" for o in objectives)
    pre = "\n".join(f"- {p}" for p in prerequisites)
    return md(f"# {k}. {PATH[k][1]}\n\n{nav(stem)}\n\n**Learning objectives.** After this "
              f"lesson you can\n\n{obj}\n\n**Prerequisites.**\n\n{pre}\n\n{claim.strip()}")


def footer(stem, takeaways):
    """The last cell: takeaways and links."""
    items = "\n".join(f"- {t}" for t in takeaways)
    return md(f"## Takeaways\n\n{items}\n\n{nav(stem)}")
