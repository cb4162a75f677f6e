"""The verdict mixin: true when passed, printed as its message, assert_ok raising it; and
every checker's verdict is one."""
from dataclasses import dataclass

import pytest

from fisher_ref.verdict import Verdict


@dataclass
class _V(Verdict):
    passed: bool
    message: str = "FAIL: off by 2"


def test_a_verdict_is_its_pass_and_its_message():
    assert _V(True) and not _V(False)
    assert str(_V(False)) == "FAIL: off by 2"
    assert _V(True).assert_ok().passed
    with pytest.raises(AssertionError, match="off by 2"):
        _V(False).assert_ok()


def test_every_checkers_verdict_is_a_verdict():
    from fisher_ref.applied_covariance import CovarianceVerdict
    from fisher_ref.applied_gradient import AppliedGradientVerdict
    from fisher_ref.estimators.check import LossVerdict
    for cls in (CovarianceVerdict, AppliedGradientVerdict, LossVerdict):
        assert issubclass(cls, Verdict), cls
