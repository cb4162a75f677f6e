r"""Every batch of groups that can be drawn, with its gradient and its probability: the
distribution whose mean, variance and covariance
:func:`fisher_ref.estimators.expected_loss_gradient` returns. Draw rows from it to
simulate a correct trainer's applied gradients (small tasks: it holds ``(N, P)``)."""
from __future__ import annotations

from ..engine.plan import EnumerationTooLarge
from ..limits import readable
from .gradient import walk_batches
from .groups import DEFAULT_MAX_BYTES, DEFAULT_MAX_GROUPS
from .moments import Collected

__all__ = ["enumerated_gradients"]


def enumerated_gradients(task, loss, group_size=1, symmetric=False, *, groups_per_batch=1,
                         pad="max_len", max_groups=DEFAULT_MAX_GROUPS,
                         max_bytes=DEFAULT_MAX_BYTES, vectorize=True):
    r"""Every batch's gradient and probability, the distribution whose moments
    :func:`fisher_ref.estimators.expected_loss_gradient` returns: draw rows by ``probabilities`` to simulate a
    correct trainer's applied gradients.

    .. math:: E[\nabla L] = \sum_n \pi_n g_n, \qquad
       \mathrm{Cov}[\nabla L] = \sum_n \pi_n (g_n - E)(g_n - E)^T.

    Args: as :func:`fisher_ref.estimators.expected_loss_gradient` (the ``(N, P)`` gradients must also fit in
        ``max_bytes``).

    Returns:
        ``(gradients (N, P), probabilities (N,))``, ``N`` the ``n_batches`` that can be
        drawn (with ``symmetric``, one row per multiset with its multiplicity folded into
        its probability), the probabilities summing to 1.

    Example:
        >>> import numpy as np
        >>> from fisher_ref import load_config
        >>> loss = lambda b: -(b.rewards * b.logp.sum(1)).mean()
        >>> g, p = enumerated_gradients(load_config("tabular"), loss)
        >>> from fisher_ref.estimators import expected_loss_gradient
        >>> lg = expected_loss_gradient(load_config("tabular"), loss)
        >>> bool(np.allclose(p @ g, lg.mean, rtol=1e-12, atol=0)), round(float(p.sum()), 12)
        (True, 1.0)
    """
    def make_acc(P, n):
        if 8 * P * n > max_bytes:
            raise EnumerationTooLarge(
                f"enumerated_gradients refused: {readable(n)} batches x P = {P} parameters "
                f"need {readable(8 * P * n)} bytes, more than max_bytes={readable(max_bytes)}")
        return Collected()
    acc, state = walk_batches(task, loss, group_size, symmetric, groups_per_batch, pad, max_groups,
                       max_bytes, vectorize, make_acc)
    return acc.arrays(state["P"])
