"""The docstring examples of the core modules run and print what they say."""
import doctest
import importlib

import pytest

CORE = ["model", "sensitivities", "token_fisher", "tasks", "rewards", "samplers",
        "enumeration", "exact", "results", "progress", "limits", "fileio", "command"]


@pytest.mark.parametrize("name", CORE)
def test_docstring_examples(name):
    mod = importlib.import_module(f"fisher_ref.{name}")
    res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                          verbose=False)
    assert res.failed == 0, f"{res.failed} of {res.attempted} doctests failed in {name}"
