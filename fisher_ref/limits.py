"""The input limits of fisher_ref, and numbers written so that a person can read them.

Every size is checked in closed form before anything is allocated, so a task
that is too large is refused within a second, with its numbers in the message:

- :data:`MAX_PARAMS`: parameters of a model built from a spec (``theta`` is drawn
  only after the count passed);
- :data:`MAX_CONTEXT`: tokens a model reads (``context``, GPT-2's ``n_positions``);
- :data:`MAX_LAYERS`: GPT-2 blocks;
- :data:`MAX_INIT_SCALE`: ``|init_scale|``; :data:`MAX_ABS_THETA`: ``|theta_i|``;
- :data:`MAX_ABS_VALUE`: ``|reward|`` and ``|baseline|``;
- :data:`MAX_COUNT`: states or responses of an enumeration (counted without
  forming the number when it is astronomically large).

The time and memory limits of the exact engine and of Monte Carlo are arguments
(``max_seconds``, ``max_bytes``) checked by :func:`check_limit`.
"""
from __future__ import annotations

import math
import numbers

__all__ = ["MAX_PARAMS", "MAX_CONTEXT", "MAX_LAYERS", "MAX_INIT_SCALE", "MAX_ABS_THETA",
           "MAX_ABS_VALUE", "MAX_COUNT", "readable", "readable_log10", "check_limit",
           "is_real", "check_size"]

#: Parameters of a spec-built model: ``theta`` alone is 80 MB at this size, and the
#: exact engine's sensitivities are ``V`` times that per state.
MAX_PARAMS = 10 ** 7
#: Tokens a model reads (GPT-2's own ``n_positions``); longer windows only pad with BOS.
MAX_CONTEXT = 1024
#: GPT-2 blocks (GPT-2's largest model has 48).
MAX_LAYERS = 48
#: ``|init_scale|``: at 1e3 every shipped model's softmax is already one-hot in
#: float64 (``exp(-1000)`` underflows), so larger scales only overflow.
MAX_INIT_SCALE = 1e3
#: ``|theta_i|``: with entries up to 1e6 no shipped model's logits or their
#: derivatives overflow float64.
MAX_ABS_THETA = 1e6
#: ``|R|`` and ``|b|``: the engines sum :math:`A^2 h^2` with :math:`A = R - b`;
#: 1e100 keeps :math:`A^2` (1e200) far inside float64's range (1.8e308).
MAX_ABS_VALUE = 1e100
#: States or responses of an enumeration: no machine lists 1e60 of anything.
MAX_COUNT = 10 ** 60


def readable_log10(log10):
    """A count given by its base-10 logarithm, as ``1.2e+603`` (or ``10^(3e+07)``).

    Example:
        >>> readable_log10(602.07918)
        '1.2e+602'
        >>> readable_log10(3.5)
        '3,162'
    """
    if not math.isfinite(log10):
        return "10^(10^300) or more"
    if log10 < 15:
        return f"{round(10 ** log10):,}"
    if log10 > 1e15:
        return f"10^({log10:.3g})"
    e = math.floor(log10)
    m = 10 ** (log10 - e)
    if round(m, 1) >= 10:  # 9.96 would print as 10.0
        m, e = m / 10, e + 1
    return f"{m:.1f}e+{e:d}"


def readable(x):
    """``x`` (an int of any size or a float) written for a person: commas below 1e15,
    else a mantissa and an exponent, never hundreds of digits.

    Example:
        >>> readable(1234567), readable(4 ** 1000), readable(2.5e20), readable(0.25)
        ('1,234,567', '1.1e+602', '2.5e+20', '0.25')
    """
    if isinstance(x, numbers.Integral):
        x = int(x)
        if abs(x) < 10 ** 15:
            return f"{x:,}"
        return ("-" if x < 0 else "") + readable_log10(math.log10(abs(x)))
    x = float(x)
    if not math.isfinite(x) or abs(x) >= 1e15:
        return f"{x:.2g}"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def is_real(x):
    """True for a real number (int or float, numpy's too), False for bool, str, None."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_limit(value, name):
    """A time or memory limit: a positive number (``inf``: no limit); else raise.

    Raises:
        TypeError: ``value`` is not a number (``name`` in the message).
        ValueError: ``value`` is NaN, zero or negative.

    Example:
        >>> check_limit(2 ** 30, "max_bytes")
        1073741824.0
    """
    if not is_real(value):
        raise TypeError(f"{name} must be a positive number (inf for no limit), got {value!r}")
    value = float(value)
    if math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number (inf for no limit), got {value!r}")
    return value


def check_size(value, name, limit, why=""):
    """Raise ``ValueError`` naming ``name`` when the size ``value`` exceeds ``limit``."""
    if value > limit:
        raise ValueError(f"{name} is {readable(value)}, more than the limit {readable(limit)}"
                         + (f" ({why})" if why else ""))
