"""Check your implementation against fisher_ref's golden files: numpy only.

The public face of :mod:`fisher_ref.golden.check` (comparison) and
:mod:`fisher_ref.golden.format` (the reader); importing it loads no engine, autograd,
scipy or torch.

Example:
    >>> from fisher_ref.testing import golden_names
    >>> "default" in golden_names()
    True
"""
from fisher_ref.golden.check import *  # noqa: F401,F403
from fisher_ref.golden.check import __all__  # noqa: F401
from fisher_ref.applied_covariance import CovarianceVerdict, check_applied_covariance  # noqa: F401,E501
