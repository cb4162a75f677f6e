"""Monte Carlo estimates of the exact quantities, and their z-tests against exact values.

- :mod:`fisher_ref.monte_carlo.sampling`: drawing responses, :func:`estimate` and
  :func:`check_monte_carlo`; the per-response values in
  :mod:`~fisher_ref.monte_carlo.values`, the memory a run needs in
  :mod:`~fisher_ref.monte_carlo.memory`;
- :mod:`fisher_ref.monte_carlo.estimators`: the estimators and their standard errors;
- :mod:`fisher_ref.monte_carlo.ztests`: z-scores against exact values and the Bernstein
  bounds the checks use.

Every name of the three is available here, so ``from fisher_ref.monte_carlo import estimate``
keeps working.
"""
from fisher_ref.monte_carlo.sampling import *  # noqa: F401,F403
from fisher_ref.monte_carlo.sampling import __all__ as _sampling_all
from fisher_ref.monte_carlo.estimators import *  # noqa: F401,F403
from fisher_ref.monte_carlo.estimators import __all__ as _estimators_all
from fisher_ref.monte_carlo.ztests import *  # noqa: F401,F403
from fisher_ref.monte_carlo.ztests import __all__ as _ztests_all

__all__ = list(dict.fromkeys(_sampling_all + _estimators_all + _ztests_all))
