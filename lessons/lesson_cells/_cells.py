"""Helpers to write lesson cells as data."""

IMPORTS = """\
import numpy as np
import matplotlib.pyplot as plt
from fisher_ref import load_config, exact
from fisher_ref.quizzes import show, check"""


def md(text):
    """A markdown cell."""
    return ("md", text.strip("\n"))


def code(text):
    """A code cell."""
    return ("code", text.strip("\n"))


def quiz(quiz_id):
    """The two cells of a quiz: show it, then an unanswered check that runs unattended."""
    return [("code", f'show("{quiz_id}")'),
            ("code", f'answer = None  # put your letter here, e.g. "A"\n'
                     f'check("{quiz_id}", answer)')]
