"""The docstring examples of fisher_ref.estimators (tests/docs/test_doctests.py leaves the
torch-dependent packages to their own tests)."""
import doctest
import importlib
import pkgutil

import pytest

import fisher_ref.estimators

MODULES = sorted(m.name for m in pkgutil.walk_packages(fisher_ref.estimators.__path__,
                                                        "fisher_ref.estimators."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    res = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert res.failed == 0, f"{res.failed} of {res.attempted} doctests failed in {name}"


def test_the_examples_exist():
    assert len(MODULES) >= 6
