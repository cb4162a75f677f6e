"""Monte Carlo estimates of the exact quantities, and their z-tests against exact values.

- :mod:`fisher_ref.monte_carlo.sampling`: drawing responses, per-response values,
  :func:`estimate` and :func:`check_monte_carlo`;
- :mod:`fisher_ref.monte_carlo.stats`: the estimators, their standard errors and the
  z-scores and Bernstein bounds the checks use.

Every name of both is available here, so ``from fisher_ref.monte_carlo import estimate``
keeps working.
"""
from fisher_ref.monte_carlo.sampling import *  # noqa: F401,F403
from fisher_ref.monte_carlo.sampling import __all__ as _sampling_all
from fisher_ref.monte_carlo.stats import *  # noqa: F401,F403
from fisher_ref.monte_carlo.stats import __all__ as _stats_all

__all__ = list(dict.fromkeys(_sampling_all + _stats_all))
