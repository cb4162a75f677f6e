"""The docstring examples of the core modules run and print what they say."""
import doctest
import importlib

import pytest

import pkgutil

import fisher_ref

# every module of the package but the torch twin (tests/torch/test_adapters.py runs its
# doctests) and the entry points; found by walking the package, so a move needs no edit here
CORE = sorted(m.name for m in pkgutil.walk_packages(fisher_ref.__path__, "fisher_ref.")
              if not m.name.startswith(("fisher_ref.torch", "fisher_ref.estimators",
                                        "fisher_ref.parallel.distributed"))
              and not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", CORE)
def test_docstring_examples(name):
    mod = importlib.import_module(name)
    res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                          verbose=False)
    assert res.failed == 0, f"{res.failed} of {res.attempted} doctests failed in {name}"
