"""fisher_ref.testing, the public face of the golden-file checker: its names are the
checker's and the reader's own objects, its examples run, and importing it (and checking
every shipped file through it) loads no autograd, scipy or torch."""
import doctest
import json

import fisher_ref.golden.check as check
import fisher_ref.golden.format as golden_format
import fisher_ref.testing as testing
from tests.test_package import run_python

HEAVY = ("autograd", "matplotlib", "nbformat", "scipy", "torch")


def test_public_names_are_the_checkers_objects():
    import fisher_ref.applied_covariance as covariance
    import fisher_ref.applied_gradient as applied
    assert testing.__all__[:len(check.__all__)] == check.__all__ and len(testing.__all__) > 5
    for name in testing.__all__[len(check.__all__):]:
        home = applied if hasattr(applied, name) else covariance
        assert getattr(testing, name) is getattr(home, name), name
    for name in check.__all__:
        assert getattr(testing, name) is getattr(check, name), name
    assert testing.load_golden is golden_format.load_golden
    assert testing.GoldenFileError is golden_format.GoldenFileError


def test_importing_testing_and_checking_loads_no_heavy_package():
    code = f"""
import json, sys
import numpy as np
from fisher_ref.testing import compare_to_golden, golden_names, golden_path, load_golden
for name in golden_names():
    g = load_golden(golden_path(name))
    h, w = g["seq_score"], g["seq_prob"]
    assert compare_to_golden({{"sequence_fisher": w @ h ** 2}}, g).passed
from fisher_ref.testing import check_applied_gradient, steps_needed
steps = np.random.default_rng(0).choice([0.0, 2.0], size=(50, 3))
exact = (np.ones(3), np.ones(3), np.zeros(3), 2 * np.ones(3))
check_applied_gradient(steps, exact), steps_needed(exact, 0.1)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})))
"""
    assert json.loads(run_python(code)) == []


def test_doctests():
    res = doctest.testmod(testing)
    assert res.attempted > 0 and res.failed == 0
