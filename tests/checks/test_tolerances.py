"""How another precision's value is judged against the exact one
(fisher_ref.checks.tolerances): the relative error on the largest exact entry, the
tolerances ordered by precision, and the docstring examples of the scales."""
import doctest

import numpy as np
import pytest

import fisher_ref.checks.tolerances as tolerances
from fisher_ref.checks.tolerances import TOL_BFLOAT16, TOL_FLOAT32, TOL_FLOAT64, rel_error


def test_rel_error_uses_largest_exact_entry():
    assert rel_error(np.array([1.0, 2.5]), np.array([1.0, 2.0])) == (0.5, 0.25)
    assert rel_error(np.zeros(3), np.zeros(3)) == (0.0, 0.0)
    with pytest.raises(ValueError, match="shape mismatch"):
        rel_error(np.zeros(3), np.zeros(4))


@pytest.mark.torch
def test_tolerances_are_ordered_by_precision():
    torch = pytest.importorskip("torch", reason="the dtypes' eps are torch's (the torch extra)")
    assert TOL_FLOAT64 == 1e-10 < TOL_FLOAT32 < TOL_BFLOAT16
    assert TOL_FLOAT32 > 100 * torch.finfo(torch.float32).eps
    assert TOL_BFLOAT16 > 10 * torch.finfo(torch.bfloat16).eps


def test_error_scales_docstring_examples():
    res = doctest.testmod(tolerances, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0 and res.failed == 0
