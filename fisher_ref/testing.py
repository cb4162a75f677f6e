"""Check your implementation against fisher_ref's golden files, and the gradient your
trainer applies against the exact one: numpy only.

The public face of :mod:`fisher_ref.golden.check` (comparison),
:mod:`fisher_ref.golden.format` (the reader), ``fisher_ref.applied_gradient``
(:func:`check_applied_gradient`, :func:`steps_needed`) and ``fisher_ref.applied_covariance``
(:func:`check_applied_covariance`); importing it loads no engine,
autograd, scipy or torch.

Example:
    >>> from fisher_ref.testing import golden_names
    >>> "default" in golden_names()
    True
"""
from fisher_ref.applied_gradient import (MIN_STEPS, AppliedGradientVerdict,  # noqa: F401
                                         check_applied_gradient, steps_needed)
from fisher_ref.golden.check import *  # noqa: F401,F403
from fisher_ref.golden.check import __all__ as _golden_all
from fisher_ref.applied_covariance import CovarianceVerdict, check_applied_covariance  # noqa: F401

__all__ = list(_golden_all) + ["MIN_STEPS", "AppliedGradientVerdict", "check_applied_gradient",
                               "steps_needed", "CovarianceVerdict", "check_applied_covariance"]
