"""Old module paths (fisher_ref._aliases): each is an alias of its new home that warns
once, for one release."""
import pytest

from tests.test_package import run_python


@pytest.mark.parametrize("old, new", [("verify", "checks.identities"), ("walk", "engine.run"),
                                      ("mc_stats", "monte_carlo"), ("torch.model", "torch.adapters")])
def test_moved_module_paths_are_aliases_that_warn(old, new):
    out = run_python("import warnings, importlib\n"
                     "warnings.simplefilter('always')\n"
                     "with warnings.catch_warnings(record=True) as w:\n"
                     f"    m = importlib.import_module('fisher_ref.{old}')\n"
                     f"n = importlib.import_module('fisher_ref.{new}')\n"
                     "name = sorted(n.__all__)[0]\n"
                     "print(getattr(m, name) is getattr(n, name), "
                     "any(issubclass(x.category, DeprecationWarning) for x in w))")
    assert out == "True True"
